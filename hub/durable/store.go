package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/boltfile"
	"github.com/meshfed/meshfed/mcp"
)

// LockTimeout is how long Open waits for the file's lock: a second hub on the same state
// directory fails with ErrLocked after it instead of waiting forever.
const LockTimeout = 5 * time.Second

// ErrLocked: another process holds the state file (another hub on the same directory).
var ErrLocked = errors.New("locked by another process (another hub using the same state directory?)")

// ErrClosed is returned by Flush and Load on a closed Store.
var ErrClosed = errors.New("the state file is closed")

// CorruptError says a state file cannot be read as one: it is not a bbolt file, is
// truncated, has another format version, or holds a record that does not decode. Cluster,
// Collection and Name say which record, when it is one (Collection and Name are empty for a
// cluster's metadata). OpenOrReset moves a file with such an error aside.
type CorruptError struct {
	Path                      string
	Cluster, Collection, Name string
	Err                       error // what is wrong
}

func (e *CorruptError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "state file %s: ", e.Path)
	switch {
	case e.Name != "":
		fmt.Fprintf(&b, "cluster %q, collection %q, resource %q: ", e.Cluster, e.Collection, e.Name)
	case e.Collection != "":
		fmt.Fprintf(&b, "cluster %q, collection %q: ", e.Cluster, e.Collection)
	case e.Cluster != "":
		fmt.Fprintf(&b, "cluster %q: ", e.Cluster)
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *CorruptError) Unwrap() error { return e.Err }

// ResetError is the reason OpenOrReset started with an empty file: the file's CorruptError,
// and where the file was moved.
type ResetError struct {
	MovedTo string
	Err     *CorruptError
}

func (e *ResetError) Error() string {
	return fmt.Sprintf("%v; the file was moved to %s and the hub starts without kept state", e.Err, e.MovedTo)
}

func (e *ResetError) Unwrap() error { return e.Err }

// Cluster is one cluster's state as the file holds it.
type Cluster struct {
	Meta
	// Collections: collection → resource name → the Resource as received. Each Entry's
	// Name and Version are read from its bytes, as at ingest, and its Name is the key.
	Collections map[string]map[string]*mcp.Entry
}

// Stats are the store's counters, for status and metrics.
type Stats struct {
	Path string
	// Queued is the writes not yet on disk, after coalescing: one per resource key, per
	// cluster's metadata and per cluster dropped (including a batch being committed).
	Queued int
	// Coalesced counts writes replaced, before reaching the disk, by a later write of the
	// same key; Refused, writes refused on entry (a key or value bbolt cannot store: they
	// would fail their batch forever); Dropped, writes after Close.
	Coalesced, Refused, Dropped uint64
	// Batches counts transactions committed, and Written the keys they wrote or deleted.
	Batches, Written uint64
	// LastCommit is when the last batch was committed, LastCommitDuration how long its
	// transaction took (fsync included), LastBatch how many keys it held.
	LastCommit         time.Time
	LastCommitDuration time.Duration
	LastBatch          int
	// Failures counts failed commits (each retried); Failing says the last attempt failed
	// and what is queued is not on disk; LastError is the last failure and LastErrorAt when.
	Failures    uint64
	Failing     bool
	LastError   string
	LastErrorAt time.Time
	// FileSize is the file's size in bytes as of the last commit (bbolt's files do not
	// shrink: deleted pages are reused).
	FileSize int64
}

// Store is the hub's state file. Its write methods (Put, Remove, Apply, SetMeta,
// DropCluster) are safe for concurrent use, and so is everything else.
type Store struct {
	path string
	log  *slog.Logger
	cfg  config

	dbMu sync.RWMutex // guards db against the writer's reopening it; the writer reads db without it
	db   *bolt.DB     // nil after a reopen failed, until one succeeds
	file os.FileInfo  // the file first opened: a reopen must find the same file

	// reopen: the last commit failed, and the file is reopened before the next attempt
	// (the writer's).
	reopen bool

	stop chan struct{} // closed by Close
	wake chan struct{} // a write is pending (capacity 1)
	// hurry cuts the wait between two commits (capacity 1): a Flush waits for the disk,
	// not for the interval.
	hurry chan struct{}
	done  chan struct{} // closed when the writer has ended

	mu        sync.Mutex // guards the following fields
	pending   *batch     // writes not yet taken by the writer
	inflight  int        // entries of the batch the writer is committing
	seq       uint64     // write calls enqueued so far
	committed uint64     // calls whose effect is on disk: seq when the last committed batch was cut
	commitCh  chan struct{}
	signaled  bool // the writer was woken since it last took the pending batch
	closing   bool
	closeErr  error // the writer's final failure, when Close could not write everything

	refusalLogged               [refusedKinds]bool
	coalesced, refused, dropped uint64
	batches, written, failures  uint64
	lastCommit, lastErrorAt     time.Time
	lastCommitDuration          time.Duration
	lastBatch                   int
	failing                     bool
	lastError                   string
	fileSize                    int64
}

// config holds what tests change; Open uses defaultConfig.
type config struct {
	lockTimeout        time.Duration
	retryMin, retryMax time.Duration
	// commitInterval is the least time from one commit's start to the next's: under a
	// steady stream of changes each commit (two fsyncs, page writes) then carries what
	// arrived in that time instead of one change, at the price of that much more lost on a
	// crash. A change after a quiet spell is committed at once.
	commitInterval time.Duration
	// openFile opens the file for bbolt (os.OpenFile); tests keep the handle to break it.
	openFile func(name string, flag int, perm os.FileMode) (*os.File, error)
	// beforeCommit runs in each write transaction before its writes: tests make it slow or
	// failing.
	beforeCommit func() error
}

// Faults make the state file's disk fail on purpose, for tests of what the hub does when
// a disk does (the hub's model-based test of its invariant); production passes none. Each
// hook stands for the system call it replaces, so what the Store does about the failure is
// the code a real failure runs.
type Faults struct {
	// OpenFile replaces os.OpenFile for the state file (a read-only file system fails the
	// opens for writing).
	OpenFile func(name string, flag int, perm os.FileMode) (*os.File, error)
	// BeforeCommit runs in each write transaction before its writes: an error fails the
	// commit as a full disk does (and a process killed at that point commits nothing more).
	BeforeCommit func() error
}

// with returns cfg with the hooks f sets.
func (cfg config) with(f *Faults) config {
	if f == nil {
		return cfg
	}
	if f.OpenFile != nil {
		cfg.openFile = f.OpenFile
	}
	if f.BeforeCommit != nil {
		cfg.beforeCommit = f.BeforeCommit
	}
	return cfg
}

// CommitInterval is the least time between the starts of two commits (see config).
const CommitInterval = 100 * time.Millisecond

func defaultConfig() config {
	return config{lockTimeout: LockTimeout, retryMin: 100 * time.Millisecond, retryMax: 5 * time.Second, commitInterval: CommitInterval, openFile: os.OpenFile}
}

// Open opens the state file at path, creating it (mode 0600; its directory 0700 if it does
// not exist) when there is none. It checks the file is a hub state file of FormatVersion and
// not truncated; a file that is not is a *CorruptError. A file another process holds is
// ErrLocked after LockTimeout. The records themselves are read by Load.
func Open(path string, log *slog.Logger) (*Store, error) {
	return open(path, log, defaultConfig())
}

func open(path string, log *slog.Logger, cfg config) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{path: path, log: log, cfg: cfg, stop: make(chan struct{}), wake: make(chan struct{}, 1), hurry: make(chan struct{}, 1),
		done: make(chan struct{}), pending: newBatch(), commitCh: make(chan struct{})}
	db, info, err := s.openDB(true)
	if err != nil {
		return nil, err
	}
	s.db, s.file = db, info
	if st, err := os.Stat(path); err == nil {
		s.fileSize = st.Size()
	}
	go s.run()
	return s, nil
}

// openDB opens the file (boltfile.Open: its lock, the checks bbolt does not make, bbolt
// behind a guard) and checks its layout; create: a missing or empty file is initialized (a
// reopen must find the file it had).
func (s *Store) openDB(create bool) (*bolt.DB, os.FileInfo, error) {
	db, info, err := boltfile.Open(s.path, boltfile.Options{LockTimeout: s.cfg.lockTimeout, Create: create, OpenFile: s.cfg.openFile})
	if err != nil {
		return nil, nil, s.classifyOpen(err)
	}
	// Checked in a read transaction: opening a good file writes nothing (a commit at start
	// could fail on a full disk, and the hub must start then too).
	var empty bool
	err = s.guard(func() error {
		return db.View(func(tx *bolt.Tx) error {
			var err error
			empty, err = s.checkLayout(tx)
			return err
		})
	})
	if err == nil && empty {
		if !create {
			err = fmt.Errorf("state file %s: the file has been emptied; not writing a partial state into it", s.path)
		} else {
			err = db.Update(initLayout)
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return db, info, nil
}

// classifyOpen turns boltfile's errors into the package's: a damaged file, the file's lock,
// an emptied file, and anything else (an I/O or permission error) as it is.
func (s *Store) classifyOpen(err error) error {
	switch {
	case boltfile.IsDamaged(err):
		return s.corrupt(err)
	case errors.Is(err, boltfile.ErrLocked):
		return fmt.Errorf("state file %s: %w; gave up after %s", s.path, ErrLocked, s.cfg.lockTimeout)
	case errors.Is(err, boltfile.ErrEmpty):
		return fmt.Errorf("state file %s: the file is empty now; not writing a partial state into it", s.path)
	}
	return fmt.Errorf("state file %s: %w", s.path, err)
}

// guard runs f behind boltfile.Guard: a panic or a memory fault of bbolt's on a bad file is
// a *CorruptError, and must not take the hub down (on every restart).
func (s *Store) guard(f func() error) error { return s.corrupt(boltfile.Guard(f)) }

// corrupt names the file in the damage boltfile reports.
func (s *Store) corrupt(err error) error {
	var de *boltfile.DamagedError
	if errors.As(err, &de) {
		return &CorruptError{Path: s.path, Err: de.Err}
	}
	return err
}

// checkLayout checks the top-level buckets and the format version. empty: the file has no
// bucket at all (bbolt has just created it).
func (s *Store) checkLayout(tx *bolt.Tx) (empty bool, err error) {
	corrupt := func(format string, args ...any) error {
		return &CorruptError{Path: s.path, Err: fmt.Errorf(format, args...)}
	}
	fb := tx.Bucket(formatBucket)
	if fb == nil {
		if k, _ := tx.Cursor().First(); k != nil {
			return false, corrupt("not a meshfed hub state file: it has buckets but no format marker (the first is %q)", k)
		}
		return true, nil
	}
	v := fb.Get(formatKey)
	if v == nil {
		return false, corrupt("the format marker has no version")
	}
	version, err := decodeFormat(v)
	if err != nil {
		return false, corrupt("%v", err)
	}
	if err := checkFormat(version); err != nil {
		return false, corrupt("%v", err)
	}
	for _, b := range [][]byte{clustersBucket, metaBucket} {
		if tx.Bucket(b) == nil {
			return false, corrupt("the %q bucket is missing", b)
		}
	}
	return false, tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		if !bytes.Equal(name, formatBucket) && !bytes.Equal(name, clustersBucket) && !bytes.Equal(name, metaBucket) {
			return corrupt("an unexpected top-level bucket %q", name)
		}
		return nil
	})
}

// initLayout gives a new file its buckets and format marker.
func initLayout(tx *bolt.Tx) error {
	fb, err := tx.CreateBucket(formatBucket)
	if err != nil {
		return err
	}
	if err := fb.Put(formatKey, encodeFormat(FormatVersion)); err != nil {
		return err
	}
	if _, err := tx.CreateBucket(clustersBucket); err != nil {
		return err
	}
	_, err = tx.CreateBucket(metaBucket)
	return err
}

// OpenOrReset opens the state file and loads it (Open, then Load). If either finds the file
// corrupt (a *CorruptError), the file is renamed to <path>.corrupt-<UTC time>, kept as
// evidence, and an empty one is opened in its place: the hub starts from its minions, as it
// would without a state file, instead of not starting. reset is then a *ResetError saying
// why and where the file went; err is any error it cannot start past (the lock, a
// permission, the rename). faults is nil but in tests.
func OpenOrReset(path string, log *slog.Logger, faults *Faults) (st *Store, state map[string]*Cluster, reset, err error) {
	return openOrReset(path, log, defaultConfig().with(faults))
}

func openOrReset(path string, log *slog.Logger, cfg config) (*Store, map[string]*Cluster, error, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, err := open(path, log, cfg)
	if err == nil {
		var state map[string]*Cluster
		if state, err = st.Load(); err == nil {
			return st, state, nil, nil
		}
		_ = st.Close() // nothing was enqueued: it writes nothing
	}
	var ce *CorruptError
	if !errors.As(err, &ce) {
		return nil, nil, nil, err
	}
	moved, rerr := boltfile.MoveAside(path)
	if rerr != nil {
		return nil, nil, nil, fmt.Errorf("%w; moving it aside failed: %v", err, rerr)
	}
	reset := &ResetError{MovedTo: moved, Err: ce}
	log.Error("state file unreadable: moved aside, starting without kept state", "err", ce, "moved_to", moved)
	st, err = open(path, log, cfg)
	if err != nil {
		return nil, nil, reset, err
	}
	return st, map[string]*Cluster{}, reset, nil
}

// Load returns every cluster's state as the file holds it: what was committed, not what is
// still queued (the hub loads before it writes). A record that does not decode is a
// *CorruptError naming its cluster, collection and name. Clusters no longer configured are
// included: the hub drops them (DropCluster).
func (s *Store) Load() (map[string]*Cluster, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		if closing {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("state file %s: not open (reopening it after a failed write failed: %s)", s.path, s.Stats().LastError)
	}
	out := map[string]*Cluster{}
	err := s.guard(func() error {
		return s.db.View(func(tx *bolt.Tx) error { return s.load(tx, out) })
	})
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return nil, ErrClosed
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Store) load(tx *bolt.Tx, out map[string]*Cluster) error {
	cb, mb := tx.Bucket(clustersBucket), tx.Bucket(metaBucket)
	if cb == nil || mb == nil {
		return &CorruptError{Path: s.path, Err: errors.New("the clusters or meta bucket is missing")}
	}
	get := func(name string) *Cluster {
		c := out[name]
		if c == nil {
			c = &Cluster{Collections: map[string]map[string]*mcp.Entry{}}
			out[name] = c
		}
		return c
	}
	err := cb.ForEach(func(ck, v []byte) error {
		cluster := string(ck)
		if v != nil {
			return &CorruptError{Path: s.path, Cluster: cluster, Err: errors.New("a value where a cluster's bucket belongs")}
		}
		c := get(cluster)
		return cb.Bucket(ck).ForEach(func(colk, v []byte) error {
			coll := string(colk)
			if v != nil {
				return &CorruptError{Path: s.path, Cluster: cluster, Collection: coll, Err: errors.New("a value where a collection's bucket belongs")}
			}
			held := map[string]*mcp.Entry{}
			c.Collections[coll] = held
			scratch := new(mcpapi.Resource)
			return cb.Bucket(ck).Bucket(colk).ForEach(func(nk, v []byte) error {
				name := string(nk)
				if v == nil {
					return &CorruptError{Path: s.path, Cluster: cluster, Collection: coll, Name: name, Err: errors.New("a bucket where a resource belongs")}
				}
				e, err := decodeRecord(name, bytes.Clone(v), scratch) // bbolt's bytes live only as long as the transaction
				if err != nil {
					return &CorruptError{Path: s.path, Cluster: cluster, Collection: coll, Name: name, Err: err}
				}
				held[name] = e
				return nil
			})
		})
	})
	if err != nil {
		return err
	}
	return mb.ForEach(func(ck, v []byte) error {
		cluster := string(ck)
		if v == nil {
			return &CorruptError{Path: s.path, Cluster: cluster, Err: errors.New("a bucket where the cluster's metadata belongs")}
		}
		m, err := decodeMeta(v)
		if err != nil {
			return &CorruptError{Path: s.path, Cluster: cluster, Err: fmt.Errorf("metadata: %w", err)}
		}
		get(cluster).Meta = m
		return nil
	})
}

// Flush waits until every write enqueued before it is on disk (committed and fsynced), or
// ctx ends; while writes fail, the error says why.
func (s *Store) Flush(ctx context.Context) error {
	s.mu.Lock()
	target := s.seq
	s.mu.Unlock()
	select {
	case s.hurry <- struct{}{}:
	default:
	}
	for {
		s.mu.Lock()
		if s.committed >= target {
			s.mu.Unlock()
			return nil
		}
		ch, failing, lastErr := s.commitCh, s.failing, s.lastError
		s.mu.Unlock()
		select {
		case <-ch:
		case <-s.done:
			s.mu.Lock()
			ok, closeErr := s.committed >= target, s.closeErr
			s.mu.Unlock()
			if ok {
				return nil
			}
			if closeErr != nil {
				return closeErr
			}
			return ErrClosed
		case <-ctx.Done():
			if failing {
				return fmt.Errorf("state file %s: %w while writes fail: %s", s.path, ctx.Err(), lastErr)
			}
			return fmt.Errorf("state file %s: %w", s.path, ctx.Err())
		}
	}
}

// Close writes what is queued (one attempt) and closes the file. Writes after Close are
// dropped (Stats.Dropped). If the last attempt fails, the error says how many writes did
// not reach the file.
func (s *Store) Close() error {
	s.mu.Lock()
	already := s.closing
	s.closing = true
	s.mu.Unlock()
	if already {
		<-s.done
		return nil
	}
	close(s.stop)
	<-s.done
	s.mu.Lock()
	err := s.closeErr
	s.mu.Unlock()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.db != nil {
		if cerr := s.db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("state file %s: closing: %w", s.path, cerr)
		}
		s.db = nil
	}
	return err
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Path: s.path, Queued: s.pending.n + s.inflight, Coalesced: s.coalesced, Refused: s.refused,
		Dropped: s.dropped, Batches: s.batches, Written: s.written, LastCommit: s.lastCommit,
		LastCommitDuration: s.lastCommitDuration, LastBatch: s.lastBatch, Failures: s.failures,
		Failing: s.failing, LastError: s.lastError, LastErrorAt: s.lastErrorAt, FileSize: s.fileSize}
}
