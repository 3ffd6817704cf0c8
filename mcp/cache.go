package mcp

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	mcpapi "istio.io/api/mcp/v1alpha1"
)

// minLogSize is the least number of changes a collection remembers for deltas.
const minLogSize = 1024

// Cache is an in-memory, versioned store of collections that implements Watcher. Every
// stream sees every collection the cache serves. A change costs O(changed entries + watchers);
// snapshots and deltas are built lazily, once per version, and shared by all streams.
type Cache struct {
	mu    sync.RWMutex // guards colls
	colls map[string]*cacheCollection
}

// NewCache returns a Cache serving the named collections (empty until set). Collections are
// also added by the first change to them.
func NewCache(collections ...string) *Cache {
	c := &Cache{colls: make(map[string]*cacheCollection)}
	for _, name := range collections {
		c.collection(name)
	}
	return c
}

// Collections returns the served collection names, sorted.
func (c *Cache) Collections() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	names := make([]string, 0, len(c.colls))
	for n := range c.colls {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (c *Cache) collection(name string) *cacheCollection {
	c.mu.RLock()
	cc := c.colls[name]
	c.mu.RUnlock()
	if cc != nil {
		return cc
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc = c.colls[name]; cc == nil {
		cc = &cacheCollection{name: name, entries: make(map[string]*Entry), watchers: make(map[*cacheWatch]struct{})}
		c.colls[name] = cc
	}
	return cc
}

// Watch implements Watcher.
func (c *Cache) Watch(_ *StreamInfo, collection string, notify func()) (Collection, func(), bool) {
	c.mu.RLock()
	cc := c.colls[collection]
	c.mu.RUnlock()
	if cc == nil {
		return nil, func() {}, false
	}
	w := &cacheWatch{notify: notify}
	cc.mu.Lock()
	cc.watchers[w] = struct{}{}
	cc.mu.Unlock()
	var once sync.Once
	return cc, func() {
		once.Do(func() {
			cc.mu.Lock()
			delete(cc.watchers, w)
			cc.mu.Unlock()
		})
	}, true
}

// Put adds or updates entries in one change (one version step). Entries whose version equals
// the stored one are skipped; if nothing changes, the version does not move. It returns the
// collection's version after the call.
func (c *Cache) Put(collection string, entries ...*Entry) uint64 {
	return c.collection(collection).apply(entries, nil, false)
}

// PutResources marshals each resource once and Puts them.
func (c *Cache) PutResources(collection string, resources ...*mcpapi.Resource) (uint64, error) {
	entries := make([]*Entry, 0, len(resources))
	for i, r := range resources {
		e, err := NewEntry(r)
		if err != nil {
			return 0, fmt.Errorf("collection %s: resource %d: %w", collection, i, err)
		}
		entries = append(entries, e)
	}
	return c.Put(collection, entries...), nil
}

// Update adds or updates put and deletes remove in one change (one version step).
func (c *Cache) Update(collection string, put []*Entry, remove []string) uint64 {
	return c.collection(collection).apply(put, remove, false)
}

// Remove deletes the named entries in one change. Unknown names are ignored.
func (c *Cache) Remove(collection string, names ...string) uint64 {
	return c.collection(collection).apply(nil, names, false)
}

// Replace sets the collection's full state to entries in one change: entries not listed are
// removed.
func (c *Cache) Replace(collection string, entries []*Entry) uint64 {
	return c.collection(collection).apply(entries, nil, true)
}

// Get returns one entry, or nil.
func (c *Cache) Get(collection, name string) *Entry {
	c.mu.RLock()
	cc := c.colls[collection]
	c.mu.RUnlock()
	if cc == nil {
		return nil
	}
	cc.mu.RLock()
	defer cc.mu.RUnlock()
	return cc.entries[name]
}

// Entries returns a collection's current entries (its snapshot's: shared, do not modify),
// or nil for a collection the cache does not serve.
func (c *Cache) Entries(collection string) []*Entry {
	c.mu.RLock()
	cc := c.colls[collection]
	c.mu.RUnlock()
	if cc == nil {
		return nil
	}
	return cc.Snapshot().Entries
}

// Len returns the number of entries in a collection.
func (c *Cache) Len(collection string) int {
	c.mu.RLock()
	cc := c.colls[collection]
	c.mu.RUnlock()
	if cc == nil {
		return 0
	}
	cc.mu.RLock()
	defer cc.mu.RUnlock()
	return len(cc.entries)
}

type cacheWatch struct{ notify func() }

type logRecord struct {
	version uint64
	name    string
}

type cacheCollection struct {
	name string

	mu       sync.RWMutex // guards the following fields
	version  uint64
	entries  map[string]*Entry
	log      []logRecord // changes in version order
	logFloor uint64      // Delta(from) works for from >= logFloor
	snap     *Snapshot   // of version, built lazily
	deltas   map[uint64]*Delta
	watchers map[*cacheWatch]struct{}
}

func (cc *cacheCollection) apply(put []*Entry, remove []string, replace bool) uint64 {
	cc.mu.Lock()
	var changed []string
	if replace {
		keep := make(map[string]struct{}, len(put))
		for _, e := range put {
			keep[e.Name] = struct{}{}
		}
		for name := range cc.entries {
			if _, ok := keep[name]; !ok {
				remove = append(remove, name)
			}
		}
	}
	for _, e := range put {
		if old, ok := cc.entries[e.Name]; ok && old.Version == e.Version && old.Version != "" {
			continue
		}
		cc.entries[e.Name] = e
		changed = append(changed, e.Name)
	}
	for _, name := range remove {
		if _, ok := cc.entries[name]; ok {
			delete(cc.entries, name)
			changed = append(changed, name)
		}
	}
	if len(changed) == 0 {
		v := cc.version
		cc.mu.Unlock()
		return v
	}
	cc.version++
	for _, name := range changed {
		cc.log = append(cc.log, logRecord{version: cc.version, name: name})
	}
	cc.trimLogLocked()
	cc.snap = nil
	cc.deltas = nil
	v := cc.version
	watchers := make([]*cacheWatch, 0, len(cc.watchers))
	for w := range cc.watchers {
		watchers = append(watchers, w)
	}
	cc.mu.Unlock()
	for _, w := range watchers {
		w.notify()
	}
	return v
}

// trimLogLocked bounds the change log to about twice max(minLogSize, entries), cutting only
// at version boundaries.
func (cc *cacheCollection) trimLogLocked() {
	limit := max(minLogSize, len(cc.entries))
	if len(cc.log) <= 2*limit {
		return
	}
	cut := len(cc.log) - limit
	floor := cc.log[cut-1].version
	for cut < len(cc.log) && cc.log[cut].version == floor {
		cut++
	}
	cc.log = slices.Clone(cc.log[cut:])
	cc.logFloor = floor
}

func (cc *cacheCollection) Version() uint64 {
	cc.mu.RLock()
	defer cc.mu.RUnlock()
	return cc.version
}

func (cc *cacheCollection) Snapshot() *Snapshot {
	cc.mu.RLock()
	s := cc.snap
	cc.mu.RUnlock()
	if s != nil {
		return s
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.snap == nil {
		entries := make([]*Entry, 0, len(cc.entries))
		for _, e := range cc.entries {
			entries = append(entries, e)
		}
		slices.SortFunc(entries, func(a, b *Entry) int { return strings.Compare(a.Name, b.Name) })
		cc.snap = &Snapshot{Collection: cc.name, Version: cc.version, Entries: entries}
	}
	return cc.snap
}

func (cc *cacheCollection) Delta(from uint64) (*Delta, bool) {
	cc.mu.RLock()
	d, ok := cc.deltas[from]
	cc.mu.RUnlock()
	if ok {
		return d, true
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if from > cc.version || from < cc.logFloor {
		return nil, false
	}
	if d, ok := cc.deltas[from]; ok {
		return d, true
	}
	seen := make(map[string]struct{})
	d = &Delta{Collection: cc.name, From: from, To: cc.version}
	for i := len(cc.log) - 1; i >= 0 && cc.log[i].version > from; i-- {
		name := cc.log[i].name
		if _, dup := seen[name]; dup {
			continue
		}
		seen[name] = struct{}{}
		if e, ok := cc.entries[name]; ok {
			d.Updated = append(d.Updated, e)
		} else {
			d.Removed = append(d.Removed, name)
		}
	}
	slices.SortFunc(d.Updated, func(a, b *Entry) int { return strings.Compare(a.Name, b.Name) })
	sort.Strings(d.Removed)
	if cc.deltas == nil {
		cc.deltas = make(map[uint64]*Delta)
	}
	cc.deltas[from] = d
	return d, true
}
