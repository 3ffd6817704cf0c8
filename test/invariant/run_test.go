package invariant

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// settleTimeout bounds how long a step may take to settle: the minions answered, the
// sinks holding what the model says. A step that does not settle in it fails.
const settleTimeout = 10 * time.Second

// do applies event e to the world and to the model.
func (h *harness) do(e event) error {
	m := h.m
	switch e.op {
	case "put", "del":
		id, k := e.args[0], key{e.args[1], e.args[2]}
		v := -1
		if e.op == "put" {
			m.version++
			v = m.version
			m.src[id][k] = v
		} else {
			delete(m.src[id], k)
		}
		if m.running[id] {
			h.minions[id].set(k, v)
		}
	case "empty":
		id := e.args[0]
		if len(m.src[id]) > 0 {
			m.saved[id] = m.src[id]
			m.src[id] = map[key]int{}
		}
		if m.running[id] {
			h.minions[id].replace(m.src[id])
		}
	case "restore":
		id := e.args[0]
		for k, v := range m.saved[id] {
			if _, ok := m.src[id][k]; !ok {
				m.src[id][k] = v
			}
		}
		m.saved[id] = nil
		if m.running[id] {
			h.minions[id].replace(m.src[id])
		}
	case "stop":
		m.running[e.args[0]] = false
		h.minions[e.args[0]].halt()
		if m.second[e.args[0]] { // the second, refused while this one wrote, takes over
			h.seconds[e.args[0]].mayWriteNow()
			return h.waitWrites(h.seconds[e.args[0]])
		}
	case "start":
		m.running[e.args[0]] = true
		h.minions[e.args[0]].start(m.src[e.args[0]])
	case "cut":
		h.minions[e.args[0]].cutStream()
	case "second":
		// A second minion with the identity's certificate starts (publishing a state of its
		// own: a copied Secret in another deployment) or stops.
		id := e.args[0]
		if m.second[id] {
			m.second[id] = false
			h.seconds[id].halt()
			// The first, refused while the second wrote, takes over at its next attempt:
			// only an answer or a refusal after this settles it.
			if m.running[id] {
				h.minions[id].mayWriteNow()
				return h.waitWrites(h.minions[id])
			}
			break
		}
		seed, _ := strconv.Atoi(e.args[1])
		src := m.secondStarts(id, seed)
		h.seconds[id].start(src)
	case "crash", "restart":
		h.heldAcrossRestart()
		h.stopHub(e.op == "crash")
		return h.restarted(h.startHub())
	case "damage":
		h.heldAcrossRestart()
		h.stopHub(true)
		seed, _ := strconv.Atoi(e.args[1])
		if err := damage(statePath(h.dir), e.args[0], seed); err != nil {
			return err
		}
		return h.restarted(h.startHub())
	case "disk":
		h.diskFull.Store(e.args[0] == "full")
	case "readonly":
		h.readonly.Store(e.args[0] == "on")
	case "reload":
		next := m.next(e)
		if next == nil {
			return nil
		}
		cfg, err := h.config(next)
		if err != nil {
			return nil // a configuration the hub refuses to parse (two clusters owning one namespace)
		}
		ended := h.endedStreams()
		res, err := h.hub.Reload(cfg)
		if err != nil {
			return nil // refused: the running configuration stays
		}
		m.reconfigure(next)
		m.withdrawn(heldNames(h.hub))
		// The streams the reload closed end at the minions soon after: settling must not
		// take an answer of one of them for the minion's state. A minion refused before may
		// be admitted now: only a refusal after the reload settles it.
		h.waitEnded(ended + res.ClosedIngest)
		for _, ms := range []map[string]*minion{h.minions, h.seconds} {
			for _, mi := range ms {
				mi.mayWriteNow()
			}
		}
	case "release":
		// The operator reviews what the breaker holds, then releases that.
		unknown := false
		for _, c := range h.hub.Clusters() {
			unknown = unknown || c.Name == e.args[0] && c.Unknown != ""
		}
		if _, err := h.hub.ReleaseBreaker(e.args[0], "spiffe://test/operator/model", reviewedDigest(h.hub, e.args[0])); err == nil {
			if unknown {
				// The operator accepted what the hub read of a cluster whose last state was
				// unknown: its writer's objects are the operator's decision until it
				// publishes again.
				for _, c := range m.cfg {
					// The released one may be a name the configuration no longer has (a
					// rename the state file lost departs it at the start): its minion's
					// objects, under whatever name, are the operator's decision too.
					if c.name == e.args[0] || c.identity == e.args[0] {
						m.acc[c.identity] = map[key]int{}
						m.loose[c.ns] = true
					}
				}
				if r, ok := m.removed[e.args[0]]; ok {
					// A removed one (departed, unknown: its records damaged) stays kept, now
					// with what was read of it (the hub confirms its removal only at a
					// second release): what it had is the operator's decision too, also if
					// the configuration has it again.
					m.loose[homeNS[r.identity]] = true
					for k := range r.keys {
						m.loose[k.namespace()] = true
					}
				}
			}
			if r, ok := m.removed[e.args[0]]; ok {
				// The removal is confirmed: the hub has nothing of that writer's any more.
				delete(m.removed, e.args[0])
				if m.clusterOf(r.identity) == nil {
					m.acc[r.identity] = map[key]int{}
				}
			}
			m.withdrawn(heldNames(h.hub)) // what a reload's ownership withheld is gone too
		}
	case "advance":
		d, _ := time.ParseDuration(e.args[0])
		h.clock.advance(d)
		h.hub.Housekeep()
		h.waitCommitted() // time passes for the state file too
	default:
		return fmt.Errorf("unknown event %q", e)
	}
	return nil
}

// settle waits until every running minion has had its current state answered (what it
// published is then the model's) and, if the hub serves sinks, every sink holds what the
// hub serves now (a new full-state sink's first pushes: the probe); it returns what is
// still amiss at the deadline, and what the hub serves is then checked against the model.
func (h *harness) settle(step int) string {
	deadline := time.Now().Add(settleTimeout)
	for {
		var amiss []string
		for _, id := range minionNames {
			ingest := h.ingest.Load().(string)
			if h.m.running[id] && !h.minions[id].settled(ingest) {
				amiss = append(amiss, "minion "+id+" not answered")
			}
			if h.m.second[id] && !h.seconds[id].settled(ingest) {
				amiss = append(amiss, "minion "+id+"'s second not answered")
			}
			// The only minion of a configured identity writes its cluster in the end: a
			// refusal for competing with a writer that is gone (its stream's end not yet
			// seen, damping) is not its answer.
			if only := h.onlyMinion(id); only != nil && !only.writes(ingest) {
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
		// The cluster's writer is whichever of the identity's minions the hub takes.
		switch ingest := h.ingest.Load().(string); {
		case h.m.second[id] && h.m.running[id]:
			h.m.publishedByTwo(id)
		case h.m.second[id] && h.seconds[id].writes(ingest):
			h.m.published(id, h.m.src2[id])
		case h.m.running[id]:
			h.m.published(id, h.m.src[id])
		}
	}
	if !h.hub.Ready() {
		return ""
	}
	served, err := h.probe(time.Until(deadline))
	if errors.Is(err, errNotServing) {
		return "" // the sinks keep what they hold: the changes they received are checked
	}
	if err != nil {
		return err.Error()
	}
	for {
		var amiss []string
		for _, s := range h.sinks {
			if d := diff(s.snapshot(), served); d != "" {
				amiss = append(amiss, s.name+" (against what the hub serves): "+d)
			}
		}
		if len(amiss) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return strings.Join(amiss, "\n  ")
		}
		time.Sleep(time.Millisecond)
	}
	if d := mismatch(served, h.m.protected(), h.allowed(), h.m.loose); d != "" {
		h.fail(step, "the hub serves what the model does not allow: %s", d)
	}
	return ""
}

// allowed are the objects a sink may hold beyond the protected ones: deletions the hub's
// breakers hold, and what removed clusters had.
func (h *harness) allowed() map[key]bool {
	out := map[key]bool{}
	for k := range heldNames(h.hub) {
		out[k] = true
	}
	for _, r := range h.m.removed {
		for k := range r.keys {
			out[k] = true
		}
	}
	for _, ks := range h.m.either {
		for k := range ks {
			out[k] = true
		}
	}
	for k := range h.m.stale {
		out[k] = true
	}
	return out
}

// check compares what the sinks received during step i with what the model protected
// before and after it, and the hub's held deletions with what is published.
func (h *harness) check(i int, before map[key]prot) {
	after := h.m.protected()
	loose := h.stepLoose
	h.stepLoose = nil
	for _, s := range h.sinks {
		for _, c := range s.takeChanges() {
			pb, okb := before[c.k]
			pa, oka := after[c.k]
			if !okb || !oka || loose[c.k.namespace()] {
				continue
			}
			switch {
			case c.version == "":
				h.fail(i, "%s lost %s, which %s's writer published before and after the step (v%d, v%d)", s.name, c.k, pa.cluster, pb.version, pa.version)
			case !pb.lenient && !pa.lenient && pb.version == pa.version && versionOf(c.version) != pa.version:
				h.fail(i, "%s got %s at %s while %s's writer published v%d throughout the step", s.name, c.k, c.version, pa.cluster, pa.version)
			}
		}
	}
	if h.hub == nil {
		return
	}
	for k, holder := range heldNames(h.hub) {
		if p, ok := after[k]; ok && !p.lenient && p.cluster == holder {
			h.fail(i, "the hub holds the deletion of %s, which %s's writer publishes (v%d)", k, p.cluster, p.version)
		}
	}
}

func (h *harness) fail(step int, format string, args ...any) {
	h.violations = append(h.violations, violation{step: step, msg: fmt.Sprintf(format, args...)})
}

// runSequence runs events against a new world in dir and returns the violations, stopping
// at the first step that has any.
func runSequence(dir string, events []event) (vs []violation, failed int, h *harness) {
	h = newHarness(dir)
	defer h.close()
	if err := h.startHub(); err != nil {
		h.fail(0, "start: %v", err)
		return h.violations, 0, h
	}
	for i, e := range events {
		h.step.Store(int64(i))
		h.log.mark(i, e)
		before := h.m.protected()
		if err := h.do(e); err != nil {
			h.fail(i, "%s: %v", e, err)
			return h.violations, i, h
		}
		if amiss := h.settle(i); amiss != "" {
			h.fail(i, "after %q, not settled in %v:\n  %s", e, settleTimeout, amiss)
		}
		h.check(i, before)
		if *trace {
			fmt.Fprintf(os.Stderr, "step %d: %s\n%s", i, e, h.describe())
		}
		if len(h.violations) > 0 {
			return h.violations, i, h
		}
	}
	return nil, len(events), h
}

// report is a failing sequence as a script to keep, its violations and the hub's last log.
func report(events []event, failed int, vs []violation, h *harness) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the invariant failed at step %d (%s):\n", failed, events[failed])
	for _, v := range vs {
		fmt.Fprintf(&b, "  step %d: %s\n", v.step, v.msg)
	}
	b.WriteString("\nthe sequence (keep it as testdata/regressions/NAME.seq):\n")
	b.WriteString(formatScript(events[:failed+1]))
	b.WriteString("\nthe last lines logged:\n")
	h.log.dump(&b)
	return b.String()
}

// describe is the world after a step, for -invariant.trace.
func (h *harness) describe() string {
	var b strings.Builder
	if h.hub == nil {
		return "  hub down\n"
	}
	fmt.Fprintf(&b, "  hub ready %v, held %v\n", h.hub.Ready(), sortedKeys(heldNames(h.hub)))
	for _, c := range h.hub.Clusters() {
		fmt.Fprintf(&b, "  cluster %s: connected %v synced %v restored %v resources %v\n", c.Name, c.Connected, c.Synced, c.Restored, c.Resources)
	}
	prot := h.m.protected()
	fmt.Fprintf(&b, "  protected %d, removed %v\n", len(prot), h.m.removed)
	for _, s := range h.sinks {
		st := s.snapshot()
		var items []string
		for _, k := range sortedKeys(st) {
			items = append(items, k.String()+"@"+st[k])
		}
		fmt.Fprintf(&b, "  %s: %s\n", s.name, strings.Join(items, ", "))
	}
	return b.String()
}

// waitCommitted waits until the state file has committed what is queued, unless its disk
// fails.
func (h *harness) waitCommitted() {
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		st := h.hub.StateStatus()
		if !st.Open || st.Failing || st.Queued == 0 || h.diskFull.Load() {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// waitEnded waits until the minions have seen n of their admitted streams end.
func (h *harness) waitEnded(n int) {
	deadline := time.Now().Add(settleTimeout)
	for h.endedStreams() < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// waitWrites waits until the hub takes mi's pushes (a minion of an identity whose other
// minion stopped takes over once the hub has seen that one's stream end), unless mi's
// cluster is no configured one's.
func (h *harness) waitWrites(mi *minion) error {
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		if mi.writes(h.ingest.Load().(string)) || h.m.clusterOf(mi.id) == nil {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("minion %s did not take over its cluster within %v once the other stopped", mi.id, settleTimeout)
}

// onlyMinion is the one running minion of identity id whose cluster is configured (nil:
// none, or both of its minions run, or its cluster is not configured).
func (h *harness) onlyMinion(id string) *minion {
	switch {
	case h.m.clusterOf(id) == nil || h.m.running[id] == h.m.second[id]:
		return nil
	case h.m.running[id]:
		return h.minions[id]
	}
	return h.seconds[id]
}

// heldAcrossRestart records the deletions the hub holds before it stops (model.stale).
func (h *harness) heldAcrossRestart() {
	if h.hub == nil {
		return
	}
	for k := range heldNames(h.hub) {
		h.m.stale[k] = true
	}
}

// restarted brings the model up to what a restarted hub knows: a cluster that left the
// configuration is known only from the state file, and one the file lost (read as a whole,
// it could not be) is gone with it — a documented limit: its removal can no longer be
// confirmed, and its objects are withdrawn once the configured clusters are known again.
func (h *harness) restarted(err error) error {
	if err != nil {
		return err
	}
	listed := map[string]bool{}
	for _, c := range h.hub.Clusters() {
		listed[c.Name] = true
	}
	for name, r := range h.m.removed {
		if !listed[name] {
			delete(h.m.removed, name)
			if h.m.clusterOf(r.identity) == nil {
				h.m.acc[r.identity] = map[key]int{} // nothing of it is known any more
			}
		}
	}
	// The restart re-checks ownership as a reload does: what a cluster does not own and the
	// breaker does not hold again is gone (or was never read back: a file set aside).
	h.m.withdrawn(heldNames(h.hub))
	return nil
}
