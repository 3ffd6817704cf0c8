package hub

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

// OriginAnnotation is set on every served resource to the name of the cluster it came from.
const OriginAnnotation = "meshfed.io/origin-cluster"

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
	served     *mcp.Entry // with OriginAnnotation and a version qualified by the cluster
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
	ann[OriginAnnotation] = cluster
	smd.Annotations = ann
	smd.Version = cluster + "/" + e.Version
	var err error
	if res.served, err = mcp.NewEntry(served); err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	return res, nil
}

// ConflictPolicy orders the candidates for one collection/namespace/name; the first wins.
type ConflictPolicy struct {
	// Priority lists cluster names, highest first; when set it decides before creation
	// time. Clusters not listed come after those listed.
	Priority []string
}

// less reports whether a wins over b: higher priority, else the older create_time (a
// resource without one counts as newest), else the lower cluster name.
func (p ConflictPolicy) less(a, b *resource) bool {
	if len(p.Priority) > 0 {
		pa, pb := p.rank(a.cluster), p.rank(b.cluster)
		if pa != pb {
			return pa < pb
		}
	}
	switch {
	case a.created.IsZero() != b.created.IsZero():
		return !a.created.IsZero()
	case !a.created.Equal(b.created):
		return a.created.Before(b.created)
	}
	return a.cluster < b.cluster
}

func (p ConflictPolicy) rank(cluster string) int {
	for i, c := range p.Priority {
		if c == cluster {
			return i
		}
	}
	return len(p.Priority)
}

func (p ConflictPolicy) why(winner *resource) string {
	if len(p.Priority) > 0 && p.rank(winner.cluster) < len(p.Priority) {
		return "higher priority"
	}
	if !winner.created.IsZero() {
		return "older create_time"
	}
	return "lower cluster name"
}

// Conflict is one collection/name published by several clusters.
type Conflict struct {
	Collection string   `json:"collection"`
	Name       string   `json:"name"`
	Winner     string   `json:"winner"`
	Losers     []string `json:"losers"`
	Why        string   `json:"why"`
}

// view is what one routing subset receives: a cache every sink with that subset shares.
type view struct {
	subset *routing.Subset
	cache  *mcp.Cache
	refs   int // open watches
}

// store is the hub's state: every cluster's accepted resources, the merged index, and the
// views. A change costs O(changed names × views); views are few (one per distinct subset).
type store struct {
	log         *slog.Logger
	collections []string
	policy      ConflictPolicy
	metrics     *Metrics

	mu       sync.Mutex                                 // guards the following fields; cache updates happen under it, in order
	clusters map[string]map[string]map[string]*resource // cluster -> collection -> name -> resource
	// index: collection -> name -> candidates, best first.
	index map[string]map[string][]*resource
	views map[string]*view // subset key -> view
	// conflicting counts the collection/names held by more than one cluster.
	conflicting int
	// feeds (replicas only, else nil): per cluster, its resources as received, which
	// peers follow.
	feeds map[string]*mcp.Cache
}

func newStore(collections []string, policy ConflictPolicy, log *slog.Logger, m *Metrics) *store {
	return &store{log: log, collections: collections, policy: policy, metrics: m,
		clusters: map[string]map[string]map[string]*resource{}, index: map[string]map[string][]*resource{}, views: map[string]*view{}}
}

// versions returns the versions, as received, of what the hub holds for cluster in
// collection: what the cluster's next stream declares so it resumes instead of resending.
func (s *store) versions(cluster, collection string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for n, r := range s.clusters[cluster][collection] {
		out[n] = r.version
	}
	return out
}

// apply records a cluster's change to a collection: put resources (accepted), remove
// names; with full, everything else the cluster held in the collection is removed too,
// except the names in keep (resources whose new version was rejected keep their last
// accepted one). It returns the conflicts the cluster's put resources lose, by name.
func (s *store) apply(cluster, collection string, put []*resource, remove []string, full bool, keep map[string]bool) []Conflict {
	s.mu.Lock()
	defer s.mu.Unlock()
	cc := s.clusters[cluster]
	if cc == nil {
		cc = map[string]map[string]*resource{}
		s.clusters[cluster] = cc
	}
	held := cc[collection]
	if held == nil {
		held = map[string]*resource{}
		cc[collection] = held
	}
	touched := map[string]bool{}
	if full {
		listed := make(map[string]bool, len(put))
		for _, r := range put {
			listed[r.name] = true
		}
		for n := range held {
			if !listed[n] && !keep[n] {
				remove = append(remove, n)
			}
		}
	}
	var feedPut []*mcp.Entry
	var feedRemove []string
	for _, n := range remove {
		if old := held[n]; old != nil {
			delete(held, n)
			s.dropCandidateLocked(old)
			touched[n] = true
			feedRemove = append(feedRemove, n)
		}
	}
	for _, r := range put {
		if old := held[r.name]; old != nil {
			if old.version == r.version {
				continue
			}
			s.dropCandidateLocked(old)
		}
		held[r.name] = r
		s.addCandidateLocked(r)
		touched[r.name] = true
		feedPut = append(feedPut, r.received)
	}
	s.publishLocked(collection, touched)
	s.feedLocked(cluster, collection, feedPut, feedRemove)
	var lost []Conflict
	for _, r := range put {
		if h := held[r.name]; h != nil {
			if c := s.index[collection][r.name]; len(c) > 1 && c[0] != h {
				lost = append(lost, Conflict{Collection: collection, Name: r.name, Winner: c[0].cluster, Losers: []string{cluster}, Why: s.policy.why(c[0])})
			}
		}
	}
	sort.Slice(lost, func(i, j int) bool { return lost[i].Name < lost[j].Name })
	return lost
}

// feedLocked brings cluster's feed up to date, if replicas follow it.
func (s *store) feedLocked(cluster, collection string, put []*mcp.Entry, remove []string) {
	if s.feeds == nil || (len(put) == 0 && len(remove) == 0) {
		return
	}
	sort.Strings(remove)
	s.feedOfLocked(cluster).Update(collection, put, remove)
}

func (s *store) feedOfLocked(cluster string) *mcp.Cache {
	f := s.feeds[cluster]
	if f == nil {
		f = mcp.NewCache(s.collections...)
		s.feeds[cluster] = f
	}
	return f
}

// feed returns cluster's resources as received, for peers to follow (replicas only).
func (s *store) feed(cluster string) *mcp.Cache {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.feedOfLocked(cluster)
}

// dropCluster removes what cluster holds in the given collections (staleness).
func (s *store) dropCluster(cluster string, collections []string) int {
	n := 0
	for _, c := range collections {
		s.mu.Lock()
		held := len(s.clusters[cluster][c])
		s.mu.Unlock()
		if held > 0 {
			s.apply(cluster, c, nil, nil, true, nil)
			n += held
		}
	}
	return n
}

func (s *store) addCandidateLocked(r *resource) {
	idx := s.index[r.collection]
	if idx == nil {
		idx = map[string][]*resource{}
		s.index[r.collection] = idx
	}
	c := append(idx[r.name], r)
	sort.SliceStable(c, func(i, j int) bool { return s.policy.less(c[i], c[j]) })
	idx[r.name] = c
	if len(c) == 2 {
		s.conflicting++
		s.metrics.conflicts(s.conflicting)
	}
}

func (s *store) dropCandidateLocked(r *resource) {
	idx := s.index[r.collection]
	c := idx[r.name]
	for i, x := range c {
		if x == r {
			c = append(c[:i:i], c[i+1:]...)
			break
		}
	}
	if len(c) == 0 {
		delete(idx, r.name)
	} else {
		idx[r.name] = c
	}
	if len(c) == 1 {
		s.conflicting--
		s.metrics.conflicts(s.conflicting)
	}
}

// winnerLocked returns the served resource for collection/name, or nil.
func (s *store) winnerLocked(collection, name string) *resource {
	if c := s.index[collection][name]; len(c) > 0 {
		return c[0]
	}
	return nil
}

// publishLocked brings every view up to date for the touched names of collection.
func (s *store) publishLocked(collection string, touched map[string]bool) {
	if len(touched) == 0 {
		return
	}
	for _, v := range s.views {
		if !v.subset.WantsCollection(collection) {
			continue
		}
		var put []*mcp.Entry
		var remove []string
		for n := range touched {
			if w := s.winnerLocked(collection, n); w != nil && v.subset.Includes(collection, w.cluster, w.namespace, w.labels) {
				put = append(put, w.served)
			} else {
				remove = append(remove, n)
			}
		}
		sort.Strings(remove)
		v.cache.Update(collection, put, remove)
	}
}

// watch opens a view for subset (building it on first use) and returns it with a release
// function that drops the view when its last watch ends.
func (s *store) watch(sub *routing.Subset) (*mcp.Cache, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.views[sub.Key()]
	if v == nil {
		v = &view{subset: sub, cache: mcp.NewCache(s.collections...)}
		for _, coll := range s.collections {
			if !sub.WantsCollection(coll) {
				continue
			}
			var put []*mcp.Entry
			for _, cands := range s.index[coll] {
				if w := cands[0]; sub.Includes(coll, w.cluster, w.namespace, w.labels) {
					put = append(put, w.served)
				}
			}
			if len(put) > 0 {
				v.cache.Put(coll, put...)
			}
		}
		s.views[sub.Key()] = v
		s.metrics.views(len(s.views))
	}
	v.refs++
	var once sync.Once
	return v.cache, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if v.refs--; v.refs == 0 && s.views[sub.Key()] == v {
				delete(s.views, sub.Key())
				s.metrics.views(len(s.views))
			}
		})
	}
}

// served returns what a subset receives now, per collection: name -> served version. It
// builds nothing (for dry runs).
func (s *store) served(sub *routing.Subset) map[string]map[string]string {
	return s.servedWith(sub, nil)
}

// servedWith is served where only resources allow accepts count (a candidate ownership):
// for each name the first allowed candidate, in the current policy's order, is served.
func (s *store) servedWith(sub *routing.Subset, allow func(*resource) bool) map[string]map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]string{}
	for _, coll := range s.collections {
		m := map[string]string{}
		if sub.WantsCollection(coll) {
			for n, cands := range s.index[coll] {
				for _, w := range cands {
					if allow != nil && !allow(w) {
						continue
					}
					if sub.Includes(coll, w.cluster, w.namespace, w.labels) {
						m[n] = w.served.Version
					}
					break
				}
			}
		}
		out[coll] = m
	}
	return out
}

// conflicts lists every name held by more than one cluster.
func (s *store) conflicts() []Conflict {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Conflict
	for coll, idx := range s.index {
		for n, c := range idx {
			if len(c) < 2 {
				continue
			}
			cf := Conflict{Collection: coll, Name: n, Winner: c[0].cluster, Why: s.policy.why(c[0])}
			for _, l := range c[1:] {
				cf.Losers = append(cf.Losers, l.cluster)
			}
			out = append(out, cf)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Collection != out[j].Collection {
			return out[i].Collection < out[j].Collection
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// counts returns how many resources each cluster holds per collection.
func (s *store) counts(cluster string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for c, held := range s.clusters[cluster] {
		out[c] = len(held)
	}
	return out
}

// refusal is a stored resource a reload no longer allows.
type refusal struct {
	collection, name, reason string
}

// recheck removes every stored resource check refuses (a reload's new ownership) and
// returns them by cluster. Views drop them like any removal.
func (s *store) recheck(check func(*resource) error) map[string][]refusal {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]refusal{}
	touched := map[string]map[string]bool{}
	for cluster, colls := range s.clusters {
		for coll, held := range colls {
			for name, r := range held {
				err := check(r)
				if err == nil {
					continue
				}
				delete(held, name)
				s.dropCandidateLocked(r)
				s.feedLocked(cluster, coll, nil, []string{name})
				if touched[coll] == nil {
					touched[coll] = map[string]bool{}
				}
				touched[coll][name] = true
				out[cluster] = append(out[cluster], refusal{collection: coll, name: name, reason: err.Error()})
			}
		}
	}
	for coll, t := range touched {
		s.publishLocked(coll, t)
	}
	return out
}

// setPolicy re-orders every candidate list under p and serves the new winners.
func (s *store) setPolicy(p ConflictPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policy = p
	for coll, idx := range s.index {
		touched := map[string]bool{}
		for name, c := range idx {
			if len(c) < 2 {
				continue
			}
			before := c[0]
			sort.SliceStable(c, func(i, j int) bool { return s.policy.less(c[i], c[j]) })
			if c[0] != before {
				touched[name] = true
			}
		}
		s.publishLocked(coll, touched)
	}
}

// reroute gives every open view the new definition of its rules and pushes only the
// difference. A view whose rules no longer all exist keeps its content: its sinks are
// routed elsewhere and closed by the caller, and the view goes with its last watch.
func (s *store) reroute(table *routing.Table) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, v := range s.views {
		sub, ok := table.SubsetByKey(key)
		if !ok {
			continue
		}
		v.subset = sub
		for _, coll := range s.collections {
			want := map[string]*mcp.Entry{}
			if sub.WantsCollection(coll) {
				for n, cands := range s.index[coll] {
					if w := cands[0]; sub.Includes(coll, w.cluster, w.namespace, w.labels) {
						want[n] = w.served
					}
				}
			}
			var put []*mcp.Entry
			var remove []string
			have := map[string]bool{}
			for _, e := range v.cache.Entries(coll) {
				have[e.Name] = true
				if w, ok := want[e.Name]; !ok {
					remove = append(remove, e.Name)
				} else if w.Version != e.Version {
					put = append(put, w)
				}
			}
			for n, e := range want {
				if !have[n] {
					put = append(put, e)
				}
			}
			if len(put) > 0 || len(remove) > 0 {
				sort.Strings(remove)
				v.cache.Update(coll, put, remove)
			}
		}
	}
}

// Candidate is one cluster's resource for a collection/name, as the why API shows it.
type Candidate struct {
	Cluster string     `json:"cluster"`
	Version string     `json:"version"` // served form: cluster/version as received
	Created *time.Time `json:"created,omitempty"`
	Served  bool       `json:"served"`
}

// candidates returns every cluster's resource for collection/name, the served one first,
// and, when there are several, why the first wins.
func (s *store) candidates(collection, name string) (out []Candidate, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cands := s.index[collection][name]
	if len(cands) > 1 {
		why = s.policy.why(cands[0])
	}
	for i, r := range cands {
		c := Candidate{Cluster: r.cluster, Version: r.served.Version, Served: i == 0}
		if !r.created.IsZero() {
			t := r.created
			c.Created = &t
		}
		out = append(out, c)
	}
	return out, why
}

// winner returns the served resource's cluster, namespace and labels, if any.
func (s *store) winner(collection, name string) (*resource, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.winnerLocked(collection, name)
	return w, w != nil
}
