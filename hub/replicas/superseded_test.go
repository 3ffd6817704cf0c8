package replicas

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/replicas/membership"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

// eastMinion is a minion of east over a real stream to a running replica: its source
// publishes shop/o1 and reports each collection answered on acked.
type eastMinion struct {
	src   *mcp.Source
	acked chan string
}

func newEastMinion(t *testing.T) *eastMinion {
	t.Helper()
	cache := mcp.NewCache(vs)
	body, _ := anypb.New(&networking.VirtualService{Hosts: []string{"x"}})
	e, err := mcp.NewEntry(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "shop/o1", Version: "1"}, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	cache.Replace(vs, []*mcp.Entry{e})
	m := &eastMinion{acked: make(chan string, 16)}
	m.src, err = mcp.NewSource(mcp.SourceOptions{Watcher: cache, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks: mcp.Hooks{Acked: func(_ *mcp.StreamInfo, e mcp.AckEvent) { m.acked <- e.Collection }}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// push runs one stream of the minion to addr in the background; its end comes on the
// returned channel, and cancel ends it from here.
func (m *eastMinion) push(t *testing.T, addr string) (ended chan error, cancel func()) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), mcp.DevIdentityHeader, "east"))
	ended, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		ended <- m.src.PushTo(ctx, conn)
		_ = conn.Close()
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ended, cancel
}

// Two minions with east's identity write through two replicas (a copied Secret). When the
// other's session, through replica b, supersedes this replica's, the stream here must not
// go on taking pushes it drops (it ACKed them, and once b's session ended it was east's
// writer again over b's state, never resent: test/invariant's
// replicas-second-minion-superseded). It is ended with a retryable refusal; its minion's
// return is refused as competing while b's session is live (the cluster just changed
// hands), and admitted, holding east at a newer epoch with its whole state, once it ended.
func TestSupersededStreamIsEnded(t *testing.T) {
	cfg, err := hub.ParseConfig([]byte(layerConfig + "ingest: 127.0.0.1:0\nserve: 127.0.0.1:0\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	h, l, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	fm := newFakeMembers("self", "b")
	l.join = func(membership.Config, *slog.Logger) (members, error) { return fm, nil }
	testrun.Start(t, "replica", h.Run)
	testwait.For(t, 10*time.Second, "the replica listening", func() bool { ing, _, _ := h.Addrs(); return ing != "" })
	ingest, _, _ := h.Addrs()
	m := newEastMinion(t)

	first, _ := m.push(t, ingest)
	answered(t, m.acked)
	if a := fm.Authorities()["east"]; a.Replica != "self" || a.Epoch != 1 {
		t.Fatalf("east's authority after its minion synced here: %+v, want self at epoch 1", a)
	}

	fm.set("b", "east", 2) // the other minion's session through b
	fm.Poke()
	err = ended(t, first)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "supersedes this stream's (epoch 2,") || !retryable(err) {
		t.Fatalf("the superseded stream ended with %v, want a retryable FailedPrecondition naming the session that supersedes it", err)
	}

	again, _ := m.push(t, ingest)
	if err := ended(t, again); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "through replica b") || !retryable(err) {
		t.Fatalf("the minion's return while b's session is live: %v, want refused as competing", err)
	}

	fm.set("b", "east", 0) // the other minion stopped
	_, stop := m.push(t, ingest)
	answered(t, m.acked)
	if a := fm.Authorities()["east"]; a.Replica != "self" || a.Epoch != 3 {
		t.Errorf("east's authority once the minion returned: %+v, want self at epoch 3", a)
	}
	stop()
}

// answered waits for the minion's stream to be answered; ended for its end. Bounded: the
// defect this test pins left the stream open for ever.
func answered(t *testing.T, acked chan string) {
	t.Helper()
	select {
	case <-acked:
	case <-time.After(10 * time.Second):
		t.Fatal("the minion's stream was not answered within 10s")
	}
}

func ended(t *testing.T, end chan error) error {
	t.Helper()
	select {
	case err := <-end:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the minion's stream did not end within 10s")
		return nil
	}
}

// retryable reports whether err tells its peer when to come back.
func retryable(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return true
		}
	}
	return false
}
