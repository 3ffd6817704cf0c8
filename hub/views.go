package hub

import (
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

// publishLocked brings every view up to date for the touched names of collection.
func (s *store) publishLocked(collection string, touched map[string]bool) {
	if len(touched) == 0 {
		return
	}
	for _, v := range s.views {
		if !v.route.wantsCollection(collection) {
			continue
		}
		var put []*mcp.Entry
		var remove []string
		for n := range touched {
			if w := s.winnerLocked(collection, n); w != nil && v.route.includes(collection, w.cluster, w.namespace, w.labels) {
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
	for n, cands := range s.index[collection] {
		if w := cands[0]; rt.includes(collection, w.cluster, w.namespace, w.labels) {
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
	v := s.views[key]
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
		s.views[key] = v
		s.metrics.views(len(s.views))
	}
	v.refs++
	var once sync.Once
	return v.cache, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if v.refs--; v.refs == 0 && s.views[key] == v {
				delete(s.views, key)
				s.metrics.views(len(s.views))
			}
		})
	}
}

// served returns what a route receives now, per collection: name -> served version. It
// builds nothing (for dry runs).
func (s *store) served(rt route) map[string]map[string]string {
	return s.servedWith(rt, nil)
}

// servedWith is served where only resources allow accepts count (a candidate ownership):
// for each name the first allowed candidate, in the current policy's order, is served.
func (s *store) servedWith(rt route, allow func(*resource) bool) map[string]map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]string{}
	for _, coll := range s.collections {
		m := map[string]string{}
		if rt.wantsCollection(coll) {
			for n, cands := range s.index[coll] {
				for _, w := range cands {
					if allow != nil && !allow(w) {
						continue
					}
					if rt.includes(coll, w.cluster, w.namespace, w.labels) {
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

// reroute gives every open view the new definition of its route under comp, and pushes
// only the difference to the views of the tenants affected says changed (what the others
// see is the same). A view whose tenant or rules no longer all exist keeps its content:
// its sinks are routed elsewhere and closed by the caller, and the view goes with its last
// watch. It returns how many views it recomputed.
func (s *store) reroute(comp *compiled, affected func(tenant string) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	recomputed := 0
	for key, v := range s.views {
		rt, ok := comp.routeByKey(key)
		if !ok {
			continue
		}
		v.route = rt
		if !affected(rt.tenant) {
			continue
		}
		recomputed++
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
	return recomputed
}
