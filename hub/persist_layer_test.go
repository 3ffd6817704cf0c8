package hub

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub/durable"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
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

// changesLayer records the changes of what each cluster holds that the store tells it.
type changesLayer struct {
	noLayer
	mu      sync.Mutex
	put     map[string][]string // cluster -> names put
	removed map[string][]string // cluster -> names removed
}

func (l *changesLayer) StateChanged(cluster, _ string, put []*mcp.Entry, removed []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range put {
		l.put[cluster] = append(l.put[cluster], e.Name)
	}
	l.removed[cluster] = append(l.removed[cluster], removed...)
}

// A rename moves a cluster's objects to its new name: the layer is told the new name has
// them, never that the old name deleted them (a replica's peers following the old name from
// it would apply that deletion before their own reload renames it: test/invariant's replica
// world found every sink losing the objects); the state file has them under the new name
// only.
func TestRenameIsNoDeletionForTheLayer(t *testing.T) {
	dir := t.TempDir()
	cfg, err := ParseConfig([]byte(persistHub))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = dir
	l := &changesLayer{put: map[string][]string{}, removed: map[string][]string{}}
	h, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Layer: l})
	if err != nil {
		t.Fatal(err)
	}
	stop := testrun.Start(t, "hub Run", h.Run)
	testwait.For(t, 10*time.Second, "listening", func() bool { _, s, _ := h.Addrs(); return s != "" })
	if err := h.Apply("east", push(t, vsColl, "shop/a", "shop/b")); err != nil {
		t.Fatal(err)
	}
	renamed := strings.Replace(persistHub, "{name: east,", "{name: east2,", 1)
	reload(t, h, renamed)
	l.mu.Lock()
	removed, put := l.removed["east"], l.put["east2"]
	l.mu.Unlock()
	if len(removed) > 0 {
		t.Errorf("the layer was told east deleted %v", removed)
	}
	if !slices.Equal(put, []string{"shop/a", "shop/b"}) {
		t.Errorf("the layer was told east2 has %v, want shop/a and shop/b", put)
	}
	stop()

	h2, stop2 := persistedHub(t, renamed, dir, nil)
	defer stop2()
	for _, c := range h2.Clusters() {
		switch {
		case c.Name == "east2" && c.Resources[vsColl] != 2:
			t.Errorf("restarted: east2 has %v, want the two objects", c.Resources)
		case c.Name == "east":
			t.Errorf("restarted: the state file still has east: %+v", c)
		}
	}
}

// A departed cluster is written by nothing but a copy of it kept elsewhere (a replica's
// peer's: an Away session): what the copy brings is stored and served, and held as every
// object of a departed cluster is (its breaker open, counting them). Without this, a replica
// that was down at the removal kept its older copy while its peers had the newer one
// (test/invariant's replica world: replicas-departed-copy-of-a-replica-down-at-the-removal).
func TestDepartedClusterWrittenByACopyOnly(t *testing.T) {
	h := testHub(t, persistHub)
	mustApply(t, h, "east", push(t, vsColl, "shop/a"))
	own, err := h.OpenSession("east", SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reload(t, h, strings.Replace(persistHub, "- {name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}\n", "", 1))
	if !h.ClusterDeparted("east") {
		t.Fatal("east did not depart")
	}
	if err := h.apply(own, push(t, vsColl, "shop/a", "shop/x")); err == nil {
		t.Error("a session of the departed cluster that is not a copy wrote it")
	}
	cp, err := h.OpenSession("east", SessionOptions{Away: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.apply(cp, push(t, vsColl, "shop/a", "shop/b")); err != nil {
		t.Fatalf("a copy of the departed cluster: %v", err)
	}
	if got := servedBytes(t, h, vsColl); len(got) != 2 || got["shop/a"] == nil || got["shop/b"] == nil {
		t.Errorf("served: %v, want shop/a and shop/b", got)
	}
	for _, c := range h.Clusters() {
		if c.Name == "east" && (c.Departed == nil || c.Breaker == nil || !c.Breaker.Open || c.Breaker.Held != 2) {
			t.Errorf("east after its copy arrived: departed %v, breaker %+v; want both objects held", c.Departed, c.Breaker)
		}
	}
}

// A departed cluster restored from the state file is told to the layer like any other, which
// may hold it back (a replica's peers may have a newer copy of it): the hub is not ready on
// it until the layer confirms it or a copy replaces it. A single hub's counts at once.
func TestDepartedRestoredHeldBackByTheLayer(t *testing.T) {
	dir := t.TempDir()
	a, _, stop := layeredHub(t, dir)
	mustApply(t, a, "east", push(t, vsColl, "shop/a"))
	mustApply(t, a, "east", push(t, drColl))
	a.SetClusterEpoch("east", 4)
	stop()

	cfg, err := ParseConfig([]byte(strings.Replace(persistHub, "- {name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = dir
	l := &heldBackLayer{restored: map[string]uint64{}}
	b, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Layer: l})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub Run", b.Run)
	testwait.For(t, 10*time.Second, "listening", func() bool { _, s, _ := b.Addrs(); return s != "" })
	if !b.ClusterDeparted("east") || l.told()["east"] != 4 {
		t.Fatalf("departed %v; the layer was told %v, want east at epoch 4", b.ClusterDeparted("east"), l.told())
	}
	if !slices.Contains(b.pendingClusters(), "east") {
		t.Fatalf("pending %v: the departed copy the layer holds back is not waited for", b.pendingClusters())
	}
	if !b.ConfirmRestored("east") || slices.Contains(b.pendingClusters(), "east") {
		t.Errorf("confirmed: pending %v", b.pendingClusters())
	}
}

// A replica keeps a cluster it does not know that its peers keep (Hub.KeepDeparted): as
// departed, waited for by the warm-up until a copy of it has delivered; never one it knows.
func TestKeepDepartedFromAPeer(t *testing.T) {
	h := testHub(t, persistHub)
	if h.KeepDeparted("east", "", "a") {
		t.Error("a configured cluster was kept as departed")
	}
	if !h.KeepDeparted("south", "", "a") || !h.ClusterDeparted("south") || h.KeepDeparted("south", "", "b") {
		t.Fatalf("south: departed %v", h.ClusterDeparted("south"))
	}
	if !slices.Contains(h.pendingClusters(), "south") {
		t.Fatalf("pending %v: south's copy is not waited for", h.pendingClusters())
	}
	cp, err := h.OpenSession("south", SessionOptions{Away: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, coll := range []string{vsColl, drColl} {
		if err := h.apply(cp, push(t, coll)); err != nil {
			t.Fatal(err)
		}
	}
	if slices.Contains(h.pendingClusters(), "south") {
		t.Errorf("pending %v after south's copy delivered", h.pendingClusters())
	}
}

// A copy that may lack its session's last changes (the hub was killed while the cluster's
// minion was connected) is told to the layer with its epoch like any whole one: a replica
// that did not know it held the cluster at a lower epoch than its file had, and took a
// peer's older copy over it (a new session there, or an older epoch than the file's, must
// not order before it). But the layer's confirmation (nothing newer known) does not make it
// count: it is not its session's whole state, so it stays pending, is not given to peers,
// and becomes unknown at the warm-up's end unless its minion resyncs it.
func TestMayLackCopyToldToTheLayerButNotConfirmedWhole(t *testing.T) {
	dir := t.TempDir()
	killed, dead := killSwitch()
	start := func(faults *durable.Faults) (*Hub, *heldBackLayer, func()) {
		cfg, err := ParseConfig([]byte(persistHub))
		if err != nil {
			t.Fatal(err)
		}
		cfg.StateDir = dir
		l := &heldBackLayer{restored: map[string]uint64{}}
		h, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Layer: l, StateFaults: faults})
		if err != nil {
			t.Fatal(err)
		}
		stop := testrun.Start(t, "hub Run", h.Run)
		testwait.For(t, 10*time.Second, "listening", func() bool { _, s, _ := h.Addrs(); return s != "" })
		return h, l, stop
	}
	a, _, stop := start(&durable.Faults{BeforeCommit: dead, BeforeMark: dead})
	east := openSession(t, a, "east") // connected: its Connected mark is on disk
	for _, c := range []*mcp.Change{push(t, vsColl, "shop/a"), push(t, drColl)} {
		if err := a.apply(east.s, c); err != nil {
			t.Fatal(err)
		}
	}
	mustApply(t, a, "west", push(t, vsColl, "pay/x"))
	mustApply(t, a, "west", push(t, drColl))
	a.SetClusterEpoch("east", 3)
	a.SetClusterEpoch("west", 2)
	if err := a.flushState(); err != nil {
		t.Fatal(err)
	}
	killed.Store(true) // -9 while east's minion is connected
	stop()
	killed.Store(false)

	b, l, _ := start(nil)
	if got := l.told(); got["east"] != 3 || got["west"] != 2 {
		t.Fatalf("the layer was told %v, want east at epoch 3 (it may lack its last changes) and west at 2", got)
	}
	if b.ClusterIsSessionState("east") {
		t.Error("a copy that may lack its session's last changes is reported as that session's state")
	}
	if !b.ConfirmRestored("west") || !b.ClusterSynced("west") {
		t.Fatal("west's whole copy was not confirmed")
	}
	if b.ConfirmRestored("east") || b.ClusterSynced("east") || !slices.Contains(b.pendingClusters(), "east") || b.Ready() {
		t.Fatalf("east, which may lack its last changes, confirmed whole: synced %v, pending %v", b.ClusterSynced("east"), b.pendingClusters())
	}
	b.unknownAtWarmUpEnd()
	if !b.cluster("east").isUnknown() {
		t.Error("east not unknown at the warm-up's end")
	}
}
