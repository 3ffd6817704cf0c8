// Command hub runs meshfed's central control plane. With no -config it runs
// hub.DefaultConfig: development mode on 127.0.0.1 (ingest :9901, serve :9900, admin
// :9990), one cluster "dev" owning everything, every sink receiving everything.
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
)

func main() {
	config := flag.String("config", "", "configuration file (YAML)")
	level := flag.String("log-level", "info", "log level: debug, info, warn, error")
	flag.Parse()

	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "hub: -log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	cfg := hub.DefaultConfig()
	if *config != "" {
		var err error
		if cfg, err = hub.LoadConfig(*config); err != nil {
			log.Error("configuration refused", "err", err)
			os.Exit(2)
		}
	} else {
		cfg.HTTP = "127.0.0.1:9990"
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	h, err := hub.New(cfg, log, reg)
	if err != nil {
		log.Error("hub not started", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := h.Run(ctx); err != nil {
		log.Error("hub stopped", "err", err)
		os.Exit(1)
	}
}
