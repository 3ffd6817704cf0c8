package hub

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// A refused configuration is logged and counted once, however often its directory changes:
// here the hub logs to a file next to its configuration, so every refusal line is itself a
// change in the directory. Another file written, the refused file saved again unchanged and
// touched refuse nothing more; a valid change after them is applied.
func TestRefusedConfigurationOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hub.yaml")
	put := func(content string) { // by a rename, as editors do: never read half-written
		t.Helper()
		if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	put(twoClusters)
	appendTo := func(name string) *os.File {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	logPath := filepath.Join(dir, "hub.log")
	logFile := appendTo("hub.log")
	cfg, err := ParseConfig([]byte(twoClusters))
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(cfg, slog.New(slog.NewTextHandler(logFile, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.watchConfig(ctx, path, time.Millisecond) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watchConfig: %v", err)
		}
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("hub.log:\n%s", log)
		}
	}()
	reloads := func(result string) float64 {
		t.Helper()
		mfs, err := h.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "meshfed_hub_config_reloads_total" {
				for _, m := range mf.GetMetric() {
					if m.GetLabel()[0].GetValue() == result {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}

	refused := twoClusters + "surprise: true\n"
	put(refused)
	testwait.For(t, 10*time.Second, "the refusal", func() bool { return reloads("refused") >= 1 })
	access := appendTo("access.log")
	for range 50 {
		if _, err := access.WriteString("GET /\n"); err != nil {
			t.Fatal(err)
		}
	}
	put(refused)
	if now := time.Now(); os.Chtimes(path, now, now) != nil {
		t.Fatal("touch")
	}
	// Changes are seen in order: once this one is applied, the ones above have been seen.
	put(strings.Replace(twoClusters, "- {name: west, identities: [west], namespaces: [pay], hosts: [\"*\"]}\n", "", 1))
	testwait.For(t, 10*time.Second, "the valid change", func() bool { return reloads("applied") == 1 })
	if got := clusterNames(h); got != "east" {
		t.Errorf("clusters after the valid change: %q", got)
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n, got := bytes.Count(log, []byte("configuration refused")), reloads("refused"); n != 1 || got != 1 {
		t.Errorf("%d refusals logged, %v counted; want 1 and 1", n, got)
	}
}
