// Command hub runs meshfed's central control plane, and is the operator's command line for
// a running one (package hub/admin: status, get, why, whatif, breaker release, certs issue,
// subscribe), `hub validate` for a configuration file, `hub version` and `hub completion`.
// With no command and no --config it runs hub.DefaultConfig: its development CA and the
// clusters' kept state in .meshfed/hub, mutual TLS on 127.0.0.1 (ingest :9901, serve :9900,
// admin :9990, adminTLS :9991), one cluster "dev" owning everything, every sink receiving
// everything. A word that is no command is an error: nothing starts.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/hub/replicas"
	"github.com/meshfed/meshfed/internal/cli"
	"github.com/meshfed/meshfed/internal/procmetrics"
)

func main() { cli.Main(newRoot()) }

// newRoot is the hub's command tree: the root runs the hub.
func newRoot() *cobra.Command {
	var config string
	var logs cli.LogFlags
	root := &cobra.Command{
		Use:   "hub",
		Short: "meshfed's hub: federates Istio configuration from many clusters to many sinks",
		Long: `hub with no command runs the hub (until Ctrl-C): with --config FILE that file (reloaded when
it changes), else the development configuration: its own CA and state in .meshfed/hub, mutual
TLS on 127.0.0.1 (ingest :9901, serve :9900, admin :9990, adminTLS :9991), one cluster "dev"
owning everything, every sink receiving everything.

The other commands ask a running hub over its admin API (status, get, why, whatif, breaker),
issue certificates from its development CA (certs), subscribe as a sink (subscribe), or check
a configuration file offline (validate).`,
		Example: "  hub                          # the development hub\n  hub --config hub.yaml --log-format text\n  hub status\n  hub get vs shop/cart -o yaml",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logs.Logger(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return run(cmd.Context(), config, log)
		},
	}
	root.Flags().StringVar(&config, "config", "", "configuration file (YAML); watched, and a valid change applied without a restart")
	logs.Add(root)
	root.AddCommand(admin.Commands()...)
	root.AddCommand(validateCommand(), cli.VersionCommand())
	return root
}

// run runs the hub until ctx ends: on the configuration file at path, or the development
// configuration without one.
func run(ctx context.Context, path string, log *slog.Logger) error {
	reg := procmetrics.NewRegistry()
	// Failures are logged (for log pipelines) and returned (for the person at the terminal).
	notStarted := func(err error) error {
		log.Error("hub not started", "err", err)
		if !errors.Is(err, hub.ErrNotStarted) {
			err = fmt.Errorf("%w: %w", hub.ErrNotStarted, err)
		}
		return &cli.ExitError{Code: 2, Err: err}
	}
	cfg := hub.DefaultConfig()
	if path != "" {
		var err error
		if cfg, err = hub.LoadConfig(path); err != nil {
			return notStarted(err)
		}
	}
	h, err := build(cfg, log, reg)
	if err != nil {
		return notStarted(err)
	}
	if path != "" {
		err = h.RunWithReload(ctx, path) // valid changes of the file apply without a restart
	} else {
		err = h.Run(ctx)
	}
	if errors.Is(err, hub.ErrNotStarted) {
		return notStarted(err)
	}
	if err != nil {
		log.Error("hub stopped", "err", err)
		return fmt.Errorf("hub stopped: %w", err)
	}
	return nil
}

// build makes the hub cfg describes: the single-hub core, with the replica layer plugged in
// when cfg has a replicas section.
func build(cfg *hub.Config, log *slog.Logger, reg *prometheus.Registry) (*hub.Hub, error) {
	if cfg.Replicas != nil {
		h, _, err := replicas.New(cfg, log, reg)
		return h, err
	}
	return hub.New(cfg, log, hub.Options{Registry: reg})
}
