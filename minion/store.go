package minion

import (
	"log/slog"
	"sort"
	"sync"

	"github.com/meshfed/meshfed/mcp"
)

// Store merges what the minion's sources read into the mcp.Cache it publishes. Each source
// owns its entries; when two sources hold the same collection/name, the source listed first
// in the configuration wins and the clash is logged. It is safe for concurrent use.
type Store struct {
	cache *mcp.Cache
	log   *slog.Logger

	mu      sync.Mutex                                  // guards the following fields
	rank    map[string]int                              // source name -> precedence (lower wins)
	entries map[string]map[string]map[string]*mcp.Entry // collection -> name -> source -> entry
	clashes map[string]bool                             // collection/name already logged
}

// NewStore returns a Store publishing into cache. sources lists the source names in
// precedence order.
func NewStore(cache *mcp.Cache, sources []string, log *slog.Logger) *Store {
	s := &Store{cache: cache, log: log, rank: map[string]int{}, entries: map[string]map[string]map[string]*mcp.Entry{}, clashes: map[string]bool{}}
	for i, n := range sources {
		s.rank[n] = i
	}
	return s
}

// Cache returns the published cache.
func (s *Store) Cache() *mcp.Cache { return s.cache }

// Apply records source's puts and removals in collection and publishes the result in one
// version step.
func (s *Store) Apply(source, collection string, put []*mcp.Entry, remove []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	coll := s.collLocked(collection)
	touched := make(map[string]struct{}, len(put)+len(remove))
	for _, e := range put {
		if coll[e.Name] == nil {
			coll[e.Name] = map[string]*mcp.Entry{}
		}
		coll[e.Name][source] = e
		touched[e.Name] = struct{}{}
	}
	for _, name := range remove {
		if bySrc := coll[name]; bySrc != nil {
			delete(bySrc, source)
			if len(bySrc) == 0 {
				delete(coll, name)
			}
		}
		touched[name] = struct{}{}
	}
	s.publishLocked(collection, coll, touched)
}

// Replace sets source's full content for collection: entries it held before and does not
// list now are removed.
func (s *Store) Replace(source, collection string, entries []*mcp.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	coll := s.collLocked(collection)
	touched := make(map[string]struct{}, len(entries))
	keep := make(map[string]*mcp.Entry, len(entries))
	for _, e := range entries {
		keep[e.Name] = e
	}
	for name, bySrc := range coll {
		if _, ok := bySrc[source]; ok {
			if _, still := keep[name]; !still {
				delete(bySrc, source)
				if len(bySrc) == 0 {
					delete(coll, name)
				}
				touched[name] = struct{}{}
			}
		}
	}
	for name, e := range keep {
		if coll[name] == nil {
			coll[name] = map[string]*mcp.Entry{}
		}
		if old := coll[name][source]; old != nil && old.Version == e.Version {
			continue
		}
		coll[name][source] = e
		touched[name] = struct{}{}
	}
	s.publishLocked(collection, coll, touched)
}

func (s *Store) collLocked(collection string) map[string]map[string]*mcp.Entry {
	coll := s.entries[collection]
	if coll == nil {
		coll = map[string]map[string]*mcp.Entry{}
		s.entries[collection] = coll
	}
	return coll
}

// publishLocked pushes the winners of the touched names to the cache.
func (s *Store) publishLocked(collection string, coll map[string]map[string]*mcp.Entry, touched map[string]struct{}) {
	if len(touched) == 0 {
		return
	}
	var put []*mcp.Entry
	var remove []string
	for name := range touched {
		bySrc := coll[name]
		if len(bySrc) == 0 {
			remove = append(remove, name)
			continue
		}
		put = append(put, s.winner(collection, name, bySrc))
	}
	sort.Strings(remove)
	s.cache.Update(collection, put, remove)
}

// winner picks the entry of the best-ranked source (unranked sources last, by name).
func (s *Store) winner(collection, name string, bySrc map[string]*mcp.Entry) *mcp.Entry {
	srcs := make([]string, 0, len(bySrc))
	for src := range bySrc {
		srcs = append(srcs, src)
	}
	rank := func(src string) int {
		if r, ok := s.rank[src]; ok {
			return r
		}
		return len(s.rank)
	}
	sort.Slice(srcs, func(i, j int) bool {
		if ri, rj := rank(srcs[i]), rank(srcs[j]); ri != rj {
			return ri < rj
		}
		return srcs[i] < srcs[j]
	})
	key := collection + "/" + name
	if len(srcs) > 1 && !s.clashes[key] {
		s.clashes[key] = true
		s.log.Warn("several sources publish the same object; the first configured wins",
			"collection", collection, "resource", name, "sources", srcs, "winner", srcs[0])
	} else if len(srcs) == 1 {
		delete(s.clashes, key)
	}
	return bySrc[srcs[0]]
}
