package hub

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/tenancy"
	"github.com/meshfed/meshfed/mcp"
)

// resource is one accepted resource of one cluster.
type resource struct {
	cluster    string
	collection string
	name       string // namespace/name, or name when cluster-scoped
	namespace  string
	labels     map[string]string
	created    time.Time // zero when the source sent none
	version    string    // as the cluster sent it (resume uses it)
	hosts      []string  // the hosts it claims, as the ACL read them (a reload re-checks them)
	received   *mcp.Entry
	served     *mcp.Entry // with the origin annotation and a version qualified by the cluster
}

// newResource decodes what the hub needs from an entry as received and builds the served
// form once: the origin annotation added, the version qualified by the cluster (so a
// winner changing between clusters always changes the version a sink sees).
func newResource(cluster, collection string, e *mcp.Entry, r *mcpapi.Resource, hosts []string) (*resource, error) {
	md := r.GetMetadata()
	res := &resource{cluster: cluster, collection: collection, name: e.Name, labels: md.GetLabels(), version: e.Version, received: e, hosts: hosts}
	if ns, _, ok := strings.Cut(e.Name, "/"); ok {
		res.namespace = ns
	}
	if ct := md.GetCreateTime(); ct != nil {
		res.created = ct.AsTime()
	}
	served := proto.Clone(r).(*mcpapi.Resource)
	smd := served.GetMetadata()
	ann := make(map[string]string, len(smd.GetAnnotations())+1)
	for k, v := range smd.GetAnnotations() {
		ann[k] = v
	}
	ann[api.OriginAnnotation] = cluster
	smd.Annotations = ann
	smd.Version = cluster + "/" + e.Version
	var err error
	if res.served, err = mcp.NewEntry(served); err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	return res, nil
}

// clusterData is one configured cluster's accepted resources. A removed cluster's is marked
// removed, so a write from a session that outlived the removal cannot bring it back.
type clusterData struct {
	name    string
	colls   map[string]map[string]*resource // collection -> name -> resource
	removed bool
	held    heldDeletions    // deletions its breaker holds (their resources are still in colls)
	objects int              // how many resources colls holds
	bytes   int64            // what they add up to, as served (servedSize)
	coll    map[string]int64 // the same per collection (its share of the collection's bound)
	// usage is its tenant's (set under the store's mu; read without it to pick the write
	// path's turn).
	usage atomic.Pointer[tenantUsage]
}

// errRemoved refuses a write to a cluster that has left the configuration.
var errRemoved = errors.New("the cluster is no longer in the hub's configuration")

// store is the hub's state: every cluster's accepted resources, the merged index of their
// collections (merge.go), and the views routing subsets are served from (views.go). Each
// part is brought up to date in the same step, under one lock, so a sink never sees a
// state the store did not have. A change costs O(changed names × views). It also counts
// what each tenant holds, and keeps each tenant's load on the hub (tenant_limits.go).
type store struct {
	log         *slog.Logger
	collections []string
	metrics     *Metrics
	// changed, if set, is told every change of a cluster's resources as received (a Layer's
	// StateChanged), under mu and in order.
	changed func(cluster, collection string, put []*mcp.Entry, removed []string)
	// movedAway, if set, is told the resources a rename moved away from a cluster's old
	// name (the state file's report, not the layer's: see transfer), under mu.
	movedAway func(cluster, collection string, removed []string)

	mu       sync.Mutex // guards the following fields; cache updates happen under it, in order
	clusters map[string]*clusterData
	policy   ConflictPolicy
	// index: collection -> name -> candidates, best first.
	index map[string]map[string][]*resource
	// conflicting counts the collection/names held by more than one cluster.
	conflicting int
	// views: tenant -> route key -> view; a write visits only the views of the tenants
	// that may see the writing cluster (publishLocked).
	views  map[string]map[string]*view
	nviews int
	// tenants is the tenancy the views are kept under (reroute replaces it).
	tenants *tenancy.Set
	// usage is what each tenant's clusters hold, all candidates (a bound on what its sinks
	// receive of its own clusters).
	usage map[string]*tenantUsage

	// gate orders the writers (apply) by tenant before they take mu, when there are several
	// tenants (tenanted): one tenant's queue of writers does not hold another's back.
	gate     *fairGate
	tenanted atomic.Bool
	load     *tenantLoad
}

func newStore(collections []string, policy ConflictPolicy, tenants *tenancy.Set, log *slog.Logger, m *Metrics,
	changed func(cluster, collection string, put []*mcp.Entry, removed []string)) *store {
	return &store{log: log, collections: collections, policy: policy, tenants: tenants, metrics: m, changed: changed,
		clusters: map[string]*clusterData{}, index: map[string]map[string][]*resource{}, views: map[string]map[string]*view{},
		usage: map[string]*tenantUsage{}, gate: newFairGate(), load: newTenantLoad()}
}

// addCluster starts an empty store for a cluster of tenant joining the configuration ("" if
// the live configuration does not name it yet: retenant will).
func (s *store) addCluster(name, tenant string) *clusterData {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := &clusterData{name: name, colls: map[string]map[string]*resource{}, coll: map[string]int64{}}
	d.usage.Store(s.usageLocked(tenant))
	s.tenanted.Store(len(s.usage) > 1)
	s.clusters[name] = d
	return d
}

// removeCluster deletes what d holds, withdrawing it from the views, and marks d removed.
func (s *store) removeCluster(d *clusterData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d.removed = true
	if s.clusters[d.name] == d {
		delete(s.clusters, d.name)
	}
	for coll, held := range d.colls {
		touched := make(map[string]bool, len(held))
		for n, r := range held {
			s.dropCandidateLocked(r)
			s.countLocked(d, r, -1)
			touched[n] = true
		}
		// Every view: a reload may no longer say whose the cluster was (and the tenants
		// that saw it are few, removal rare).
		s.publishLocked(coll, touched, "")
	}
	d.colls = nil
}

// versions returns the versions, as received, of what the hub holds for cluster in
// collection: what the cluster's next stream declares so it resumes instead of resending.
// A name whose deletion the breaker holds is not declared: the cluster deleted it, so a
// source that has it again (a directory restored while the minion was away) sends it anew,
// which un-holds it, and the held deletions are judged again against the new session's
// whole state rather than kept open over objects the cluster publishes.
func (s *store) versions(cluster, collection string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	if d := s.clusters[cluster]; d != nil {
		for n, r := range d.colls[collection] {
			if !d.held.holds(collection, n) {
				out[n] = r.version
			}
		}
	}
	return out
}

// write is one change of a cluster's resources in a collection: put resources (accepted),
// remove names; with full, everything else the cluster holds in the collection is removed
// too, except the names in keep (resources whose new version was rejected keep their last
// accepted one). guard, when set, is the cluster's breaker limits: the cluster's own
// writes are judged by them, copies (and the staleness policy) are not.
type write struct {
	collection string
	put        []*resource
	remove     []string
	full       bool
	keep       map[string]bool
	guard      *breakerGuard
	quota      *quotaGuard // the cluster's bounds; nil for copies (already bounded where they were written)
}

// applied is what a write did.
type applied struct {
	lost    []api.Conflict // conflicts the write's put resources lose, by name
	held    int            // resources the cluster now holds in the collection
	breaker breakerVerdict
	refused []mcp.Rejection // put resources over a bound: not stored (a last accepted version stays)
}

// apply records a cluster's write, or returns errRemoved.
func (s *store) apply(d *clusterData, w write) (res applied, err error) {
	if s.tenanted.Load() {
		s.gate.enter(d.usage.Load().name)
		defer s.gate.leave()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.removed {
		return res, errRemoved
	}
	collection := w.collection
	have := d.colls[collection]
	if have == nil {
		have = map[string]*resource{}
		d.colls[collection] = have
	}
	var removing []string
	if w.full {
		listed := make(map[string]bool, len(w.put))
		for _, r := range w.put {
			listed[r.name] = true
		}
		for n := range have {
			if !listed[n] && !w.keep[n] {
				removing = append(removing, n)
			}
		}
		sort.Strings(removing)
	}
	for _, n := range w.remove {
		if have[n] != nil {
			removing = append(removing, n)
		}
	}
	removing, res.breaker = d.judgeLocked(collection, w.put, removing, w.guard)
	touched := map[string]bool{}
	var putReceived []*mcp.Entry
	removed := s.dropLocked(d, collection, removing, touched)
	for _, r := range w.put {
		old := have[r.name]
		if old != nil && old.version == r.version {
			continue
		}
		if why := s.overQuotaLocked(d, collection, old, r, w.quota); why != "" {
			res.refused = append(res.refused, mcp.Rejection{Resource: r.name, Reason: why})
			continue
		}
		if old != nil {
			s.dropCandidateLocked(old)
			s.countLocked(d, old, -1)
		}
		s.countLocked(d, r, 1)
		have[r.name] = r
		s.addCandidateLocked(r)
		touched[r.name] = true
		if s.changed != nil {
			putReceived = append(putReceived, r.received)
		}
	}
	s.publishLocked(collection, touched, d.name)
	s.changedLocked(d.name, collection, putReceived, removed)
	tenant := s.tenants.OfCluster(d.name)
	for _, r := range w.put {
		if h := have[r.name]; h != nil {
			// Lost to the copy its own tenant's sinks are served: a copy of another tenant
			// (one a breaker holds after ownership moved) is not this cluster's to know of.
			if w := s.pickLocked(tenant, collection, r.name); w != nil && w != h {
				res.lost = append(res.lost, api.Conflict{Collection: collection, Name: r.name, Winner: w.cluster, Losers: []string{d.name}, Why: s.policy.why(w)})
			}
		}
	}
	sort.Slice(res.lost, func(i, j int) bool { return res.lost[i].Name < res.lost[j].Name })
	res.held = len(have)
	return res, nil
}

// overQuotaLocked says why putting r in place of old (nil: a new object) would exceed
// the cluster's bounds, its tenant's, or what its tenant's sinks can receive of the
// collection, or "". Each reason names the bound and whose it is: the cluster, or its own
// tenant, never another tenant or its clusters. The caller holds the lock.
func (s *store) overQuotaLocked(d *clusterData, collection string, old, r *resource, g *quotaGuard) string {
	return s.overLimitLocked(d, collection, old == nil, servedSize(r)-servedSize(old), g)
}

// overLimitLocked is overQuotaLocked for a write that adds an object (isNew) or changes one,
// growing what d serves by grow bytes.
func (s *store) overLimitLocked(d *clusterData, collection string, isNew bool, grow int64, g *quotaGuard) string {
	if g == nil {
		return ""
	}
	u := d.usage.Load()
	switch {
	case isNew && g.q.MaxObjects > 0 && d.objects >= g.q.MaxObjects:
		return fmt.Sprintf("quota: cluster %q holds %d objects, its maxObjects", d.name, d.objects)
	case grow > 0 && g.q.MaxBytes > 0 && d.bytes+grow > g.q.MaxBytes:
		return fmt.Sprintf("quota: cluster %q's objects would add up to %d bytes, more than its maxBytes %d", d.name, d.bytes+grow, g.q.MaxBytes)
	case isNew && g.tenant.MaxObjects > 0 && u.objects >= g.tenant.MaxObjects:
		return fmt.Sprintf("quota: tenant %q's clusters hold %d objects, all together: its maxObjects (tenantLimits)", u.name, u.objects)
	case grow > 0 && g.tenant.MaxBytes > 0 && u.bytes+grow > g.tenant.MaxBytes:
		return fmt.Sprintf("quota: tenant %q's clusters' objects would add up to %d bytes, all together: more than its maxBytes %d (tenantLimits)", u.name, u.bytes+grow, g.tenant.MaxBytes)
	case grow > 0 && g.collectionShare >= 0 && d.coll[collection]+grow > g.collectionShare:
		return fmt.Sprintf("%s: cluster %q's objects in it would add up to %d bytes with it, more than its share of the collection's bound: %d bytes (%s; clusters[].quotas.collectionShare sets it)",
			collection, d.name, d.coll[collection]+grow, g.collectionShare, g.shareOf)
	case grow > 0 && g.collectionBudget >= 0 && u.coll[collection]+grow > g.collectionBudget:
		whose := "all clusters together"
		if g.tenanted {
			whose = fmt.Sprintf("all of tenant %q's clusters together", u.name)
		}
		return fmt.Sprintf("%s would add up to %d bytes with it, %s: more than its bound, %d (quotas.maxCollectionBytes; by default what a sink can receive in one push)",
			collection, u.coll[collection]+grow, whose, g.collectionBudget)
	}
	return ""
}

// dropLocked deletes names from what d holds in collection (those it holds), marking them
// touched for the views and forgetting any held deletion of them, and returns the names
// deleted (only when a layer is told of changes). The caller publishes.
func (s *store) dropLocked(d *clusterData, collection string, names []string, touched map[string]bool) []string {
	have := d.colls[collection]
	var removed []string
	for _, n := range names {
		old := have[n]
		if old == nil {
			continue
		}
		delete(have, n)
		s.countLocked(d, old, -1)
		d.held.unhold(collection, n)
		s.dropCandidateLocked(old)
		touched[n] = true
		if s.changed != nil {
			removed = append(removed, n)
		}
	}
	return removed
}

// deleteHeldLocked applies deletions the breaker held (settled, or released): each is
// deleted if d still holds it. It returns how many were deleted per collection. The caller
// holds the lock.
func (s *store) deleteHeldLocked(d *clusterData, names map[string][]string) map[string]int {
	out := map[string]int{}
	for coll, ns := range names {
		touched := map[string]bool{}
		removed := s.dropLocked(d, coll, ns, touched)
		s.publishLocked(coll, touched, d.name)
		s.changedLocked(d.name, coll, nil, removed)
		if len(touched) > 0 {
			out[coll] = len(touched)
		}
	}
	return out
}

// settle applies d's held deletions whose settling time has passed.
func (s *store) settle(d *clusterData, now time.Time) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.removed {
		return nil
	}
	return s.deleteHeldLocked(d, d.settleLocked(now))
}

// release applies every deletion d's breaker holds and closes it, if what it holds is
// what the operator reviewed (digest: heldDeletions.digest); a deletion the cluster took
// back (it published the object again) is no longer held, so a release never deletes what
// the cluster publishes.
func (s *store) release(d *clusterData, digest string) (map[string]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := &d.held
	if d.removed || b.count == 0 && !b.open {
		return nil, ErrNothingHeld
	}
	if now := b.digest(); digest != now {
		return nil, &HeldChangedError{Reviewed: digest, Now: now, Held: b.count}
	}
	all := map[string][]string{}
	for c, m := range b.names {
		for n := range m {
			all[c] = append(all[c], n)
		}
		sort.Strings(all[c])
	}
	d.held = heldDeletions{}
	return s.deleteHeldLocked(d, all), nil
}

// heldForTheConfiguration counts the deletions d's breaker holds that a reload's narrower
// ownership made, not the cluster.
func (s *store) heldForTheConfiguration(d *clusterData) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range d.held.names {
		for _, hd := range m {
			if hd.byReload {
				n++
			}
		}
	}
	return n
}

// breaker returns d's breaker status (nil: it holds nothing).
func (s *store) breaker(d *clusterData) *api.Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return d.held.status()
}

// changedLocked tells changed what a cluster's resources became (removed names sorted).
func (s *store) changedLocked(cluster, collection string, put []*mcp.Entry, removed []string) {
	if s.changed == nil || (len(put) == 0 && len(removed) == 0) {
		return
	}
	sort.Strings(removed)
	s.changed(cluster, collection, put, removed)
}

// dropCollections removes what d holds in the given collections (staleness) and returns
// how many resources it removed, or errRemoved.
func (s *store) dropCollections(d *clusterData, collections []string) (int, error) {
	n := 0
	for _, c := range collections {
		s.mu.Lock()
		held := len(d.colls[c])
		s.mu.Unlock()
		if held > 0 {
			if _, err := s.apply(d, write{collection: c, full: true}); err != nil {
				return n, err
			}
			n += held
		}
	}
	return n, nil
}

// transfer moves everything from holds into to (a cluster renamed by a reload: its minion's
// identity is to's now), re-built as to's (origin and version are the cluster's), with its
// held deletions, in place of what to held (an older, departed copy of the same minion's
// state); from is left empty. It publishes nothing: the
// views see the move when the reload recomputes them (the tenant's sight changed with the
// cluster's name), under the new tenancy, which knows to (the old one would hide to's
// objects from every view in between). Sinks then see each object change version, none
// withdrawn.
func (s *store) transfer(from, to *clusterData) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from.removed || to.removed {
		return errors.New("a cluster of the rename has left the hub")
	}
	for coll, old := range to.colls { // an older state of the same minion's (a departed copy)
		var removed []string
		for _, n := range slices.Sorted(maps.Keys(old)) {
			r := old[n]
			s.dropCandidateLocked(r)
			s.countLocked(to, r, -1)
			delete(old, n)
			removed = append(removed, n)
		}
		s.changedLocked(to.name, coll, nil, removed)
	}
	for coll, held := range from.colls {
		moved := to.colls[coll]
		if moved == nil {
			moved = map[string]*resource{}
			to.colls[coll] = moved
		}
		var put []*mcp.Entry
		var removed []string
		for _, n := range slices.Sorted(maps.Keys(held)) {
			r := held[n]
			src := &mcpapi.Resource{}
			if err := proto.Unmarshal(r.received.Encoded, src); err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			nr, err := newResource(to.name, coll, r.received, src, r.hosts)
			if err != nil {
				return err
			}
			s.dropCandidateLocked(r)
			s.countLocked(from, r, -1)
			delete(held, n)
			moved[n] = nr
			s.countLocked(to, nr, 1)
			s.addCandidateLocked(nr)
			put, removed = append(put, nr.received), append(removed, n)
		}
		// The old name's objects move, they are not deleted: only the state file forgets
		// them under it. The layer is not told (a replica's peers following the old name
		// would apply the deletion of every object before their own reload renames it);
		// the old name's removal, right after, ends what it had of it.
		if s.movedAway != nil && len(removed) > 0 {
			s.movedAway(from.name, coll, removed)
		}
		s.changedLocked(to.name, coll, put, nil)
	}
	to.held, from.held = from.held, heldDeletions{}
	return nil
}

// fits returns, of want (collection → name → size as served), the names d has room for now
// under g: objects it was refused for a bound, which room freed since would let in.
func (s *store) fits(d *clusterData, want map[string]map[string]int64, g *quotaGuard) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for coll, names := range want {
		for _, size := range names {
			if s.overLimitLocked(d, coll, true, size, g) == "" {
				n++
			}
		}
	}
	return n
}

// count returns how many resources d holds.
func (s *store) count(d *clusterData) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return d.objects
}

// counts returns how many resources each cluster holds per collection.
func (s *store) counts(cluster string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	if d := s.clusters[cluster]; d != nil {
		for c, held := range d.colls {
			out[c] = len(held)
		}
	}
	return out
}

// refusal is a stored resource a reload no longer allows.
type refusal struct {
	collection, name, reason string
}

// recheck removes every stored resource check refuses (a reload's new ownership) and
// returns them by cluster. Views drop them like any removal. guard gives each cluster's
// breaker limits: a cluster whose refusals exceed them keeps them served, held (the
// verdict says so), and held ones that check allows again are no longer held.
func (s *store) recheck(check func(*resource) error, guard func(cluster string) *breakerGuard, cause string) (map[string][]refusal, map[string]breakerVerdict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]refusal{}
	verdicts := map[string]breakerVerdict{}
	touched := map[string]map[string]bool{}
	for cluster, d := range s.clusters {
		b := &d.held
		refused := map[string][]refusal{} // by collection
		for coll, held := range d.colls {
			for name, r := range held {
				err := check(r)
				if hd, ok := b.names[coll][name]; ok {
					if err == nil && hd.byReload {
						b.unhold(coll, name) // allowed again
					}
					continue // held: a release or the cluster's recovery decides
				}
				if err != nil {
					refused[coll] = append(refused[coll], refusal{collection: coll, name: name, reason: err.Error()})
				}
			}
		}
		g := guard(cluster)
		if g != nil && g.cfg.Disabled && b.count > 0 {
			b.disable(g.now)
			verdicts[cluster] = breakerVerdict{closed: true, count: b.count}
		}
		if g != nil && b.recover(d.colls, g) {
			verdicts[cluster] = breakerVerdict{closed: true, count: b.count}
		}
		if g != nil && !g.cfg.Disabled && len(refused) > 0 {
			n := 0
			for coll, rs := range refused {
				for _, r := range rs {
					b.hold(coll, r.name, heldDeletion{byReload: true})
					n++
				}
			}
			v := breakerVerdict{reload: n}
			switch why := b.exceeded(d.colls, g.cfg, g.now); {
			case g.departed:
				// Not a share of it: all of it, and a cluster the hub no longer recognises.
				v.tripped = fmt.Sprintf("%s: the cluster left the configuration; its %d objects stay served until an operator confirms the removal (hub breaker release %s) or the configuration has it again", cause, n, cluster)
				b.trip(v.tripped, g.now)
			case b.open:
			case why != "":
				v.tripped = cause + " would withdraw what it owns: " + why
				b.trip(v.tripped, g.now)
			default:
				for coll, rs := range refused {
					for _, r := range rs {
						b.unhold(coll, r.name)
					}
				}
			}
			if b.open {
				v.open, v.count = true, b.count
				verdicts[cluster] = v
				continue
			}
		}
		for coll, rs := range refused {
			names := make([]string, len(rs))
			for i, r := range rs {
				names[i] = r.name
			}
			sort.Strings(names)
			if touched[coll] == nil {
				touched[coll] = map[string]bool{}
			}
			removed := s.dropLocked(d, coll, names, touched[coll])
			s.changedLocked(cluster, coll, nil, removed)
			out[cluster] = append(out[cluster], rs...)
		}
	}
	for coll, t := range touched {
		s.publishLocked(coll, t, "")
	}
	return out, verdicts
}
