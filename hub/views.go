package hub

import (
	"sort"
	"sync"

	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

// The views: one mcp.Cache per distinct routing subset in use, holding the served form of
// every winner the subset includes. Sinks with the same subset share it, and the engine
// encodes each of its pushes once for all of them.

// view is what one routing subset receives: a cache every sink with that subset shares.
type view struct {
	subset *routing.Subset
	cache  *mcp.Cache
	refs   int // open watches
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

// includedLocked returns what sub includes of collection now: name -> served entry.
func (s *store) includedLocked(sub *routing.Subset, collection string) map[string]*mcp.Entry {
	out := map[string]*mcp.Entry{}
	if !sub.WantsCollection(collection) {
		return out
	}
	for n, cands := range s.index[collection] {
		if w := cands[0]; sub.Includes(collection, w.cluster, w.namespace, w.labels) {
			out[n] = w.served
		}
	}
	return out
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
			inc := s.includedLocked(sub, coll)
			if len(inc) == 0 {
				continue
			}
			put := make([]*mcp.Entry, 0, len(inc))
			for _, e := range inc {
				put = append(put, e)
			}
			v.cache.Put(coll, put...)
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
			want := s.includedLocked(sub, coll)
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
