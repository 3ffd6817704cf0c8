// Command minion runs meshfed's per-cluster agent: it watches the configured sources and
// publishes them to the hub. With no command and no --config it runs DefaultConfig (the
// example files, pushing to a hub on 127.0.0.1:9901); `minion version` and `minion
// completion` are its only commands, and a word that is none is an error: nothing starts.
package main

import (
	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/internal/cli"
	"github.com/meshfed/meshfed/minion"
)

func main() { cli.Main(newRoot()) }

// newRoot is the minion's command tree: the root runs the minion.
func newRoot() *cobra.Command {
	var config string
	var logs cli.LogFlags
	root := &cobra.Command{
		Use:   "minion",
		Short: "meshfed's minion: publishes one cluster's Istio configuration to the hub",
		Long: `minion with no command runs the minion (until Ctrl-C): with --config FILE that file (reloaded
when it changes), else the development configuration: cluster "dev", the example files, pushed
to a hub on 127.0.0.1:9901 with the certificate the development hub issues.`,
		Example: "  minion\n  minion --config examples/minion.yaml --log-format text",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logs.Logger(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := minion.RunWithReload(cmd.Context(), config, log, minion.NewTelemetry()); err != nil {
				log.Error("minion stopped", "err", err) // for log pipelines; Execute tells the terminal
				return err
			}
			return nil
		},
	}
	root.Flags().StringVar(&config, "config", "", "configuration file (YAML); watched and reloaded on change")
	logs.Add(root)
	root.AddCommand(cli.VersionCommand())
	return root
}
