package minion

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshfed/meshfed/internal/connlimit"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/mcp"
)

// The minion's listeners admit connections through its limits: on a plaintext listener
// (destinations.listen, development mode) a connection that sends nothing is closed at the
// handshake timeout, a second one from the same address meanwhile is refused at once
// (maxPendingPerIP 1), each counted by listener and reason; a polling hub that speaks is
// established at its first bytes and served.
func TestListenerConnectionBounds(t *testing.T) {
	root := t.TempDir()
	write(t, root, "ns/a.yaml", vsDoc("a", "", "a"))
	cfg := fsConfig(root)
	cfg.Destinations.Listen = "127.0.0.1:0"
	cfg.Limits.HandshakeTimeout, cfg.Limits.MaxPendingPerIP = ops.D(300*time.Millisecond), 1
	m := runMinion(t, cfg)
	waitFor(t, 10*time.Second, "listener", func() bool { return m.ListenAddr() != "" })
	refused := func(reason string) float64 {
		return promtest.Sum(t, m.reg, "meshfed_minion_connections_refused_total", map[string]string{"listener": "listen", "reason": reason})
	}

	silent, silentGone := dialSilent(t, m.ListenAddr())
	waitFor(t, 10*time.Second, "the silent connection accepted", func() bool { _, p := m.conns.Counts(); return p == 1 })
	_, secondGone := dialSilent(t, m.ListenAddr())
	waitFor(t, 10*time.Second, "a second connection from 127.0.0.1 refused", func() bool { return isClosed(secondGone) })
	waitFor(t, 10*time.Second, "the silent connection closed at the handshake timeout", func() bool { return isClosed(silentGone) })
	silent.Close()
	if p, h := refused(connlimit.ReasonPendingPerIP), refused(connlimit.ReasonHandshakeTimeout); p != 1 || h != 1 {
		t.Errorf("refused: pending_per_ip %v, handshake_timeout %v; want 1, 1", p, h)
	}

	got := make(chan struct{}, 1)
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vsColl}, Logger: testLog(t),
		Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error {
			select {
			case got <- struct{}{}:
			default:
			}
			return nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(m.ListenAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sink.PullFrom(ctx, conn) }()
	defer func() { cancel(); <-done }()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the polling sink was not served")
	}
	if open, pending := m.conns.Counts(); open != 1 || pending != 0 {
		t.Errorf("with the sink served: %d connections open, %d pending; want 1, 0", open, pending)
	}
}

// dialSilent connects to addr and sends nothing; gone is closed once the server has closed
// the connection. The test's cleanup closes it.
func dialSilent(t *testing.T, addr string) (net.Conn, <-chan struct{}) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		b := make([]byte, 64)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-gone })
	return c, gone
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
