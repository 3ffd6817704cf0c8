package durable

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/mcp"
)

// State is what the state file holds and what is known to be wrong with it (OpenState).
type State struct {
	// Clusters is what could be read, per cluster (as Load returns it).
	Clusters map[string]*Cluster
	// Damaged names each cluster whose state in the file is not whole, with what is wrong
	// (which collection, which record or which check). Its Clusters entry holds what could
	// be read (an empty one if nothing could). A cluster stays here, on every open, until
	// the hub calls Repaired for it (its own session replaced its state) or drops it: the
	// damage is marked in the file, since a quarantined record is no longer there to be
	// found again.
	Damaged map[string]string
	// Reset is set when the file could not be read as a whole (not a bbolt file, both meta
	// pages bad, truncated, zero length, no layout, another format, a panic or fault inside
	// bbolt on its top-level pages...): it was moved aside (MovedTo; kept as evidence) and
	// an empty file is open in its place, and every cluster's state is unknown. MovedTo is
	// empty when it could not be moved (ReadOnly) or there was nothing to move (the file is
	// missing while its run marker shows it was in use).
	Reset *ResetError
	// ReadOnly: the file could not be opened for writing (a read-only file system,
	// permissions: EROFS, EACCES, EPERM); it was opened read-only and loaded, and the Store
	// writes nothing until it can (each attempt is a failure: Stats().ReadOnly, Failing,
	// LastError). Nothing was quarantined or marked.
	ReadOnly bool
	// Unclean: the process that used the file before did not close it cleanly (killed,
	// crashed, or its run marker is missing): the file holds a prefix of its writes, and what
	// it enqueued in its last moments may be missing. Failing: its writes were failing when
	// it stopped (disk full, I/O errors): any cluster's state may be older than what it had
	// served, by as long as the failure lasted; it is also set after a Close that could not
	// write everything. Failing implies Unclean.
	Unclean, Failing bool
	// LastCommitLost says why the file may hold the state before its last commit ("" if
	// not): one of bbolt's two meta pages is damaged (a flipped bit, a write torn by a power
	// loss) and bbolt reads the other, which may be the older. What that commit wrote is then
	// missing, however much it was: Failing and Unclean are set too, for what follows for the
	// hub is the same.
	LastCommitLost string
	// Migrated: the file had no valid integrity digests (written before they existed, or
	// last written by another program), so silent damage could not be checked for on this
	// open; they are computed by the first commit.
	Migrated bool
}

// OpenState opens the state file at path and loads it, reporting what is wrong with it
// rather than failing on it (see State and the package doc's "A file that cannot be
// trusted whole"). A missing file is created whole (a temporary file with the layout,
// fsynced, linked into place), so a zero-length or half-initialized file is never one this
// package made, and is reported as a Reset. The error is what the hub cannot start the file
// past: another process holds it (ErrLocked), a permission or I/O error with no way to
// read it, or moving a corrupt file aside failed. faults is nil but in tests.
func OpenState(path string, log *slog.Logger, faults *Faults) (*Store, *State, error) {
	return openState(path, log, defaultConfig().with(faults))
}

func openState(path string, log *slog.Logger, cfg config) (*Store, *State, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	prev, prevErr := readRunMarker(path)
	_, statErr := os.Stat(path)
	existed := statErr == nil
	st := &State{}
	s, err := newStore(path, log, cfg, true)
	var ce *CorruptError
	switch {
	case err == nil:
	case errors.As(err, &ce):
		if s, err = resetFile(path, log, cfg, ce, st); err != nil {
			return nil, nil, err
		}
	default:
		return nil, nil, err
	}
	if s.db != nil {
		var r *scanResult
		err := s.guard(func() error {
			return s.db.View(func(tx *bolt.Tx) error {
				var err error
				r, err = s.scan(tx)
				return err
			})
		})
		if errors.As(err, &ce) { // the file's top-level structure: not readable as a whole
			_ = s.closeDB()
			if s, err = resetFile(path, log, cfg, ce, st); err != nil {
				return nil, nil, err
			}
		} else if err != nil {
			_ = s.closeDB()
			return nil, nil, err
		} else {
			st.Clusters, st.Damaged, st.Migrated = r.clusters, r.damaged(), !r.valid
			s.repair = r.plan() // a read-only store keeps it for when it can write
			if s.salvage != nil && !probeReadOnly(path, cfg) {
				if s, err = s.rebuild(r); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	if st.Clusters == nil {
		st.Clusters = map[string]*Cluster{}
	}
	if st.Damaged == nil {
		st.Damaged = map[string]string{}
	}
	st.ReadOnly = s.readOnly

	// The run marker: what the previous process left. A file that did not exist has no
	// past, unless its marker shows it was in use (deleted under the hub).
	switch {
	case !existed && prevErr == nil && st.Reset == nil:
		ce := &CorruptError{Path: path, Err: fmt.Errorf("the file is missing, but its run marker %s says it was in use (%s): it was deleted", runMarkerPath(path), prev)}
		st.Reset = &ResetError{Err: ce}
		log.Error("state file missing although it was in use: starting without kept state; every cluster's state is unknown", "err", ce)
	case !existed:
	case errors.Is(prevErr, os.ErrNotExist):
		st.Unclean = true // a file in use before the marker existed, or whose marker was lost
	case prevErr != nil:
		st.Unclean = true
		log.Warn("state file: its run marker cannot be read; taking the last run as unclean", "err", prevErr)
	case prev == runFailing:
		st.Unclean, st.Failing = true, true
	case prev == runOpen:
		st.Unclean = true
	}
	if s.lostCommit != "" && st.Reset == nil {
		st.LastCommitLost, st.Failing = s.lostCommit, true
		log.Error("state file: it may hold the state before its last commit; any cluster's kept state may be older than what was served", "why", s.lostCommit)
	}
	if st.Failing {
		st.Unclean = true
	}
	s.report(st)
	s.start(true)
	return s, st, nil
}

// resetFile moves a file that cannot be read as a whole aside and opens an empty one in its
// place; on a read-only file system it moves nothing and returns a Store with no file.
func resetFile(path string, log *slog.Logger, cfg config, ce *CorruptError, st *State) (*Store, error) {
	reset := &ResetError{Err: ce}
	st.Reset = reset
	if probeReadOnly(path, cfg) {
		log.Error("state file unreadable, and read-only: starting without kept state; every cluster's state is unknown", "err", ce)
		s := newStoreNoFile(path, log, cfg)
		s.setReadOnly(fmt.Errorf("state file %s: unreadable and read-only: %v", path, ce))
		return s, nil
	}
	moved := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := os.Rename(path, moved); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w; moving it aside failed: %v", ce, err)
	}
	reset.MovedTo = moved
	log.Error("state file unreadable: moved aside, starting without kept state; every cluster's state is unknown", "err", ce, "moved_to", moved)
	return newStore(path, log, cfg, false)
}

// rebuild replaces a file that is readable but must not be written (s.salvage: its
// freelist names pages in use) with a new one holding what the scan read, its damage marks
// and its findings as marks: written whole beside it, then the old file moved aside (kept as
// evidence) and the new one linked into its place. A crash between the two leaves no file
// at the path and a run marker saying it was in use, which the next start reports as a
// Reset: never a silently empty file. Nothing the scan read is lost, so this is not a Reset.
func (s *Store) rebuild(r *scanResult) (*Store, error) {
	why := s.salvage
	tmp, err := s.writeTemp(func(tx *bolt.Tx) error { return r.writeAll(tx, time.Now()) })
	if err != nil {
		return nil, fmt.Errorf("%w; rebuilding it failed: %v", why, err)
	}
	defer func() { _ = os.Remove(tmp) }()
	_ = s.closeDB()
	moved := s.path + ".corrupt-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := os.Rename(s.path, moved); err != nil {
		return nil, fmt.Errorf("%w; moving it aside to rebuild it failed: %v", why, err)
	}
	if err := os.Link(tmp, s.path); err != nil {
		return nil, fmt.Errorf("%w; moved aside to %s, and linking the rebuilt file failed: %v", why, moved, err)
	}
	syncDir(filepath.Dir(s.path))
	s.log.Warn("state file: readable but not writable as it was; rebuilt from what it holds (nothing read was lost), the old file kept",
		"err", why, "moved_to", moved)
	ns, err := newStore(s.path, s.log, s.cfg, true)
	if err != nil {
		return nil, err
	}
	return ns, nil
}

// writeAll writes everything the scan read into a new file's tx: the clusters (but records
// under an unknown name), their metadata, the damage marks, and the findings as marks.
func (r *scanResult) writeAll(tx *bolt.Tx, now time.Time) error {
	cb, mb := tx.Bucket(clustersBucket), tx.Bucket(metaBucket)
	for _, c := range slices.Sorted(maps.Keys(r.clusters)) {
		if r.unknown[c] {
			continue
		}
		colls := map[string]map[string][]byte{}
		for coll, held := range r.clusters[c].Collections {
			m := make(map[string][]byte, len(held))
			for n, e := range held {
				m[n] = e.Encoded
			}
			colls[coll] = m
		}
		if err := writeCluster(cb, c, colls); err != nil {
			return err
		}
	}
	for _, c := range slices.Sorted(maps.Keys(r.metaRaw)) {
		if err := mb.Put([]byte(c), r.metaRaw[c]); err != nil {
			return err
		}
	}
	_, _, damaged, err := integrityBuckets(tx)
	if err != nil {
		return err
	}
	for _, c := range slices.Sorted(maps.Keys(r.marksRaw)) {
		if err := damaged.Put([]byte(c), r.marksRaw[c]); err != nil {
			return err
		}
	}
	for _, c := range r.order {
		var why []string
		for _, f := range r.findings[c] {
			why = append(why, f.detail())
		}
		if err := addMark(damaged, c, why, now); err != nil {
			return err
		}
	}
	return nil
}

// probeReadOnly reports whether path cannot be written (or created) for the reasons a
// read-only file system or permissions give.
func probeReadOnly(path string, cfg config) bool {
	f, err := cfg.openFile(path, os.O_RDWR, 0)
	if err == nil {
		_ = f.Close()
		return false
	}
	return isReadOnlyErr(err)
}

// report logs what OpenState found, once, in the lines an operator needs.
func (s *Store) report(st *State) {
	for _, c := range slices.Sorted(maps.Keys(st.Damaged)) {
		s.log.Error("state file: a cluster's kept state is not whole; the hub does not know its state until its session resyncs it",
			"cluster", c, "damage", st.Damaged[c])
	}
	if st.Migrated && st.Reset == nil {
		s.log.Warn("state file: no valid integrity digests (written before they existed, or last written by another program): silent damage could not be checked for; they are computed with the first commit")
	}
	if st.ReadOnly {
		s.log.Error("state file: read-only: loaded, but nothing is written (a restart serves what it holds now)", "err", s.Stats().LastError)
	}
	switch {
	case st.Failing:
		s.log.Warn("state file: its last user's writes were failing when it stopped: any cluster's kept state may be older than what was served")
	case st.Unclean:
		s.log.Warn("state file: its last user did not close it cleanly (killed or crashed): what it enqueued in its last moments may be missing")
	}
}

// scanResult is what a scan of the whole file found.
type scanResult struct {
	path     string
	clusters map[string]*Cluster
	// findings: new damage, per cluster, in the order found; order lists the clusters.
	findings map[string][]*CorruptError
	order    []string
	seen     map[string]bool // "cluster\x00collection" with a finding: its digest is not compared again
	marks    map[string]string
	valid    bool // the digests are the file's last transaction's
	// What a repair must rewrite: rewriteAll, the clusters bucket as a whole (a key in it
	// that bbolt cannot look up); metaRewrite, the meta bucket; digestsLost, the digests
	// bucket cannot be read (moved aside, recomputed); marksLost, the marks cannot be read.
	rewriteAll, metaRewrite, digestsLost, marksLost bool
	unknown                                         map[string]bool // records under a name the file knows nothing of
	metaRaw, marksRaw                               map[string][]byte
	// maxValue: no value can be longer than the file (a damaged element's size can say
	// anything up to 4 GiB, and copying or printing it would take the process down).
	maxValue int
}

// impossible reports a key or value of a size no record can have (a damaged page's
// element header), which must not be copied or printed.
func (r *scanResult) impossible(k, v []byte) error {
	if len(k) == 0 || len(k) > bolt.MaxKeySize || len(v) > r.maxValue {
		return fmt.Errorf("an entry of impossible size (key %d bytes, value %d bytes): a damaged page", len(k), len(v))
	}
	return nil
}

func (r *scanResult) find(ce *CorruptError) {
	ce.Path = r.path
	if r.findings[ce.Cluster] == nil {
		r.order = append(r.order, ce.Cluster)
	}
	r.findings[ce.Cluster] = append(r.findings[ce.Cluster], ce)
	r.seen[ce.Cluster+"\x00"+ce.Collection] = true
}

func (r *scanResult) cluster(name string) *Cluster {
	c := r.clusters[name]
	if c == nil {
		c = &Cluster{Collections: map[string]map[string]*mcp.Entry{}}
		r.clusters[name] = c
	}
	return c
}

// first is the first damage found (strict Load's error).
func (r *scanResult) first() *CorruptError {
	if len(r.order) > 0 {
		return r.findings[r.order[0]][0]
	}
	for _, c := range slices.Sorted(maps.Keys(r.marks)) {
		return &CorruptError{Path: r.path, Cluster: c, Err: fmt.Errorf("marked damaged: %s", r.marks[c])}
	}
	return nil
}

// damaged is State.Damaged: each cluster's new findings, then its persisted mark.
func (r *scanResult) damaged() map[string]string {
	out := map[string]string{}
	for c, fs := range r.findings {
		out[c] = joinFindings(fs)
	}
	for c, m := range r.marks {
		if out[c] != "" {
			out[c] += "; "
		}
		out[c] += "marked: " + m
	}
	for c := range out {
		r.cluster(c) // a damaged cluster always has an entry, maybe empty
	}
	return out
}

const maxFindingsShown = 10

func joinFindings(fs []*CorruptError) string {
	var b strings.Builder
	for i, f := range fs {
		if i == maxFindingsShown {
			fmt.Fprintf(&b, "; and %d more", len(fs)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.detail())
	}
	return b.String()
}

// detail is the error without the file and cluster: what Damaged says of a cluster.
func (e *CorruptError) detail() string {
	switch {
	case e.Name != "":
		return fmt.Sprintf("collection %q, resource %q: %v", e.Collection, truncate(e.Name), e.Err)
	case e.Collection != "":
		return fmt.Sprintf("collection %q: %v", e.Collection, e.Err)
	}
	return e.Err.Error()
}

// scan reads every record of the file in tx, checking each one, the keys' order, and the
// integrity digests. Damage confined to a cluster is a finding, and the scan goes on; only
// what makes the file unreadable as a whole is its error (a missing top-level bucket; a
// panic or fault in the top-level buckets' own pages, which the caller's guard turns into a
// *CorruptError). A panic inside one cluster's or one collection's pages is caught there:
// that part is unreadable, the rest is not.
func (s *Store) scan(tx *bolt.Tx) (*scanResult, error) {
	r := &scanResult{path: s.path, clusters: map[string]*Cluster{}, findings: map[string][]*CorruptError{},
		seen: map[string]bool{}, marks: map[string]string{}, unknown: map[string]bool{}, metaRaw: map[string][]byte{}, marksRaw: map[string][]byte{},
		maxValue: int(tx.Size())}
	cb, mb, fb := tx.Bucket(clustersBucket), tx.Bucket(metaBucket), tx.Bucket(formatBucket)
	if cb == nil || mb == nil || fb == nil {
		return nil, &CorruptError{Path: s.path, Err: errors.New("the clusters, meta or format bucket is missing")}
	}
	r.valid, _ = digestsValid(tx)
	stored := map[string]digest{}
	if r.valid {
		if err := s.guard(func() error {
			if err := s.damagedTree(fb.Bucket(digestsBucket)); err != nil {
				return err
			}
			return readDigests(r, fb, stored)
		}); err != nil {
			s.log.Error("state file: the integrity digests cannot be read: not checked on this open, recomputed by the first commit", "err", err)
			r.valid, r.digestsLost = false, true
		}
	}
	if err := s.guard(func() error {
		if err := s.damagedTree(fb.Bucket(damagedBucket)); err != nil {
			return err
		}
		return readMarks(r, fb)
	}); err != nil {
		r.marksLost = true
		s.log.Error("state file: the damage marks cannot be read: every cluster is taken as damaged", "err", err)
	}

	computed := map[string]digest{}
	var prev []byte
	err := cb.ForEach(func(ck, v []byte) error {
		if err := r.impossible(ck, v); err != nil {
			r.rewriteAll = true
			r.find(&CorruptError{Cluster: fmt.Sprintf("(a damaged cluster key of %d bytes)", len(ck)), Err: err})
			return nil
		}
		cluster := string(ck)
		if prev != nil && bytes.Compare(ck, prev) <= 0 {
			r.rewriteAll = true
			r.find(&CorruptError{Cluster: cluster, Err: errors.New("its name is out of order in the clusters bucket (a damaged key)")})
		}
		prev = append(prev[:0], ck...)
		c := r.cluster(cluster)
		if v != nil {
			r.find(&CorruptError{Cluster: cluster, Err: errors.New("a value where a cluster's bucket belongs")})
			return nil
		}
		kb := cb.Bucket(ck)
		if kb == nil {
			r.rewriteAll = true
			r.find(&CorruptError{Cluster: cluster, Err: errors.New("its bucket cannot be looked up by its name (a damaged key)")})
			return nil
		}
		if err := s.damagedTree(kb); err != nil {
			r.find(&CorruptError{Cluster: cluster, Err: fmt.Errorf("unreadable: %v", err)})
			return nil
		}
		if err := s.guard(func() error { return s.scanCluster(r, cluster, kb, c, computed) }); err != nil {
			r.find(&CorruptError{Cluster: cluster, Err: fmt.Errorf("unreadable: %v", unwrapCorrupt(err))})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := s.guard(func() error {
		if err := s.damagedTree(mb); err != nil {
			return err
		}
		return scanMeta(r, mb, computed)
	}); err != nil {
		r.metaRewrite = true
		for c := range r.clusters {
			r.find(&CorruptError{Cluster: c, Err: fmt.Errorf("metadata unreadable: %v", unwrapCorrupt(err))})
		}
	}
	if r.marksLost {
		for c := range r.clusters {
			r.find(&CorruptError{Cluster: c, Err: errors.New("the file's damage marks are unreadable")})
		}
	}
	if r.valid {
		r.compareDigests(stored, computed)
	}
	return r, nil
}

// damagedTree says whether b's tree is one boltfile.WalkTree found damaged: bbolt must not be let
// into it (it can loop forever on a page loop).
func (s *Store) damagedTree(b *bolt.Bucket) error {
	if b == nil {
		return nil
	}
	if r := uint64(b.Root()); r != 0 && s.badRoots[r] != "" {
		return fmt.Errorf("its tree is damaged: %s", s.badRoots[r])
	}
	return nil
}

func unwrapCorrupt(err error) error {
	var ce *CorruptError
	if errors.As(err, &ce) {
		return ce.Err
	}
	return err
}

func (s *Store) scanCluster(r *scanResult, cluster string, kb *bolt.Bucket, c *Cluster, computed map[string]digest) error {
	var prev []byte
	return kb.ForEach(func(colk, v []byte) error {
		if err := r.impossible(colk, v); err != nil {
			r.find(&CorruptError{Cluster: cluster, Collection: fmt.Sprintf("(a damaged key of %d bytes)", len(colk)), Err: err})
			return nil
		}
		coll := string(colk)
		if prev != nil && bytes.Compare(colk, prev) <= 0 {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Err: errors.New("its name is out of order in the cluster's bucket (a damaged key)")})
		}
		prev = append(prev[:0], colk...)
		if v != nil {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Err: errors.New("a value where a collection's bucket belongs")})
			return nil
		}
		colb := kb.Bucket(colk)
		if colb == nil {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Err: errors.New("its bucket cannot be looked up by its name (a damaged key)")})
			return nil
		}
		held := c.Collections[coll]
		if held == nil {
			held = map[string]*mcp.Entry{}
		}
		var d digest
		if err := s.damagedTree(colb); err != nil {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Err: fmt.Errorf("unreadable: %v", err)})
			return nil
		}
		if err := s.guard(func() error { return scanCollection(r, cluster, coll, colb, held, &d) }); err != nil {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Err: fmt.Errorf("unreadable past %d records: %v", len(held), unwrapCorrupt(err))})
		}
		if len(held) > 0 {
			c.Collections[coll] = held
		}
		if d.count > 0 {
			k := string(digestKey(cluster, kindResources, coll))
			o := computed[k]
			computed[k] = digest{o.count + d.count, o.sum + d.sum}
		}
		return nil
	})
}

func scanCollection(r *scanResult, cluster, coll string, colb *bolt.Bucket, held map[string]*mcp.Entry, d *digest) error {
	scratch := new(mcpapi.Resource)
	var prev []byte
	misordered := false
	return colb.ForEach(func(nk, v []byte) error {
		if err := r.impossible(nk, v); err != nil {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Err: err})
			return nil
		}
		name := string(nk)
		if prev != nil && bytes.Compare(nk, prev) <= 0 && !misordered {
			misordered = true // once per collection: the record may be whole, its neighbour not
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Err: fmt.Errorf("keys out of order at %q (a damaged key)", truncate(name))})
		}
		prev = append(prev[:0], nk...)
		if v == nil {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Name: name, Err: errors.New("a bucket where a resource belongs")})
			return nil
		}
		e, err := decodeRecord(name, bytes.Clone(v), scratch) // bbolt's bytes live only as long as the transaction
		if err != nil {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Name: name, Err: err})
			return nil
		}
		if _, dup := held[name]; dup {
			r.find(&CorruptError{Cluster: cluster, Collection: coll, Name: name, Err: errors.New("stored twice (a damaged key)")})
			return nil
		}
		held[name] = e
		d.add(name, e.Encoded)
		return nil
	})
}

func scanMeta(r *scanResult, mb *bolt.Bucket, computed map[string]digest) error {
	var prev []byte
	return mb.ForEach(func(ck, v []byte) error {
		if err := r.impossible(ck, v); err != nil {
			r.metaRewrite = true
			r.find(&CorruptError{Cluster: fmt.Sprintf("(a damaged metadata key of %d bytes)", len(ck)), Err: err})
			return nil
		}
		cluster := string(ck)
		if prev != nil && bytes.Compare(ck, prev) <= 0 {
			r.metaRewrite = true
			r.find(&CorruptError{Cluster: cluster, Err: errors.New("metadata: its name is out of order in the meta bucket (a damaged key)")})
		}
		prev = append(prev[:0], ck...)
		if v == nil {
			r.metaRewrite = true
			r.find(&CorruptError{Cluster: cluster, Err: errors.New("a bucket where the cluster's metadata belongs")})
			return nil
		}
		m, err := decodeMeta(v)
		if err != nil {
			r.metaRewrite = true
			r.cluster(cluster)
			r.find(&CorruptError{Cluster: cluster, Err: fmt.Errorf("metadata: %w", err)})
			return nil
		}
		if _, dup := r.metaRaw[cluster]; dup {
			r.metaRewrite = true
			r.find(&CorruptError{Cluster: cluster, Err: errors.New("metadata stored twice (a damaged key)")})
			return nil
		}
		r.cluster(cluster).Meta = m
		r.metaRaw[cluster] = bytes.Clone(v)
		var d digest
		d.add("", v)
		computed[string(digestKey(cluster, kindMeta, ""))] = d
		return nil
	})
}

func readDigests(r *scanResult, fb *bolt.Bucket, into map[string]digest) error {
	db := fb.Bucket(digestsBucket)
	if db == nil {
		return nil
	}
	return db.ForEach(func(k, v []byte) error {
		if err := r.impossible(k, v); err != nil {
			return err
		}
		d, ok := decodeDigest(v)
		if !ok {
			return fmt.Errorf("digest %q: %d bytes", truncate(string(k)), len(v))
		}
		into[string(k)] = d
		return nil
	})
}

func readMarks(r *scanResult, fb *bolt.Bucket) error {
	into := r.marks
	mb := fb.Bucket(damagedBucket)
	if mb == nil {
		return nil
	}
	return mb.ForEach(func(k, v []byte) error {
		if err := r.impossible(k, v); err != nil {
			return err
		}
		if v == nil {
			into[string(k)] = "(a damaged mark: a bucket)"
			return nil
		}
		r.marksRaw[string(k)] = bytes.Clone(v)
		m, err := decodeMark(v)
		if err != nil {
			into[string(k)] = err.Error()
			return nil
		}
		into[string(k)] = fmt.Sprintf("since %s: %s", m.Since.Format(time.RFC3339), m.Why)
		return nil
	})
}

// compareDigests compares what the file's records hash to with what its commits recorded.
func (r *scanResult) compareDigests(stored, computed map[string]digest) {
	known := map[string]bool{} // clusters the digests name
	for k := range stored {
		if c, _, _, ok := parseDigestKey([]byte(k)); ok {
			known[c] = true
		}
	}
	// Records under a cluster name the file has neither metadata nor digests for were not
	// written under that name: a damaged cluster key (the real cluster's digests no longer
	// match below). They are left out; the repair quarantines them.
	for _, c := range slices.Sorted(maps.Keys(r.clusters)) {
		cl := r.clusters[c]
		if _, meta := r.metaRaw[c]; !meta && !known[c] && len(cl.Collections) > 0 && !r.seenCluster(c) {
			n := 0
			for _, held := range cl.Collections {
				n += len(held)
			}
			r.unknown[c] = true
			cl.Collections = map[string]map[string]*mcp.Entry{}
			r.find(&CorruptError{Cluster: c, Err: fmt.Errorf("%d records under a cluster name the file has no metadata or digests for (a damaged key?): left out", n)})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(joinKeys(stored, computed))) {
		c, kind, coll, ok := parseDigestKey([]byte(k))
		if !ok {
			r.digestsLost = true // a damaged digest key: the digests are rewritten
			continue
		}
		if r.unknown[c] || r.seen[c+"\x00"+coll] {
			continue
		}
		sd, hasStored := stored[k]
		cd := computed[k]
		if hasStored && sd == cd {
			continue
		}
		what := "resources"
		if kind == kindMeta {
			what = "metadata"
		}
		var err error
		switch {
		case !hasStored:
			err = fmt.Errorf("integrity digest: %d %s in the file that no commit recorded", cd.count, what)
		case sd.count != cd.count:
			err = fmt.Errorf("integrity digest: %d %s in the file, %d recorded", cd.count, what, sd.count)
		default:
			err = fmt.Errorf("integrity digest: the %s's bytes differ from what was written (%d %s; hash %016x, recorded %016x)", what, cd.count, what, cd.sum, sd.sum)
		}
		r.cluster(c)
		r.find(&CorruptError{Cluster: c, Collection: coll, Err: err})
	}
}

func (r *scanResult) seenCluster(c string) bool { return len(r.findings[c]) > 0 }

func joinKeys(a, b map[string]digest) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// repairPlan is what the first writable commit does about the damage a scan found, before
// its batch: each damaged cluster's bucket is moved into a quarantine entry as it is (never
// read again), and what could be read of it is written back; a damaged meta bucket or
// clusters bucket likewise as a whole; then every digest is recomputed from the tree, and
// the damaged clusters are marked. It runs in the writer's transaction, so it is retried
// with the batch on a failing disk, and a process killed before it leaves the file as it was
// (the next open finds the same damage).
type repairPlan struct {
	at          time.Time
	all         bool                                    // rewrite the clusters bucket as a whole
	clusters    map[string]map[string]map[string][]byte // cluster → collection → name → record, to write back
	meta        bool
	metaRaw     map[string][]byte
	digestsLost bool
	marksLost   bool
	marks       map[string][]string // cluster → what to add to its mark
	summary     string
}

// plan is the repair of what r found, nil when there is nothing to do.
func (r *scanResult) plan() *repairPlan {
	if len(r.findings) == 0 && !r.digestsLost && !r.marksLost {
		return nil
	}
	p := &repairPlan{at: time.Now(), all: r.rewriteAll, clusters: map[string]map[string]map[string][]byte{},
		meta: r.metaRewrite, metaRaw: r.metaRaw, digestsLost: r.digestsLost, marksLost: r.marksLost, marks: map[string][]string{}}
	rewrite := func(c string) {
		colls := map[string]map[string][]byte{}
		if cl := r.clusters[c]; cl != nil && !r.unknown[c] {
			for coll, held := range cl.Collections {
				m := make(map[string][]byte, len(held))
				for n, e := range held {
					m[n] = e.Encoded
				}
				colls[coll] = m
			}
		}
		p.clusters[c] = colls
	}
	for _, c := range r.order {
		for _, f := range r.findings[c] {
			p.marks[c] = append(p.marks[c], f.detail())
		}
		rewrite(c)
	}
	if p.all {
		for c := range r.clusters {
			rewrite(c)
		}
	}
	p.summary = fmt.Sprintf("%d clusters damaged", len(r.order))
	return p
}

// apply runs the repair in tx (a write transaction), before the batch.
func (p *repairPlan) apply(tx *bolt.Tx) error {
	cb, mb := tx.Bucket(clustersBucket), tx.Bucket(metaBucket)
	if cb == nil || mb == nil {
		return errors.New("the clusters or meta bucket is missing")
	}
	info := map[string]any{"why": p.summary}
	data, err := quarantineEntry(tx, p.at, info)
	if err != nil {
		return err
	}
	if !p.all {
		// The clusters bucket's keys are in order (the scan would have set all otherwise),
		// so bbolt finds each one. If it did not, the transaction is abandoned rather than
		// fixed up: a subtree already linked into the quarantine and still in the clusters
		// bucket could not be unlinked from either without freeing its pages under the other.
		for _, c := range slices.Sorted(maps.Keys(p.clusters)) {
			if err := takeOut(cb, []byte(c), data); err != nil {
				return fmt.Errorf("cluster %q: %w", c, err)
			}
		}
	}
	if p.all {
		if err := tx.MoveBucket(clustersBucket, nil, data); err != nil {
			return fmt.Errorf("moving the clusters bucket aside: %w", err)
		}
		if cb, err = tx.CreateBucket(clustersBucket); err != nil {
			return err
		}
	}
	for _, c := range slices.Sorted(maps.Keys(p.clusters)) {
		if err := writeCluster(cb, c, p.clusters[c]); err != nil {
			return err
		}
	}
	fb := tx.Bucket(formatBucket)
	if p.meta {
		md, err := quarantineEntry(tx, p.at, map[string]any{"why": "the meta bucket was damaged"})
		if err != nil {
			return err
		}
		if err := tx.MoveBucket(metaBucket, nil, md); err != nil {
			return fmt.Errorf("moving the meta bucket aside: %w", err)
		}
		if mb, err = tx.CreateBucket(metaBucket); err != nil {
			return err
		}
		for _, c := range slices.Sorted(maps.Keys(p.metaRaw)) {
			if err := mb.Put([]byte(c), p.metaRaw[c]); err != nil {
				return err
			}
		}
	}
	if p.digestsLost && fb.Bucket(digestsBucket) != nil {
		dd, err := quarantineEntry(tx, p.at, map[string]any{"why": "the digests bucket was damaged"})
		if err != nil {
			return err
		}
		if err := fb.MoveBucket(digestsBucket, dd); err != nil {
			return fmt.Errorf("moving the digests aside: %w", err)
		}
	}
	if p.marksLost && fb.Bucket(damagedBucket) != nil {
		dd, err := quarantineEntry(tx, p.at, map[string]any{"why": "the damage marks bucket was damaged"})
		if err != nil {
			return err
		}
		if err := fb.MoveBucket(damagedBucket, dd); err != nil {
			return fmt.Errorf("moving the damage marks aside: %w", err)
		}
	}
	if err := recomputeDigests(tx); err != nil {
		return err
	}
	_, _, damaged, err := integrityBuckets(tx)
	if err != nil {
		return err
	}
	for _, c := range slices.Sorted(maps.Keys(p.marks)) {
		if err := addMark(damaged, c, p.marks[c], p.at); err != nil {
			return err
		}
	}
	return nil
}

// takeOut moves cluster key's bucket (or a value at its place) from cb into data.
func takeOut(cb *bolt.Bucket, key []byte, data *bolt.Bucket) error {
	if v := cb.Get(key); v != nil {
		if err := data.Put(key, bytes.Clone(v)); err != nil {
			return err
		}
		if err := cb.Delete(key); err != nil {
			return err
		}
		if cb.Get(key) != nil || stillThere(cb, key) {
			return fmt.Errorf("%q: still there after deleting it", key)
		}
		return nil
	}
	if cb.Bucket(key) == nil {
		if stillThere(cb, key) {
			return fmt.Errorf("%q: listed, but cannot be looked up", key)
		}
		return nil // nothing to take out (a cluster known only by its metadata or digests)
	}
	return moveAside(cb, key, data)
}

// writeCluster writes a cluster's records back, in key order.
func writeCluster(cb *bolt.Bucket, cluster string, colls map[string]map[string][]byte) error {
	var kb *bolt.Bucket
	for _, coll := range slices.Sorted(maps.Keys(colls)) {
		m := colls[coll]
		if len(m) == 0 {
			continue
		}
		if kb == nil {
			var err error
			if kb, err = cb.CreateBucket([]byte(cluster)); err != nil {
				return fmt.Errorf("cluster %q: %w", cluster, err)
			}
		}
		colb, err := kb.CreateBucket([]byte(coll))
		if err != nil {
			return fmt.Errorf("cluster %q, collection %q: %w", cluster, coll, err)
		}
		for _, n := range slices.Sorted(maps.Keys(m)) {
			if err := colb.Put([]byte(n), m[n]); err != nil {
				return fmt.Errorf("cluster %q, collection %q, resource %q: %w", cluster, coll, n, err)
			}
		}
	}
	return nil
}

// errRepair marks a repair's own failure (as opposed to the disk's): the writer then drops
// the repair and commits without it, rather than failing every commit forever.
type errRepair struct{ err error }

func (e *errRepair) Error() string { return "repairing the damage found at open: " + e.err.Error() }
func (e *errRepair) Unwrap() error { return e.err }
