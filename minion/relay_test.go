package minion

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// A minion whose relay state file cannot be opened does not run, and leaves nothing running
// behind it: not its HTTP endpoints (a reload that goes back to the previous configuration
// binds them again), nor its sources.
func TestRunRelayStateUnopenableStartsNothing(t *testing.T) {
	cfg := fsConfig(t.TempDir(), "push://"+deadAddr(t))
	cfg.HTTP = deadAddr(t)
	cfg.Relay = &RelayConfig{Listen: "127.0.0.1:0", StateFile: filepath.Join(t.TempDir(), "missing", "relay.db")}
	m, err := New(cfg, testLog(t), NewTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Run(ctx); err == nil || !strings.Contains(err.Error(), "relay.stateFile") {
		t.Fatalf("Run: %v, want the state file's error", err)
	}
	if c, err := net.Dial("tcp", cfg.HTTP); err == nil {
		c.Close()
		t.Errorf("the HTTP endpoints are still served at %s after Run returned", cfg.HTTP)
	}
	if m.sources[0].Synced() {
		t.Error("the fs:// source ran after Run returned")
	}
}
