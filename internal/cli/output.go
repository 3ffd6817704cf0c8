package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Output is a command's -o flag: table (the default), wide, json or yaml, as kubectl's.
// json is the admin API's document as the hub sent it, yaml the same document in YAML, so
// a script reads the same fields whichever it asks for.
type Output struct {
	Format  string
	allowed []string
}

// AddFlag adds -o/--output to cmd with def as the default, of the formats allowed, checked
// before the command runs.
func (o *Output) AddFlag(cmd *cobra.Command, def string, allowed ...string) {
	o.allowed = allowed
	cmd.Flags().StringVarP(&o.Format, "output", "o", def, "output format: "+strings.Join(allowed, ", "))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return allowed, cobra.ShellCompDirectiveNoFileComp
	})
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if !slices.Contains(o.allowed, o.Format) {
			return Usagef(c, "-o %q: want one of %s", o.Format, strings.Join(o.allowed, ", "))
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

// Machine reports whether the output is a document (json, yaml) rather than a table.
func (o *Output) Machine() bool { return o.Format == "json" || o.Format == "yaml" }

// Wide reports whether -o wide was asked for.
func (o *Output) Wide() bool { return o.Format == "wide" }

// Print writes doc (JSON) as the format asks: as it is for json, converted for yaml;
// otherwise table, told whether -o wide was asked for.
func (o *Output) Print(w io.Writer, doc []byte, table func(wide bool) error) error {
	switch o.Format {
	case "json":
		if len(doc) > 0 && doc[len(doc)-1] != '\n' {
			doc = append(doc, '\n')
		}
		_, err := w.Write(doc)
		return err
	case "yaml":
		y, err := yaml.JSONToYAML(doc)
		if err != nil {
			return fmt.Errorf("-o yaml: %w", err)
		}
		_, err = w.Write(y)
		return err
	}
	return table(o.Wide())
}
