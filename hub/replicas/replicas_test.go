package replicas

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/replicas/membership"
	"github.com/meshfed/meshfed/mcp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The replica rules without processes: the layer on a core that is built but not run,
// driven through its hooks as the core calls them, over a membership held in memory.

// fakeMembers is a membership in memory: what each replica holds, at which epoch.
type fakeMembers struct {
	self string

	mu       sync.Mutex
	addrs    map[string]string                     // live replicas -> MCP address
	holds    map[string]map[string]uint64          // replica -> cluster -> epoch
	copies   map[string]map[string]membership.Copy // replica -> cluster -> its copy
	maxEpoch map[string]uint64
	unsynced bool // Synced reports false
	changed  chan struct{}
}

func newFakeMembers(self string, peers ...string) *fakeMembers {
	m := &fakeMembers{self: self, addrs: map[string]string{self: "127.0.0.1:1"}, holds: map[string]map[string]uint64{},
		copies: map[string]map[string]membership.Copy{}, maxEpoch: map[string]uint64{}, changed: make(chan struct{}, 1)}
	for _, p := range peers {
		m.addrs[p] = "127.0.0.1:1" // nothing listens: follows dial and retry until stopped
	}
	return m
}

// set records that replica holds cluster at epoch (0: releases it).
func (m *fakeMembers) set(replica, cluster string, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds[replica] == nil {
		m.holds[replica] = map[string]uint64{}
	}
	if epoch == 0 {
		delete(m.holds[replica], cluster)
		return
	}
	m.holds[replica][cluster] = epoch
	m.maxEpoch[cluster] = max(m.maxEpoch[cluster], epoch)
}

// setCopy records replica's copy of cluster at epoch (0: none), restored or not.
func (m *fakeMembers) setCopy(replica, cluster string, epoch uint64, restored bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.copies[replica] == nil {
		m.copies[replica] = map[string]membership.Copy{}
	}
	if epoch == 0 {
		delete(m.copies[replica], cluster)
		return
	}
	m.copies[replica][cluster] = membership.Copy{Replica: replica, MCPAddr: m.addrs[replica], Epoch: epoch, Restored: restored}
	m.maxEpoch[cluster] = max(m.maxEpoch[cluster], epoch)
}

func (m *fakeMembers) SetCopy(cluster, _ string, epoch uint64, restored bool) {
	m.setCopy(m.self, cluster, epoch, restored)
}

func (m *fakeMembers) CopiedClusters() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for r, cs := range m.copies {
		for c := range cs {
			if r != m.self && !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	sort.Strings(out)
	return out
}

// copyOf returns this replica's advertised copy of cluster.
func (m *fakeMembers) copyOf(cluster string) membership.Copy {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.copies[m.self][cluster]
}

func (m *fakeMembers) Copies(cluster string) []membership.Copy {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []membership.Copy
	for r, cs := range m.copies {
		if cp, ok := cs[cluster]; ok && r != m.self {
			out = append(out, cp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Replica < out[j].Replica })
	return out
}

func (m *fakeMembers) Synced() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.unsynced
}

func (m *fakeMembers) Hold(cluster string) uint64 {
	m.mu.Lock()
	e := m.maxEpoch[cluster] + 1
	m.mu.Unlock()
	m.set(m.self, cluster, e)
	return e
}

func (m *fakeMembers) Release(cluster string, epoch uint64) {
	m.mu.Lock()
	held := m.holds[m.self][cluster] == epoch
	m.mu.Unlock()
	if held {
		m.set(m.self, cluster, 0)
	}
}

func (m *fakeMembers) Holds(cluster string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.holds[m.self][cluster] > 0
}

func (m *fakeMembers) Authorities() map[string]membership.Authority {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]membership.Authority{}
	for r, hs := range m.holds {
		for c, e := range hs {
			if a, ok := out[c]; !ok || e > a.Epoch || (e == a.Epoch && r < a.Replica) {
				out[c] = membership.Authority{Replica: r, MCPAddr: m.addrs[r], Epoch: e}
			}
		}
	}
	return out
}

func (m *fakeMembers) Authority(cluster string) (string, uint64, bool) {
	a, ok := m.Authorities()[cluster]
	return a.Replica, a.Epoch, ok
}

func (m *fakeMembers) Replicas() []membership.Replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []membership.Replica
	for r, addr := range m.addrs {
		out = append(out, membership.Replica{Name: r, MCPAddr: addr, Holding: maps.Clone(m.holds[r])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (m *fakeMembers) Changed() <-chan struct{}         { return m.changed }
func (m *fakeMembers) Watch() (<-chan struct{}, func()) { return m.changed, func() {} }
func (m *fakeMembers) Addr() string                     { return "fake" }
func (m *fakeMembers) Close() error                     { return nil }
func (m *fakeMembers) Crash()                           {}
func (m *fakeMembers) Poke() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

const vs = "istio/networking/v1alpha3/virtualservices"

// layerConfig is replica self's: two clusters, and follows that do not redial while a test
// looks at them.
const layerConfig = `
insecure: true
collections: [istio/networking/v1alpha3/virtualservices]
clusters:
- {name: east, identities: [east], namespaces: [shop], hosts: ["*"]}
- {name: west, identities: [west], namespaces: [pay], hosts: ["*"]}
backoff: {initial: 1h, max: 1h}
replicas: {name: self}
`

// testLayer is replica "self" of a group with peers, its membership fm.
type testLayer struct {
	*Layer
	h   *hub.Hub
	fm  *fakeMembers
	ctx context.Context
	wg  *sync.WaitGroup
}

func newTestLayer(t *testing.T, peers ...string) *testLayer {
	t.Helper()
	cfg, err := hub.ParseConfig([]byte(layerConfig))
	if err != nil {
		t.Fatal(err)
	}
	h, l, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	fm := newFakeMembers("self", peers...)
	l.mem.Store(&memberRef{fm})
	ctx, cancel := context.WithCancel(context.Background())
	tl := &testLayer{Layer: l, h: h, fm: fm, ctx: ctx, wg: &sync.WaitGroup{}}
	t.Cleanup(func() { cancel(); tl.wg.Wait() })
	return tl
}

func (tl *testLayer) reconcile() { tl.Layer.reconcile(tl.ctx, tl.wg) }

// following returns which replica the layer follows cluster from ("" for none).
func (tl *testLayer) following(cluster string) *follow {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if c := tl.clusters[cluster]; c != nil {
		return c.follow
	}
	return nil
}

// minionSession opens a session of cluster as a minion's stream here.
func (tl *testLayer) minionSession(t *testing.T, cluster string) *hub.Session {
	t.Helper()
	s, err := tl.h.OpenSession(cluster, hub.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tl.SessionOpened(s)
	return s
}

// followSession is a session of f's stream, as runFollow opens it.
func (tl *testLayer) followSession(t *testing.T, cluster string, f *follow) *hub.Session {
	t.Helper()
	s, err := tl.h.OpenSession(cluster, hub.SessionOptions{Away: f.copy, Peer: true})
	if err != nil {
		t.Fatal(err)
	}
	tl.mu.Lock()
	tl.follows[s] = f
	tl.mu.Unlock()
	tl.SessionOpened(s)
	return s
}

// One writer per cluster copy: while this replica follows east from a, a minion session of
// east opening here retires the follow at once (its pushes are dropped) and the next
// reconciliation stops it; once the minion has delivered everything, this replica holds
// east at the next epoch and follows it from nowhere.
func TestOneWriterPerCluster(t *testing.T) {
	tl := newTestLayer(t, "a")
	tl.fm.set("a", "east", 1)
	tl.reconcile()
	f := tl.following("east")
	if f == nil || f.replica != "a" {
		t.Fatalf("following east from %+v, want a", f)
	}
	fs := tl.followSession(t, "east", f)
	if !tl.MayWrite(fs) {
		t.Fatal("the follow may not write")
	}

	m := tl.minionSession(t, "east")
	if tl.MayWrite(fs) || !tl.MayWrite(m) {
		t.Errorf("after the minion's stream opened: follow may write %v, minion %v; want only the minion", tl.MayWrite(fs), tl.MayWrite(m))
	}
	tl.reconcile()
	if f := tl.following("east"); f != nil {
		t.Errorf("still following east from %s while its minion resyncs here", f.replica)
	}
	if tl.fm.Holds("east") {
		t.Error("held before the minion delivered everything")
	}

	tl.SessionDelivered(m)
	if a, _ := tl.fm.Authorities()["east"]; a.Replica != "self" || a.Epoch != 2 {
		t.Errorf("authority of east = %+v, want self at epoch 2 (one above a's)", a)
	}
	tl.reconcile()
	if f := tl.following("east"); f != nil {
		t.Errorf("following east from %s while holding it", f.replica)
	}
	if st := tl.Status(); st.Following["east"] != "" || st.Authorities["east"].Replica != "self" {
		t.Errorf("status = %+v", st)
	}
}

// A minion session here whose epoch a newer session elsewhere has superseded writes
// nothing, and this replica follows the newer session; its end releases nothing that is
// not its own.
func TestSupersededSession(t *testing.T) {
	tl := newTestLayer(t, "b")
	m := tl.minionSession(t, "east")
	tl.SessionDelivered(m)
	if !tl.fm.Holds("east") || !tl.MayWrite(m) {
		t.Fatal("the synced minion session does not hold east")
	}
	tl.fm.set("b", "east", 2) // the minion reconnected to b before this stream was noticed dead
	if tl.MayWrite(m) {
		t.Error("a superseded session still writes")
	}
	tl.reconcile()
	if f := tl.following("east"); f == nil || f.replica != "b" {
		t.Errorf("following east from %+v, want b (the newer session)", f)
	}
	tl.SessionClosed(m)
	if a := tl.fm.Authorities()["east"]; a.Replica != "b" {
		t.Errorf("authority after the old session ended: %+v", a)
	}
}

// Two replicas that took a cluster at once, each before it heard of the other (two minions
// of one identity, or one failing over while the other connects), hold it at the same
// epoch: the authority (the lower replica name) wins the tie, and the other's session
// writes nothing more and is ended. Before, neither was superseded: the loser followed the
// winner's session while its own minion's stream, ACKed, stayed its writer, so its state
// was the winner's and its minion never resent its own (test/invariant:
// replicas-two-writers-second-not-taken-after-the-first-stops).
func TestTiedSessionLosesToTheAuthority(t *testing.T) {
	tl := newTestLayer(t, "a")
	m := tl.minionSession(t, "east")
	tl.SessionDelivered(m)
	a, _ := tl.fm.Authorities()["east"]
	if a.Replica != "self" {
		t.Fatalf("authority %+v, want self", a)
	}
	tl.fm.set("a", "east", a.Epoch) // a took east at the same epoch; "a" < "self" wins the tie
	if tl.MayWrite(m) {
		t.Error("the session that lost the tie still writes")
	}
	tl.reconcile()
	if f := tl.following("east"); f == nil || f.replica != "a" {
		t.Errorf("following east from %+v, want a (the tie's winner)", f)
	}
}

// Handover: when east's authority moves from a to b, the follow from a stops at once and
// one from b starts; when nobody holds east, the follow stops and this replica keeps the
// copy it has.
func TestHandover(t *testing.T) {
	tl := newTestLayer(t, "a", "b")
	if err := tl.h.Apply("east", &mcp.Change{Collection: vs}); err != nil { // this replica has east's state
		t.Fatal(err)
	}
	tl.fm.set("a", "east", 1)
	tl.reconcile()
	fromA := tl.following("east")
	if fromA == nil || fromA.replica != "a" {
		t.Fatalf("following %+v, want a", fromA)
	}
	if _, at := tl.GroupWriter("east"); !at.IsZero() {
		t.Errorf("east changed hands at %v before any second session", at)
	}
	tl.fm.set("b", "east", 2) // while a still holds epoch 1: b's session took over a live one
	tl.reconcile()
	fromB := tl.following("east")
	if fromB == nil || fromB.replica != "b" || !fromA.retired.Load() {
		t.Errorf("after the handover: following %+v, the follow from a retired %v", fromB, fromA.retired.Load())
	}
	if elsewhere, at := tl.GroupWriter("east"); !strings.Contains(elsewhere, "replica b") || at.IsZero() {
		t.Errorf("the group's writer of east after b took over a's live session: %q, changed hands at %v", elsewhere, at)
	}
	tl.fm.set("a", "east", 0)
	tl.fm.set("b", "east", 0)
	tl.reconcile()
	if f := tl.following("east"); f != nil || !fromB.retired.Load() {
		t.Errorf("nobody holds east: following %+v", f)
	}
}

// A replica that has no state of a cluster nobody holds takes a peer's copy (an Away
// session: the cluster is not connected here) of the newest epoch, and stops asking once
// the copy arrived; its copy is then of that epoch.
func TestCopyOfAnAbsentCluster(t *testing.T) {
	tl := newTestLayer(t, "a", "b", "c")
	tl.fm.setCopy("a", "west", 2, false)
	tl.fm.setCopy("b", "west", 2, false)
	tl.fm.setCopy("c", "west", 1, false) // an older session's state
	tl.fm.unsynced = true
	tl.reconcile()
	if f := tl.following("west"); f != nil {
		t.Fatalf("took a copy (%+v) before hearing every peer: a peer not heard yet may have a newer one", f)
	}
	tl.fm.unsynced = false
	tl.reconcile()
	f := tl.following("west")
	if f == nil || !f.copy || f.epoch != 2 || len(f.peers) != 2 || slices.Contains(f.peers, "c") {
		t.Fatalf("following west %+v, want a copy of epoch 2 asked of a and b", f)
	}
	s := tl.followSession(t, "west", f)
	if err := tl.h.Apply("west", &mcp.Change{Collection: vs}); err != nil {
		t.Fatal(err)
	}
	tl.SessionDelivered(s) // as the core reports the follow's delivery
	if cp := tl.fm.copyOf("west"); cp.Epoch != 2 || cp.Restored {
		t.Errorf("this replica's copy after it arrived: %+v, want epoch 2", cp)
	}
	tl.SessionClosed(s)
	if !f.retired.Load() {
		t.Error("the copy arrived; the follow still asks another peer")
	}
	for _, c := range tl.h.Clusters() {
		if c.Name == "west" && c.Connected {
			t.Error("a copy counts as the cluster connected")
		}
	}
}

// A minion session that ends releases the cluster; another synced session of the same
// minion still open here (it reconnected before the old stream was noticed dead) holds it
// anew.
func TestReleaseAndRehold(t *testing.T) {
	tl := newTestLayer(t)
	m1 := tl.minionSession(t, "east")
	tl.SessionDelivered(m1)
	m2 := tl.minionSession(t, "east")
	tl.SessionDelivered(m2)
	tl.SessionClosed(m2)
	if a := tl.fm.Authorities()["east"]; a.Replica != "self" || a.Epoch != 3 {
		t.Errorf("after the newer session ended: %+v, want self held again at epoch 3", a)
	}
	tl.SessionClosed(m1)
	if tl.fm.Holds("east") {
		t.Error("east still held after its last session ended")
	}
}

// Each dial-out runs on one live replica, and a replica leaving moves only its own tasks.
func TestDialOutsAssignedByRendezvous(t *testing.T) {
	names := []string{"a", "b", "c"}
	assigned := func(live []string, key string) []string {
		var out []string
		for _, self := range live {
			l := &Layer{cfg: hub.ReplicasConfig{Name: self}}
			l.mem.Store(&memberRef{newFakeMembers(self, without(live, self)...)})
			if l.assigned(key) {
				out = append(out, self)
			}
		}
		return out
	}
	moved := 0
	for i := range 30 {
		key := fmt.Sprintf("poll/c%d", i)
		all := assigned(names, key)
		if len(all) != 1 {
			t.Fatalf("%s runs on %v", key, all)
		}
		after := assigned([]string{"a", "b"}, key)
		if len(after) != 1 || (all[0] != "c" && after[0] != all[0]) {
			t.Errorf("%s: on %v, then on %v after c left", key, all, after)
		}
		if all[0] == "c" {
			moved++
		}
	}
	if moved == 0 {
		t.Error("no task was c's: the test shows nothing")
	}
}

func without(list []string, x string) []string {
	var out []string
	for _, s := range list {
		if s != x {
			out = append(out, s)
		}
	}
	return out
}

// The feed of a cluster is its resources as received, in the store's order.
func TestFeedFollowsTheStore(t *testing.T) {
	tl := newTestLayer(t)
	body, _ := anypb.New(&networking.VirtualService{Hosts: []string{"x"}})
	r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "shop/a", Version: "7"}, Body: body}
	e, err := mcp.NewEntry(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.h.Apply("east", &mcp.Change{Collection: vs, Entries: []*mcp.Entry{e}, Resources: []*mcpapi.Resource{r}}); err != nil {
		t.Fatal(err)
	}
	got := tl.feeds.of("east").Entries(vs)
	if len(got) != 1 || got[0].Version != "7" {
		t.Errorf("feed of east = %+v, want shop/a at the version received", got)
	}
	tl.ClusterRemoved("east")
	if got := tl.feeds.of("east").Entries(vs); len(got) != 0 {
		t.Errorf("feed after east was removed = %+v", got)
	}
}

// A held cluster that leaves the configuration is released when its minion's stream ends,
// even when the reconciliation the removal pokes runs first.
func TestRemovedClusterReleased(t *testing.T) {
	tl := newTestLayer(t)
	m := tl.minionSession(t, "east")
	tl.SessionDelivered(m)
	if !tl.fm.Holds("east") {
		t.Fatal("east not held")
	}
	next, err := hub.ParseConfig([]byte(strings.Replace(layerConfig, "- {name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tl.h.Reload(next); err != nil {
		t.Fatal(err)
	}
	tl.reconcile()      // poked by ClusterRemoved
	tl.SessionClosed(m) // the stream's end, as the core reports it
	if tl.fm.Holds("east") {
		t.Errorf("east still held after it was removed and its session ended: %+v", tl.fm.Authorities())
	}
	tl.reconcile()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if _, ok := tl.clusters["east"]; ok {
		t.Error("the removed cluster's state outlives its last session")
	}
}

// Replicas joining and leaving, and a cluster's authority moving, are the hub's events,
// and the vendor's only: which replica holds a cluster names no tenant.
func TestMembershipChangesAreEvents(t *testing.T) {
	tl := newTestLayer(t, "a")
	tl.fm.set("a", "east", 1)
	tl.reconcile() // the first view: nothing changed yet
	tl.fm.mu.Lock()
	tl.fm.addrs["b"] = "127.0.0.1:2"
	tl.fm.mu.Unlock()
	tl.fm.set("a", "east", 0)
	tl.fm.set("b", "east", 2)
	tl.reconcile()
	if _, at := tl.GroupWriter("east"); !at.IsZero() {
		t.Errorf("east moved from a, released, to b: taken for a takeover of a live session at %v", at)
	}
	tl.fm.mu.Lock()
	delete(tl.fm.addrs, "a")
	tl.fm.mu.Unlock()
	tl.reconcile()
	var got []string
	for _, e := range tl.h.Events(0).Events {
		if e.Kind == api.EventReplica {
			if e.Tenant != "" || e.Cluster != "" {
				t.Errorf("a replica event is a tenant's: %+v", e)
			}
			got = append(got, e.Reason+": "+e.Message)
		}
	}
	want := []string{"joined: replica b joined (MCP 127.0.0.1:2)", "authority: cluster east is now held by replica b (epoch 2), was a", "left: replica a left or died"}
	if !slices.Equal(got, want) {
		t.Errorf("replica events:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// NewWithOptions passes the core's options through (the clock every decision reads, the
// registry) and keeps the layer its own.
func TestNewWithOptions(t *testing.T) {
	cfg, err := hub.ParseConfig([]byte(layerConfig))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	reg := prometheus.NewRegistry()
	h, _, err := NewWithOptions(cfg, log, hub.Options{Clock: func() time.Time { return at }, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	h.Note(api.Event{Kind: api.EventReplica, Reason: api.ReasonJoined, Message: "x"})
	if ev := h.Events(0).Events; len(ev) != 1 || !ev[0].Time.Equal(at) {
		t.Errorf("events = %+v, want one at %v (the options' clock)", ev, at)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		found = found || mf.GetName() == "meshfed_hub_replicas"
	}
	if !found {
		t.Error("the layer's metrics are not in the options' registry")
	}
	if _, _, err := NewWithOptions(cfg, log, hub.Options{Layer: &Layer{}}); err == nil {
		t.Error("a layer in the options was accepted")
	}
}

// A cluster that departs (removed by a reload while it holds objects) keeps its feed: the
// configuration may have it again, with what it had, and a peer following it then declares
// those objects; an empty feed would send it their deletion (test/invariant's replica world
// found every sink on the followers losing them). Its removal, confirmed, drops the feed.
func TestDepartedClusterKeepsItsFeed(t *testing.T) {
	tl := newTestLayer(t)
	body, _ := anypb.New(&networking.VirtualService{Hosts: []string{"x"}})
	r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "shop/a", Version: "7"}, Body: body}
	e, err := mcp.NewEntry(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.h.Apply("east", &mcp.Change{Collection: vs, Entries: []*mcp.Entry{e}, Resources: []*mcpapi.Resource{r}}); err != nil {
		t.Fatal(err)
	}
	withoutEast, err := hub.ParseConfig([]byte(strings.Replace(layerConfig, "- {name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	base, err := hub.ParseConfig([]byte(layerConfig))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tl.h.Reload(withoutEast); err != nil {
		t.Fatal(err)
	}
	if !tl.h.ClusterDeparted("east") {
		t.Fatal("east did not depart")
	}
	if _, err := tl.h.Reload(base); err != nil {
		t.Fatal(err)
	}
	if got := tl.feeds.of("east").Entries(vs); len(got) != 1 || got[0].Version != "7" {
		t.Fatalf("feed of east configured again = %+v, want shop/a as it had", got)
	}

	if _, err := tl.h.Reload(withoutEast); err != nil {
		t.Fatal(err)
	}
	held := tl.h.Clusters()
	digest := ""
	for _, c := range held {
		if c.Name == "east" && c.Breaker != nil {
			digest = c.Breaker.Digest
		}
	}
	if _, err := tl.h.ReleaseBreaker("east", "operator", digest); err != nil {
		t.Fatal(err)
	}
	if tl.h.ClusterDeparted("east") {
		t.Fatal("east still departed after its removal was confirmed")
	}
	if got := tl.feeds.of("east").Entries(vs); len(got) != 0 {
		t.Errorf("feed of east after its removal was confirmed = %+v", got)
	}
}
