// Command minion runs meshfed's per-cluster agent: it watches the configured sources and
// publishes them to the hub. With no -config it runs DefaultConfig (the example files,
// pushing to a hub on 127.0.0.1:9901).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/minion"
)

func main() {
	config := flag.String("config", "", "configuration file (YAML); watched and reloaded on change")
	level := flag.String("log-level", "info", "log level: debug, info, warn, error")
	flag.Parse()

	log, err := ops.Logger(os.Stderr, *level)
	if err != nil {
		fmt.Fprintf(os.Stderr, "minion: -log-level: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := minion.RunWithReload(ctx, *config, log, minion.NewTelemetry()); err != nil {
		log.Error("minion stopped", "err", err)
		os.Exit(1)
	}
}
