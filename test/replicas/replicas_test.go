package replicas

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/internal/testkit/golden"
	rt "github.com/meshfed/meshfed/internal/testkit/replicatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	clusters = 4
	objects  = 5
)

// group is the routing group of sink i: global (every cluster), odd or even clusters.
func group(i int) string { return []string{"global", "odd", "even"}[i%3] }

// sinkGroup is the routing group of a fleet's sink: its name's prefix (late sinks added by
// a test are named global-late-N).
func sinkGroup(_ int, s *rt.Sink) string { g, _, _ := strings.Cut(s.Name, "-"); return g }

// expected is what a sink of group g must hold when every cluster of the fleet publishes
// gen (1 unless changed) of each of its objects.
func expected(g string, except map[string]bool) string { return expectedOf(clusters, g, except) }

// expectedOf is expected for a world of n clusters.
func expectedOf(n int, g string, except map[string]bool) string {
	var out []string
	for c := 1; c <= n; c++ {
		if (g == "odd" && c%2 == 0) || (g == "even" && c%2 == 1) {
			continue
		}
		for j := 0; j < objects; j++ {
			name := fmt.Sprintf("ns-c%d/vs-%d", c, j)
			if !except[name] {
				out = append(out, name+"@"+rt.ClusterName(c))
			}
		}
	}
	return strings.Join(out, " ")
}

// fleet is a started world: three replicas a, b, c; four minions (c1 and c4 prefer a, c2
// b, c3 c); twenty sinks, sink i homed on replica i%3 and failing over to the others.
type fleet struct {
	w     *rt.World
	hubs  []*rt.Hub
	sinks []*rt.Sink
	mins  map[string]*rt.Minion
}

func rotate(hubs []*rt.Hub, first int) []*rt.Hub {
	out := make([]*rt.Hub, 0, len(hubs))
	for i := range hubs {
		out = append(out, hubs[(first+i)%len(hubs)])
	}
	return out
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("runs hub and minion processes")
	}
	return startFleetOn(t, rt.New(t, rt.Options{Clusters: clusters, Objects: objects}))
}

// startFleetOn starts the fleet in w (which may have a network: World.UseNet).
func startFleetOn(t *testing.T, w *rt.World) *fleet {
	t.Helper()
	a := w.StartHub("a", nil, true)
	b := w.StartHub("b", nil, true, a.Gossip)
	c := w.StartHub("c", nil, true, a.Gossip)
	f := &fleet{w: w, hubs: []*rt.Hub{a, b, c}, mins: map[string]*rt.Minion{}}
	for i, home := range []int{0, 1, 2, 0} {
		name := rt.ClusterName(i + 1)
		f.mins[name] = w.StartMinion(name, rotate(f.hubs, home)...)
	}
	for i := 0; i < 20; i++ {
		f.sinks = append(f.sinks, w.StartSink(fmt.Sprintf("%s-%02d", group(i), i), i%2 == 0, rotate(f.hubs, i%3)...))
	}
	f.converge(t, nil, 60*time.Second)
	return f
}

// converge waits until every sink holds its group's expected view.
func (f *fleet) converge(t *testing.T, except map[string]bool, d time.Duration) time.Duration {
	t.Helper()
	return f.w.Eventually(d, "every sink holds its subset", func() bool {
		for i, s := range f.sinks {
			if s.Names() != expected(sinkGroup(i, s), except) {
				return false
			}
		}
		return true
	})
}

// heldBy waits until every live replica says cluster is held by want.
func (f *fleet) heldBy(t *testing.T, live []*rt.Hub, want map[string]string, d time.Duration) time.Duration {
	t.Helper()
	return f.w.Eventually(d, fmt.Sprintf("replicas agree clusters are held by %v", want), func() bool {
		for _, h := range live {
			got, err := h.HeldBy()
			if err != nil {
				return false
			}
			for c, r := range want {
				if got[c] != r {
					return false
				}
			}
		}
		return true
	})
}

// noDeletions fails the test if a sink was sent a deletion not in allowed.
func (f *fleet) noDeletions(t *testing.T, allowed map[string]bool) {
	t.Helper()
	for _, s := range f.sinks {
		for _, n := range s.Removed() {
			if !allowed[n] {
				t.Errorf("sink %s was sent a deletion of %s, which its cluster still has", s.Name, n)
			}
		}
	}
}

// Three replicas, four minions, twenty sinks: every sink converges to its subset (golden),
// and each cluster is held by the replica its minion is connected to, everywhere.
func TestReplicasConverge(t *testing.T) {
	f := startFleet(t)
	f.heldBy(t, f.hubs, map[string]string{"c1": "a", "c2": "b", "c3": "c", "c4": "a"}, 10*time.Second)
	var got strings.Builder
	for i, s := range f.sinks {
		fmt.Fprintf(&got, "%s (on %s): %s\n", s.Name, f.hubs[i%3].Name, s.View())
	}
	path := filepath.Join("testdata", "converged.golden")
	if *golden.Update {
		if err := os.WriteFile(path, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("converged views differ from %s (run with -update to accept):\n%s", path, got.String())
	}
	f.noDeletions(t, nil)
	// No replica served before it had every cluster (a fresh group has no copies to share):
	// every sink's first push was its whole subset.
	for i, s := range f.sinks {
		if first := names(strings.SplitN(s.FirstViews(), "\n", 2)[0]); first != expected(group(i), nil) {
			t.Errorf("sink %s's first push was partial:\n got %s\nwant %s", s.Name, first, expected(group(i), nil))
		}
	}

	// The operator's view: hub status on any replica says who holds each cluster.
	var out bytes.Buffer
	if err := admin.Run(context.Background(), []string{"status", "-admin", f.hubs[2].HTTP}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HELD BY", "a (epoch 1)", "b (epoch 1)", "c (epoch 1)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("hub status lacks %q:\n%s", want, out.String())
		}
	}
}

// kill -9 of the replica holding c2: c2's minion fails over and is held by the replica it
// reached, the killed replica's sinks reconnect elsewhere, nothing is deleted anywhere, and a
// change made in c2 afterwards reaches every sink.
func TestReplicaKill(t *testing.T) {
	f := startFleet(t)
	a, b, c := f.hubs[0], f.hubs[1], f.hubs[2]
	f.heldBy(t, f.hubs, map[string]string{"c2": "b"}, 10*time.Second)
	opened := make([]int64, len(f.sinks))
	received := make([]int, len(f.sinks))
	onB := map[int]bool{}
	for i, s := range f.sinks {
		opened[i], _ = s.Streams()
		received[i] = s.Received()
		if s.Target() == b.Serve {
			onB[i] = true
		}
	}
	start := time.Now()
	b.Kill()
	// c2's minion fails over to c (its next address).
	held := f.heldBy(t, []*rt.Hub{a, c}, map[string]string{"c2": "c"}, 30*time.Second)
	sinksBack := f.w.Eventually(30*time.Second, "every sink connected", func() bool {
		for _, s := range f.sinks {
			if _, up := s.Streams(); !up {
				return false
			}
		}
		return true
	})
	f.converge(t, nil, 10*time.Second)
	// Sinks that moved and declare versions (incremental) resume: nothing is resent.
	for i, s := range f.sinks {
		if onB[i] && i%2 == 0 && s.Received() != received[i] {
			t.Errorf("sink %s resumed on another replica with %d resources resent, want 0", s.Name, s.Received()-received[i])
		}
	}
	f.w.Write("c2", "vs-0", 2)
	changed := f.w.Eventually(30*time.Second, "every sink that routes c2 sees its change", func() bool {
		for i, s := range f.sinks {
			if group(i) != "odd" && !s.Contains("ns-c2/vs-0", "g2") {
				return false
			}
		}
		return true
	})
	f.noDeletions(t, nil)
	for i, s := range f.sinks {
		n, _ := s.Streams()
		if !onB[i] && n != opened[i] {
			t.Errorf("sink %s on a live replica reconnected (%d streams, had %d)", s.Name, n, opened[i])
		}
	}
	t.Logf("after kill -9 of the replica holding c2 (%v ago): c2 held again on both survivors after %v, every sink connected %v later (%d sinks moved); a change in c2 then reached every sink in %v",
		time.Since(start).Round(time.Millisecond), held.Round(time.Millisecond), sinksBack.Round(time.Millisecond), len(onB), changed.Round(time.Millisecond))
}

// A minion flapping between replicas, with changes (and one deletion) made between its
// sessions: every replica ends up with the cluster held by the last one, every sink with the
// last content, and the only deletion any sink saw is the real one.
func TestMinionFlapping(t *testing.T) {
	f := startFleet(t)
	except := map[string]bool{}
	m := f.mins["c1"]
	for round := 0; round < 6; round++ {
		m.Kill()
		f.w.Write("c1", "vs-0", round+2)
		if round == 3 {
			f.w.Delete("c1", "vs-4")
			except["ns-c1/vs-4"] = true
		}
		home := (round + 1) % 3
		m = f.w.StartMinion("c1", rotate(f.hubs, home)...)
		f.heldBy(t, f.hubs, map[string]string{"c1": f.hubs[home].Name}, 30*time.Second)
	}
	f.converge(t, except, 30*time.Second)
	f.w.Eventually(30*time.Second, "every sink has the last change", func() bool {
		for i, s := range f.sinks {
			if group(i) != "even" && !s.Contains("ns-c1/vs-0", "g7") {
				return false
			}
		}
		return true
	})
	f.noDeletions(t, except)
}

// A replica killed and restarted with an empty state directory, on the same addresses:
// it serves no sink until it has followed every held cluster from its peers, so a sink that
// connects to it gets the whole state in its first push, never a part.
func TestReplicaRestartEmpty(t *testing.T) {
	f := startFleet(t)
	a, b, c := f.hubs[0], f.hubs[1], f.hubs[2]
	a.Kill()
	// c1 and c4 fail over to b (their next address); changed meanwhile.
	f.heldBy(t, []*rt.Hub{b, c}, map[string]string{"c1": "b", "c4": "b"}, 30*time.Second)
	f.w.Write("c4", "vs-1", 2)
	a2 := f.w.StartHub("a", a, true, b.Gossip, c.Gossip)
	late := f.w.StartSink("global-99", true, a2)
	f.sinks = append(f.sinks, late)
	ready := f.w.Eventually(30*time.Second, "the restarted replica serves the late sink", func() bool {
		_, up := late.Streams()
		return up && late.Names() != ""
	})
	first := strings.SplitN(late.FirstViews(), "\n", 2)[0]
	if got, want := names(first), expected("global", nil); got != want {
		t.Errorf("the restarted replica's first push to a sink was partial:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(first, "ns-c4/vs-1@c4/") {
		t.Fatalf("first push lacks c4's vs-1: %s", first)
	}
	f.heldBy(t, []*rt.Hub{a2, b, c}, map[string]string{"c1": "b", "c2": "b", "c3": "c", "c4": "b"}, 10*time.Second)
	f.w.Eventually(30*time.Second, "the late sink matches the others", func() bool { return late.View() == f.sinks[0].View() })
	f.noDeletions(t, nil)
	t.Logf("the replica restarted with an empty state directory served its first sink %v after it listened, with the complete state", ready.Round(time.Millisecond))
}

// names strips versions from a view: "n@cluster/version" -> "n@cluster".
func names(view string) string {
	var out []string
	for _, e := range strings.Fields(view) {
		if i := strings.LastIndexByte(e, '/'); i > strings.IndexByte(e, '@') {
			e = e[:i]
		}
		out = append(out, e)
	}
	return strings.Join(out, " ")
}

// A network split between {a, b} and {c} (blackhole routes in the replicas' own network
// namespaces; minions and sinks still reach every replica), changes made on both sides,
// then the heal. During the split each side keeps serving what it had of the other side's
// clusters (no deletion) and its own side's changes; after the heal the replicas merge
// again and every sink converges to every change.
func TestNetworkSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs hub and minion processes")
	}
	if why := rt.NetAvailable(); why != "" {
		t.Skip(why)
	}
	w := rt.New(t, rt.Options{Clusters: clusters, Objects: objects})
	n := rt.NewNet(t, "a", "b", "c")
	w.UseNet(n)
	f := startFleetOn(t, w)
	a, c := f.hubs[0], f.hubs[2]
	f.heldBy(t, f.hubs, map[string]string{"c1": "a", "c2": "b", "c3": "c", "c4": "a"}, 10*time.Second)

	n.Split([]string{"a", "b"}, []string{"c"})
	detect := w.Eventually(30*time.Second, "each side sees the other gone", func() bool {
		ab, err1 := a.HeldBy()
		cc, err2 := c.HeldBy()
		return err1 == nil && err2 == nil && ab["c3"] == "" && cc["c1"] == "" && cc["c2"] == "" && cc["c4"] == ""
	})
	w.Write("c1", "vs-0", 2) // on a's side
	w.Write("c3", "vs-0", 2) // on c's side
	w.Eventually(30*time.Second, "each side serves its own side's change", func() bool {
		for i, s := range f.sinks {
			onC := s.Target() == c.Serve
			if g := group(i); g != "even" && s.Contains("ns-c1/vs-0", "g2") == onC {
				return false
			}
			if g := group(i); g != "even" && s.Contains("ns-c3/vs-0", "g2") != onC {
				return false
			}
		}
		return true
	})
	f.converge(t, nil, 10*time.Second) // no object missing on either side
	f.noDeletions(t, nil)

	n.Heal()
	rejoined := f.heldBy(t, f.hubs, map[string]string{"c1": "a", "c2": "b", "c3": "c", "c4": "a"}, 30*time.Second)
	merged := w.Eventually(30*time.Second, "every sink has both sides' changes", func() bool {
		for i, s := range f.sinks {
			if group(i) != "even" && (!s.Contains("ns-c1/vs-0", "g2") || !s.Contains("ns-c3/vs-0", "g2")) {
				return false
			}
		}
		return true
	})
	f.converge(t, nil, 10*time.Second)
	f.noDeletions(t, nil)
	t.Logf("split: each side saw the other gone %v after the cut; heal: every replica saw every holding again after %v, every sink had both sides' changes %v later",
		detect.Round(time.Millisecond), rejoined.Round(time.Millisecond), merged.Round(time.Millisecond))
}

// Five rounds of churn: each round kills a replica (SIGKILL), changes a cluster while it is
// down and restarts it with an empty state directory on its addresses. After each round
// every cluster is held by a live replica, every sink has every change, and no sink was
// ever sent a deletion.
func TestReplicaChurn(t *testing.T) {
	f := startFleet(t)
	for round := 0; round < 5; round++ {
		victim := round % 3
		old := f.hubs[victim]
		old.Kill()
		cluster := rt.ClusterName(round%clusters + 1)
		marker := fmt.Sprintf("g%d", round+10)
		f.w.Write(cluster, "vs-1", round+10)
		var seeds []string
		for i, h := range f.hubs {
			if i != victim {
				seeds = append(seeds, h.Gossip)
			}
		}
		f.hubs[victim] = f.w.StartHub(old.Name, old, true, seeds...)
		f.w.Eventually(60*time.Second, fmt.Sprintf("round %d: every cluster held, everywhere", round), func() bool {
			for _, h := range f.hubs {
				held, err := h.HeldBy()
				if err != nil || len(held) != clusters {
					return false
				}
			}
			return true
		})
		f.w.Eventually(60*time.Second, fmt.Sprintf("round %d: every sink has %s's change", round, cluster), func() bool {
			for i, s := range f.sinks {
				if routes(group(i), cluster) && !s.Contains("ns-"+cluster+"/vs-1", marker) {
					return false
				}
			}
			return true
		})
		f.converge(t, nil, 30*time.Second)
	}
	f.noDeletions(t, nil)
}

// routes reports whether sinks of group g receive cluster.
func routes(g, cluster string) bool {
	odd := (cluster[len(cluster)-1]-'0')%2 == 1
	return g == "global" || (g == "odd") == odd
}

// kill -9 of a replica while every cluster keeps changing (a change every 20 ms, for two
// seconds): no sink is ever sent a deletion, and every sink ends with every cluster's last
// change.
func TestReplicaKillUnderLoad(t *testing.T) {
	f := startFleet(t)
	b := f.hubs[1]
	killed := make(chan struct{})
	last := map[string]int{}
	deadline := time.Now().Add(2 * time.Second)
	for k := 0; time.Now().Before(deadline); k++ {
		cluster := rt.ClusterName(k%clusters + 1)
		f.w.Write(cluster, "vs-3", 100+k)
		last[cluster] = 100 + k
		if k == 25 {
			go func() { b.Kill(); close(killed) }()
		}
		time.Sleep(20 * time.Millisecond)
	}
	<-killed
	f.w.Eventually(60*time.Second, "every sink has every cluster's last change", func() bool {
		for i, s := range f.sinks {
			for cluster, gen := range last {
				if routes(group(i), cluster) && !s.Contains("ns-"+cluster+"/vs-3", fmt.Sprintf("g%d", gen)) {
					return false
				}
			}
		}
		return true
	})
	f.converge(t, nil, 10*time.Second)
	f.noDeletions(t, nil)
}

// A rolling restart of every replica (kill -9, empty state directory) while one cluster's
// minion is away: each restarted replica takes the absent cluster's copy from a peer, so
// after the roll every replica still serves its last state (staleness policy: keep), a
// sink connecting to a restarted replica gets everything in its first push, and no sink is
// sent a deletion; when the minion returns, its changes flow again.
func TestRollingRestartDuringOutage(t *testing.T) {
	f := startFleet(t)
	f.mins["c3"].Kill()
	f.heldBy(t, f.hubs, map[string]string{"c3": ""}, 30*time.Second)
	for i := range f.hubs {
		old := f.hubs[i]
		old.Kill()
		var seeds []string
		for j, h := range f.hubs {
			if j != i {
				seeds = append(seeds, h.Gossip)
			}
		}
		f.hubs[i] = f.w.StartHub(old.Name, old, true, seeds...)
		late := f.w.StartSink(fmt.Sprintf("global-late-%d", i), true, f.hubs[i])
		f.w.Eventually(15*time.Second, fmt.Sprintf("replica %s serves its late sink", old.Name), func() bool {
			_, up := late.Streams()
			return up && late.Names() != ""
		})
		if first := names(strings.SplitN(late.FirstViews(), "\n", 2)[0]); first != expected("global", nil) {
			t.Fatalf("restarted replica %s's first push lacks the absent cluster's copy:\n got %s\nwant %s", old.Name, first, expected("global", nil))
		}
		f.sinks = append(f.sinks, late)
		f.converge(t, nil, 30*time.Second)
	}
	f.noDeletions(t, nil)

	f.w.Write("c3", "vs-0", 9)
	f.mins["c3"] = f.w.StartMinion("c3", rotate(f.hubs, 2)...)
	f.heldBy(t, f.hubs, map[string]string{"c3": "c"}, 30*time.Second)
	f.w.Eventually(30*time.Second, "c3's change after its return reaches every sink", func() bool {
		for i, s := range f.sinks {
			if (i >= 20 || routes(group(i), "c3")) && !s.Contains("ns-c3/vs-0", "g9") {
				return false
			}
		}
		return true
	})
	f.noDeletions(t, nil)
}
