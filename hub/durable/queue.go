package durable

import (
	bolt "go.etcd.io/bbolt"

	"github.com/meshfed/meshfed/mcp"
)

// The write side. The hub calls these on its push path, under its store's lock and in the
// order it applies changes, so each is O(its arguments), takes s.mu only for map updates and
// never waits for the disk: the writer goroutine takes the whole pending batch in O(1) and
// commits it while callers go on filling the next one.

// Put enqueues storing entry (the Resource as received, mcp.Entry.Encoded) as cluster's
// resource name in collection. entry is kept, not copied: the caller must not modify it
// (an mcp.Entry's bytes never are).
func (s *Store) Put(cluster, collection, name string, entry []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closedLocked(1) || s.refusedLocked(keyRefusal(cluster, collection, name, entry, true), cluster, collection, name, len(entry)) {
		return
	}
	s.coalesced += s.pending.set(cluster, collection, name, entry)
	s.enqueuedLocked()
}

// Remove enqueues deleting cluster's resource name from collection.
func (s *Store) Remove(cluster, collection, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closedLocked(1) || s.refusedLocked(keyRefusal(cluster, collection, name, nil, false), cluster, collection, name, 0) {
		return
	}
	s.coalesced += s.pending.set(cluster, collection, name, nil)
	s.enqueuedLocked()
}

// Apply enqueues one change of what cluster holds in collection, as the hub's Layer
// StateChanged reports it: the names removed, then the entries put. It is one unit: the file
// holds all of it or none of it, never a part, as the hub's store applied it in one step.
func (s *Store) Apply(cluster, collection string, put []*mcp.Entry, removed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closedLocked(len(put) + len(removed)) {
		return
	}
	n := 0
	for _, name := range removed {
		if !s.refusedLocked(keyRefusal(cluster, collection, name, nil, false), cluster, collection, name, 0) {
			s.coalesced += s.pending.set(cluster, collection, name, nil)
			n++
		}
	}
	for _, e := range put {
		if !s.refusedLocked(keyRefusal(cluster, collection, e.Name, e.Encoded, true), cluster, collection, e.Name, len(e.Encoded)) {
			s.coalesced += s.pending.set(cluster, collection, e.Name, e.Encoded)
			n++
		}
	}
	if n > 0 {
		s.enqueuedLocked()
	}
}

// SetMeta enqueues cluster's metadata; the last one set before a commit is the one written.
func (s *Store) SetMeta(cluster string, m Meta) {
	// Encoded here, not in the writer: a value that cannot be encoded is refused now instead
	// of failing its batch on every retry. It costs about a microsecond, once per session
	// event.
	enc, err := encodeMeta(m)
	why := clusterRefusal(cluster)
	if why < 0 && err != nil {
		why = refusedMeta
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closedLocked(1) || s.refusedLocked(why, cluster, "", "", len(enc)) {
		return
	}
	s.coalesced += s.pending.setMeta(cluster, enc)
	s.enqueuedLocked()
}

// DropCluster enqueues deleting everything the file holds of cluster (a cluster leaving the
// configuration): its resources and its metadata. What was enqueued for it before is
// superseded; what is enqueued after is kept. It costs O(what is pending for the cluster).
func (s *Store) DropCluster(cluster string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closedLocked(1) || s.refusedLocked(clusterRefusal(cluster), cluster, "", "", 0) {
		return
	}
	s.coalesced += s.pending.drop(cluster)
	s.enqueuedLocked()
}

// Repaired enqueues clearing cluster's damage mark (State.Damaged): its state in the file is
// whole again. The hub calls it once the cluster's own session has replaced its state (every
// collection delivered and written after the damage was reported). Like every write it is
// committed in order: the mark goes in the same commit as, or after, the writes enqueued
// before it, so a file whose mark is gone holds the cluster's replaced state.
func (s *Store) Repaired(cluster string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closedLocked(1) || s.refusedLocked(clusterRefusal(cluster), cluster, "", "", 0) {
		return
	}
	s.coalesced += s.pending.mark(cluster, true, "")
	s.enqueuedLocked()
}

// MarkDamaged enqueues marking cluster's state in the file as not whole, saying why: every
// later OpenState reports it in State.Damaged until Repaired or DropCluster. The hub uses it
// for what it knows and the file cannot (after a Reset, or State.Failing: clusters whose
// kept state may be missing or older than what was served), so that a hub restarted again
// before their sessions resync is told too. The file's own findings are marked by the
// repair OpenState starts; the hub need not mark them.
func (s *Store) MarkDamaged(cluster, why string) {
	if why == "" {
		why = "marked damaged by the hub"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closedLocked(1) || s.refusedLocked(clusterRefusal(cluster), cluster, "", "", 0) {
		return
	}
	s.coalesced += s.pending.mark(cluster, false, why)
	s.enqueuedLocked()
}

// enqueuedLocked counts one call and wakes the writer if it is not already woken.
func (s *Store) enqueuedLocked() {
	s.seq++
	if !s.signaled {
		s.signaled = true
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// closedLocked reports whether the store is closed, counting n writes dropped if so: after
// Close nothing more reaches the file.
func (s *Store) closedLocked(n int) bool {
	if s.closing {
		s.dropped += uint64(n)
	}
	return s.closing
}

// Refusals: keys and values bbolt cannot store, and metadata that cannot be encoded. They are
// checked on entry because a batch holding one would fail to commit on every retry, and take
// every other write with it.
const (
	refusedEmptyKey = iota
	refusedLongKey
	refusedEmptyValue
	refusedLongValue
	refusedMeta
	refusedKinds
)

var refusalReasons = [refusedKinds]string{
	"an empty cluster, collection or name",
	"a cluster, collection or name over bbolt's 32 KiB key limit",
	"an empty resource",
	"a resource over bbolt's 2 GiB value limit",
	"metadata whose lastContact cannot be encoded (a year outside 0–9999)",
}

func keyRefusal(cluster, collection, name string, value []byte, isPut bool) int {
	switch {
	case cluster == "" || collection == "" || name == "":
		return refusedEmptyKey
	case len(cluster) > bolt.MaxKeySize || len(collection) > bolt.MaxKeySize || len(name) > bolt.MaxKeySize:
		return refusedLongKey
	case isPut && len(value) == 0:
		return refusedEmptyValue
	case len(value) > bolt.MaxValueSize:
		return refusedLongValue
	}
	return -1
}

func clusterRefusal(cluster string) int {
	switch {
	case cluster == "":
		return refusedEmptyKey
	case len(cluster) > bolt.MaxKeySize:
		return refusedLongKey
	}
	return -1
}

// refusedLocked counts and logs a refusal (why >= 0) and reports whether there was one. It
// logs under s.mu, on the caller's path: refusals do not happen with what the hub stores,
// and each kind is logged once in the store's life.
func (s *Store) refusedLocked(why int, cluster, collection, name string, size int) bool {
	if why < 0 {
		return false
	}
	s.refused++
	if !s.refusalLogged[why] {
		s.refusalLogged[why] = true
		s.log.Error("state file: a write cannot be stored and is refused (logged once per kind)", "file", s.path,
			"why", refusalReasons[why], "cluster", truncate(cluster), "collection", truncate(collection),
			"name", truncate(name), "bytes", size)
	}
	return true
}

func truncate(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}

// batch is writes not yet on disk, the latest per key: at most one entry per (cluster,
// collection, name), one metadata and one drop per cluster. A batch is cut at one point of
// the call sequence and committed in one transaction, so coalescing only ever merges writes
// that reach the disk together.
type batch struct {
	clusters map[string]*clusterOps
	n        int // entries: names, metadata, drops

	// Recycled maps, so that the steady state allocates nothing: a batch is reset after its
	// commit and becomes the next pending one. Only small maps are kept (a map keeps the
	// capacity it grew to, and iterating it costs that capacity).
	freeOps  []*clusterOps
	freeColl []map[string][]byte
}

// clusterOps is a batch's writes of one cluster.
type clusterOps struct {
	drop  bool                         // delete what the file holds of the cluster, before the rest
	meta  []byte                       // encoded Meta to write; nil: none
	colls map[string]map[string][]byte // collection → name → Resource; nil value: delete
	// The damage mark: cleared first (Repaired), then markAdd added (MarkDamaged).
	markClear bool
	markAdd   []string
}

const (
	maxRecycledMap = 1024
	maxFreeMaps    = 256
)

func newBatch() *batch { return &batch{clusters: map[string]*clusterOps{}} }

func (c *clusterOps) count() int {
	n := 0
	if c.drop {
		n++
	}
	if c.meta != nil {
		n++
	}
	if c.markClear || len(c.markAdd) > 0 {
		n++
	}
	for _, m := range c.colls {
		n += len(m)
	}
	return n
}

func (b *batch) cluster(name string) *clusterOps {
	c := b.clusters[name]
	if c == nil {
		if i := len(b.freeOps) - 1; i >= 0 {
			c, b.freeOps = b.freeOps[i], b.freeOps[:i]
		} else {
			c = &clusterOps{colls: map[string]map[string][]byte{}}
		}
		b.clusters[name] = c
	}
	return c
}

// set records name's latest value (nil: deleted); it returns 1 if it replaced a pending
// write of the same key (coalesced), else 0.
func (b *batch) set(cluster, collection, name string, value []byte) uint64 {
	c := b.cluster(cluster)
	m := c.colls[collection]
	if m == nil {
		if i := len(b.freeColl) - 1; i >= 0 {
			m, b.freeColl = b.freeColl[i], b.freeColl[:i]
		} else {
			m = map[string][]byte{}
		}
		c.colls[collection] = m
	}
	before := len(m)
	m[name] = value // one hash of name: whether it was there shows in the length
	if len(m) == before {
		return 1
	}
	b.n++
	return 0
}

func (b *batch) setMeta(cluster string, enc []byte) uint64 {
	c := b.cluster(cluster)
	if c.meta != nil {
		c.meta = enc
		return 1
	}
	c.meta = enc
	b.n++
	return 0
}

// mark records a change of cluster's damage mark (clear, or add why); it returns 1 if the
// cluster already had one pending (coalesced into a single entry).
func (b *batch) mark(cluster string, clear bool, why string) uint64 {
	c := b.cluster(cluster)
	had := c.markClear || len(c.markAdd) > 0
	if clear {
		c.markClear, c.markAdd = true, nil
	} else {
		c.markAdd = append(c.markAdd, why)
	}
	if had {
		return 1
	}
	b.n++
	return 0
}

// drop supersedes everything pending for cluster with a drop; it returns how many pending
// writes it superseded.
func (b *batch) drop(cluster string) uint64 {
	c := b.cluster(cluster)
	old := c.count()
	b.clear(c)
	c.drop = true
	b.n += 1 - old
	if old > 0 {
		return uint64(old)
	}
	return 0
}

// clear empties c, recycling its maps.
func (b *batch) clear(c *clusterOps) {
	for _, m := range c.colls {
		if len(m) <= maxRecycledMap && len(b.freeColl) < maxFreeMaps {
			clear(m)
			b.freeColl = append(b.freeColl, m)
		}
	}
	clear(c.colls)
	c.drop, c.meta = false, nil
	c.markClear, c.markAdd = false, nil
}

// reset empties the batch once committed (or absorbed), keeping its maps for the next.
func (b *batch) reset() {
	for _, c := range b.clusters {
		b.clear(c)
		if len(b.freeOps) < maxFreeMaps {
			b.freeOps = append(b.freeOps, c)
		}
	}
	if len(b.clusters) > maxRecycledMap {
		b.clusters = map[string]*clusterOps{}
	} else {
		clear(b.clusters)
	}
	b.n = 0
}

// absorb applies newer, the writes enqueued after b was cut, on top of b (b failed to
// commit and is retried with them): each of newer's writes replaces b's of the same key,
// and a drop in newer replaces all of b's writes of the cluster. newer is left empty. It
// costs O(newer), not O(b): it runs under s.mu, and b can be large after a long failure.
func (b *batch) absorb(newer *batch) {
	for name, nc := range newer.clusters {
		bc := b.clusters[name]
		if bc == nil || nc.drop {
			if bc != nil {
				b.n -= bc.count()
				b.clear(bc)
			}
			b.clusters[name] = nc
			b.n += nc.count()
			delete(newer.clusters, name) // moved, not to be recycled by newer
			continue
		}
		if nc.meta != nil {
			if bc.meta == nil {
				b.n++
			}
			bc.meta = nc.meta
		}
		if nc.markClear || len(nc.markAdd) > 0 {
			if !bc.markClear && len(bc.markAdd) == 0 {
				b.n++
			}
			if nc.markClear {
				bc.markClear, bc.markAdd = true, nc.markAdd
			} else {
				bc.markAdd = append(bc.markAdd, nc.markAdd...)
			}
		}
		for coll, nm := range nc.colls {
			bm := bc.colls[coll]
			if bm == nil {
				bc.colls[coll] = nm
				b.n += len(nm)
				delete(nc.colls, coll)
				continue
			}
			for k, v := range nm {
				if _, had := bm[k]; !had {
					b.n++
				}
				bm[k] = v
			}
		}
	}
	newer.reset()
}
