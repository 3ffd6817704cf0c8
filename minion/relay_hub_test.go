package minion

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// relayHub is a hub for a minion with a relay: the hubSim's ResourceSink for the minion's
// pushes and, on the same listener as the hub's ingest, a ResourceSource of what the hub
// gives the cluster (relayed), for the relay's subscription. Until Answer, the source refuses
// the relay (Unavailable, as a hub warming up), so a test sees what the relay serves without
// the hub.
type relayHub struct {
	*hubSim
	relayed      *mcp.Cache
	answered     atomic.Bool
	relayStreams atomic.Int64 // the relay's streams admitted
}

func startRelayHub(t testing.TB, relayed *mcp.Cache) *relayHub {
	t.Helper()
	h := &relayHub{relayed: relayed}
	h.hubSim = newHubSim(nil, relayed.Collections()...)
	h.register = h.registerSource
	h.listen(t)
	return h
}

// Answer lets the relay subscribe.
func (h *relayHub) Answer() { h.answered.Store(true) }

func (h *relayHub) registerSource(t testing.TB, srv *grpc.Server) {
	opened := func(*mcp.StreamInfo) { h.relayStreams.Add(1) }
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: h.relayed, Logger: testLog(t), Hooks: mcp.Hooks{StreamOpened: opened}})
	if err != nil {
		t.Fatal(err)
	}
	ready := func(*mcp.StreamInfo) (time.Duration, string, bool) {
		if !h.answered.Load() {
			return 50 * time.Millisecond, "the test's hub does not answer the relay yet", false
		}
		return 0, "", true
	}
	mcp.NewSourceServer(src, mcp.ServerConfig{Logger: testLog(t), Ready: ready, StreamRate: 1000, StreamBurst: 1000}).Register(srv)
}

// istiod follows a relay as istiod does (full states), until the test ends; what it holds is
// Versions.
func istiod(t testing.TB, addr string, collections ...string) *mcp.Sink {
	t.Helper()
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: collections, Node: &mcppb.SinkNode{Id: "istiod"}, FullStateOnly: true,
		Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error { return nil }), Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil { // istiod retries a source that refuses it
			_ = sink.PullFrom(ctx, conn)
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
	return sink
}

// relayAnswer opens one stream to the relay as istiod would and returns how the relay
// answers it (nil: it pushed something).
func relayAnswer(t testing.TB, addr string) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := mcppb.NewResourceSourceClient(conn).EstablishResourceStream(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&mcppb.RequestResources{Collection: vsColl, SinkNode: &mcppb.SinkNode{Id: "probe"}}); err != nil {
		_, err = st.Recv()
		return err
	}
	_, err = st.Recv()
	return err
}

// holds reports whether sink holds exactly want (collection → name → version).
func holds(sink *mcp.Sink, want map[string]map[string]string) bool {
	for c, w := range want {
		if !maps.Equal(sink.Versions(c), w) {
			return false
		}
	}
	return true
}

// versionsOf is what a cache holds, collection → name → version.
func versionsOf(c *mcp.Cache) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, coll := range c.Collections() {
		out[coll] = published(c, coll)
	}
	return out
}

// logCapture keeps a logger's lines for assertions, and passes them to the test's log.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
	tee io.Writer
}

func captureLog(t testing.TB) (*slog.Logger, *logCapture) {
	l := &logCapture{tee: testlog.Writer(t, "")}
	return slog.New(slog.NewTextHandler(l, nil)), l
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(p)
	l.mu.Unlock()
	return l.tee.Write(p)
}

// count returns how many lines contain every one of subs.
func (l *logCapture) count(subs ...string) int {
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

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
