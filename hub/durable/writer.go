package durable

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// run is the writer goroutine. It takes the whole pending batch (cutting the call sequence
// at one point), commits it in one bbolt transaction (its fsyncs), and goes on with what was
// enqueued meanwhile, at most one commit per commitInterval: batches grow with the load. A batch that
// fails to commit is put back under what was enqueued since (the newer writes win) and
// retried with backoff, the file reopened first; the callers never see any of it.
func (s *Store) run() {
	defer close(s.done)
	spare := newBatch()
	var backoff time.Duration
	var fl failureLog
	for {
		if backoff == 0 {
			select {
			case <-s.wake:
			case <-s.stop:
			}
		} else {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.stop: // Close: one last attempt now
				t.Stop()
			}
		}
		s.mu.Lock()
		b := s.pending
		s.pending, spare = spare, nil
		s.inflight = b.n
		seq, closing := s.seq, s.closing
		s.signaled = false
		s.mu.Unlock()

		start := time.Now()
		err := s.write(b)
		took := time.Since(start)
		if err == nil {
			fl.recovered(s) // before the commit is published: a Flush that returns has it logged
			n := b.n
			b.reset()
			spare = b
			var size int64 = -1
			if n > 0 {
				if info, err := os.Stat(s.path); err == nil {
					size = info.Size()
				}
			}
			s.mu.Lock()
			s.inflight = 0
			s.committed = seq
			if n > 0 {
				s.batches++
				s.written += uint64(n)
				s.lastCommit, s.lastCommitDuration, s.lastBatch = time.Now(), took, n
				if size >= 0 {
					s.fileSize = size
				}
			}
			s.failing = false
			close(s.commitCh)
			s.commitCh = make(chan struct{})
			s.mu.Unlock()
			backoff = 0
			if closing {
				return
			}
			if wait := s.cfg.commitInterval - took; wait > 0 && n > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-s.hurry:
					t.Stop()
				case <-s.stop:
					t.Stop()
				}
			}
			continue
		}

		s.prune(b)
		s.mu.Lock()
		newer := s.pending
		b.absorb(newer)
		s.pending, spare = b, newer
		s.inflight = 0
		s.failures++
		s.failing = true
		s.lastError, s.lastErrorAt = err.Error(), time.Now()
		queued := b.n
		if closing {
			s.closeErr = fmt.Errorf("state file %s: closed with %d writes not on disk: %w", s.path, queued, err)
		}
		s.mu.Unlock()
		backoff = min(max(2*backoff, s.cfg.retryMin), s.cfg.retryMax)
		fl.failed(s, err, queued, backoff)
		if closing {
			return
		}
	}
}

// write commits b, reopening the file first if the last commit failed.
func (s *Store) write(b *batch) error {
	if s.unwritable != nil && (b.n > 0 || s.eager && (s.repair != nil || s.migrate)) {
		return s.unwritable
	}
	if s.reopen {
		if err := s.reopenDB(); err != nil {
			return err
		}
		s.reopen = false
	}
	if b.n == 0 && (!s.eager || s.repair == nil && !s.migrate) {
		return nil
	}
	repair := s.repair
	err := s.guard(func() error {
		return s.db.Update(func(tx *bolt.Tx) error { return s.commit(tx, b) })
	})
	if err != nil {
		s.reopen = true
		var re *errRepair
		var ce *CorruptError
		if repair != nil && (errors.As(err, &re) || errors.As(err, &ce)) {
			// The repair's own failure, or bbolt panicking on what it moves: left as it is
			// rather than failing every commit after it. The hub was told (State.Damaged);
			// the next start finds the same damage.
			s.log.Error("state file: cannot repair the damage found at open; leaving it as it is", "file", s.path, "err", err)
			s.repair = nil
			if len(s.badRoots) > 0 {
				// Damaged trees are still linked, and a commit could walk into one (bbolt
				// loops on a page loop): nothing more is written.
				s.unwritable = fmt.Errorf("state file %s: not writing: the repair of its damaged trees failed (%v); restart the hub", s.path, err)
			}
		}
		return err
	}
	s.migrate = false
	if repair != nil {
		s.repair = nil
		s.log.Warn("state file: damage quarantined: each damaged cluster's old bucket was moved into the quarantine, what could be read of it written back, and the cluster marked damaged until the hub repairs it",
			"file", s.path, "what", repair.summary)
		var trimmed int
		terr := s.guard(func() error {
			return s.db.Update(func(tx *bolt.Tx) error {
				var err error
				trimmed, err = trimQuarantine(tx, s.badRoots)
				return err
			})
		})
		if terr != nil {
			s.log.Warn("state file: cannot trim the quarantine; its oldest entries stay", "file", s.path, "err", terr)
		} else if trimmed > 0 {
			s.log.Info("state file: oldest quarantine entries deleted", "file", s.path, "deleted", trimmed, "kept", maxQuarantine)
		}
	}
	return nil
}

// reopenDB closes and reopens the file after a failed commit. bbolt rolls a failed commit
// back in memory, but a failure while writing its meta page (or its fsync) can leave the
// file ahead of what bbolt believes (etcd-io/bbolt#233): reopening reads the file's own
// state back, and since every write in a batch sets a key's final state, retrying the batch
// on either state gives the same file. It also recovers a file handle that went bad. A reopen
// must find the same file, not empty: writing only the latest changes into a new file would
// make it claim a state it does not hold.
func (s *Store) reopenDB() error {
	readOnly := s.isReadOnly()
	if readOnly {
		// Read-only: can it be written now (a file system remounted read-write)? Asked before
		// closing the read-only handle, which keeps the file loaded and locked meanwhile.
		f, err := s.cfg.openFile(s.path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("state file %s: read-only, nothing is written: %w", s.path, err)
		}
		_ = f.Close()
	}
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.db != nil {
		_ = s.db.Close() // a handle that failed may fail to close too; the file is what matters
		s.db = nil
	}
	db, info, _, err := s.openDB(false, false)
	if err != nil {
		return fmt.Errorf("reopening after a failed write: %w", err)
	}
	if s.file == nil || !os.SameFile(info, s.file) {
		_ = db.Close()
		return fmt.Errorf("state file %s: reopening after a failed write found another file at its path; not writing a partial state into it (restart the hub)", s.path)
	}
	s.db = db
	if readOnly {
		s.mu.Lock()
		s.readOnly = false
		s.mu.Unlock()
		s.log.Warn("state file: writable again; writing what is queued", "file", s.path)
		s.openRunMarker()
		s.markRun(runFailing) // until what is queued is on disk
		s.migrate = true      // the digests are checked (and computed if need be) by the commit
	}
	return nil
}

// commit writes b in tx: per cluster, a drop first, then each name's latest value, then
// its metadata. Buckets left empty are deleted, so a cluster that holds nothing and has no
// metadata is not in the file.
func (s *Store) commit(tx *bolt.Tx, b *batch) error {
	if s.cfg.beforeCommit != nil {
		if err := s.cfg.beforeCommit(); err != nil {
			return err
		}
	}
	keep := !s.cfg.noDigests
	// Damage found at open first, or digests that are not the last commit's (a migration):
	// the batch's digests are kept from theirs.
	if valid, present := digestsValid(tx); !keep {
	} else if s.repair != nil {
		if err := s.repair.apply(tx); err != nil {
			return &errRepair{err}
		}
	} else if !valid {
		if err := recomputeDigests(tx); err != nil {
			return fmt.Errorf("computing the integrity digests: %w", err)
		}
		if present {
			s.log.Warn("state file: its integrity digests were stale (the file was written by something else since, e.g. an older release): recomputed; damage from before this could not be detected", "file", s.path)
		} else {
			s.log.Info("state file: computing its integrity digests (a file written before they existed: a one-time migration)", "file", s.path)
		}
	}
	cb, mb := tx.Bucket(clustersBucket), tx.Bucket(metaBucket)
	if cb == nil || mb == nil {
		return &CorruptError{Path: s.path, Err: errors.New("the clusters or meta bucket is missing")}
	}
	fb, digests, damaged, err := integrityBuckets(tx)
	if err != nil {
		return err
	}
	for cluster, c := range b.clusters {
		key := []byte(cluster)
		if c.drop {
			if err := cb.DeleteBucket(key); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
				return fmt.Errorf("cluster %q: %w", cluster, err)
			}
			if err := mb.Delete(key); err != nil {
				return fmt.Errorf("cluster %q: %w", cluster, err)
			}
			if err := deleteClusterDigests(digests, cluster); err != nil {
				return fmt.Errorf("cluster %q: digests: %w", cluster, err)
			}
			if err := damaged.Delete(key); err != nil {
				return fmt.Errorf("cluster %q: damage mark: %w", cluster, err)
			}
		}
		if c.markClear {
			if err := damaged.Delete(key); err != nil {
				return fmt.Errorf("cluster %q: damage mark: %w", cluster, err)
			}
		}
		if err := addMark(damaged, cluster, c.markAdd, time.Now()); err != nil {
			return fmt.Errorf("cluster %q: damage mark: %w", cluster, err)
		}
		kb := cb.Bucket(key)
		for coll, m := range c.colls {
			if len(m) == 0 {
				continue
			}
			collKey := []byte(coll)
			var colb *bolt.Bucket
			if kb != nil {
				colb = kb.Bucket(collKey)
			}
			// The collection's digest moves by each key's old and new value, read here in
			// the same transaction: what the file holds and what its digest says change
			// together or not at all.
			var delta digest
			// In key order: bbolt keeps a node's keys in a slice until the commit splits it,
			// so each insert in map order shifts half of it: quadratic in a large first push
			// (see the package doc's Writing).
			for _, name := range slices.Sorted(maps.Keys(m)) {
				v := m[name]
				var old []byte
				if colb != nil && keep {
					old = colb.Get([]byte(name))
				}
				if old != nil {
					delta.sub(name, old)
				}
				if v == nil {
					if colb != nil && (old != nil || !keep) {
						if err := colb.Delete([]byte(name)); err != nil {
							return fmt.Errorf("cluster %q, collection %q, resource %q: %w", cluster, coll, name, err)
						}
					}
					continue
				}
				if keep {
					delta.add(name, v)
				}
				if colb == nil {
					var err error
					if kb == nil {
						if kb, err = cb.CreateBucketIfNotExists(key); err != nil {
							return fmt.Errorf("cluster %q: %w", cluster, err)
						}
					}
					if colb, err = kb.CreateBucketIfNotExists(collKey); err != nil {
						return fmt.Errorf("cluster %q, collection %q: %w", cluster, coll, err)
					}
				}
				if err := colb.Put([]byte(name), v); err != nil {
					return fmt.Errorf("cluster %q, collection %q, resource %q: %w", cluster, coll, name, err)
				}
			}
			if colb != nil && isEmpty(colb) {
				if err := kb.DeleteBucket(collKey); err != nil {
					return fmt.Errorf("cluster %q, collection %q: %w", cluster, coll, err)
				}
			}
			if delta != (digest{}) {
				dk := digestKey(cluster, kindResources, coll)
				d, _ := decodeDigest(digests.Get(dk)) // none: zero
				d.count += delta.count
				d.sum += delta.sum
				var err error
				if d.count == 0 && d.sum == 0 {
					err = digests.Delete(dk)
				} else {
					err = digests.Put(dk, d.bytes())
				}
				if err != nil {
					return fmt.Errorf("cluster %q, collection %q: digest: %w", cluster, coll, err)
				}
			}
		}
		if kb != nil && isEmpty(kb) {
			if err := cb.DeleteBucket(key); err != nil {
				return fmt.Errorf("cluster %q: %w", cluster, err)
			}
		}
		if c.meta != nil {
			if err := mb.Put(key, c.meta); err != nil {
				return fmt.Errorf("cluster %q: metadata: %w", cluster, err)
			}
			if keep {
				var d digest
				d.add("", c.meta)
				if err := digests.Put(digestKey(cluster, kindMeta, ""), d.bytes()); err != nil {
					return fmt.Errorf("cluster %q: metadata digest: %w", cluster, err)
				}
			}
		}
	}
	if !keep {
		return nil
	}
	return setDigested(fb, tx)
}

func isEmpty(b *bolt.Bucket) bool {
	k, _ := b.Cursor().First()
	return k == nil
}

// prune drops, from a batch that failed, the deletions of names the file does not hold:
// they change nothing, and without this a disk that stays full while a cluster churns
// names would grow the queue by one deletion per name ever removed. With it, what is queued
// stays within the names held (in the hub or in the file) plus one retry interval's churn.
// The file cannot change meanwhile: only the writer commits.
func (s *Store) prune(b *batch) {
	if s.db == nil || s.repair != nil || s.unwritable != nil { // damaged trees may still be linked
		return
	}
	pruned := 0
	_ = s.guard(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			cb := tx.Bucket(clustersBucket)
			for cluster, c := range b.clusters {
				var kb *bolt.Bucket
				if !c.drop && cb != nil { // after a drop the cluster holds nothing: every deletion goes
					kb = cb.Bucket([]byte(cluster))
				}
				for coll, m := range c.colls {
					var colb *bolt.Bucket
					if kb != nil {
						colb = kb.Bucket([]byte(coll))
					}
					for name, v := range m {
						if v == nil && (colb == nil || colb.Get([]byte(name)) == nil) {
							delete(m, name)
							pruned++
						}
					}
				}
			}
			return nil
		})
	})
	b.n -= pruned
}

// failureLog logs a run of failed commits: each kind of error once (at most maxLoggedKinds
// of them), and the recovery, so a disk that stays full does not flood the log while Stats
// counts every attempt.
type failureLog struct {
	kinds          map[string]bool
	since, lastLog time.Time
	attempts       int
}

const maxLoggedKinds = 8

// failureReminder: while writes keep failing, a line this often says so (with how many
// attempts and since when), so that a failure that began before the log was looked at is
// still in the recent log.
const failureReminder = 10 * time.Minute

func (fl *failureLog) failed(s *Store, err error, queued int, retry time.Duration) {
	if fl.attempts == 0 {
		fl.since = time.Now()
		fl.lastLog = fl.since
		fl.kinds = map[string]bool{}
		// The run marker says so at once: a process killed from here on leaves a file that
		// may be older than what the hub served (State.Failing at the next start).
		s.markRun(runFailing)
	}
	fl.attempts++
	kind := errorKind(err)
	switch {
	case fl.kinds[kind]:
		if time.Since(fl.lastLog) >= failureReminder {
			fl.lastLog = time.Now()
			s.log.Error("state file: writes still fail", "file", s.path, "err", err, "queued", queued,
				"failed_attempts", fl.attempts, "failing_for", time.Since(fl.since).Round(time.Second))
		}
	case len(fl.kinds) < maxLoggedKinds:
		fl.lastLog = time.Now()
		fl.kinds[kind] = true
		s.log.Error("state file: cannot write; the latest state of every key is kept in memory and retried (logged once per kind of error)",
			"file", s.path, "err", err, "queued", queued, "retry_in", retry)
	case len(fl.kinds) == maxLoggedKinds:
		fl.kinds[""] = true
		s.log.Error("state file: writes still fail, with errors of further kinds; not logging them (see the hub's status)", "file", s.path, "err", err)
	}
}

func (fl *failureLog) recovered(s *Store) {
	if fl.attempts == 0 {
		if s.runWord == runFailing { // writable again after read-only
			s.markRun(runOpen)
		}
		return
	}
	s.markRun(runOpen) // the commit that recovered is on disk: the file is current again
	s.log.Info("state file: writes recovered", "file", s.path, "failed_attempts", fl.attempts, "failing_for", time.Since(fl.since).Round(time.Millisecond))
	*fl = failureLog{}
}

// errorKind groups errors for logging: by errno when there is one (no space, I/O error,
// file too large), else by the message with its numbers taken out (sizes and page ids vary
// between attempts of the same failure).
func errorKind(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return "errno " + errno.Error()
	}
	if errors.Is(err, os.ErrClosed) {
		return "file closed"
	}
	var b strings.Builder
	digits := false
	for _, r := range err.Error() {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}
