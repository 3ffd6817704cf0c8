package hub

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
)

// The mass-deletion breaker. A source that suddenly reads empty (a watched directory
// emptied or renamed, informers losing their RBAC or CRDs, a wrong label selector) looks,
// on the wire, exactly like a cluster deleting everything; so does a hub configuration
// with an ownership typo. Deleting is what production meshes fear most from a control
// plane, so the hub holds deletions that withdraw more than a configured share of what a
// cluster serves (per collection, or in total) and keeps serving those objects until the
// cluster's state recovers (the objects come back) or an operator releases them.
//
// The evaluation runs in the store, under its lock, on the cluster's own writes only (its
// minion's or its stock source's sessions, Hub.Apply, and a reload's re-check): copies a
// replica follows from the replica holding the cluster carry that replica's decision.
//
// A push carries one collection. An emptied source withdraws every collection, one push
// each, and a cluster with a few objects in many collections withdraws fewer than
// minDeletes in each; so deletions that withdraw more than the share of their collection
// but fewer than minDeletes wait `settle` (they stay served) to see whether the cluster's
// total crosses the limit. Deletions within the share apply at once: an ordinary rollout
// is not delayed; nor is anything in a cluster serving fewer than minDeletes objects,
// which can never open it.

// BreakerConfig bounds how much of what a cluster serves its changes may withdraw.
type BreakerConfig struct {
	// MaxDeleteShare: deletions of more than this share (0 < share < 1) of what the
	// cluster serves, in one collection or in total, and at least MinDeletes objects, are
	// held.
	MaxDeleteShare float64 `json:"maxDeleteShare,omitempty"`
	// MinDeletes is the fewest deletions that can open the breaker.
	MinDeletes int `json:"minDeletes,omitempty"`
	// Settle is how long deletions of more than MaxDeleteShare of a collection, but fewer
	// than MinDeletes, wait (still served) for the cluster's other collections.
	Settle Duration `json:"settle,omitempty"`
	// Window is how far back the deletions the cluster already made count with a new one:
	// the share is judged on what it withdrew within the window, so a source losing a
	// little at a time (an informer losing its RBAC namespace by namespace) opens the
	// breaker as one losing it at once does. 0: each write alone.
	Window Duration `json:"window,omitempty"`
	// Disabled turns the breaker off (per cluster: for a cluster whose objects come and go in
	// bulk by design).
	Disabled bool `json:"disabled,omitempty"`
}

// over returns cfg with the fields o sets.
func (cfg BreakerConfig) over(o *BreakerConfig) BreakerConfig { return ops.Overlay(cfg, o) }

// check validates the fields set (field names the section).
func (cfg *BreakerConfig) check(field string) error {
	if cfg == nil {
		return nil
	}
	if cfg.MaxDeleteShare < 0 || cfg.MaxDeleteShare >= 1 {
		return fmt.Errorf("%s.maxDeleteShare: %g is not a share between 0 and 1 (0.5 holds deletions of more than half)", field, cfg.MaxDeleteShare)
	}
	if cfg.MinDeletes < 0 {
		return fmt.Errorf("%s.minDeletes: %d is negative", field, cfg.MinDeletes)
	}
	if err := cfg.Window.Check(field + ".window"); err != nil {
		return err
	}
	return cfg.Settle.Check(field + ".settle")
}

// ErrUnknownCluster and ErrNothingHeld are ReleaseBreaker's refusals, and so is a
// *HeldChangedError.
var (
	ErrUnknownCluster = errors.New("no such cluster in the hub's configuration")
	ErrNothingHeld    = errors.New("the cluster's breaker holds no deletions")
	// ErrNotDurable refuses an operator's decision the state file cannot keep now.
	ErrNotDurable = errors.New("the state file cannot keep the decision now, so a restart would undo it")
)

// HeldChangedError refuses a release whose operator reviewed other held deletions than the
// breaker holds now (deletions held since, or taken back by the cluster): a release applies
// exactly the diff its operator saw, or nothing.
type HeldChangedError struct {
	Reviewed, Now string // digests (api.Breaker.Digest)
	Held          int    // deletions held now
}

func (e *HeldChangedError) Error() string {
	if e.Reviewed == "" {
		return fmt.Sprintf("name the held deletions you reviewed: the breaker's digest (%s, %d held; hub breaker release shows them and passes it)", e.Now, e.Held)
	}
	return fmt.Sprintf("the held deletions changed since they were reviewed (digest %s then, %s now, %d held): review them again", e.Reviewed, e.Now, e.Held)
}

// heldDeletions is one cluster's breaker: the deletions it holds. Guarded by the store's
// lock (it is part of the cluster's stored state).
type heldDeletions struct {
	open   bool
	since  time.Time
	reason string
	// names: collection -> name -> the held deletion.
	names map[string]map[string]heldDeletion
	count int
	// applied are the cluster's deletions applied lately (its own, not held, or held and
	// then settled), oldest first: what BreakerConfig.Window counts.
	applied []appliedDeletions
}

// appliedDeletions are n deletions of collection applied at once.
type appliedDeletions struct {
	at         time.Time
	collection string
	n          int
}

// window returns the deletions applied within cfg.Window before now, in collection and in
// all, forgetting older ones.
func (b *heldDeletions) window(collection string, cfg BreakerConfig, now time.Time) (inColl, total int) {
	if cfg.Window.Duration <= 0 {
		b.applied = nil
		return 0, 0
	}
	i := 0
	for i < len(b.applied) && now.Sub(b.applied[i].at) >= cfg.Window.Duration {
		i++
	}
	b.applied = b.applied[i:]
	for _, a := range b.applied {
		total += a.n
		if a.collection == collection {
			inColl += a.n
		}
	}
	return inColl, total
}

// noteApplied records n deletions of collection applied at now (for the window).
func (b *heldDeletions) noteApplied(collection string, n int, now time.Time) {
	if n > 0 {
		b.applied = append(b.applied, appliedDeletions{at: now, collection: collection, n: n})
	}
}

type heldDeletion struct {
	until    time.Time // settling: applied then unless the breaker has opened; zero: held until released
	byReload bool      // withdrawn by a reload's ownership, not by the cluster
}

func (b *heldDeletions) hold(collection, name string, d heldDeletion) {
	if b.names == nil {
		b.names = map[string]map[string]heldDeletion{}
	}
	m := b.names[collection]
	if m == nil {
		m = map[string]heldDeletion{}
		b.names[collection] = m
	}
	if _, ok := m[name]; !ok {
		b.count++
	}
	m[name] = d
}

// unhold forgets a held deletion (the object came back, or left the store another way).
// A breaker that holds nothing is closed, however its deletions went (re-put, settled,
// dropped for staleness, removed with a copy): open with nothing held would say nothing
// true and alert forever.
func (b *heldDeletions) unhold(collection, name string) {
	if m := b.names[collection]; m != nil {
		if _, ok := m[name]; ok {
			delete(m, name)
			b.count--
			if len(m) == 0 {
				delete(b.names, collection)
			}
			if b.count == 0 {
				b.open, b.reason = false, ""
			}
		}
	}
}

// disable closes the breaker of a cluster whose configuration turned it off: what it
// holds settles at once (the next housekeeping applies it).
func (b *heldDeletions) disable(now time.Time) {
	b.open, b.reason = false, ""
	for _, m := range b.names {
		for n, hd := range m {
			hd.until = now
			m[n] = hd
		}
	}
}

func (b *heldDeletions) holds(collection, name string) bool {
	_, ok := b.names[collection][name]
	return ok
}

// explain says why the breaker holds collection/name's deletion ("" if it does not).
func (b *heldDeletions) explain(collection, name string) string {
	hd, ok := b.names[collection][name]
	if !ok {
		return ""
	}
	what := "its source deleted it"
	if hd.byReload {
		what = "the configuration no longer lets the cluster publish it"
	}
	if b.open {
		return fmt.Sprintf("%s, and the cluster's mass-deletion breaker holds the deletion (open: %s); it stays served until the cluster publishes it again or an operator releases the breaker", what, b.reason)
	}
	return fmt.Sprintf("%s; the deletion waits until %s to see whether the breaker opens (it stays served meanwhile)", what, hd.until.UTC().Format(time.RFC3339))
}

// digest names the set of held deletions (not when each settles): what an operator
// reviewed, which a release must match. "" when nothing is held.
func (b *heldDeletions) digest() string {
	if b.count == 0 {
		return ""
	}
	h := sha256.New()
	for _, c := range slices.Sorted(maps.Keys(b.names)) {
		for _, n := range slices.Sorted(maps.Keys(b.names[c])) {
			h.Write([]byte(c))
			h.Write([]byte{0})
			h.Write([]byte(n))
			h.Write([]byte{0})
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// exceeded returns why the held deletions, with those applied within the window, exceed
// cfg against what the cluster serves (colls, which still holds the held ones) and served
// before the window's deletions, or "".
func (b *heldDeletions) exceeded(colls map[string]map[string]*resource, cfg BreakerConfig, now time.Time) string {
	_, recent := b.window("", cfg, now)
	gone := b.count + recent
	if gone < cfg.MinDeletes || b.count == 0 {
		return ""
	}
	pct := fmt.Sprintf("more than %g%%", cfg.MaxDeleteShare*100)
	total := served(colls) + recent
	within := ""
	if recent > 0 {
		within = fmt.Sprintf(", %d of them already deleted within %s", recent, cfg.Window.Duration)
	}
	if float64(gone) > cfg.MaxDeleteShare*float64(total) {
		return fmt.Sprintf("%d of the %d objects it serves would be deleted (%s, at least %d%s)", gone, total, pct, cfg.MinDeletes, within)
	}
	held := make([]string, 0, len(b.names))
	for c := range b.names {
		held = append(held, c)
	}
	sort.Strings(held)
	for _, c := range held {
		inColl, _ := b.window(c, cfg, now)
		n, of := len(b.names[c])+inColl, len(colls[c])+inColl
		if n >= cfg.MinDeletes && float64(n) > cfg.MaxDeleteShare*float64(of) {
			return fmt.Sprintf("%d of its %d %s would be deleted (%s, at least %d%s)", n, of, c, pct, cfg.MinDeletes, within)
		}
	}
	return ""
}

// trip opens the breaker: every held deletion waits for a release.
func (b *heldDeletions) trip(reason string, now time.Time) {
	b.open, b.since, b.reason = true, now, reason
	for _, m := range b.names {
		for n, d := range m {
			d.until = time.Time{}
			m[n] = d
		}
	}
}

// recover closes an open breaker whose held deletions no longer exceed the limits (the
// objects came back): what is still held is then like an ordinary change, and settles. A
// departed cluster's never does: its hold is not a share of what it serves but all of it,
// until an operator confirms (however few objects that is).
func (b *heldDeletions) recover(colls map[string]map[string]*resource, g *breakerGuard) bool {
	if !b.open || g.departed || b.exceeded(colls, g.cfg, g.now) != "" {
		return false
	}
	b.open, b.reason = false, ""
	for _, m := range b.names {
		for n, hd := range m {
			hd.until = g.now.Add(g.cfg.Settle.Duration)
			m[n] = hd
		}
	}
	return true
}

// breakerGuard is what the store needs to judge a cluster's write.
type breakerGuard struct {
	cfg BreakerConfig
	now time.Time
	// departed: the cluster left the configuration (departure.go); a re-check holds all it
	// had whatever the limits, until an operator confirms.
	departed bool
}

// breakerVerdict is what the breaker did to one write.
type breakerVerdict struct {
	withheld []string // names of the write's deletions held (still served)
	reload   int      // a reload's re-check: the refusals it held
	open     bool     // the breaker is open after the write
	tripped  string   // the write opened it: why
	closed   bool     // the write closed it (the cluster's state recovered)
	count    int      // deletions held after the write
}

// judgeLocked decides which of removing (names the cluster holds in collection, which a
// write withdraws) apply now; the rest are held. put are the names the write (re)puts. The
// caller holds the store's lock.
func (d *clusterData) judgeLocked(collection string, put []*resource, removing []string, g *breakerGuard) (apply []string, v breakerVerdict) {
	b := &d.held
	for _, r := range put {
		b.unhold(collection, r.name)
	}
	if g == nil || g.cfg.Disabled {
		for _, n := range removing {
			b.unhold(collection, n)
		}
		if g != nil && b.count > 0 {
			b.disable(g.now)
		}
		v.open, v.count = b.open, b.count
		return removing, v
	}
	v.closed = b.recover(d.colls, g)
	var fresh []string
	for _, n := range removing {
		hd, held := b.names[collection][n]
		switch {
		case held && hd.byReload:
			// The cluster deletes what a reload's ownership withheld: it is the cluster's
			// deletion now, which a reload allowing the object again must not undo.
			hd.byReload = false
			b.names[collection][n] = hd
			v.withheld = append(v.withheld, n)
		case held:
			v.withheld = append(v.withheld, n)
		default:
			fresh = append(fresh, n)
		}
	}
	// A rename (as many new names as old ones withdrawn) withdraws nothing that is
	// served: what counts is the write's net withdrawal.
	added := 0
	for _, r := range put {
		if d.colls[collection][r.name] == nil {
			added++
		}
	}
	net := max(len(fresh)-added, 0)
	// What the cluster deleted within the window counts with this write, against what it
	// served before (issue 25, finding 9: a drain of 45% a step never tripped).
	inColl, recent := b.window(collection, g.cfg, g.now)
	switch {
	case len(fresh) == 0:
	case b.open:
		for _, n := range fresh {
			b.hold(collection, n, heldDeletion{})
		}
		v.withheld = append(v.withheld, fresh...)
	case float64(len(b.names[collection])+net+inColl) > g.cfg.MaxDeleteShare*float64(len(d.colls[collection])+inColl) &&
		served(d.colls)+recent >= g.cfg.MinDeletes: // a cluster serving fewer could never open it
		for _, n := range fresh {
			b.hold(collection, n, heldDeletion{until: g.now.Add(g.cfg.Settle.Duration)})
		}
		if why := b.exceeded(d.colls, g.cfg, g.now); why != "" {
			b.trip(why, g.now)
			v.tripped = why
			v.withheld = append(v.withheld, fresh...)
		} else if g.cfg.Settle.Duration <= 0 {
			for _, n := range fresh {
				b.unhold(collection, n)
			}
			apply = fresh
		} else {
			v.withheld = append(v.withheld, fresh...)
		}
	default:
		apply = fresh
	}
	b.noteApplied(collection, len(apply), g.now)
	v.open, v.count = b.open, b.count
	return apply, v
}

// settleLocked returns the held deletions whose settling time has passed, by collection,
// and forgets them; none while the breaker is open. The caller holds the store's lock.
func (d *clusterData) settleLocked(now time.Time) map[string][]string {
	b := &d.held
	if b.open || b.count == 0 {
		return nil
	}
	var due map[string][]string
	for c, m := range b.names {
		for n, hd := range m {
			if !hd.until.IsZero() && !now.Before(hd.until) {
				if due == nil {
					due = map[string][]string{}
				}
				due[c] = append(due[c], n)
			}
		}
	}
	for c, names := range due {
		sort.Strings(names)
		for _, n := range names {
			b.unhold(c, n)
		}
		b.noteApplied(c, len(names), now)
	}
	return due
}

// status is the breaker as the admin API shows it, or nil when it holds nothing. The
// caller holds the store's lock.
func (b *heldDeletions) status() *api.Breaker {
	if b.count == 0 && !b.open {
		return nil
	}
	st := &api.Breaker{Open: b.open, Reason: b.reason, Held: b.count, Digest: b.digest(), Pending: map[string][]string{}}
	if b.open {
		t := b.since
		st.Since = &t
	}
	for c, m := range b.names {
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		if len(names) > maxListedHeld {
			names = names[:maxListedHeld]
		}
		st.Pending[c] = names
	}
	return st
}

// maxListedHeld bounds the names listed per collection in status and in a NACK.
const maxListedHeld = 100

// served counts the objects of colls.
func served(colls map[string]map[string]*resource) int {
	n := 0
	for _, m := range colls {
		n += len(m)
	}
	return n
}

// heldRejections reports a write's held deletions to its source as rejections (at most
// maxListedHeld by name).
func heldRejections(cluster, collection string, names []string) []mcp.Rejection {
	if len(names) == 0 {
		return nil
	}
	reason := fmt.Sprintf("deletion held: the hub's mass-deletion breaker for cluster %q is open; the object stays served until it comes back or an operator releases the breaker (hub breaker release %s)", cluster, cluster)
	out := make([]mcp.Rejection, 0, min(len(names), maxListedHeld))
	for _, n := range names[:min(len(names), maxListedHeld)] {
		out = append(out, mcp.Rejection{Resource: n, Reason: reason, Held: true})
	}
	return out
}

// breakerChanged records what the breaker did to a write of cs: a log line when it opens
// or closes, and its metrics.
func (h *Hub) breakerChanged(cs *clusterState, collection string, v breakerVerdict) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.removed {
		return
	}
	switch {
	case v.tripped != "":
		h.metrics.breakerTripped(cs.name)
		h.note(api.Event{Kind: api.EventBreaker, Cluster: cs.name, Collection: collection, Reason: api.ReasonTripped,
			Message: fmt.Sprintf("mass-deletion breaker opened (%s): %d deletions held; release with `hub breaker release %s` once intended", v.tripped, v.count, cs.name)})
		cs.log.Warn("mass-deletion breaker opened: the cluster's deletions are held and its objects stay served; release it with `hub breaker release` once the deletions are intended",
			"reason", v.tripped, "collection", collection, "held", v.count)
	case v.closed:
		cs.log.Info("mass-deletion breaker closed: the cluster's state recovered", "still_settling", v.count)
		h.note(api.Event{Kind: api.EventBreaker, Cluster: cs.name, Collection: collection, Reason: api.ReasonClosed, Message: "mass-deletion breaker closed: the cluster's state recovered"})
	}
	h.metrics.breaker(cs.name, v.open, v.count)
}

// settleBreakers applies the held deletions whose settling time has passed (the breaker
// did not open meanwhile).
func (h *Hub) settleBreakers() {
	now := h.now()
	for _, cs := range h.clusterList() {
		if n := h.store.settle(cs.data, now); len(n) > 0 {
			cs.log.Info("held deletions applied: the breaker did not open", "deleted", n)
			h.breakerRefresh(cs)
		}
	}
}

// breakerRefresh sets cs's breaker metrics from the store.
func (h *Hub) breakerRefresh(cs *clusterState) {
	st := h.store.breaker(cs.data)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.removed {
		return
	}
	if st == nil {
		h.metrics.breaker(cs.name, false, 0)
		return
	}
	h.metrics.breaker(cs.name, st.Open, st.Held)
}

// ReleaseBreaker applies every deletion cluster's breaker holds and closes it, on behalf
// of operator (logged), if they are those the operator reviewed: digest is the breaker's
// (api.Breaker.Digest) as shown to the operator. ErrUnknownCluster, ErrNothingHeld,
// ErrNotDurable and a *HeldChangedError refuse it.
func (h *Hub) ReleaseBreaker(cluster, operator, digest string) (rel api.BreakerRelease, err error) {
	cs := h.cluster(cluster)
	if cs == nil {
		return api.BreakerRelease{}, fmt.Errorf("%w: %q", ErrUnknownCluster, cluster)
	}
	// An operator's decision is on disk before it is reported done: a restart must not
	// restore what it withdrew. So the file is tried first, and a decision it could not
	// keep is not taken at all: taken, it would hold until the next restart and then be
	// undone, serving again, fleet-wide, what the operator withdrew.
	if why := h.keepableNow(cs); why != nil {
		return api.BreakerRelease{}, fmt.Errorf("cluster %q: %w: %v; nothing was released: release again once the state file is writable (meshfed_hub_state_file_failing is 0)", cluster, ErrNotDurable, why)
	}
	defer func() {
		if err != nil {
			return
		}
		// It failed between the try and now: taken, and said so.
		if why := h.flushState(); why != nil {
			rel.NotDurable = fmt.Sprintf("applied, but not on disk (%v): a restart before the state file is writable again serves again what it withdrew", why)
			cs.log.Warn("a breaker release is not on disk: a restart before the state file is writable again undoes it", "operator", operator, "err", why)
		}
	}()
	if rel, ok, err := h.releaseUnknown(cs, operator, digest); ok {
		return rel, err
	}
	if n := h.store.heldForTheConfiguration(cs.data); n > 0 {
		// The release withdraws what the cluster's writer did not delete: what this hub
		// holds of it becomes this operator's decision, which replicas do not share. Marked
		// (no peer may start following it), and the peers' streams following it from here
		// ended, before anything changes; unless the layer says the decision is the group's
		// (this hub holds the cluster's live session, which its followers follow). A release
		// refused below leaves the mark: its copy is offered again once a session delivers
		// the cluster, which costs nothing.
		h.decided(cs, fmt.Sprintf("operator %s released %d deletions the configuration made, not the cluster", operator, n))
		if h.layer.ClusterDecided(cluster) {
			h.decided(cs, "")
		}
	}
	deleted, err := h.store.release(cs.data, digest)
	if err != nil {
		return api.BreakerRelease{}, fmt.Errorf("cluster %q: %w", cluster, err)
	}
	total := 0
	for _, n := range deleted {
		total += n
	}
	cs.log.Warn("mass-deletion breaker released by an operator: its held deletions are applied", "operator", operator, "deleted", total, "by_collection", deleted)
	h.note(api.Event{Kind: api.EventBreaker, Cluster: cluster, Reason: api.ReasonReleased,
		Message: fmt.Sprintf("released by operator %s: %d held deletions applied", operator, total)})
	h.breakerRefresh(cs)
	defer h.resolicit() // the deletions free room
	if cs.isDeparted() && h.forgetDeparted(cluster) {
		cs.log.Info("departed cluster's removal confirmed by an operator: it is no longer kept", "operator", operator)
	}
	return api.BreakerRelease{Cluster: cluster, Operator: operator, Deleted: deleted}, nil
}
