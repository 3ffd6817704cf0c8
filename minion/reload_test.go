package minion

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
)

// A refused configuration is logged and counted once, however often its directory changes:
// here the minion logs to a file next to its configuration, so every refusal line is itself
// a change in the directory. Another file written, the refused file saved again unchanged and
// touched refuse nothing more; a valid change after them goes through.
func TestRefusedConfigurationOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "minion.yaml")
	conf := func(cluster string) string {
		return "cluster: " + cluster + "\nsources: [{url: 'fs://" + dir + "'}]\ndestinations: {push: ['push://127.0.0.1:1']}\nhttp: ''\ninsecure: true\n"
	}
	write(t, dir, "minion.yaml", conf("east"))
	current, err := ParseConfig([]byte(conf("east")))
	if err != nil {
		t.Fatal(err)
	}
	appendTo := func(name string) *os.File {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	logPath := filepath.Join(dir, "minion.log")
	log := slog.New(slog.NewTextHandler(appendTo("minion.log"), nil))
	tel := NewTelemetry()
	changes := make(chan *Config, 1)
	var live atomic.Pointer[Config]
	live.Store(current)
	stop := testrun.Start(t, "watchConfig", func(ctx context.Context) error {
		return watchConfig(ctx, path, &live, time.Millisecond, log, tel, changes)
	})
	defer func() {
		stop()
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("minion.log:\n%s", log)
		}
	}()
	refusals := func() float64 {
		return promtest.Sum(t, tel.Registry, "meshfed_minion_config_reloads_total", map[string]string{"result": "refused"})
	}

	refused := conf("east") + "surprise: true\n"
	write(t, dir, "minion.yaml", refused)
	waitFor(t, 10*time.Second, "the refusal", func() bool { return refusals() >= 1 })
	access := appendTo("access.log")
	for range 50 {
		if _, err := access.WriteString("GET /\n"); err != nil {
			t.Fatal(err)
		}
	}
	write(t, dir, "minion.yaml", refused)
	if now := time.Now(); os.Chtimes(path, now, now) != nil {
		t.Fatal("touch")
	}
	// Changes are seen in order: once this one is sent, the ones above have been seen.
	write(t, dir, "minion.yaml", conf("west"))
	select {
	case next := <-changes:
		if next.Cluster != "west" {
			t.Errorf("sent a configuration of cluster %q, want west", next.Cluster)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the valid change was not sent")
	}
	logged, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n, got := bytes.Count(logged, []byte("configuration refused")), refusals(); n != 1 || got != 1 {
		t.Errorf("%d refusals logged, %v counted; want 1 and 1", n, got)
	}

	// west fails to start, and east runs again (RunWithReload's part): the file put back to
	// east is the running configuration again, and the failed reload is over.
	tel.Metrics.reloaded().FailedToStart()
	ok := func() float64 {
		return promtest.Sum(t, tel.Registry, "meshfed_minion_config_last_reload_successful", nil)
	}
	if ok() != 0 {
		t.Fatal("a change that failed to start left the last reload successful")
	}
	write(t, dir, "minion.yaml", conf("east"))
	waitFor(t, 10*time.Second, "east, which runs, put back", func() bool { return ok() == 1 })
	select {
	case next := <-changes:
		t.Errorf("the running configuration was sent as a change (cluster %q)", next.Cluster)
	default:
	}
}

// A minion with a relay state file reloads its configuration: the state file is held by a
// running minion only, so the next one (built while the first still runs) can open it.
func TestReloadWithRelayStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "minion.yaml")
	conf := func(cluster string) string {
		return "cluster: " + cluster + "\nsources: [{url: 'fs://" + dir + "'}]\ndestinations: {push: ['push://127.0.0.1:1']}\nhttp: ''\ninsecure: true\n" +
			"relay: {listen: '127.0.0.1:0', stateFile: '" + filepath.Join(dir, "relay.db") + "'}\n"
	}
	write(t, dir, "minion.yaml", conf("east"))
	tel := NewTelemetry()
	testrun.Start(t, "RunWithReload", func(ctx context.Context) error { return RunWithReload(ctx, path, testLog(t), tel) })
	reloads := func(result string) float64 {
		return promtest.Sum(t, tel.Registry, "meshfed_minion_config_reloads_total", map[string]string{"result": result})
	}
	waitFor(t, 10*time.Second, "the first minion holding the state file", func() bool {
		_, err := os.Stat(filepath.Join(dir, "relay.db"))
		return err == nil
	})
	write(t, dir, "minion.yaml", conf("west"))
	waitFor(t, 20*time.Second, "the reload applied", func() bool { return reloads("applied") >= 1 })
	// Had the new configuration not opened the state file, it would have gone back to the
	// previous one and counted a refusal, before the next change is taken.
	write(t, dir, "minion.yaml", conf("north"))
	waitFor(t, 20*time.Second, "a second reload applied", func() bool { return reloads("applied") >= 2 })
	if n := reloads("refused"); n != 0 {
		t.Errorf("%v reloads refused, want 0", n)
	}
}
