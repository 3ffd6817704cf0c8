package hub

import (
	"fmt"
	"sort"
	"time"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/tenancy"
)

// The merge: per collection and name, every cluster's accepted resource is a candidate,
// kept in the conflict policy's order; the first is served, the others are held and served
// if it goes away.

// ConflictPolicy orders the candidates for one collection/namespace/name; the first wins.
type ConflictPolicy struct {
	// Priority lists cluster names, highest first; when set it decides before creation
	// time. Clusters not listed come after those listed.
	Priority []string
	// Departed are clusters that left the configuration (departure.go): their copies come
	// after every configured cluster's (a renamed cluster's live copies win over the copies
	// its old name left).
	Departed map[string]bool
}

// less reports whether a wins over b: a configured cluster's over a departed one's, then
// higher priority, else the older create_time (a resource without one counts as newest),
// else the lower cluster name.
func (p ConflictPolicy) less(a, b *resource) bool {
	if da, db := p.Departed[a.cluster], p.Departed[b.cluster]; da != db {
		return db
	}
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

// why names the rule that makes winner win.
func (p ConflictPolicy) why(winner *resource) string {
	if len(p.Priority) > 0 && p.rank(winner.cluster) < len(p.Priority) {
		return "higher priority"
	}
	if !winner.created.IsZero() {
		return "older create_time"
	}
	return "lower cluster name"
}

// explain says why loser is held while winner is served, with the values compared.
func (p ConflictPolicy) explain(winner, loser *resource) string {
	w, l := winner.cluster, loser.cluster
	if p.Departed[l] && !p.Departed[w] {
		return fmt.Sprintf("cluster %q's copy is served: %q left the configuration, and its copy is kept only where no configured cluster has one", w, l)
	}
	if pw, pl := p.rank(w), p.rank(l); len(p.Priority) > 0 && pw != pl {
		if pl == len(p.Priority) {
			return fmt.Sprintf("cluster %q's copy is served: conflicts.priority lists %q (at %d) and not %q", w, w, pw, l)
		}
		return fmt.Sprintf("cluster %q's copy is served: conflicts.priority lists %q (at %d) before %q (at %d)", w, w, pw, l, pl)
	}
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	switch {
	case !winner.created.IsZero() && loser.created.IsZero():
		return fmt.Sprintf("cluster %q's copy is served: it has a create_time (%s) and %q's has none, which counts as newest", w, stamp(winner.created), l)
	case !winner.created.Equal(loser.created):
		return fmt.Sprintf("cluster %q's copy is served: its create_time %s is older than %q's %s", w, stamp(winner.created), l, stamp(loser.created))
	case winner.created.IsZero():
		return fmt.Sprintf("cluster %q's copy is served: neither copy has a create_time, and %q is the lower cluster name", w, w)
	}
	return fmt.Sprintf("cluster %q's copy is served: both were created at %s, and %q is the lower cluster name", w, stamp(winner.created), w)
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

// pickLocked returns the candidate for collection/name that tenant's sinks are served: the
// first, in the conflict policy's order, of its own clusters', else of those exported to
// it, or nil. Claims of two tenants never overlap, so this is the winner, but for a copy a
// breaker holds after a reload moved its ownership to another tenant: each tenant is then
// served its own, and never the other's stale copy over its own, exported or not.
func (s *store) pickLocked(tenant, collection, name string) *resource {
	return pick(s.tenants, tenant, s.index[collection][name], nil)
}

// pick is pickLocked's choice among cands, under the tenancy set (a dry run's candidate
// configuration has its own), of those allow accepts (nil: all).
func pick(set *tenancy.Set, tenant string, cands []*resource, allow func(*resource) bool) *resource {
	for _, r := range cands {
		if (allow == nil || allow(r)) && set.OfCluster(r.cluster) == tenant {
			return r
		}
	}
	for _, r := range cands {
		if (allow == nil || allow(r)) && set.Sees(tenant, r.cluster, r.collection, r.namespace, r.labels) {
			return r
		}
	}
	return nil
}

// pick is pickLocked under the lock.
func (s *store) pick(tenant, collection, name string) *resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pickLocked(tenant, collection, name)
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
		s.publishLocked(coll, touched, "")
	}
}

// conflicts lists every name held by more than one cluster of a tenant v sees (its own, or
// every tenant for the vendor), with the copy that tenant's sinks are served. Claims of two
// tenants never overlap, so candidates of two tenants (a copy a breaker holds after a
// reload moved ownership) are no conflict: each tenant is served its own.
func (s *store) conflicts(v viewer) []api.Conflict {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []api.Conflict
	for coll, idx := range s.index {
		for n, all := range idx {
			if len(all) < 2 {
				continue
			}
			byTenant := map[string][]*resource{}
			for _, r := range all {
				if t := s.tenants.OfCluster(r.cluster); v.isVendor() || t == v.tenant {
					byTenant[t] = append(byTenant[t], r)
				}
			}
			for _, c := range byTenant {
				if len(c) < 2 {
					continue
				}
				cf := api.Conflict{Collection: coll, Name: n, Winner: c[0].cluster, Why: s.policy.why(c[0])}
				for _, l := range c[1:] {
					cf.Losers = append(cf.Losers, l.cluster)
				}
				out = append(out, cf)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Collection != out[j].Collection {
			return out[i].Collection < out[j].Collection
		}
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Winner < out[j].Winner
	})
	return out
}

// candidates returns every cluster's resource for collection/name that v sees, each served
// one (its tenant's pick) before those its tenant holds, each held one saying why, and,
// when several are candidates for one tenant, the rule that picked the served one.
func (s *store) candidates(v viewer, collection, name string) (out []api.Candidate, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.index[collection][name] {
		if !v.sees(r) {
			continue
		}
		// The copy served to the sinks of r's tenant, or of v's for a copy exported to it.
		tenant := s.tenants.OfCluster(r.cluster)
		if !v.isVendor() {
			tenant = v.tenant
		}
		served := s.pickLocked(tenant, collection, name)
		c := api.Candidate{Cluster: r.cluster, Version: r.served.Version, Served: served == r}
		if d := s.clusters[r.cluster]; d != nil {
			c.DeletionHeld = d.held.explain(collection, name)
		}
		if !r.created.IsZero() {
			t := r.created
			c.Created = &t
		}
		switch {
		case served == r:
		case served != nil && v.sees(served):
			c.HeldBecause = s.policy.explain(served, r)
			if why == "" {
				why = s.policy.why(served)
			}
		default:
			c.HeldBecause = "another copy, not shared with your tenant, is served"
		}
		out = append(out, c)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Served && !out[j].Served })
	return out, why
}
