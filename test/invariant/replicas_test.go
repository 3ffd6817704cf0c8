package invariant

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/durable"
	"github.com/meshfed/meshfed/hub/replicas"
)

// The replica world: the same minions, sinks and model as the single hub's, against a group
// of hub replicas (package hub/replicas) in process, each with its own state directory, its
// own state file's disk and the sequence's clock; gossip on loopback with short probes, as
// test/e2e and test/replicas run them.
//
//   - A minion dials its list of the replicas' ingest addresses in turn, as the minion's
//     mcp.Redial does: a new process from the first, the next after a stream ends (a cut, a
//     refusal, its replica killed). Each minion's list starts at another replica, and a
//     second minion of an identity at yet another, so clusters are held on several replicas.
//   - A sink dials a Service that load-balances over the ready replicas: each of its
//     streams goes to the first ready replica from its own (two sinks per replica, one
//     incremental and one full-state), and stays there until the stream ends (the replica
//     killed or restarted), as kube-proxy keeps a connection on its endpoint.
//   - After each step the world waits until every running minion has been answered by the
//     replica it writes to, every replica that restarted is ready if its peers have every
//     cluster it waits for, and every ready replica serves what the model allows (a probe per
//     replica) and every sink holds what its replica serves. Replicas follow each other, so
//     this is waited for, bounded: a replica that never serves what the model allows is a
//     violation when the step's time is up.
//
// What the model adds for replicas, as ARCHITECTURE.md ("Hub replicas", "Clusters: a
// lifecycle") and the README document them:
//   - A departed cluster's removal is confirmed per replica (each keeps its own departed
//     copy): a removal is in every replica's removed set, and a release at a replica takes it
//     out of that replica's only. A replica that lost its departed copies (wiped, or its
//     state file unreadable as a whole) has only the removals its running peers keep. A sink
//     is checked against the protection of the replica it is on, before and after the step.
//   - A breaker is the holder's: followers keep the objects it holds as present. What any
//     replica's breaker held once stays allowed (not protected) until no replica serves it.
//   - A replica may serve what another replica's protection has (a peer's copy), never less
//     than its own.
//   - A replica's run whose state file was read-only from its start leaves no trace, its
//     epochs included (the single hub's loose, from the end of that run: readOnlyRunEnded).
var (
	rseqs   = flag.Int("invariant.replicas.seqs", 3, "random sequences TestInvariantReplicas runs")
	rlength = flag.Int("invariant.replicas.len", 30, "events per replica sequence after its prelude")
)

var replicaNames = []string{"a", "b", "c", "d", "e"}

// TestInvariantReplicas runs random sequences of events, replica kills and restarts among
// them, against a group of three replicas and checks the invariant after every step.
func TestInvariantReplicas(t *testing.T) {
	base := *seed
	if base == 0 {
		base = uint64(time.Now().UnixNano())
	}
	start := time.Now()
	steps, failures := 0, 0
	for i := range *rseqs {
		s := base + uint64(i)
		events := replicaSequence(rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15)), 3, *rlength, strings.Split(*without, ","))
		vs, failed, h := runReplicaSequence(t.TempDir(), events)
		steps += failed
		if len(vs) == 0 {
			continue
		}
		failures++
		if !*survey {
			t.Fatalf("seed %d: %s", s, report(events, failed, vs, h))
		}
		t.Errorf("seed %d: step %d (%s): %s", s, failed, events[failed], vs[0].msg)
		if *reports != "" {
			_ = os.WriteFile(filepath.Join(*reports, fmt.Sprintf("replicas-seed-%d.txt", s)), []byte(report(events, failed, vs, h)), 0o644)
		}
	}
	t.Logf("%d replica sequences (%d failed), %d steps, in %v", *rseqs, failures, steps, time.Since(start).Round(time.Millisecond))
}

// FuzzInvariantReplicas is FuzzInvariant in the replica world.
func FuzzInvariantReplicas(f *testing.F) {
	f.Add([]byte("meshfed replicas"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var s [16]byte
		copy(s[:], in)
		a, b := uint64(0), uint64(0)
		for i := range 8 {
			a = a<<8 | uint64(s[i])
			b = b<<8 | uint64(s[8+i])
		}
		n := 30
		if len(in) > 16 {
			n = 10 + int(in[16])%60
		}
		events := replicaSequence(rand.New(rand.NewPCG(a, b)), 3, n, nil)
		if vs, failed, h := runReplicaSequence(t.TempDir(), events); len(vs) > 0 {
			t.Fatal(report(events, failed, vs, h))
		}
	})
}

// runScript runs a script in its world: the replica world's starts with `replicas N`.
func runScript(dir string, events []event) ([]violation, int, *harness) {
	if len(events) > 0 && events[0].op == "replicas" {
		return runReplicaSequence(dir, events)
	}
	return runSequence(dir, events)
}

// The generator of the replica world: the single hub's events, with those that concern the
// hub's process and disk aimed at one replica, and replicas killed, started and restarted.

type replicaGenerator struct {
	*generator
	names    []string
	down     map[string]bool
	diskFull map[string]bool
	readonly map[string]bool
}

// replicaSequence returns a random sequence for n replicas: `replicas n`, the prelude, then
// length events, none of whose operations is in without.
func replicaSequence(r *rand.Rand, n, length int, without []string) []event {
	g := &replicaGenerator{generator: newGenerator(r), names: replicaNames[:n], down: map[string]bool{}, diskFull: map[string]bool{}, readonly: map[string]bool{}}
	out := append([]event{{"replicas", []string{strconv.Itoa(n)}}}, g.prelude()...)
	for added := 0; added < length; {
		if e := g.next(); !slices.Contains(without, e.op) {
			out = append(out, e)
			added++
		}
	}
	return out
}

func (g *replicaGenerator) up() []string {
	var out []string
	for _, n := range g.names {
		if !g.down[n] {
			out = append(out, n)
		}
	}
	return out
}

func (g *replicaGenerator) next() event {
	switch n := g.r.IntN(100); {
	case n < 7:
		return g.killOrBoot()
	case n < 9:
		return event{"restart", []string{g.pick(g.up())}}
	case n < 11:
		r := g.pick(g.names)
		if len(g.up()) == 1 && !g.down[r] {
			return event{"restart", []string{r}} // the last one up keeps its state
		}
		g.down[r] = false
		return event{"wipe", []string{r}}
	}
	e := g.generator.next()
	switch e.op {
	case "crash":
		return g.killOrBoot()
	case "restart":
		return event{"restart", []string{g.pick(g.up())}}
	case "damage":
		r := g.pick(g.names)
		g.down[r] = false // damage kills it if up, then starts it
		return event{"damage", []string{r, e.args[0], e.args[1]}}
	case "disk":
		r := g.pick(g.names)
		g.diskFull[r] = !g.diskFull[r]
		if g.diskFull[r] {
			return event{"disk", []string{r, "full"}}
		}
		return event{"disk", []string{r, "ok"}}
	case "readonly":
		r := g.pick(g.names)
		g.readonly[r] = !g.readonly[r]
		if g.readonly[r] {
			return event{"readonly", []string{r, "on"}}
		}
		return event{"readonly", []string{r, "off"}}
	case "release":
		// As documented: at the replica holding the cluster (hub status HELD BY), a departed
		// cluster's removal on each replica; now and then at one replica, as an operator
		// may.
		switch k := g.r.IntN(10); {
		case k < 6:
			return event{"release", []string{"holder", e.args[0]}}
		case k < 8:
			return event{"release", []string{"each", e.args[0]}}
		default:
			return event{"release", []string{g.pick(g.names), e.args[0]}}
		}
	}
	return e
}

// killOrBoot kills an up replica, keeping one up, or starts a killed one.
func (g *replicaGenerator) killOrBoot() event {
	up := g.up()
	if len(up) < len(g.names) && (len(up) == 1 || g.r.IntN(2) == 0) {
		var down []string
		for _, n := range g.names {
			if g.down[n] {
				down = append(down, n)
			}
		}
		r := g.pick(down)
		g.down[r] = false
		return event{"boot", []string{r}}
	}
	r := g.pick(up)
	g.down[r] = true
	return event{"kill", []string{r}}
}

// replica is one hub replica of the world: its process-in-process, its state directory and
// its disk, and the addresses it listens on (kept across restarts, as a StatefulSet's pod
// keeps its name).
type replica struct {
	name, dir string
	w         *rworld

	mu                    sync.Mutex
	hub                   *hub.Hub
	layer                 *replicas.Layer
	stop                  context.CancelFunc
	ended                 chan error
	ingest, serve, gossip string      // bound at the first start ("" before)
	booted                *hub.Config // the configuration it started with (a reload keeps its listeners and replicas section)

	disk
	// roStart: the run now going opened its state file read-only (it writes nothing, and
	// leaves no trace: readOnlyRunEnded).
	roStart bool
}

// running returns the replica's hub if it is up.
func (r *replica) running() *hub.Hub {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hub
}

func (r *replica) ready() bool {
	h := r.running()
	return h != nil && h.Ready()
}

func (r *replica) ingestAddr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ingest
}

func (r *replica) serveAddr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.serve
}

func (r *replica) faults() *durable.Faults {
	return r.disk.faults(func() error {
		// A killed process's writer stops dead: nothing more is committed, and what would
		// wait for a commit (a flush as the replica's follows end) finds the store closed
		// instead of waiting out its timeout, as nothing waits in a dead process.
		runtime.Goexit()
		return nil
	})
}

// rworld is the replica world: the single hub's harness (its clock, log, model, minions,
// sinks and violations) with replicas instead of the hub.
type rworld struct {
	*harness
	reps []*replica

	// removedAt is, per replica, the clusters removed from the configuration whose
	// removal it has not had confirmed: each replica keeps its own departed copy.
	removedAt map[string]map[string]removal
	// forgot is, per replica, the identities whose objects a confirmed removal there took
	// (acc, for that replica, is empty until the writer publishes again).
	forgot map[string]map[string]bool
	// heldEver are the objects whose deletion a breaker held, until no replica serves them.
	heldEver map[key]bool
	// releasedAt is, per replica, what an operator's release there withdrew (replicas do not
	// share operators' decisions): not protected on it until its writer publishes again.
	releasedAt map[string]map[key]bool

	atMu sync.Mutex
	at   []int // each sink's replica (index in reps; -1 when it has none)

	minionLists map[*minion]*addrList
}

// addrList is a minion's list of the replicas' ingest addresses, dialed in turn.
type addrList struct {
	w     *rworld
	order []int
	next  int
}

func (l *addrList) dial() string {
	r := l.w.reps[l.order[l.next%len(l.order)]]
	l.next++
	return r.ingestAddr()
}

func newReplicaWorld(dir string, n int) *rworld {
	h := &harness{dir: dir, clock: &clock{t: time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)}, log: newRingLog(3000), m: newModel(),
		minions: map[string]*minion{}, seconds: map[string]*minion{}}
	h.ingest.Store("")
	h.serve.Store("")
	w := &rworld{harness: h, removedAt: map[string]map[string]removal{}, forgot: map[string]map[string]bool{}, heldEver: map[key]bool{},
		releasedAt: map[string]map[key]bool{}, minionLists: map[*minion]*addrList{}}
	for _, name := range replicaNames[:n] {
		w.reps = append(w.reps, &replica{name: name, dir: filepath.Join(dir, name), w: w})
		w.removedAt[name] = map[string]removal{}
		w.forgot[name] = map[string]bool{}
		w.releasedAt[name] = map[key]bool{}
	}
	list := func(from int) *addrList {
		l := &addrList{w: w}
		for i := range n {
			l.order = append(l.order, (from+i)%n)
		}
		return l
	}
	for i, name := range minionNames {
		first, second := &minion{id: name, h: h}, &minion{id: name, h: h, second: true}
		w.minionLists[first], w.minionLists[second] = list(i), list(i+2)
		first.dial, second.dial = w.minionLists[first].dial, w.minionLists[second].dial
		h.minions[name], h.seconds[name] = first, second
	}
	w.at = slices.Repeat([]int{-1}, 2*n)
	return w
}

// startSinks starts the sinks (two per replica, one incremental, one full-state): once the
// group first serves, so that each finds its own replica ready.
func (w *rworld) startSinks() {
	if len(w.sinks) > 0 {
		return
	}
	n := len(w.reps)
	for i := range 2 * n {
		w.sinks = append(w.sinks, newSinkDialing(w.harness, fmt.Sprintf("sink-%d", i), i < n, w.sinkDial(i, i%n)))
	}
}

// sinkDial is sink i's Service: the first ready replica from its own.
func (w *rworld) sinkDial(i, own int) func() string {
	return func() string {
		for k := range w.reps {
			j := (own + k) % len(w.reps)
			if w.reps[j].ready() {
				w.atMu.Lock()
				w.at[i] = j
				w.atMu.Unlock()
				return w.reps[j].serveAddr()
			}
		}
		w.atMu.Lock()
		w.at[i] = -1
		w.atMu.Unlock()
		return ""
	}
}

func (w *rworld) sinkAt(i int) int {
	w.atMu.Lock()
	defer w.atMu.Unlock()
	return w.at[i]
}

// config is replica r's configuration for the model's entries: its listeners where they
// were (first 127.0.0.1:0), its peers' gossip addresses as seeds.
func (w *rworld) config(r *replica, entries []entry) (*hub.Config, error) {
	base, err := w.harness.config(entries)
	if err != nil {
		return nil, err
	}
	addr := func(a string) string {
		if a == "" {
			return "127.0.0.1:0"
		}
		return a
	}
	base.Ingest, base.Serve, base.StateDir = addr(r.ingest), addr(r.serve), r.dir
	// The followers' redials, as the replica tests shorten them.
	base.Backoff.Initial, base.Backoff.Max = hub.Duration{Duration: 20 * time.Millisecond}, hub.Duration{Duration: 500 * time.Millisecond}
	rc := hub.DefaultReplicas()
	rc.Name, rc.Gossip, rc.Profile = r.name, addr(r.gossip), "local"
	// Short probes: memberlist's last probe goroutine outlives Shutdown by up to a probe
	// interval, and goleak checks for it at the end of the package.
	rc.ProbeInterval = hub.Duration{Duration: 200 * time.Millisecond}
	rc.RejoinInterval = hub.Duration{Duration: time.Second}
	for _, p := range w.reps {
		if p != r && p.gossip != "" {
			rc.Seeds = append(rc.Seeds, p.gossip)
		}
	}
	base.Replicas = rc
	return base, base.Validate()
}

// boot starts r on its state directory with the model's configuration, on the addresses
// it had (new ones if they are taken meanwhile), and waits until it has joined its peers.
func (w *rworld) boot(r *replica) error {
	if r.running() != nil {
		return nil
	}
	err := w.bootOn(r)
	if errors.Is(err, hub.ErrNotStarted) && r.ingest != "" && !r.readonly.Load() {
		w.log.Write([]byte(fmt.Sprintf("replica %s: %v; starting on new addresses\n", r.name, err)))
		r.mu.Lock()
		r.ingest, r.serve, r.gossip = "", "", ""
		r.mu.Unlock()
		err = w.bootOn(r)
	}
	if err == nil {
		w.waitJoined(r)
	}
	return err
}

// waitJoined waits, bounded, until r knows every replica that is up and follows each
// cluster another one holds from it, its restored copy replaced. The sequence's clock
// jumps (an advance of 11 s takes a millisecond): without this, a warm-up could pass
// before r has heard its peers, which takes it milliseconds of the seconds a warm-up lasts.
func (w *rworld) waitJoined(r *replica) {
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		hb, layer := r.hub, r.layer
		r.mu.Unlock()
		if hb == nil {
			return
		}
		st, up := layer.Status(), 0
		held := map[string]string{}
		for _, p := range w.reps {
			p.mu.Lock()
			if p.layer != nil {
				up++
				if p != r {
					for c, a := range p.layer.Status().Authorities {
						if a.Replica != r.name && a.Replica != "" {
							held[c] = a.Replica
						}
					}
				}
			}
			p.mu.Unlock()
		}
		joined := st != nil && len(st.Replicas) == up
		for _, c := range hb.Clusters() {
			if from, ok := held[c.Name]; ok && c.Departed == nil && (st == nil || st.Following[c.Name] != from || c.Restored) {
				joined = false
			}
		}
		if joined {
			return
		}
		time.Sleep(time.Millisecond)
	}
	w.log.Write([]byte(fmt.Sprintf("replica %s had not joined its peers within %v\n", r.name, settleTimeout)))
}

func (w *rworld) bootOn(r *replica) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg, err := w.config(r, w.m.cfg)
	if err != nil {
		return err
	}
	hb, layer, err := replicas.NewWithOptions(cfg, w.logger().With("side", "hub-"+r.name), hub.Options{Clock: w.clock.now, StateFaults: r.faults()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- hb.Run(ctx) }()
	deadline := time.Now().Add(settleTimeout)
	for {
		ing, srv, _ := hb.Addrs()
		if g := layer.GossipAddr(); ing != "" && srv != "" && g != "" {
			r.hub, r.layer, r.stop, r.ended, r.booted = hb, layer, cancel, ended, cfg
			r.roStart = r.readonly.Load()
			r.ingest, r.serve, r.gossip = ing, srv, g
			return nil
		}
		select {
		case err := <-ended:
			cancel()
			return fmt.Errorf("replica %s did not start: %w", r.name, err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-ended
			return fmt.Errorf("replica %s did not listen within %v", r.name, settleTimeout)
		}
	}
}

// halt stops r: killed (-9: nothing more reaches its state file, and it leaves the
// membership without a word), else cleanly (it leaves). The streams it had end at the
// minions before it returns (their next stream goes to the next replica).
func (w *rworld) halt(r *replica, kill bool) {
	r.mu.Lock()
	hb, layer, stop, ended, ingest := r.hub, r.layer, r.stop, r.ended, r.ingest
	r.hub, r.layer, r.stop, r.ended = nil, nil, nil, nil
	r.mu.Unlock()
	if hb == nil {
		return
	}
	if r.roStart {
		w.readOnlyRunEnded()
	}
	if kill {
		r.killed.Store(true)
		layer.Crash()
	}
	stop()
	<-ended
	r.killed.Store(false)
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		on := false
		for _, ms := range []map[string]*minion{w.minions, w.seconds} {
			for _, m := range ms {
				m.mu.Lock()
				on = on || m.to == ingest
				m.mu.Unlock()
			}
		}
		if !on {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// readOnlyRunEnded is the single hub's rule for a run whose state file was read-only from
// its start (harness.startHub, ARCHITECTURE.md's known limit), in the replica world: that
// run leaves no trace, the epochs of the sessions it held or followed included, and once it
// ends no replica may know them any more. Its own next start, read-only again, keeps its
// copies unknown; but a peer restarted on an older copy (its own file's, whole to it) finds
// nothing newer in the group and confirms it, as the single hub's next writable start
// serves its file's older state (test/invariant/testdata/regressions/
// replicas-read-only-run-leaves-no-epoch.seq). So every cluster's namespace, a removed
// one's included, is loose until its writer publishes again (for a running minion, at the
// step's settle): what was served of it may be served, or not.
func (w *rworld) readOnlyRunEnded() {
	m := w.m
	for _, c := range m.cfg {
		m.loose[c.ns] = true
	}
	for _, at := range w.removedAt {
		for _, rm := range at {
			for k := range rm.keys {
				m.loose[k.namespace()] = true
			}
		}
	}
}

func (w *rworld) close() {
	for _, m := range w.minions {
		m.halt()
	}
	for _, m := range w.seconds {
		m.halt()
	}
	for _, s := range w.sinks {
		s.halt()
	}
	for _, r := range w.reps {
		w.halt(r, false)
	}
}

func (w *rworld) replica(name string) (*replica, error) {
	for _, r := range w.reps {
		if r.name == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("no replica %q in this world", name)
}

// upHubs are the hubs of the replicas that are up, by replica name.
func (w *rworld) upHubs() map[string]*hub.Hub {
	out := map[string]*hub.Hub{}
	for _, r := range w.reps {
		if h := r.running(); h != nil {
			out[r.name] = h
		}
	}
	return out
}

// holder is the replica holding cluster, as the replicas that are up say (hub status HELD
// BY), or "".
func (w *rworld) holder(cluster string) string {
	for _, h := range w.upHubs() {
		for _, c := range h.Clusters() {
			if c.Name == cluster && c.HeldBy != nil {
				return c.HeldBy.Replica
			}
		}
	}
	return ""
}

// startGroup starts the replicas one after the other, each seeded with those before it,
// and waits until each knows all.
func (w *rworld) startGroup() error {
	for _, r := range w.reps {
		if err := w.boot(r); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(settleTimeout)
	for {
		all := true
		for _, r := range w.reps {
			r.mu.Lock()
			st := r.layer.Status()
			r.mu.Unlock()
			all = all && st != nil && len(st.Replicas) == len(w.reps)
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replicas did not all see each other within %v", settleTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// restartMinion starts a new process of mi (its address list from the first).
func (w *rworld) restartMinion(mi *minion, src map[key]int) {
	mi.halt()
	w.minionLists[mi].next = 0
	mi.start(src)
}

// do applies event e to the replica world and to the model.
func (w *rworld) do(e event) error {
	m := w.m
	switch e.op {
	case "put", "del", "empty", "restore", "cut":
		return w.harness.do(e) // the minions' events: no hub in them
	case "start":
		m.running[e.args[0]] = true
		w.restartMinion(w.minions[e.args[0]], m.src[e.args[0]])
	case "stop":
		id := e.args[0]
		m.running[id] = false
		w.minions[id].halt()
		if m.second[id] {
			w.seconds[id].mayWriteNow()
			return w.waitWrites(w.seconds[id])
		}
	case "second":
		id := e.args[0]
		if m.second[id] {
			m.second[id] = false
			w.seconds[id].halt()
			if m.running[id] {
				w.minions[id].mayWriteNow()
				return w.waitWrites(w.minions[id])
			}
			break
		}
		seed, _ := strconv.Atoi(e.args[1])
		src := m.secondStarts(id, seed)
		w.restartMinion(w.seconds[id], src)
	case "kill", "boot", "restart", "wipe", "damage", "disk", "readonly":
		r, err := w.replica(e.args[0])
		if err != nil {
			return err
		}
		switch e.op {
		case "kill":
			w.halt(r, true)
		case "boot":
			return w.boot(r)
		case "restart":
			w.halt(r, false)
			return w.boot(r)
		case "wipe":
			w.halt(r, true)
			if err := os.RemoveAll(r.dir); err != nil {
				return err
			}
			w.removalsFromPeers(r, func(string) bool { return true })
			return w.boot(r)
		case "damage":
			w.halt(r, true)
			seed, _ := strconv.Atoi(e.args[2])
			if err := damage(statePath(r.dir), e.args[1], seed); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			if err := w.boot(r); err != nil {
				return err
			}
			// A file that could not be read as a whole (zeroed, garbage) lost the departed
			// clusters it held, as a wiped directory does: as on a single hub (restarted, and
			// ARCHITECTURE.md's known limit), its removals there can no longer be confirmed,
			// and the replica knows only those its running peers keep. What the file still
			// had, the hub restored before it listened.
			listed := map[string]bool{}
			for _, c := range r.running().Clusters() {
				listed[c.Name] = true
			}
			w.removalsFromPeers(r, func(cluster string) bool { return !listed[cluster] })
		case "disk":
			r.diskFull.Store(e.args[1] == "full")
		case "readonly":
			r.readonly.Store(e.args[1] == "on")
		}
	case "reload":
		// One configuration for the group: each replica that is up reloads it in turn; one
		// that is down starts with it.
		next := m.next(e)
		if next == nil {
			return nil
		}
		closing := w.closedByReload(next)
		reloaded := false
		for _, r := range w.reps {
			hb := r.running()
			if hb == nil {
				continue
			}
			cfg, err := w.harness.config(next)
			if err != nil {
				return nil // a configuration the hub refuses to parse
			}
			r.mu.Lock()
			cfg.Ingest, cfg.Serve, cfg.StateDir, cfg.Backoff, cfg.Replicas = r.booted.Ingest, r.booted.Serve, r.booted.StateDir, r.booted.Backoff, r.booted.Replicas
			r.mu.Unlock()
			_, err = hb.Reload(cfg)
			if err != nil {
				if reloaded {
					return fmt.Errorf("replica %s refused a configuration another replica took: %v", r.name, err)
				}
				return nil // refused: the running configuration stays
			}
			reloaded = true
		}
		old := maps.Clone(m.removed)
		m.reconfigure(next)
		for name, rm := range m.removed {
			if _, was := old[name]; !was {
				for rname, at := range w.removedAt {
					if w.forgot[rname][rm.identity] {
						// A removal confirmed there took what the writer had published, and it
						// has not published since: the replica had nothing of it to keep.
						at[name] = removal{identity: rm.identity, keys: map[key]bool{}}
						continue
					}
					at[name] = rm
				}
			}
		}
		for _, at := range w.removedAt {
			for name := range at {
				if m.configured(name) {
					delete(at, name)
				}
			}
		}
		m.withdrawn(w.heldNow())
		w.waitClosed(closing)
		for _, ms := range []map[string]*minion{w.minions, w.seconds} {
			for _, mi := range ms {
				mi.mayWriteNow()
			}
		}
	case "release":
		var at []*replica
		switch e.args[0] {
		case "holder":
			// The replica hub status names as holding the cluster; a cluster none holds (its
			// minion away, or departed), the first that is up.
			name := w.holder(e.args[1])
			for _, r := range w.reps {
				if r.running() != nil && (r.name == name || name == "") {
					at = append(at, r)
					break
				}
			}
		case "each":
			at = w.reps
		default:
			r, err := w.replica(e.args[0])
			if err != nil {
				return err
			}
			at = []*replica{r}
		}
		for _, r := range at {
			hb := r.running()
			if hb == nil {
				continue // down: the operator cannot reach it
			}
			cluster := e.args[1]
			unknown := false
			for _, c := range hb.Clusters() {
				unknown = unknown || c.Name == cluster && c.Unknown != ""
			}
			held := heldNames(hb)
			if _, err := hb.ReleaseBreaker(cluster, "spiffe://test/operator/model", reviewedDigest(hb, cluster)); err != nil {
				continue
			}
			for k := range held {
				w.releasedAt[r.name][k] = true
			}
			if unknown {
				// As in the single hub's world: the operator accepted what this replica read of
				// a cluster whose last state was unknown, until its writer publishes again.
				for _, c := range m.cfg {
					if c.name == cluster {
						m.acc[c.identity] = map[key]int{}
						m.loose[c.ns] = true
					}
				}
			}
			if rm, ok := w.removedAt[r.name][cluster]; ok {
				// The removal is confirmed at this replica: it has nothing of that writer's
				// any more; the others keep their departed copies.
				w.removalGone(r.name, cluster, rm)
			}
			m.withdrawn(w.heldNow())
		}
	case "advance":
		d, _ := time.ParseDuration(e.args[0])
		w.clock.advance(d)
		for _, r := range w.reps {
			if hb := r.running(); hb != nil {
				hb.Housekeep()
				w.waitCommitted(r, hb)
			}
		}
	default:
		return fmt.Errorf("unknown event %q in the replica world (the hub's process and disk events name a replica)", e)
	}
	return nil
}

// closedByReload returns the minions writing now whose streams a reload to next closes
// (hub/reload.go: a cluster that leaves or whose entry changes; after a change of ownership,
// one with standing refusals), with the count of their streams that had ended before.
func (w *rworld) closedByReload(next []entry) map[*minion]int {
	entryOf := func(cfg []entry, id string) (entry, bool) {
		for _, e := range cfg {
			if e.identity == id {
				return e, true
			}
		}
		return entry{}, false
	}
	owning := !slices.Equal(w.m.cfg, next)
	refusing := map[string]bool{}
	for _, hb := range w.upHubs() {
		for _, c := range hb.Clusters() {
			if len(c.Rejections) > 0 {
				refusing[c.Name] = true
			}
		}
	}
	out := map[*minion]int{}
	for _, ms := range []map[string]*minion{w.minions, w.seconds} {
		for id, mi := range ms {
			was, ok := entryOf(w.m.cfg, id)
			now, still := entryOf(next, id)
			if !ok || !mi.writesAnywhere() || (still && was == now && !(owning && refusing[was.name])) {
				continue
			}
			mi.mu.Lock()
			out[mi] = mi.ended
			mi.mu.Unlock()
		}
	}
	return out
}

// waitClosed waits until the streams closedByReload named have ended at their minions:
// settling must not take an answer of one of them for the minion's state.
func (w *rworld) waitClosed(closing map[*minion]int) {
	deadline := time.Now().Add(settleTimeout)
	for mi, ended := range closing {
		for time.Now().Before(deadline) {
			mi.mu.Lock()
			done := mi.ended > ended
			mi.mu.Unlock()
			if done {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// waitCommitted waits until r's state file has committed what is queued, unless its disk
// fails.
func (w *rworld) waitCommitted(r *replica, hb *hub.Hub) {
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		st := hb.StateStatus()
		if !st.Open || st.Failing || st.Queued == 0 || r.diskFull.Load() {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// answered: mi's current stream, to whichever replica, has been answered for every
// collection at its current version, or its last stream was refused.
func (mi *minion) answeredAnywhere() bool {
	mi.mu.Lock()
	defer mi.mu.Unlock()
	if mi.refused {
		return true
	}
	if mi.to == "" {
		return false
	}
	for c, v := range mi.want {
		if a, ok := mi.answered[c]; !ok || a < v {
			return false
		}
	}
	return true
}

// writesAnywhere: a replica takes mi's pushes (its current stream has been answered).
func (mi *minion) writesAnywhere() bool {
	mi.mu.Lock()
	defer mi.mu.Unlock()
	return !mi.refused && mi.to != "" && len(mi.answered) > 0
}

// waitWrites waits until a replica takes mi's pushes, unless its cluster is no configured
// one's.
func (w *rworld) waitWrites(mi *minion) error {
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		if mi.writesAnywhere() || w.m.clusterOf(mi.id) == nil {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("minion %s did not take over its cluster within %v once the other stopped", mi.id, settleTimeout)
}

// heldNow are the deletions the breakers of the replicas that are up hold.
func (w *rworld) heldNow() map[key]string {
	out := map[key]string{}
	for _, hb := range w.upHubs() {
		maps.Copy(out, heldNames(hb))
	}
	return out
}

// protectedAt is what replica r's sinks may not lose: the model's protection, with the
// removals r has not had confirmed, and without what a removal confirmed at r took.
func (w *rworld) protectedAt(r string) map[key]prot {
	m := w.m
	saved, savedAcc := m.removed, m.acc
	m.removed = w.removedAt[r]
	m.acc = map[string]map[key]int{}
	for id, acc := range savedAcc {
		if !w.forgot[r][id] {
			m.acc[id] = acc
		}
	}
	defer func() { m.removed, m.acc = saved, savedAcc }()
	out := m.protected()
	for k := range w.releasedAt[r] {
		delete(out, k)
	}
	return out
}

// protectedFor is what a sink on replica index i may not lose (-1: on none, the
// protection of every replica together).
func (w *rworld) protectedFor(i int) map[key]prot {
	if i >= 0 {
		return w.protectedAt(w.reps[i].name)
	}
	out := map[key]prot{}
	for _, r := range w.reps {
		for k, p := range w.protectedAt(r.name) {
			if _, ok := out[k]; !ok || !p.lenient {
				out[k] = p
			}
		}
	}
	return out
}

// allowedAt is what replica r may serve beyond what it protects: held deletions (any
// replica's, now or before, while some replica serves them), its departed copies, what
// either of two minions of an identity publishes, and what its peers protect.
func (w *rworld) allowedAt(r string) map[key]bool {
	out := map[key]bool{}
	for k := range w.heldNow() {
		out[k] = true
	}
	for k := range w.heldEver {
		out[k] = true
	}
	for _, rm := range w.removedAt[r] {
		for k := range rm.keys {
			out[k] = true
		}
	}
	for _, ks := range w.m.either {
		for k := range ks {
			out[k] = true
		}
	}
	for _, p := range w.reps {
		if p.name != r {
			for k := range w.protectedAt(p.name) {
				out[k] = true
			}
		}
	}
	return out
}

// removalGone records that replica r no longer keeps cluster's removal rm (confirmed there,
// or lost with its state): it has nothing of that writer's any more, unless the
// configuration has the writer again; once no replica keeps it, the removal is gone.
func (w *rworld) removalGone(r, cluster string, rm removal) {
	delete(w.removedAt[r], cluster)
	if w.m.clusterOf(rm.identity) == nil {
		w.forgot[r][rm.identity] = true
	}
	for _, rs := range w.removedAt {
		if _, still := rs[cluster]; still {
			return
		}
	}
	delete(w.m.removed, cluster)
}

// removalsFromPeers is what a replica started without the removals its state file kept
// (lost: those its start lost; all of them in an empty state directory) knows of them:
// only the departed copies its running peers keep (replicas do not share operators'
// decisions, so one whose only peers confirmed a removal has it confirmed too).
func (w *rworld) removalsFromPeers(r *replica, lost func(cluster string) bool) {
	for name, rm := range w.removedAt[r.name] {
		if !lost(name) {
			continue
		}
		kept := false
		for _, p := range w.reps {
			if _, ok := w.removedAt[p.name][name]; ok && p != r && p.running() != nil {
				kept = true
			}
		}
		if !kept {
			w.removalGone(r.name, name, rm)
		}
	}
}

// expectReady reports whether replica r, up and not ready, should become ready: every
// cluster it waits for has synced on a peer that is up, whose copy it can follow or take.
func (w *rworld) expectReady(r *replica, hb *hub.Hub) bool {
	synced := map[string]bool{}
	for _, p := range w.reps {
		if ph := p.running(); p != r && ph != nil {
			for _, c := range ph.Clusters() {
				// A departed cluster's copy is offered as it was restored (it has no session);
				// one whose state the peer does not know whole, or that an operator's decision
				// there changed, is not offered at all.
				if c.Synced && c.Unknown == "" && c.Decided == "" && (!c.Restored || c.Departed != nil) {
					synced[c.Name] = true
				}
			}
		}
	}
	for _, c := range hb.Clusters() {
		if !c.Synced && !synced[c.Name] { // a departed copy held back is waited for too
			return false
		}
	}
	return true
}

// settle waits until the step's effects have spread: every running minion answered (its
// state is then the model's), every replica that should be ready ready, and every ready
// replica serving what the model allows, with every sink holding what its replica serves.
// It returns what is still amiss at the deadline; a replica serving what the model does not
// allow then is a violation.
func (w *rworld) settle(step int) string {
	deadline := time.Now().Add(settleTimeout)
	for {
		var amiss []string
		for _, id := range minionNames {
			if w.m.running[id] && !w.minions[id].answeredAnywhere() {
				amiss = append(amiss, "minion "+id+" not answered")
			}
			if w.m.second[id] && !w.seconds[id].answeredAnywhere() {
				amiss = append(amiss, "minion "+id+"'s second not answered")
			}
			// The only minion of a configured identity writes its cluster in the end: a
			// refusal for competing with a writer that is gone (a dead replica's session
			// not yet noticed, damping) is not its answer.
			if only := w.onlyMinion(id); only != nil && !only.writesAnywhere() {
				amiss = append(amiss, "minion "+id+" not writing, alone")
			}
		}
		if len(amiss) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return strings.Join(amiss, "; ")
		}
		time.Sleep(time.Millisecond)
	}
	for _, id := range minionNames {
		published := true
		switch {
		case w.m.second[id] && w.m.running[id]:
			w.m.publishedByTwo(id)
		case w.m.second[id] && w.seconds[id].writesAnywhere():
			w.m.published(id, w.m.src2[id])
		case w.m.running[id]:
			w.m.published(id, w.m.src[id])
		default:
			published = false
		}
		if published && w.m.clusterOf(id) != nil {
			for _, f := range w.forgot {
				delete(f, id) // the writer publishes anew: what it publishes is protected everywhere
			}
			for _, rel := range w.releasedAt {
				for k := range w.m.pub[id] {
					delete(rel, k)
				}
			}
		}
	}
	for k := range w.heldNow() {
		w.heldEver[k] = true
	}
	wait := time.Millisecond
	for {
		var amiss, wrong []string
		served := map[int]sinkState{}
		for i, r := range w.reps {
			hb := r.running()
			if hb == nil {
				continue
			}
			if !hb.Ready() {
				if w.expectReady(r, hb) {
					amiss = append(amiss, fmt.Sprintf("replica %s not ready, though its peers have every cluster it waits for", r.name))
				}
				continue
			}
			st, err := w.probeAt(r.serveAddr(), time.Until(deadline)+time.Second)
			if errors.Is(err, errNotServing) {
				continue // its sinks keep what they hold (a cluster it does not know: unknown)
			}
			if err != nil {
				amiss = append(amiss, fmt.Sprintf("replica %s: %v", r.name, err))
				continue
			}
			served[i] = st
			if d := mismatch(st, w.protectedAt(r.name), w.allowedAt(r.name), w.m.loose); d != "" {
				wrong = append(wrong, fmt.Sprintf("replica %s serves what the model does not allow: %s", r.name, d))
			}
		}
		for i, s := range w.sinks {
			at := w.sinkAt(i)
			if st, ok := served[at]; ok {
				if d := diff(s.snapshot(), st); d != "" {
					amiss = append(amiss, fmt.Sprintf("%s (against what replica %s serves): %s", s.name, w.reps[at].name, d))
				}
			}
		}
		if len(amiss) == 0 && len(wrong) == 0 {
			w.forgetApplied(served)
			return ""
		}
		if time.Now().After(deadline) {
			for _, msg := range wrong {
				w.fail(step, "%s", msg)
			}
			return strings.Join(amiss, "\n  ")
		}
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// forgetApplied drops from heldEver what no replica holds or serves any more.
func (w *rworld) forgetApplied(served map[int]sinkState) {
	held := w.heldNow()
	for k := range w.heldEver {
		if _, ok := held[k]; ok {
			continue
		}
		gone := len(served) == len(w.upHubs())
		for _, st := range served {
			if _, ok := st[k]; ok {
				gone = false
			}
		}
		if gone {
			delete(w.heldEver, k)
		}
	}
}

// check compares what each sink received during step i with what its replica protected
// before and after it, and each replica's held deletions with what is published.
func (w *rworld) check(i int, before map[*sink]map[key]prot) {
	for j, s := range w.sinks {
		after := w.protectedFor(w.sinkAt(j))
		for _, c := range s.takeChanges() {
			pb, okb := before[s][c.k]
			pa, oka := after[c.k]
			if !okb || !oka {
				continue
			}
			switch {
			case c.version == "":
				w.fail(i, "%s lost %s, which %s's writer published before and after the step (v%d, v%d)", s.name, c.k, pa.cluster, pb.version, pa.version)
			case !pb.lenient && !pa.lenient && pb.version == pa.version && versionOf(c.version) != pa.version:
				w.fail(i, "%s got %s at %s while %s's writer published v%d throughout the step", s.name, c.k, c.version, pa.cluster, pa.version)
			}
		}
	}
	for _, r := range w.reps {
		hb := r.running()
		if hb == nil {
			continue
		}
		after := w.protectedAt(r.name)
		for k, holder := range heldNames(hb) {
			if p, ok := after[k]; ok && !p.lenient && p.cluster == holder {
				w.fail(i, "replica %s holds the deletion of %s, which %s's writer publishes (v%d)", r.name, k, p.cluster, p.version)
			}
		}
	}
}

// runReplicaSequence runs a replica world's script (`replicas N` first) against a new
// world in dir and returns the violations, stopping at the first step that has any.
func runReplicaSequence(dir string, events []event) (vs []violation, failed int, h *harness) {
	n := 0
	if len(events) > 0 && events[0].op == "replicas" {
		n, _ = strconv.Atoi(events[0].args[0])
	}
	if n < 1 || n > len(replicaNames) {
		h = newHarness(dir)
		h.close()
		h.fail(0, "a replica world's script starts with `replicas N`, N from 1 to %d", len(replicaNames))
		return h.violations, 0, h
	}
	w := newReplicaWorld(dir, n)
	defer w.close()
	if err := w.startGroup(); err != nil {
		w.fail(0, "start: %v", err)
		return w.violations, 0, w.harness
	}
	for i, e := range events {
		if i == 0 {
			continue
		}
		if e.op != "put" && e.op != "start" {
			w.startSinks() // the prelude is over
		}
		w.step.Store(int64(i))
		w.log.mark(i, e)
		began := time.Now()
		before := map[*sink]map[key]prot{}
		for j, s := range w.sinks {
			before[s] = w.protectedFor(w.sinkAt(j))
		}
		if err := w.do(e); err != nil {
			w.fail(i, "%s: %v", e, err)
			return w.violations, i, w.harness
		}
		if amiss := w.settle(i); amiss != "" {
			w.fail(i, "after %q, not settled in %v:\n  %s", e, settleTimeout, amiss)
		}
		w.check(i, before)
		if ready := true; len(w.sinks) == 0 {
			for _, r := range w.reps {
				ready = ready && (r.running() == nil || r.ready())
			}
			if ready {
				w.startSinks()
			}
		}
		if *trace {
			fmt.Fprintf(os.Stderr, "step %d: %s (%v)\n%s", i, e, time.Since(began).Round(time.Millisecond), w.describe())
		}
		if len(w.violations) > 0 {
			w.log.Write([]byte("the world at the failure:\n" + w.describe()))
			return w.violations, i, w.harness
		}
	}
	return nil, len(events), w.harness
}

// describe is the replica world after a step, for -invariant.trace and a failure's report.
func (w *rworld) describe() string {
	var b strings.Builder
	for _, r := range w.reps {
		hb := r.running()
		if hb == nil {
			fmt.Fprintf(&b, "  replica %s down\n", r.name)
			continue
		}
		fmt.Fprintf(&b, "  replica %s ready %v, held %v\n", r.name, hb.Ready(), sortedKeys(heldNames(hb)))
		for _, c := range hb.Clusters() {
			by := ""
			if c.HeldBy != nil {
				by = fmt.Sprintf("%s@%d", c.HeldBy.Replica, c.HeldBy.Epoch)
			}
			fmt.Fprintf(&b, "    cluster %s: connected %v synced %v restored %v departed %v held by %q resources %v\n",
				c.Name, c.Connected, c.Synced, c.Restored, c.Departed != nil, by, c.Resources)
		}
	}
	var rem []string
	for r, at := range w.removedAt {
		for c := range at {
			rem = append(rem, r+":"+c)
		}
	}
	sort.Strings(rem)
	fmt.Fprintf(&b, "  protected %d, removed (replica:cluster) %v, held before %v\n", len(w.m.protected()), rem, sortedKeys(w.heldEver))
	for i, s := range w.sinks {
		st := s.snapshot()
		var items []string
		for _, k := range sortedKeys(st) {
			items = append(items, k.String()+"@"+st[k])
		}
		at := "none"
		if j := w.sinkAt(i); j >= 0 {
			at = w.reps[j].name
		}
		fmt.Fprintf(&b, "  %s on %s: %s\n", s.name, at, strings.Join(items, ", "))
	}
	return b.String()
}

// TestInvariantReplicasScriptForms: the replica world's events parse, and a script of it
// runs in it.
func TestInvariantReplicasScriptForms(t *testing.T) {
	events, err := parseScript("replicas 3\nkill a\nboot a\nrestart b\nwipe c\ndisk c full\nreadonly a on\ndamage b zero 1\nrelease holder east\nrelease each west\nrelease c east\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 11 {
		t.Fatalf("%d events", len(events))
	}
	for _, bad := range []string{"kill", "boot a b", "release a b c", "replicas"} {
		if _, err := parseScript(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
