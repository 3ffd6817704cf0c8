package replicas

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub/api"
	rt "github.com/meshfed/meshfed/internal/testkit/replicatest"
)

// Restarts on the state directory (durable state, hub/persist.go): a hub or a replica
// killed with SIGKILL while a cluster's minion is down comes back with that cluster's last
// state, and, with replicas, never with a state older than the group's.

// warm is the warm-up of these tests: short, so that they see what is served after it.
const warm = 4 * time.Second

// pastWarmUp waits until h's warm-up has passed (a margin after it: its timer starts just
// before h listens), so that what is served after it can be checked too. It is a wait, not
// an assertion on time.
func pastWarmUp(h *rt.Hub) { time.Sleep(time.Until(h.Listening.Add(warm + time.Second))) }

// served waits until sink holds want.
func served(w *rt.World, s *rt.Sink, want string, d time.Duration) {
	w.Eventually(d, "sink "+s.Name+" holds its subset", func() bool { return s.Names() == want })
}

// sameBytes fails the test unless got holds every resource of want with the same bytes.
func sameBytes(t *testing.T, who string, got, want map[string][]byte) {
	t.Helper()
	for name, b := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("%s: %s is missing", who, name)
		} else if !bytes.Equal(g, b) {
			t.Errorf("%s: %s is not byte-identical to what was served before the restart", who, name)
		}
	}
}

// stateWritten waits until h's state file holds everything h has queued (the hub flushes
// it when a cluster's minion goes away, but its status says so first): what a kill then
// loses is nothing the test then expects.
func stateWritten(t *testing.T, w *rt.World, h *rt.Hub) {
	t.Helper()
	w.Eventually(10*time.Second, h.Name+"'s state file written", func() bool {
		var st api.State
		return h.Get("/api/state", &st) == nil && st.Open && st.Queued == 0 && !st.Failing
	})
}

// clusterStatus returns cluster's status on h.
func clusterStatus(t *testing.T, h *rt.Hub, cluster string) api.ClusterStatus {
	t.Helper()
	var cs []api.ClusterStatus
	if err := h.Get("/api/clusters", &cs); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Name == cluster {
			return c
		}
	}
	t.Fatalf("%s does not list cluster %s", h.Name, cluster)
	return api.ClusterStatus{}
}

// A single hub (no replicas section) killed with SIGKILL while c1's minion is down and
// restarted on its state directory: sinks connected throughout (redialling; one full-state,
// one incremental) and a sink connecting after the restart are sent no deletion, through
// the warm-up and after it, and hold c1's objects byte for byte as before.
func TestSingleHubKillWhileAMinionIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs hub and minion processes")
	}
	w := rt.New(t, rt.Options{Clusters: 2, Objects: objects, WarmUp: warm})
	h := w.StartSingle("h", nil, true)
	m1 := w.StartMinion("c1", h)
	w.StartMinion("c2", h)
	want := expectedOf(2, "global", nil)
	sinks := []*rt.Sink{w.StartSink("global-00", false, h), w.StartSink("global-01", true, h)}
	for _, s := range sinks {
		served(w, s, want, 60*time.Second)
	}
	before := sinks[0].Encoded()

	m1.Kill()
	w.Eventually(30*time.Second, "the hub sees c1's minion gone", func() bool { return !clusterStatus(t, h, "c1").Connected })
	stateWritten(t, w, h)
	h.Kill()
	h2 := w.StartSingle("h", h, false)
	late := w.StartSink("global-late", true, h2)
	served(w, late, want, 30*time.Second)
	ready := time.Since(h2.Listening)
	if first := names(strings.SplitN(late.FirstViews(), "\n", 2)[0]); first != want {
		t.Errorf("the restarted hub's first push to a new sink:\n got %s\nwant %s", first, want)
	}
	pastWarmUp(h2)
	w.Eventually(30*time.Second, "c2's minion is back", func() bool { return clusterStatus(t, h2, "c2").Connected })
	for _, s := range append(sinks, late) {
		if got := s.Names(); got != want {
			t.Errorf("sink %s after the warm-up: %s, want %s", s.Name, got, want)
		}
		if rm := s.Removed(); len(rm) > 0 {
			t.Errorf("sink %s was sent deletions: %v", s.Name, rm)
		}
		sameBytes(t, "sink "+s.Name, s.Encoded(), before)
	}
	if c1 := clusterStatus(t, h2, "c1"); !c1.Restored || c1.Connected || !c1.Synced {
		t.Errorf("c1 after the restart: %+v, want restored, synced, not connected", c1)
	}
	t.Logf("single hub restarted on its state directory: a new sink held everything %v after the hub listened", ready.Round(time.Millisecond))
}

// startFleetWarm is startFleet with the short warm-up of these tests.
func startFleetWarm(t *testing.T) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("runs hub and minion processes")
	}
	return startFleetOn(t, rt.New(t, rt.Options{Clusters: clusters, Objects: objects, WarmUp: warm}))
}

// restartA kills replica a (SIGKILL) if it still runs and restarts it on its addresses and
// its state directory, joining b and c; a sink then subscribes to it alone.
func (f *fleet) restartA(t *testing.T, name string) (*rt.Hub, *rt.Sink) {
	t.Helper()
	a, b, c := f.hubs[0], f.hubs[1], f.hubs[2]
	if a.Running() {
		stateWritten(t, f.w, a)
	}
	a.Kill()
	f.hubs[0] = f.w.StartHub("a", a, false, b.Gossip, c.Gossip)
	return f.hubs[0], f.w.StartSink(name, true, f.hubs[0])
}

// Three replicas; c1's minion on a (a holds c1), then stopped; a killed with SIGKILL and
// restarted on its state directory. No sink on any replica (a new one on a included) is
// sent a deletion, through a's warm-up and after it, and every sink holds every object
// byte for byte as before.
func TestReplicaKillWhileItsMinionIsDown(t *testing.T) {
	f := startFleetWarm(t)
	f.heldBy(t, f.hubs, map[string]string{"c1": "a"}, 10*time.Second)
	before := make([]map[string][]byte, len(f.sinks))
	for i, s := range f.sinks {
		before[i] = s.Encoded()
	}
	f.mins["c1"].Kill()
	f.heldBy(t, f.hubs, map[string]string{"c1": ""}, 30*time.Second)

	a2, late := f.restartA(t, "global-late")
	served(f.w, late, expected("global", nil), 30*time.Second)
	ready := time.Since(a2.Listening)
	if first := names(strings.SplitN(late.FirstViews(), "\n", 2)[0]); first != expected("global", nil) {
		t.Errorf("the restarted replica's first push to a new sink:\n got %s\nwant %s", first, expected("global", nil))
	}
	pastWarmUp(a2)
	f.sinks = append(f.sinks, late)
	f.converge(t, nil, 30*time.Second)
	f.noDeletions(t, nil)
	for i, s := range f.sinks[:len(before)] {
		sameBytes(t, "sink "+s.Name, s.Encoded(), before[i])
	}
	sameBytes(t, "the new sink on the restarted replica", late.Encoded(), before[0]) // sink 0 is global
	t.Logf("replica a restarted on its state directory: a new sink on it held everything %v after it listened", ready.Round(time.Millisecond))
}

// A restored copy never resurrects what a newer session deleted. c1 is held by a; its
// minion stops; a is killed; c1's minion comes back on b without vs-4 (a newer session:
// every sink is sent vs-4's deletion) and stops again, or stays. a restarts on its state
// directory, whose copy of c1 is the older session's, with vs-4: no sink, on a or
// elsewhere, is ever sent vs-4 again. When the minion stays on b, b is frozen (SIGSTOP)
// while a restarts and a sink subscribes to it, until that sink is served: a replica that
// served its restored copy before it had the holder's state would send it vs-4.
func TestRestoredCopyNeverResurrects(t *testing.T) {
	for _, tc := range []struct {
		name        string
		minionStays bool
	}{{"absent everywhere", false}, {"held by another replica", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleetWarm(t)
			a, b, c := f.hubs[0], f.hubs[1], f.hubs[2]
			f.heldBy(t, f.hubs, map[string]string{"c1": "a"}, 10*time.Second)
			f.mins["c1"].Kill()
			f.heldBy(t, f.hubs, map[string]string{"c1": ""}, 30*time.Second)
			stateWritten(t, f.w, a)
			a.Kill()

			f.w.Delete("c1", "vs-4")
			gone := map[string]bool{"ns-c1/vs-4": true}
			m := f.w.StartMinion("c1", b, c)
			f.mins["c1"] = m
			f.heldBy(t, []*rt.Hub{b, c}, map[string]string{"c1": "b"}, 30*time.Second)
			f.converge(t, gone, 30*time.Second)
			sent := make([]int, len(f.sinks))
			for i, s := range f.sinks {
				sent[i] = s.Sent("ns-c1/vs-4")
			}
			if !tc.minionStays {
				m.Kill()
				f.heldBy(t, []*rt.Hub{b, c}, map[string]string{"c1": ""}, 30*time.Second)
			}

			if tc.minionStays {
				b.Freeze()
			}
			a2, late := f.restartA(t, "global-late")
			served(f.w, late, expected("global", gone), 30*time.Second)
			ready := time.Since(a2.Listening)
			b.Thaw()
			pastWarmUp(a2)
			f.sinks = append(f.sinks, late)
			f.converge(t, gone, 30*time.Second)
			if n := late.Sent("ns-c1/vs-4"); n > 0 {
				t.Errorf("the new sink on the restarted replica was sent the deleted ns-c1/vs-4 (%d times)", n)
			}
			for i, s := range f.sinks[:len(sent)] {
				if n := s.Sent("ns-c1/vs-4"); n != sent[i] {
					t.Errorf("sink %s was sent the deleted ns-c1/vs-4 again after its deletion (%d times)", s.Name, n-sent[i])
				}
			}
			f.noDeletions(t, gone)
			t.Logf("replica a restarted with an older copy of c1: a new sink on it held the group's state %v after it listened", ready.Round(time.Millisecond))
		})
	}
}
