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
	if s.reopen {
		if err := s.reopenDB(); err != nil {
			return err
		}
		s.reopen = false
	}
	if b.n == 0 {
		return nil
	}
	err := s.guard(func() error {
		return s.db.Update(func(tx *bolt.Tx) error { return s.commit(tx, b) })
	})
	if err != nil {
		s.reopen = true
	}
	return err
}

// reopenDB closes and reopens the file after a failed commit. bbolt rolls a failed commit
// back in memory, but a failure while writing its meta page (or its fsync) can leave the
// file ahead of what bbolt believes (etcd-io/bbolt#233): reopening reads the file's own
// state back, and since every write in a batch sets a key's final state, retrying the batch
// on either state gives the same file. It also recovers a file handle that went bad. A reopen
// must find the same file, not empty: writing only the latest changes into a new file would
// make it claim a state it does not hold.
func (s *Store) reopenDB() error {
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.db != nil {
		_ = s.db.Close() // a handle that failed may fail to close too; the file is what matters
		s.db = nil
	}
	db, info, err := s.openDB(false)
	if err != nil {
		return fmt.Errorf("reopening after a failed write: %w", err)
	}
	if !os.SameFile(info, s.file) {
		_ = db.Close()
		return fmt.Errorf("state file %s: reopening after a failed write found another file at its path; not writing a partial state into it (restart the hub)", s.path)
	}
	s.db = db
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
	cb, mb := tx.Bucket(clustersBucket), tx.Bucket(metaBucket)
	if cb == nil || mb == nil {
		return &CorruptError{Path: s.path, Err: errors.New("the clusters or meta bucket is missing")}
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
			// In key order: bbolt keeps a node's keys in a slice until the commit splits it,
			// so each insert in map order shifts half of it: quadratic in a large first push
			// (see the package doc's Writing).
			for _, name := range slices.Sorted(maps.Keys(m)) {
				v := m[name]
				if v == nil {
					if colb != nil {
						if err := colb.Delete([]byte(name)); err != nil {
							return fmt.Errorf("cluster %q, collection %q, resource %q: %w", cluster, coll, name, err)
						}
					}
					continue
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
		}
	}
	return nil
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
	if s.db == nil {
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
	kinds    map[string]bool
	since    time.Time
	attempts int
}

const maxLoggedKinds = 8

func (fl *failureLog) failed(s *Store, err error, queued int, retry time.Duration) {
	if fl.attempts == 0 {
		fl.since = time.Now()
		fl.kinds = map[string]bool{}
	}
	fl.attempts++
	kind := errorKind(err)
	switch {
	case fl.kinds[kind]:
	case len(fl.kinds) < maxLoggedKinds:
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
		return
	}
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
