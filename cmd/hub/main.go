// Command hub runs meshfed's central control plane; `hub status`, `hub why` and `hub
// whatif` ask a running one, `hub breaker release` asks it, as an operator, to apply the
// deletions a cluster's breaker holds, `hub certs issue` issues certificates from its
// development CA and `hub subscribe` prints what it serves (see package hub/admin). With
// no -config it runs hub.DefaultConfig: its development CA and the clusters' kept state in
// .meshfed/hub, mutual TLS on 127.0.0.1 (ingest :9901, serve :9900, admin :9990, adminTLS
// :9991), one cluster "dev" owning everything, every sink receiving everything.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/hub/replicas"
	"github.com/meshfed/meshfed/internal/ops"
)

func main() {
	if len(os.Args) > 1 && admin.IsCommand(os.Args[1]) {
		// Operator commands: status, why, whatif, breaker release (the admin API), certs
		// issue, subscribe.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := admin.Run(ctx, os.Args[1:], os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "hub %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	config := flag.String("config", "", "configuration file (YAML)")
	level := flag.String("log-level", "info", "log level: debug, info, warn, error")
	flag.Parse()

	log, err := ops.Logger(os.Stderr, *level)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hub: -log-level: %v\n", err)
		os.Exit(2)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := hub.DefaultConfig()
	if *config != "" {
		if cfg, err = hub.LoadConfig(*config); err != nil {
			log.Error("hub not started", "err", err)
			os.Exit(2)
		}
	}
	h, err := build(cfg, log, reg)
	if err != nil {
		log.Error("hub not started", "err", err)
		os.Exit(2)
	}
	if *config != "" {
		err = h.RunWithReload(ctx, *config) // valid changes of the file apply without a restart
	} else {
		err = h.Run(ctx)
	}
	if err != nil {
		log.Error("hub stopped", "err", err)
		os.Exit(1)
	}
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
