package hub

import (
	"context"
	"sort"
	"sync"

	"github.com/meshfed/meshfed/mcp"
)

// The views: one mcp.Cache per distinct route in use (a tenant and a routing subset of its
// rules), holding the served form of every winner the route includes. Sinks with the same
// route share it, and the engine encodes each of its pushes once for all of them.

// view is what one route receives: a cache every sink with that route shares.
type view struct {
	route route
	cache *mcp.Cache
	refs  int // open watches
}

// publishLocked brings the views up to date for the touched names of collection: with from
// (the writing cluster), the views of the tenants that may see it, its own and those its
// tenant exports to; with "" (a change of several clusters, or of the conflict order),
// every view. O(touched names × those views).
func (s *store) publishLocked(collection string, touched map[string]bool, from string) {
	if len(touched) == 0 {
		return
	}
	if from == "" {
		for tenant := range s.views {
			s.publishToLocked(tenant, collection, touched)
		}
		return
	}
	own := s.tenants.OfCluster(from)
	s.publishToLocked(own, collection, touched)
	for _, t := range s.tenants.Receivers(own) {
		s.publishToLocked(t, collection, touched)
	}
}

// publishToLocked brings tenant's views up to date for the touched names of collection.
func (s *store) publishToLocked(tenant, collection string, touched map[string]bool) {
	for _, v := range s.views[tenant] {
		if !v.route.wantsCollection(collection) {
			continue
		}
		var put []*mcp.Entry
		var remove []string
		for n := range touched {
			if w := s.pickLocked(tenant, collection, n); w != nil && v.route.sub.Includes(collection, w.cluster, w.namespace, w.labels) {
				put = append(put, w.served)
			} else {
				remove = append(remove, n)
			}
		}
		sort.Strings(remove)
		v.cache.Update(collection, put, remove)
	}
}

// includedLocked returns what rt includes of collection now: name -> served entry.
func (s *store) includedLocked(rt route, collection string) map[string]*mcp.Entry {
	out := map[string]*mcp.Entry{}
	if !rt.wantsCollection(collection) {
		return out
	}
	for n := range s.index[collection] {
		if w := s.pickLocked(rt.tenant, collection, n); w != nil && rt.sub.Includes(collection, w.cluster, w.namespace, w.labels) {
			out[n] = w.served
		}
	}
	return out
}

// watch opens a view for rt (building it on first use) and returns it with a release
// function that drops the view when its last watch ends.
func (s *store) watch(rt route) (*mcp.Cache, func()) {
	key := rt.key()
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.views[rt.tenant][key]
	if v == nil {
		v = &view{route: rt, cache: mcp.NewCache(s.collections...)}
		for _, coll := range s.collections {
			inc := s.includedLocked(rt, coll)
			if len(inc) == 0 {
				continue
			}
			put := make([]*mcp.Entry, 0, len(inc))
			for _, e := range inc {
				put = append(put, e)
			}
			v.cache.Put(coll, put...)
		}
		if s.views[rt.tenant] == nil {
			s.views[rt.tenant] = map[string]*view{}
		}
		s.views[rt.tenant][key] = v
		s.nviews++
		s.metrics.views(s.nviews)
	}
	v.refs++
	var once sync.Once
	return v.cache, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if v.refs--; v.refs == 0 && s.views[rt.tenant][key] == v {
				delete(s.views[rt.tenant], key)
				if len(s.views[rt.tenant]) == 0 {
					delete(s.views, rt.tenant)
				}
				s.nviews--
				s.metrics.views(s.nviews)
			}
		})
	}
}

// servedWith returns what a route receives now, per collection: name -> served version,
// where only resources allow accepts count (nil: all; a candidate ownership: those it
// accepts): for each name the first allowed candidate the route's tenant sees, in the
// current policy's order, is served. It builds nothing (for dry runs). It holds the store's
// lock while it walks, so it stops, with ctx's error, once ctx ends (a dry run's request
// gone or out of time).
func (s *store) servedWith(ctx context.Context, rt route, allow func(*resource) bool) (map[string]map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]string{}
	i := 0
	for _, coll := range s.collections {
		m := map[string]string{}
		if rt.wantsCollection(coll) {
			for n, cands := range s.index[coll] {
				if err := checkEvery(ctx, i); err != nil {
					return nil, err
				}
				i++
				if w := pick(rt.tenants, rt.tenant, cands, allow); w != nil && rt.sub.Includes(coll, w.cluster, w.namespace, w.labels) {
					m[n] = w.served.Version
				}
			}
		}
		out[coll] = m
	}
	return out, ctx.Err()
}

// reroute gives every open view the new definition of its route under comp, and pushes
// only the difference to the views of the tenants affected says changed (what the others
// see is the same). A view whose tenant or rules no longer all exist keeps its content:
// its sinks are routed elsewhere and closed by the caller, and the view goes with its last
// watch. It returns how many views it recomputed.
func (s *store) reroute(comp *compiled, affected func(tenant string) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	recomputed := 0
	for _, views := range s.views {
		for key, v := range views {
			rt, ok := comp.routeByKey(key)
			if !ok {
				continue
			}
			v.route = rt
			if affected(rt.tenant) {
				recomputed++
				s.recomputeLocked(v)
			}
		}
	}
	return recomputed
}

// recomputeLocked brings v to what its route includes now, pushing only the difference.
func (s *store) recomputeLocked(v *view) {
	rt := v.route
	for _, coll := range s.collections {
		want := s.includedLocked(rt, coll)
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
