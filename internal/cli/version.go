package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/internal/buildinfo"
)

// VersionCommand is `PROGRAM version`: the build's module version, VCS revision and time,
// whether the tree was modified, and the Go version; -o json or yaml for machines.
func VersionCommand() *cobra.Command {
	var out Output
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the build's version, VCS revision and Go version",
		Args:  Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := buildinfo.Read()
			w := cmd.OutOrStdout()
			switch out.Format {
			case "json", "yaml":
				b, err := json.MarshalIndent(info, "", "  ")
				if err != nil {
					return err
				}
				return out.Print(w, b, nil)
			}
			modified := ""
			if info.Modified {
				modified = " (modified)"
			}
			revision := info.Revision
			if revision == "" {
				revision = "unknown (built without version control information: make build stamps it)"
			}
			_, err := fmt.Fprintf(w, "%s %s\n  revision: %s%s\n  commit time: %s\n  go: %s\n", cmd.Root().Name(), info.Version,
				revision, modified, dash(info.Time), info.GoVersion)
			return err
		},
	}
	out.AddFlag(cmd, "text", "text", "json", "yaml")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
