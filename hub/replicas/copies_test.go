package replicas

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/durable"
	"github.com/meshfed/meshfed/hub/replicas/membership"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

// restoredLayer is replica self with peers, east restored from its state file at epoch.
func restoredLayer(t *testing.T, epoch uint64, peers ...string) *testLayer {
	t.Helper()
	tl := newTestLayer(t, peers...)
	if tl.ClusterRestored("east", epoch) {
		t.Fatal("a restored copy counts as synced before the group is known")
	}
	for cluster, e := range tl.restoredCopies() { // what the membership starts with
		tl.fm.SetCopy(cluster, "", e, true)
	}
	return tl
}

// restored reports whether east's copy here is still held back.
func (tl *testLayer) restored() bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.clusters["east"].restored
}

// A restored copy waits until the membership has heard every peer, then is confirmed when
// no peer has a newer one: its epoch is advertised as a copy peers may take.
func TestRestoredCopyConfirmedWhenNewest(t *testing.T) {
	tl := restoredLayer(t, 3, "a", "b")
	if cp := tl.fm.copyOf("east"); cp.Epoch != 3 || !cp.Restored {
		t.Fatalf("advertised %+v, want epoch 3, restored", cp)
	}
	tl.fm.setCopy("a", "east", 2, false)
	tl.fm.setCopy("b", "east", 3, true) // restored too, on b: the same session's state
	tl.fm.unsynced = true
	tl.reconcile()
	if !tl.restored() || tl.following("east") != nil {
		t.Fatal("decided before the group was known")
	}
	tl.fm.unsynced = false
	tl.reconcile()
	if tl.restored() || tl.following("east") != nil {
		t.Fatalf("restored %v, following %+v: want confirmed, following nothing", tl.restored(), tl.following("east"))
	}
	if cp := tl.fm.copyOf("east"); cp.Epoch != 3 || cp.Restored {
		t.Errorf("advertised %+v, want epoch 3 confirmed", cp)
	}
	if tl.copyEpoch("east") != 3 {
		t.Errorf("copy epoch given to peers: %d", tl.copyEpoch("east"))
	}
}

// A restored copy older than a peer's is replaced by the peer's (taken as a copy, declaring
// its versions: deletions come); at a tie, a live replica's copy wins over the restored
// one; a newer copy still held back on its peer is waited for.
func TestRestoredCopyYieldsToNewer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		peerEpoch uint64
		peerHeld  bool // the peer's copy is restored and not confirmed yet
		want      string
	}{
		{"newer on a peer", 4, false, "copy"},
		{"as new on a live peer", 3, false, "copy"},
		{"newer, held back on its peer", 4, true, "wait"},
		{"older on a peer", 2, false, "confirm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := restoredLayer(t, 3, "a")
			tl.fm.setCopy("a", "east", tc.peerEpoch, tc.peerHeld)
			tl.reconcile()
			f := tl.following("east")
			got := "wait"
			switch {
			case f != nil && f.copy && f.epoch == tc.peerEpoch && len(f.peers) == 1 && f.peers[0] == "a":
				got = "copy"
			case f != nil:
				got = "following something else"
			case !tl.restored():
				got = "confirm"
			}
			if got != tc.want {
				t.Fatalf("%s, want %s (following %+v)", got, tc.want, f)
			}
			if got != "copy" {
				return
			}
			s := tl.followSession(t, "east", f)
			if err := tl.h.Apply("east", &mcp.Change{Collection: vs}); err != nil {
				t.Fatal(err)
			}
			tl.SessionDelivered(s)
			if tl.restored() || tl.fm.copyOf("east").Epoch != tc.peerEpoch {
				t.Errorf("after the peer's copy arrived: restored %v, advertised %+v", tl.restored(), tl.fm.copyOf("east"))
			}
		})
	}
}

// A held cluster is followed from its holder whatever the restored copy's epoch (the live
// session is the cluster's state), and a new session of the same holder is followed anew.
func TestRestoredCopyFollowsTheHolder(t *testing.T) {
	tl := restoredLayer(t, 5, "a")
	tl.fm.unsynced = true // the holder is known: no need to wait for the rest
	tl.fm.set("a", "east", 2)
	tl.reconcile()
	f := tl.following("east")
	if f == nil || f.copy || f.replica != "a" || f.epoch != 2 {
		t.Fatalf("following %+v, want a's session of epoch 2", f)
	}
	tl.fm.set("a", "east", 6)
	tl.reconcile()
	g := tl.following("east")
	if g == nil || g == f || g.epoch != 6 || !f.retired.Load() {
		t.Fatalf("after a's new session: following %+v (the old follow retired %v)", g, f.retired.Load())
	}
	s := tl.followSession(t, "east", g)
	if err := tl.h.Apply("east", &mcp.Change{Collection: vs}); err != nil {
		t.Fatal(err)
	}
	tl.SessionDelivered(s)
	if tl.restored() || tl.fm.copyOf("east").Epoch != 6 {
		t.Errorf("after the holder's state arrived: restored %v, advertised %+v", tl.restored(), tl.fm.copyOf("east"))
	}
}

// A replica's own session holds the cluster above every epoch it has seen, its restored
// copy's included, and its copy is then of that epoch.
func TestSessionAfterARestoreIsNewer(t *testing.T) {
	tl := restoredLayer(t, 5)
	m := tl.minionSession(t, "east")
	tl.SessionDelivered(m)
	if a := tl.fm.Authorities()["east"]; a.Replica != "self" || a.Epoch != 6 {
		t.Errorf("authority %+v, want self at epoch 6", a)
	}
	if tl.restored() || tl.fm.copyOf("east").Epoch != 6 {
		t.Errorf("restored %v, advertised %+v", tl.restored(), tl.fm.copyOf("east"))
	}
}

// heldEast makes replica tl's copy of east the state of a session it held (its minion's),
// at the epoch the membership gave it, with one object; the session has ended since (the
// minion is away). It returns that epoch.
func heldEast(t *testing.T, tl *testLayer) uint64 {
	t.Helper()
	body, _ := anypb.New(&networking.VirtualService{Hosts: []string{"x"}})
	r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "shop/a", Version: "1"}, Body: body}
	e, err := mcp.NewEntry(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.h.Apply("east", &mcp.Change{Collection: vs, Entries: []*mcp.Entry{e}, Resources: []*mcpapi.Resource{r}}); err != nil {
		t.Fatal(err)
	}
	m := tl.minionSession(t, "east")
	tl.SessionDelivered(m)
	tl.SessionClosed(m)
	epoch := tl.fm.copyOf("east").Epoch
	if epoch == 0 || tl.fm.Holds("east") {
		t.Fatalf("east's copy advertised %+v, held %v", tl.fm.copyOf("east"), tl.fm.Holds("east"))
	}
	return epoch
}

// reloadYAML reloads tl's hub with layerConfig changed by the replacer's pairs.
func reloadYAML(t *testing.T, tl *testLayer, oldnew ...string) {
	t.Helper()
	cfg, err := hub.ParseConfig([]byte(strings.NewReplacer(oldnew...).Replace(layerConfig)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tl.h.Reload(cfg); err != nil {
		t.Fatal(err)
	}
}

const eastEntry = "- {name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}\n"

// A departed cluster's copy stays offered at its epoch (its objects are kept until an
// operator confirms: a peer without them, wiped or down at the removal, takes them), and
// configured again it is still offered at that epoch: before, its epoch was reset at the
// departure and no peer could take it (test/invariant's replica world:
// replicas-departed-copy-lost-by-a-wiped-replica, replicas-renamed-cluster-copy-not-taken).
func TestDepartedCopyStaysOffered(t *testing.T) {
	tl := newTestLayer(t, "a")
	epoch := heldEast(t, tl)
	reloadYAML(t, tl, eastEntry, "")
	tl.reconcile()
	if !tl.h.ClusterDeparted("east") {
		t.Fatal("east did not depart")
	}
	if cp := tl.fm.copyOf("east"); cp.Epoch != epoch || cp.Restored || tl.copyEpoch("east") != epoch {
		t.Fatalf("departed east's copy advertised %+v, given at epoch %d; want epoch %d", cp, tl.copyEpoch("east"), epoch)
	}
	reloadYAML(t, tl)
	tl.reconcile()
	if cp := tl.fm.copyOf("east"); cp.Epoch != epoch || tl.copyEpoch("east") != epoch {
		t.Errorf("east configured again: copy advertised %+v, want epoch %d", cp, epoch)
	}
}

// A departed cluster's copy older than a peer's (this replica was down when the cluster
// changed, then removed) takes the peer's like any copy of a cluster no replica holds: a
// copy stream (only a copy writes a departed cluster), which once delivered makes this
// replica's copy of the peer's epoch, and then stops.
func TestDepartedCopyTakesAPeersNewer(t *testing.T) {
	tl := newTestLayer(t, "a")
	epoch := heldEast(t, tl)
	reloadYAML(t, tl, eastEntry, "")
	tl.fm.setCopy("a", "east", epoch+1, false)
	tl.fm.set("a", "east", epoch+1) // a holding still gossiped: the session it ends
	tl.reconcile()
	f := tl.following("east")
	if f == nil || !f.copy || f.epoch != epoch+1 || !slices.Equal(f.peers, []string{"a"}) {
		t.Fatalf("following %+v, want a's copy of epoch %d", f, epoch+1)
	}
	s := tl.followSession(t, "east", f)
	tl.SessionDelivered(s)
	if cp := tl.fm.copyOf("east"); cp.Epoch != epoch+1 {
		t.Errorf("after a's copy arrived, advertised %+v, want epoch %d", cp, epoch+1)
	}
	// Taken once, not mirrored, from the moment it arrived: an operator confirming the
	// removal on a must not withdraw east's objects here.
	if g := tl.following("east"); g != nil || !f.retired.Load() {
		t.Errorf("still following %+v after the departed copy arrived (retired %v)", g, f.retired.Load())
	}
}

// A rename carries the cluster's copy over to its new name at its epoch (the same session's
// state moved): before, the new name's copy had none, so no peer offered it and a replica
// without a copy (wiped) never took it (replicas-renamed-cluster-copy-not-taken). The old
// name offers nothing any more.
func TestRenamedCopyKeepsItsEpoch(t *testing.T) {
	tl := newTestLayer(t, "a")
	epoch := heldEast(t, tl)
	reloadYAML(t, tl, "{name: east,", "{name: east2,")
	tl.reconcile()
	if cp := tl.fm.copyOf("east2"); cp.Epoch != epoch || cp.Restored || tl.copyEpoch("east2") != epoch {
		t.Errorf("east2's copy advertised %+v, given at epoch %d; want epoch %d", cp, tl.copyEpoch("east2"), epoch)
	}
	if cp := tl.fm.copyOf("east"); cp.Epoch != 0 {
		t.Errorf("the old name's copy still advertised: %+v", cp)
	}
}

// A replica keeps, once the group is first known, the departed clusters its peers keep a
// copy of that it does not know (removed while it was down, or before it was wiped), and
// takes their copy: before, it never had their objects again and served without them while
// its peers kept them (replicas-departed-copy-lost-by-a-wiped-replica). Only once: a cluster
// a peer keeps later (this replica's operator may have confirmed its removal here) is not.
func TestDepartedClusterKeptFromPeers(t *testing.T) {
	tl := newTestLayer(t, "a")
	tl.fm.setCopy("a", "south", 3, false)
	tl.fm.unsynced = true
	tl.reconcile()
	if tl.h.ClusterDeparted("south") {
		t.Fatal("kept before the group was known")
	}
	tl.fm.unsynced = false
	tl.reconcile()
	if !tl.h.ClusterDeparted("south") || slices.Contains(tl.h.ClusterNames(), "south") {
		t.Fatalf("south departed %v, configured names %v: want kept as departed", tl.h.ClusterDeparted("south"), tl.h.ClusterNames())
	}
	f := tl.following("south")
	if f == nil || !f.copy || f.epoch != 3 || !slices.Equal(f.peers, []string{"a"}) {
		t.Fatalf("following %+v, want a's copy of epoch 3", f)
	}
	tl.fm.setCopy("a", "north", 2, false)
	tl.reconcile()
	if tl.h.ClusterDeparted("north") {
		t.Error("a departed cluster was taken from a peer after the group was first known")
	}
}

// runningLayer is replica self with peers, its core run on the state directory dir, its
// membership fm from the join on; stop ends it (its state file closed).
func runningLayer(t *testing.T, dir string, peers ...string) (tl *testLayer, stop func()) {
	t.Helper()
	return runningLayerOn(t, dir, nil, peers...)
}

// runningLayerOn is runningLayer with the state file's disk failing as faults say; its
// membership starts with the copies the layer restored, as membership.Start does.
func runningLayerOn(t *testing.T, dir string, faults *durable.Faults, peers ...string) (tl *testLayer, stop func()) {
	t.Helper()
	cfg, err := hub.ParseConfig([]byte(layerConfig + "ingest: 127.0.0.1:0\nserve: 127.0.0.1:0\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = dir
	h, l, err := NewWithOptions(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), hub.Options{StateFaults: faults})
	if err != nil {
		t.Fatal(err)
	}
	fm := newFakeMembers("self", peers...)
	l.join = func(c membership.Config, _ *slog.Logger) (members, error) {
		for cluster, epoch := range c.RestoredCopies {
			fm.setCopy("self", cluster, epoch, true)
		}
		return fm, nil
	}
	run := h.Run
	if faults != nil {
		// A failing disk's close reports what it could not write: not this test's concern.
		run = func(ctx context.Context) error { _ = h.Run(ctx); return nil }
	}
	stop = testrun.Start(t, "replica", run)
	testwait.For(t, 10*time.Second, "the replica listening", func() bool { ing, _, _ := h.Addrs(); return ing != "" })
	ctx, cancel := context.WithCancel(context.Background())
	tl = &testLayer{Layer: l, h: h, fm: fm, ctx: ctx, wg: &sync.WaitGroup{}} // tl.reconcile: at once, beside the layer's own
	t.Cleanup(func() { cancel(); tl.wg.Wait() })
	return tl, stop
}

// A copy the core does not know whole (its state file's records of it were damaged:
// unknown, hub/unknown.go) is not the state of the session its epoch names. Confirmed when
// nothing newer exists, it stays unknown (its tenant's sinks are not served, as on a single
// hub), and its epoch is advertised held back: no peer may take it. Offered, a peer
// restarted with a whole copy of the same epoch would take it as a live replica's and
// delete what the damage lost (test/invariant's replica world:
// replicas-damaged-copy-taken-by-a-booted-replica). A peer's newer copy replaces it, as
// any confirmed copy; one of the same epoch does not (its epoch may be older than what it
// holds).
func TestUnknownCopyIsNotOffered(t *testing.T) {
	dir := t.TempDir()
	tl, stop := runningLayer(t, dir, "a")
	epoch := heldEast(t, tl)
	stop()
	st, _, err := durable.OpenState(filepath.Join(dir, hub.StateFile), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	st.MarkDamaged("east", "a record damaged")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	tl, _ = runningLayer(t, dir, "a")
	if tl.h.ClusterIsSessionState("east") {
		t.Fatal("east's damaged copy is taken for its session's state after the restart")
	}
	testwait.For(t, 10*time.Second, "east's restored copy confirmed (a has none)", func() bool { return tl.h.ClusterSynced("east") })
	if cp := tl.fm.copyOf("east"); cp.Epoch != epoch || !cp.Restored || tl.copyEpoch("east") != 0 {
		t.Fatalf("east's unknown copy advertised %+v, given at epoch %d; want epoch %d held back, given to no peer", cp, tl.copyEpoch("east"), epoch)
	}
	if tl.h.ClusterIsSessionState("east") {
		t.Fatal("confirming east's copy made it its session's state")
	}

	tl.fm.setCopy("a", "east", epoch, false) // a copy of the same epoch, on a
	tl.reconcile()
	if f := tl.following("east"); f != nil {
		t.Fatalf("following %+v: a confirmed copy gave way to a peer's of the same epoch", f)
	}
	tl.fm.setCopy("a", "east", epoch+1, false) // a newer session's
	tl.reconcile()
	if f := tl.following("east"); f == nil || !f.copy || f.epoch != epoch+1 || !slices.Equal(f.peers, []string{"a"}) {
		t.Fatalf("following %+v, want a's copy of epoch %d", f, epoch+1)
	}
}

// A replica does not turn ready (serve sinks) before it knows what its peers keep: a
// departed cluster it does not know yet (a replica wiped, or down at the removal) would be
// missing from what its sinks are first served, and then come back, a withdrawal of what
// its writer publishes (test/invariant: replicas-wiped-replica-takes-a-held-copy, when a
// dead peer was not yet noticed). Its configured clusters synced, it waits for the group
// to be known, then for the copy of what it learned.
func TestNotReadyBeforeTheGroupIsKnown(t *testing.T) {
	tl := newTestLayer(t, "a")
	tl.fm.setCopy("a", "south", 3, false)
	tl.fm.unsynced = true
	for _, c := range []string{"east", "west"} {
		if err := tl.h.Apply(c, &mcp.Change{Collection: vs}); err != nil {
			t.Fatal(err)
		}
	}
	tl.reconcile()
	if !tl.h.ClusterSynced("east") || !tl.h.ClusterSynced("west") {
		t.Fatal("the configured clusters did not sync")
	}
	if tl.h.Ready() {
		t.Fatal("ready before the group was known")
	}
	tl.fm.unsynced = false
	tl.reconcile()
	if !tl.h.ClusterDeparted("south") || tl.h.Ready() {
		t.Fatalf("south departed %v, ready %v: want south kept and its copy awaited", tl.h.ClusterDeparted("south"), tl.h.Ready())
	}
}

// A copy restored from a state file that may lack its session's last changes (here a
// read-only one: the last run may not have written them; a kill while the cluster's minion
// was connected is the same) is still the copy of its epoch: the membership counts it from
// the join, so no older copy of a peer replaces it (before, the core did not tell the layer
// of it, and the replica took a peer's older copy over it, and held the cluster's next
// session at an epoch below its file's). Nothing newer known, it is not confirmed whole
// either: held back, given to no peer, it waits for its minion, or for a peer's whole copy
// of at least its epoch, which replaces it.
func TestMayLackCopyKeepsItsEpoch(t *testing.T) {
	dir := t.TempDir()
	tl, stop := runningLayer(t, dir, "a")
	heldEast(t, tl)
	epoch := heldEast(t, tl) // a second session: epoch 2
	stop()

	readOnly := &durable.Faults{OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
		if flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE) != 0 {
			return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EROFS}
		}
		return os.OpenFile(name, flag, perm)
	}}
	tl, _ = runningLayerOn(t, dir, readOnly, "a")
	tl.fm.setCopy("a", "east", epoch-1, false) // an older session's copy, confirmed on a
	if got := tl.restoredCopies()["east"]; got != epoch {
		t.Fatalf("east's restored copy is in the membership at epoch %d, want %d", got, epoch)
	}
	tl.reconcile()
	if f := tl.following("east"); f != nil {
		t.Fatalf("following %+v: a peer's older copy replaced the restored one of epoch %d", f, epoch)
	}
	if !tl.restored() || tl.h.ClusterSynced("east") || tl.copyEpoch("east") != 0 {
		t.Fatalf("east's copy that may lack its last changes: held back %v, synced %v, given at epoch %d; want held back, not synced, given to no peer",
			tl.restored(), tl.h.ClusterSynced("east"), tl.copyEpoch("east"))
	}
	if cp := tl.fm.copyOf("east"); cp.Epoch != epoch || !cp.Restored {
		t.Fatalf("advertised %+v, want epoch %d held back", cp, epoch)
	}
	tl.fm.setCopy("a", "east", epoch, false) // a's whole copy of the same session
	tl.reconcile()
	if f := tl.following("east"); f == nil || !f.copy || f.epoch != epoch {
		t.Fatalf("following %+v, want a's whole copy of epoch %d", f, epoch)
	}
}
