package durable

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/mcp"
)

func TestMain(m *testing.M) {
	// The crash test re-executes this binary as its writer; that process never returns.
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path)
	}
	goleak.VerifyTestMain(m)
}

const vs = "istio/networking/v1alpha3/virtualservices"
const dr = "istio/networking/v1alpha3/destinationrules"

// testConfig is defaultConfig with waits short enough for tests.
func testConfig() config {
	c := defaultConfig()
	c.lockTimeout = 300 * time.Millisecond
	c.retryMin, c.retryMax = 5*time.Millisecond, 40*time.Millisecond
	c.commitInterval = 0 // each test decides what a batch holds
	return c
}

func statePath(t testing.TB) string { return filepath.Join(t.TempDir(), "state", "clusters.db") }

// openT opens path with cfg; the test's cleanup closes it.
func openT(t testing.TB, path string, log *slog.Logger, cfg config) *Store {
	t.Helper()
	if log == nil {
		log = testlog.New(t)
	}
	s, err := open(path, log, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func flush(t testing.TB, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

func load(t testing.TB, s *Store) map[string]*Cluster {
	t.Helper()
	got, err := s.Load()
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return got
}

// reload closes s and returns what a new Store on its file loads.
func reload(t testing.TB, s *Store) map[string]*Cluster {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s2 := openT(t, s.path, nil, testConfig())
	got := load(t, s2)
	if err := s2.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	return got
}

// entry is a Resource as a minion sends it, with a body of size bytes.
func entry(t testing.TB, name, version string, size int) *mcp.Entry {
	t.Helper()
	e, err := mcp.NewEntry(&mcpapi.Resource{
		Metadata: &mcpapi.Metadata{Name: name, Version: version},
		Body:     &anypb.Any{TypeUrl: "type.googleapis.com/istio.networking.v1alpha3.VirtualService", Value: bytes.Repeat([]byte{'x'}, size)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// flat is a loaded state as "cluster/collection/name" → version, and "cluster" → its meta.
func flat(state map[string]*Cluster) (map[string]string, map[string]Meta) {
	res, meta := map[string]string{}, map[string]Meta{}
	for c, cl := range state {
		meta[c] = cl.Meta
		for coll, held := range cl.Collections {
			for n, e := range held {
				res[c+"|"+coll+"|"+n] = e.Version
			}
		}
	}
	return res, meta
}

// logs captures a Store's log for assertions, and passes it to the test's log.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
	tee io.Writer
}

func newLogs(t testing.TB) (*slog.Logger, *logs) {
	l := &logs{tee: testlog.Writer(t, "")}
	return slog.New(slog.NewTextHandler(l, nil)), l
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(p)
	l.mu.Unlock()
	return l.tee.Write(p)
}

// count returns how many lines contain every one of subs.
func (l *logs) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
lines:
	for _, line := range strings.Split(l.buf.String(), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue lines
			}
		}
		n++
	}
	return n
}
