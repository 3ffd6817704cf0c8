package replicas

import (
	"testing"

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
		tl.fm.SetCopy(cluster, e, true)
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
