// Package hubproc runs meshfed's hub (cmd/hub) as a process for a test or a benchmark: from
// a hub.Config written as its configuration file, with the addresses its listeners bound
// (read from its "listening" log lines) and its readiness. A process, not Hub.Run in the
// test's own process, where the test kills it (SIGKILL) or measures its CPU and memory.
//
// It is test infrastructure: nothing in the product imports it.
package hubproc

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// TB is what it needs of a test (a benchmark command that is not a test can run a hub too).
type TB interface {
	testproc.TB
	Fatal(args ...any)
}

// Hub is a running hub process.
type Hub struct {
	*testproc.Proc
	mu    sync.Mutex
	addrs map[string]string // listener -> bound address
}

// Start validates cfg, writes it to dir/hub.yaml (see File) and runs the hub on it until
// the test ends; its output goes to log (nil: kept for Tail only).
func Start(t TB, cfg *hub.Config, dir string, log io.Writer) *Hub {
	t.Helper()
	return StartWith(t, cfg, dir, log, Options{})
}

// Options change how the hub process runs.
type Options struct {
	// NoFile, if set, is the process's limit of open files (RLIMIT_NOFILE, soft and hard:
	// the Go runtime raises the soft limit to the hard one at start): a test of what the
	// hub does at the limit reaches it with hundreds of connections, not tens of thousands.
	// It is set by sh's ulimit before it execs the hub, so the hub's PID is the process's.
	NoFile int
}

// StartWith is Start with options.
func StartWith(t TB, cfg *hub.Config, dir string, log io.Writer, o Options) *Hub {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hub.yaml")
	if err := os.WriteFile(path, File(t, cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &Hub{addrs: map[string]string{}}
	bin, args := testbin.Own(t, "hub"), []string{"--config", path}
	if o.NoFile > 0 {
		// sh -c SCRIPT ARG0 ARGS...: $0 is the limit, "$@" the hub's command line.
		bin, args = "sh", append([]string{"-c", `ulimit -n "$0" && exec "$@"`, strconv.Itoa(o.NoFile), bin}, args...)
	}
	h.Proc = testproc.Start(t, testproc.Options{Path: bin, Args: args, Name: "meshfed-hub", Log: log,
		OnLine: func(line string) {
			if listener, addr, ok := testproc.Listening([]byte(line)); ok {
				h.mu.Lock()
				h.addrs[listener] = addr
				h.mu.Unlock()
			}
		}})
	return h
}

// File is cfg as a configuration file. A file is read over hub.Defaults(), and
// hub.Config's encoding leaves out a limit or quota of 0, so a cap cfg turns off (0: none)
// would come back as the default (1,024 streams per peer, 64 connections in handshake per
// address, 20 pushes/s): those are written out.
// The file is read back and its limits and quotas checked against cfg's.
func File(t TB, cfg *hub.Config) []byte {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	limits, _ := m["limits"].(map[string]any)
	quotas, _ := m["quotas"].(map[string]any)
	if limits == nil || quotas == nil {
		t.Fatalf("hub.Config encodes without limits or quotas: %s", b)
	}
	limits["maxStreamsPerPeer"], limits["maxPendingPerIP"] = cfg.Limits.MaxStreamsPerPeer, cfg.Limits.MaxPendingPerIP
	quotas["maxObjects"], quotas["maxBytes"], quotas["pushesPerSecond"], quotas["pushBurst"] = cfg.Quotas.MaxObjects, cfg.Quotas.MaxBytes, cfg.Quotas.PushesPerSecond, cfg.Quotas.PushBurst
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	back, err := hub.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.Limits != cfg.Limits || back.Quotas != cfg.Quotas {
		t.Fatalf("the hub's file reads back as limits %+v, quotas %+v; want %+v, %+v", back.Limits, back.Quotas, cfg.Limits, cfg.Quotas)
	}
	return b
}

// Addr waits up to limit for the address listener ("ingest", "serve", "http", ...) bound;
// the hub exiting first fails t.
func (h *Hub) Addr(t TB, listener string, limit time.Duration) string {
	t.Helper()
	var a string
	testwait.For(t, limit, "the hub's "+listener+" listener", func() bool {
		if h.Exited() {
			t.Fatalf("the hub exited before its %s listener was bound:\n%s", listener, h.Tail(40))
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		a = h.addrs[listener]
		return a != ""
	})
	return a
}

// Ready reports whether the hub's /readyz answers 200 (false before its http listener is
// bound: configure http).
func (h *Hub) Ready() bool {
	h.mu.Lock()
	addr := h.addrs["http"]
	h.mu.Unlock()
	if addr == "" {
		return false
	}
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
