package hub

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// heldBackLayer holds every restored state back, as the replica layer does until it knows
// what its peers have, and records the epochs it was told.
type heldBackLayer struct {
	noLayer
	mu       sync.Mutex
	restored map[string]uint64
}

func (l *heldBackLayer) ClusterRestored(cluster string, epoch uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.restored[cluster] = epoch
	return false
}

func (l *heldBackLayer) told() map[string]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]uint64{}
	for c, e := range l.restored {
		out[c] = e
	}
	return out
}

// layeredHub is persistedHub with a heldBackLayer.
func layeredHub(t *testing.T, dir string) (*Hub, *heldBackLayer, func()) {
	t.Helper()
	cfg, err := ParseConfig([]byte(persistHub))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = dir
	l := &heldBackLayer{restored: map[string]uint64{}}
	h, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Layer: l})
	if err != nil {
		t.Fatal(err)
	}
	stop := testrun.Start(t, "hub Run", h.Run)
	testwait.For(t, 10*time.Second, "listening", func() bool { _, s, _ := h.Addrs(); return s != "" })
	return h, l, stop
}

// The epoch a layer sets is kept with the cluster's state and told back at the restart; a
// restored state the layer holds back does not count as synced (the hub is not ready on
// it) until the layer confirms it, and a crash before that restores it whole again.
func TestRestoredStateHeldBackByTheLayer(t *testing.T) {
	dir := t.TempDir()
	a, _, stop := layeredHub(t, dir)
	for _, c := range []struct{ cluster, coll, name string }{{"east", vsColl, "shop/a"}, {"east", drColl, ""}, {"west", vsColl, "pay/x"}, {"west", drColl, ""}} {
		var names []string
		if c.name != "" {
			names = append(names, c.name)
		}
		if err := a.Apply(c.cluster, push(t, c.coll, names...)); err != nil {
			t.Fatal(err)
		}
	}
	a.SetClusterEpoch("east", 7)
	stop()

	b, l, stop := layeredHub(t, dir)
	if got := l.told(); len(got) != 2 || got["east"] != 7 || got["west"] != 0 {
		t.Fatalf("the layer was told %v, want east at epoch 7 and west at 0", got)
	}
	if b.Ready() || b.ClusterSynced("east") || b.ClusterSynced("west") {
		t.Fatal("a restored state the layer held back counts as synced")
	}
	if !b.ConfirmRestored("east") || !b.ClusterSynced("east") || b.Ready() {
		t.Fatalf("east confirmed: synced %v, ready %v (west is still held back)", b.ClusterSynced("east"), b.Ready())
	}
	if b.ConfirmRestored("east") {
		t.Error("confirmed twice")
	}
	b.SetClusterEpoch("west", 3) // its metadata written while it is held back
	stop()

	c, l, _ := layeredHub(t, dir)
	if got := l.told(); got["east"] != 7 || got["west"] != 3 {
		t.Fatalf("after a restart while west was held back, the layer was told %v, want east at 7 and west at 3 (whole)", got)
	}
	c.ConfirmRestored("east")
	c.ConfirmRestored("west")
	if !c.Ready() {
		t.Error("not ready once the layer confirmed every restored cluster")
	}
}
