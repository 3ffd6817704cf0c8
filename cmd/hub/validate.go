package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub/configcheck"
	"github.com/meshfed/meshfed/internal/cli"
)

// validateCommand is `hub validate FILE`: the file checked offline, as the hub would take it.
func validateCommand() *cobra.Command {
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a configuration file offline: errors with their line, and warnings",
		Long: "Check a hub configuration file without a hub: whether the hub would take it (its error,\n" +
			"with the line of the field it names), and what it would take but is likely a mistake\n" +
			"(hosts two clusters claim, routing rules that select nothing, identities that are not the\n" +
			"trust domain's SPIFFE IDs, no http: no admin API). Exit status 0: valid (warnings are\n" +
			"printed); 1: invalid.",
		Example: "  hub validate hub.yaml\n  hub validate hub.yaml -o json",
		Args:    cli.Args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			findings := configcheck.Check(data)
			invalid := len(findings) > 0 && !findings[0].Warning
			w := cmd.OutOrStdout()
			doc, err := json.MarshalIndent(struct {
				File     string                `json:"file"`
				Valid    bool                  `json:"valid"`
				Findings []configcheck.Finding `json:"findings"`
			}{args[0], !invalid, append([]configcheck.Finding{}, findings...)}, "", "  ")
			if err != nil {
				return err
			}
			err = out.Print(w, doc, func(bool) error {
				for _, f := range findings {
					kind := "error"
					if f.Warning {
						kind = "warning"
					}
					at := args[0]
					if f.Line > 0 {
						at = fmt.Sprintf("%s:%d", args[0], f.Line)
					}
					fmt.Fprintf(w, "%s: %s: %s\n", at, kind, f.Message)
				}
				if !invalid {
					fmt.Fprintf(w, "%s: valid (%d warning(s))\n", args[0], len(findings))
				}
				return nil
			})
			if err == nil && invalid {
				err = &cli.ExitError{Code: 1, Err: errors.New(args[0] + ": invalid: the hub would refuse it")}
			}
			return err
		},
	}
	out.AddFlag(cmd, "text", "text", "json", "yaml")
	return cmd
}
