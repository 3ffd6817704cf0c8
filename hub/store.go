package hub

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub/api"
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
}

// errRemoved refuses a write to a cluster that has left the configuration.
var errRemoved = errors.New("the cluster is no longer in the hub's configuration")

// store is the hub's state: every cluster's accepted resources, the merged index of their
// collections (merge.go), and the views routing subsets are served from (views.go). Each
// part is brought up to date in the same step, under one lock, so a sink never sees a
// state the store did not have. A change costs O(changed names × views).
type store struct {
	log         *slog.Logger
	collections []string
	metrics     *Metrics
	// changed, if set, is told every change of a cluster's resources as received (a Layer's
	// StateChanged), under mu and in order.
	changed func(cluster, collection string, put []*mcp.Entry, removed []string)

	mu       sync.Mutex // guards the following fields; cache updates happen under it, in order
	clusters map[string]*clusterData
	policy   ConflictPolicy
	// index: collection -> name -> candidates, best first.
	index map[string]map[string][]*resource
	// conflicting counts the collection/names held by more than one cluster.
	conflicting int
	views       map[string]*view // subset key -> view
}

func newStore(collections []string, policy ConflictPolicy, log *slog.Logger, m *Metrics,
	changed func(cluster, collection string, put []*mcp.Entry, removed []string)) *store {
	return &store{log: log, collections: collections, policy: policy, metrics: m, changed: changed,
		clusters: map[string]*clusterData{}, index: map[string]map[string][]*resource{}, views: map[string]*view{}}
}

// addCluster starts an empty store for a cluster joining the configuration.
func (s *store) addCluster(name string) *clusterData {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := &clusterData{name: name, colls: map[string]map[string]*resource{}}
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
			touched[n] = true
		}
		s.publishLocked(coll, touched)
	}
	d.colls = nil
}

// versions returns the versions, as received, of what the hub holds for cluster in
// collection: what the cluster's next stream declares so it resumes instead of resending.
func (s *store) versions(cluster, collection string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	if d := s.clusters[cluster]; d != nil {
		for n, r := range d.colls[collection] {
			out[n] = r.version
		}
	}
	return out
}

// apply records a cluster's change to a collection: put resources (accepted), remove
// names; with full, everything else the cluster held in the collection is removed too,
// except the names in keep (resources whose new version was rejected keep their last
// accepted one). It returns the conflicts the cluster's put resources lose, by name, and
// how many resources the cluster now holds in the collection, or errRemoved.
func (s *store) apply(d *clusterData, collection string, put []*resource, remove []string, full bool, keep map[string]bool) (lost []api.Conflict, held int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.removed {
		return nil, 0, errRemoved
	}
	have := d.colls[collection]
	if have == nil {
		have = map[string]*resource{}
		d.colls[collection] = have
	}
	touched := map[string]bool{}
	if full {
		listed := make(map[string]bool, len(put))
		for _, r := range put {
			listed[r.name] = true
		}
		for n := range have {
			if !listed[n] && !keep[n] {
				remove = append(remove, n)
			}
		}
	}
	var putReceived []*mcp.Entry
	var removed []string
	for _, n := range remove {
		if old := have[n]; old != nil {
			delete(have, n)
			s.dropCandidateLocked(old)
			touched[n] = true
			if s.changed != nil {
				removed = append(removed, n)
			}
		}
	}
	for _, r := range put {
		if old := have[r.name]; old != nil {
			if old.version == r.version {
				continue
			}
			s.dropCandidateLocked(old)
		}
		have[r.name] = r
		s.addCandidateLocked(r)
		touched[r.name] = true
		if s.changed != nil {
			putReceived = append(putReceived, r.received)
		}
	}
	s.publishLocked(collection, touched)
	s.changedLocked(d.name, collection, putReceived, removed)
	for _, r := range put {
		if h := have[r.name]; h != nil {
			if c := s.index[collection][r.name]; len(c) > 1 && c[0] != h {
				lost = append(lost, api.Conflict{Collection: collection, Name: r.name, Winner: c[0].cluster, Losers: []string{d.name}, Why: s.policy.why(c[0])})
			}
		}
	}
	sort.Slice(lost, func(i, j int) bool { return lost[i].Name < lost[j].Name })
	return lost, len(have), nil
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
			if _, _, err := s.apply(d, c, nil, nil, true, nil); err != nil {
				return n, err
			}
			n += held
		}
	}
	return n, nil
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
// returns them by cluster. Views drop them like any removal.
func (s *store) recheck(check func(*resource) error) map[string][]refusal {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]refusal{}
	touched := map[string]map[string]bool{}
	for cluster, d := range s.clusters {
		for coll, held := range d.colls {
			var removed []string
			for name, r := range held {
				err := check(r)
				if err == nil {
					continue
				}
				delete(held, name)
				s.dropCandidateLocked(r)
				removed = append(removed, name)
				if touched[coll] == nil {
					touched[coll] = map[string]bool{}
				}
				touched[coll][name] = true
				out[cluster] = append(out[cluster], refusal{collection: coll, name: name, reason: err.Error()})
			}
			s.changedLocked(cluster, coll, nil, removed)
		}
	}
	for coll, t := range touched {
		s.publishLocked(coll, t)
	}
	return out
}
