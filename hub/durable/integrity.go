package durable

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// The file's integrity records. They live inside the format bucket, beside the format
// marker, and not in new top-level buckets: a hub of the previous release reads only the
// marker there, so a file written by this one still opens after a rollback (a rollback that
// moved a good file aside would be the very fleet-wide deletion this is about). That hub
// does not maintain them; the digests' marker (digestedKey) then no longer names the file's
// last transaction, and the next writable open recomputes them instead of reporting damage.
//
//	format → "digested"   → the bbolt transaction id (8 bytes, big-endian) of the last commit
//	                        that kept the digests: they are valid only if it is the file's last
//	format → "digests"    → digestKey(cluster, kind, collection) → count and sum (16 bytes)
//	format → "damaged"    → cluster → damageMark (JSON): the cluster's state is not whole
//	format → "quarantine" → time+sequence → {"info": JSON, "data": what was taken out}
var (
	digestedKey      = []byte("digested")
	digestsBucket    = []byte("digests")
	damagedBucket    = []byte("damaged")
	quarantineBucket = []byte("quarantine")
	quarantineInfo   = []byte("info")
	quarantineData   = []byte("data")
)

// maxQuarantine is how many quarantine entries (one per repaired cluster, metadata bucket
// or digests bucket) the file keeps; the oldest go first. Each holds what it took out of
// the tree as it was (moved, not copied: a damaged subtree is never read again), so the
// evidence of the last damage is there for bbolt's own tools, and the file does not grow
// with every damage it ever had.
const maxQuarantine = 16

// digest is what the file holds of one collection of one cluster (or of its metadata): how
// many records, and the sum (mod 2^64) of their recordHash. It is order-independent, so a
// commit updates it from the old and new value of each key it writes, in the same
// transaction; a load recomputes it. bbolt checksums only its meta pages: a flipped bit in a
// data page can leave a record that still decodes (a changed string in a body), and this is
// what tells.
type digest struct{ count, sum uint64 }

func (d digest) bytes() []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], d.count)
	binary.BigEndian.PutUint64(b[8:], d.sum)
	return b[:]
}

func decodeDigest(b []byte) (digest, bool) {
	if len(b) != 16 {
		return digest{}, false
	}
	return digest{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}, true
}

func (d *digest) add(name string, v []byte) { d.count++; d.sum += recordHash(name, v) }
func (d *digest) sub(name string, v []byte) { d.count--; d.sum -= recordHash(name, v) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordHash hashes a record's name and value: two CRC-32s of different polynomials side by
// side, CRC-32C and IEEE, both done in hardware on amd64 and arm64 (about 200 ns for 1 KB
// here, against 2 µs for FNV). A CRC detects every error of a few bits, which is the
// damage this is for (random flips); it is no defence against someone forging a file.
func recordHash(name string, v []byte) uint64 {
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(name)))
	n := unsafe.Slice(unsafe.StringData(name), len(name))
	a := crc32.Update(crc32.Update(crc32.Update(0, castagnoli, l[:]), castagnoli, n), castagnoli, v)
	b := crc32.Update(crc32.Update(crc32.ChecksumIEEE(l[:]), crc32.IEEETable, n), crc32.IEEETable, v)
	return uint64(a)<<32 | uint64(b)
}

// Digest kinds: a collection's resources, and a cluster's metadata (one record, named "").
const (
	kindResources = 'r'
	kindMeta      = 'm'
)

// digestKey is uvarint(len(cluster)) cluster kind collection: a cluster's keys are
// contiguous (a drop deletes them with one seek), and no name can be mistaken for another.
func digestKey(cluster string, kind byte, collection string) []byte {
	b := binary.AppendUvarint(make([]byte, 0, 2+len(cluster)+1+len(collection)), uint64(len(cluster)))
	b = append(b, cluster...)
	b = append(b, kind)
	return append(b, collection...)
}

func clusterDigestPrefix(cluster string) []byte {
	return append(binary.AppendUvarint(nil, uint64(len(cluster))), cluster...)
}

func parseDigestKey(k []byte) (cluster string, kind byte, collection string, ok bool) {
	n, w := binary.Uvarint(k)
	if w <= 0 || n > uint64(len(k)-w-1) {
		return "", 0, "", false
	}
	cluster = string(k[w : w+int(n)])
	kind = k[w+int(n)]
	collection = string(k[w+int(n)+1:])
	switch {
	case cluster == "":
		return "", 0, "", false
	case kind == kindMeta && collection == "", kind == kindResources && collection != "":
		return cluster, kind, collection, true
	}
	return "", 0, "", false
}

// digestsValid reports whether the file's digests are those of its last transaction:
// every commit of this package writes its transaction id beside them, so a file last
// written by something else (the release before digests, bbolt's tools, a test editing
// it) has stale ones. In a write transaction the last one is tx.ID()-1.
func digestsValid(tx *bolt.Tx) (valid, present bool) {
	last := uint64(tx.ID())
	if tx.Writable() {
		last--
	}
	fb := tx.Bucket(formatBucket)
	if fb == nil {
		return false, false
	}
	v := fb.Get(digestedKey)
	if v == nil {
		return false, false
	}
	return len(v) == 8 && binary.BigEndian.Uint64(v) == last, true
}

// setDigested records, in a write transaction, that the digests are this transaction's.
func setDigested(fb *bolt.Bucket, tx *bolt.Tx) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(tx.ID()))
	return fb.Put(digestedKey, b[:])
}

// damageMark is a cluster's persistent mark: what was found wrong with its state in the
// file, and since when. It stays until the hub says the cluster's state is whole again
// (Repaired: its own session replaced it) or drops the cluster, so that a hub restarted
// before that is told again: a quarantined record is no longer in the file, and without
// the mark the cluster would look whole.
type damageMark struct {
	V     int       `json:"v"`
	Since time.Time `json:"since"`
	Why   string    `json:"why"`
}

// maxMarkWhy bounds a mark's text: a cluster damaged again and again keeps its first
// reasons and a note.
const maxMarkWhy = 4096

func encodeMark(m damageMark) []byte {
	m.V = 1
	b, _ := json.Marshal(m) // a time and two strings: cannot fail
	return b
}

func decodeMark(b []byte) (damageMark, error) {
	var m damageMark
	if err := json.Unmarshal(b, &m); err != nil || m.V != 1 {
		return damageMark{}, fmt.Errorf("unreadable damage mark %q", truncate(string(b)))
	}
	return m, nil
}

// addMark adds why to cluster's mark in tx (creating it).
func addMark(db *bolt.Bucket, cluster string, why []string, now time.Time) error {
	if len(why) == 0 {
		return nil
	}
	m := damageMark{Since: now.UTC()}
	if old := db.Get([]byte(cluster)); old != nil {
		if om, err := decodeMark(old); err == nil {
			m = om
		} else {
			m.Why = err.Error()
		}
	}
	for _, w := range why {
		switch {
		case strings.Contains(m.Why, w):
		case len(m.Why)+len(w) > maxMarkWhy:
			if !strings.HasSuffix(m.Why, "(and more)") {
				m.Why += "; (and more)"
			}
		case m.Why == "":
			m.Why = w
		default:
			m.Why += "; " + w
		}
	}
	return db.Put([]byte(cluster), encodeMark(m))
}

// integrityBuckets returns the format bucket's digests and damaged buckets, creating them.
func integrityBuckets(tx *bolt.Tx) (fb, digests, damaged *bolt.Bucket, err error) {
	fb = tx.Bucket(formatBucket)
	if fb == nil {
		return nil, nil, nil, errors.New("the format bucket is missing")
	}
	if digests, err = fb.CreateBucketIfNotExists(digestsBucket); err != nil {
		return nil, nil, nil, fmt.Errorf("digests: %w", err)
	}
	if damaged, err = fb.CreateBucketIfNotExists(damagedBucket); err != nil {
		return nil, nil, nil, fmt.Errorf("damage marks: %w", err)
	}
	return fb, digests, damaged, nil
}

// deleteClusterDigests deletes every digest of cluster.
func deleteClusterDigests(digests *bolt.Bucket, cluster string) error {
	prefix := clusterDigestPrefix(cluster)
	c := digests.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// recomputeDigests rewrites every digest from what the clusters and meta buckets hold (a
// file whose digests are stale or absent: the first writable open after an upgrade).
func recomputeDigests(tx *bolt.Tx) error {
	fb := tx.Bucket(formatBucket)
	if fb == nil {
		return errors.New("the format bucket is missing")
	}
	if fb.Bucket(digestsBucket) != nil {
		if err := fb.DeleteBucket(digestsBucket); err != nil {
			return fmt.Errorf("digests: %w", err)
		}
	}
	digests, err := fb.CreateBucket(digestsBucket)
	if err != nil {
		return fmt.Errorf("digests: %w", err)
	}
	cb, mb := tx.Bucket(clustersBucket), tx.Bucket(metaBucket)
	if cb == nil || mb == nil {
		return errors.New("the clusters or meta bucket is missing")
	}
	err = cb.ForEachBucket(func(ck []byte) error {
		kb := cb.Bucket(ck)
		return kb.ForEachBucket(func(colk []byte) error {
			var d digest
			if err := kb.Bucket(colk).ForEach(func(k, v []byte) error {
				if v != nil {
					d.add(string(k), v)
				}
				return nil
			}); err != nil {
				return err
			}
			if d.count == 0 {
				return nil
			}
			return digests.Put(digestKey(string(ck), kindResources, string(colk)), d.bytes())
		})
	})
	if err != nil {
		return err
	}
	return mb.ForEach(func(k, v []byte) error {
		if v == nil {
			return nil
		}
		var d digest
		d.add("", v)
		return digests.Put(digestKey(string(k), kindMeta, ""), d.bytes())
	})
}

// quarantineEntry creates a new entry in the quarantine bucket, keyed by time so that the
// oldest are trimmed first, and returns its data bucket (what is taken out of the tree goes
// there).
func quarantineEntry(tx *bolt.Tx, now time.Time, info map[string]any) (*bolt.Bucket, error) {
	fb := tx.Bucket(formatBucket)
	if fb == nil {
		return nil, errors.New("the format bucket is missing")
	}
	qb, err := fb.CreateBucketIfNotExists(quarantineBucket)
	if err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	seq, err := qb.NextSequence()
	if err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	key := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(now.UnixNano())), seq)
	eb, err := qb.CreateBucket(key)
	if err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	info["at"] = now.UTC()
	ib, _ := json.Marshal(info)
	if err := eb.Put(quarantineInfo, ib); err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	return eb.CreateBucket(quarantineData)
}

// moveAside moves parent's child bucket key into dst without reading it (bbolt's
// MoveBucket relinks the subtree: a damaged one is never walked), and checks it is gone
// from parent: in a node whose keys are out of order (a damaged key) bbolt's lookup can
// miss it, and a subtree linked twice would have its pages freed while still in use.
func moveAside(parent *bolt.Bucket, key []byte, dst *bolt.Bucket) error {
	if err := parent.MoveBucket(key, dst); err != nil {
		return err
	}
	if parent.Bucket(key) != nil || stillThere(parent, key) {
		return fmt.Errorf("bucket %q: still linked after moving it (damaged key order)", key)
	}
	return nil
}

// stillThere scans parent for key (a lookup by key cannot be trusted in a damaged node).
func stillThere(parent *bolt.Bucket, key []byte) bool {
	c := parent.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if bytes.Equal(k, key) {
			return true
		}
	}
	return false
}

// trimQuarantine deletes the oldest quarantine entries beyond maxQuarantine. Deleting one
// walks its pages to free them, and what is quarantined is damaged: it runs in its own
// transaction, under the guard, after the repair, and a failure only leaves the entry.
func trimQuarantine(tx *bolt.Tx, bad map[uint64]string) (int, error) {
	fb := tx.Bucket(formatBucket)
	if fb == nil {
		return 0, nil
	}
	qb := fb.Bucket(quarantineBucket)
	if qb == nil {
		return 0, nil
	}
	var keys [][]byte
	if err := qb.ForEachBucket(func(k []byte) error { keys = append(keys, bytes.Clone(k)); return nil }); err != nil {
		return 0, err
	}
	n := 0
	for i := 0; i+maxQuarantine < len(keys); i++ {
		if holdsBad(qb.Bucket(keys[i]), bad) {
			continue // deleting it would walk a damaged tree: kept for good
		}
		if err := qb.DeleteBucket(keys[i]); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// holdsBad reports whether b, or a bucket in it, is one of the damaged trees: only the
// good trees above them are read (a bucket's root is in its parent's element).
func holdsBad(b *bolt.Bucket, bad map[uint64]string) bool {
	if b == nil || len(bad) == 0 {
		return false
	}
	if r := uint64(b.Root()); r != 0 && bad[r] != "" {
		return true
	}
	found := false
	_ = b.ForEachBucket(func(k []byte) error {
		if holdsBad(b.Bucket(k), bad) {
			found = true
		}
		return nil
	})
	return found
}
