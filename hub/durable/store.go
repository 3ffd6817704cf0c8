package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

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
	// ReadOnly: the file could not be opened for writing (a read-only file system,
	// permissions); nothing is written, every attempt is a failure (Failing, LastError), and
	// each one first tries to open the file for writing again.
	ReadOnly bool
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
	// repair: what the first writable commit does about the damage OpenState found (the
	// writer's once started); migrate: the digests are not valid yet and the writer
	// computes them without waiting for a write.
	repair  *repairPlan
	migrate bool
	// badRoots: the buckets whose trees boltfile.WalkTree found damaged (root page → why), which
	// bbolt must never be let into; salvage: the file is readable but must not be written
	// (its freelist names pages in use), and OpenState rebuilds it; unwritable: the repair
	// of damaged trees failed, and writing could walk them: every commit fails with it.
	badRoots   map[uint64]string
	salvage    *CorruptError
	unwritable error
	lostCommit string // staleMeta's answer at the first open
	// eager: a repair or migration commits without waiting for a write (OpenState only: Open
	// changes nothing in the file before the first write, so that OpenOrReset moves a
	// damaged file aside as it found it).
	eager bool
	// runFile is the run marker (nil: none, read-only), runWord what it says; the writer's,
	// then Close's.
	runFile *os.File
	runWord string

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
	readOnly                    bool
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
	// beforeMark runs before the run marker is written: tests stop it (a kill).
	beforeMark func() error
	// noDigests: commits keep no integrity digests (the benchmarks' baseline: what the
	// digests cost; a file so written has stale digests, recomputed at its next open).
	noDigests bool
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
	// BeforeMark runs before the run marker is written: an error keeps it from being
	// written (a killed process writes nothing more, not even that its writes fail).
	BeforeMark func() error
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
	if f.BeforeMark != nil {
		cfg.beforeMark = f.BeforeMark
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
	s, err := newStore(path, log, cfg, false)
	if err != nil {
		return nil, err
	}
	s.start(false)
	return s, nil
}

func allocStore(path string, log *slog.Logger, cfg config) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{path: path, log: log, cfg: cfg, stop: make(chan struct{}), wake: make(chan struct{}, 1), hurry: make(chan struct{}, 1),
		done: make(chan struct{}), pending: newBatch(), commitCh: make(chan struct{})}
}

// newStore opens the file (creating it whole if there is none) without starting the
// writer; allowRO: a file that cannot be opened for writing is opened read-only.
func newStore(path string, log *slog.Logger, cfg config, allowRO bool) (*Store, error) {
	s := allocStore(path, log, cfg)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil && !(allowRO && isReadOnlyErr(err)) {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	db, info, roErr, err := s.openDB(true, allowRO)
	if err != nil {
		return nil, err
	}
	s.db, s.file = db, info
	switch {
	case s.salvage != nil:
		// Never written as it is (OpenState rebuilds it; Open's caller gets a store that
		// writes nothing, and the next OpenState rebuilds it).
		s.setReadOnly(fmt.Errorf("state file %s: not writable as it is, nothing is written: %v", path, s.salvage.Err))
		s.unwritable = errors.New(s.Stats().LastError)
	case roErr != nil:
		s.setReadOnly(fmt.Errorf("state file %s: read-only, nothing is written: %w", path, roErr))
	}
	if st, err := os.Stat(path); err == nil {
		s.fileSize = st.Size()
	}
	_ = s.guard(func() error {
		return db.View(func(tx *bolt.Tx) error {
			valid, _ := digestsValid(tx)
			s.migrate = !valid
			return nil
		})
	})
	return s, nil
}

// newStoreNoFile is a Store with no file (unreadable and read-only): it writes nothing.
func newStoreNoFile(path string, log *slog.Logger, cfg config) *Store {
	return allocStore(path, log, cfg)
}

// setReadOnly makes the store write nothing until the file can be opened for writing: each
// attempt fails with why, and first tries to reopen it writable.
func (s *Store) setReadOnly(why error) {
	s.mu.Lock()
	s.readOnly, s.failing = true, true
	s.lastError, s.lastErrorAt = why.Error(), time.Now()
	s.mu.Unlock()
	s.reopen = true
}

func (s *Store) isReadOnly() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readOnly
}

// start marks the run marker open and starts the writer. now: a repair or a migration is
// started at once rather than with the first write (OpenState; never on a read-only store,
// where each attempt would be a failure). Open does not: OpenOrReset's Load must see the
// file as it was, and moves it aside, unchanged, if it finds it damaged.
func (s *Store) start(now bool) {
	s.eager = now
	if !s.readOnly && s.db != nil {
		s.openRunMarker()
		if now && (s.repair != nil || s.migrate) {
			s.wake <- struct{}{}
		}
	}
	go s.run()
}

// closeDB closes the file of a store whose writer never started.
func (s *Store) closeDB() error {
	if s.db == nil {
		return nil
	}
	err := s.db.Close()
	s.db = nil
	return err
}

// isReadOnlyErr: the errors of a file that may be read but not written (a read-only file
// system, permissions).
func isReadOnlyErr(err error) bool {
	return errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) || errors.Is(err, fs.ErrPermission)
}

// openDB opens the file with bbolt, after checking what bbolt does not (boltfile.Check, and
// on the first open boltfile.WalkTree), and
// checks its layout. create: a missing file is created whole (createFile); a reopen must
// find the file it had. allowRO: a file that cannot be opened for writing is opened
// read-only, and roErr says why. A zero-length file, or one without the layout, is a
// *CorruptError: this package never leaves one (it creates files whole), so it is
// something else's, or damage, and is not silently taken as new.
func (s *Store) openDB(create, allowRO bool) (db *bolt.DB, info os.FileInfo, roErr, err error) {
	f, err := s.cfg.openFile(s.path, os.O_RDWR, 0o600)
	if create && errors.Is(err, fs.ErrNotExist) {
		if cerr := s.createFile(); cerr != nil && !errors.Is(cerr, fs.ErrExist) {
			return nil, nil, nil, fmt.Errorf("state file %s: creating it: %w", s.path, cerr)
		}
		f, err = s.cfg.openFile(s.path, os.O_RDWR, 0o600)
	}
	if err != nil && allowRO && isReadOnlyErr(err) {
		roErr = err
		f, err = s.cfg.openFile(s.path, os.O_RDONLY, 0)
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("state file %s: %w", s.path, err)
	}
	ro := roErr != nil
	ok := false
	defer func() {
		if !ok {
			_ = f.Close() // bbolt may have closed it already
		}
	}()
	if info, err = f.Stat(); err != nil {
		return nil, nil, nil, fmt.Errorf("state file %s: %w", s.path, err)
	}
	if !info.Mode().IsRegular() {
		return nil, nil, nil, fmt.Errorf("state file %s: not a regular file (%s)", s.path, info.Mode().Type())
	}
	if err := boltfile.Lock(f, s.cfg.lockTimeout); err != nil {
		return nil, nil, nil, s.classifyOpen(err)
	}
	if info, err = f.Stat(); err != nil { // again: its last holder may have written it meanwhile
		return nil, nil, nil, fmt.Errorf("state file %s: %w", s.path, err)
	}
	switch {
	case info.Size() == 0 && !create:
		return nil, nil, nil, fmt.Errorf("state file %s: the file is empty now; not writing a partial state into it", s.path)
	case info.Size() == 0:
		return nil, nil, nil, &CorruptError{Path: s.path, Err: errors.New("the file is empty (zero length): not one this package made (it creates its files whole); a crash while an older release created it, or something else truncated it")}
	case info.Size() < 2*1024: // two meta pages of bbolt's smallest page size
		return nil, nil, nil, &CorruptError{Path: s.path, Err: fmt.Errorf("the file is %d bytes: truncated, or not a bbolt file", info.Size())}
	case boltfile.Preflight:
		if err := boltfile.Check(f, info.Size()); err != nil {
			return nil, nil, nil, &CorruptError{Path: s.path, Err: err}
		}
		if create { // the first open (a reopen finds the file this package wrote)
			s.lostCommit = boltfile.StaleMeta(f, info.Size())
			bad, err := boltfile.WalkTree(f, info.Size(), string(formatBucket), string(clustersBucket))
			switch {
			case errors.Is(err, boltfile.ErrFreelistOverlap):
				// Readable, but not writable as it is: opened read-only (bbolt then does
				// not load the freelist), and OpenState rebuilds it.
				s.salvage = &CorruptError{Path: s.path, Err: err}
				ro = true
			case err != nil:
				return nil, nil, nil, &CorruptError{Path: s.path, Err: err}
			}
			s.badRoots = bad
		}
	}
	opts := &bolt.Options{
		Timeout:  s.cfg.lockTimeout,
		ReadOnly: ro,
		OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil },
	}
	err = s.guard(func() error {
		var err error
		db, err = bolt.Open(s.path, 0o600, opts)
		return err
	})
	if err != nil {
		return nil, nil, nil, s.classifyOpen(err)
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
			err = &CorruptError{Path: s.path, Err: errors.New("the file has no buckets: half-initialized (an older release crashed while creating it) or emptied; this package creates its files whole")}
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, nil, nil, err
	}
	ok = true
	return db, info, roErr, nil
}

// createFile creates the file whole: a temporary file beside it gets bbolt's pages, the
// layout and empty digests in one commit (fsynced by bbolt), and is then linked into
// place — a link, not a rename, so that a file another process created meanwhile is never
// replaced (fs.ErrExist) — and the directory fsynced. A crash at any point leaves either no
// file or a whole one (and maybe the temporary file, named <path>.new-*).
func (s *Store) createFile() error {
	tmp, err := s.writeTemp(nil)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp) }()
	if err := os.Link(tmp, s.path); err != nil {
		return err
	}
	syncDir(filepath.Dir(s.path))
	return nil
}

// writeTemp writes a whole new file beside the state file, in one commit: the layout,
// then fill's writes (nil: none), and valid digests. The caller links it into place and
// removes the temporary name.
func (s *Store) writeTemp(fill func(tx *bolt.Tx) error) (string, error) {
	tmp := fmt.Sprintf("%s.new-%d-%d", s.path, os.Getpid(), time.Now().UnixNano())
	f, err := s.cfg.openFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil }})
	if err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return "", err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := initLayout(tx); err != nil {
			return err
		}
		if fill != nil {
			if err := fill(tx); err != nil {
				return err
			}
			if err := recomputeDigests(tx); err != nil {
				return err
			}
		}
		fb, _, _, err := integrityBuckets(tx)
		if err != nil {
			return err
		}
		return setDigested(fb, tx)
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// classifyOpen turns bbolt's errors into the package's: the file's lock, a file that is
// not a bbolt file, and anything else (an I/O or permission error) as it is.
func (s *Store) classifyOpen(err error) error {
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, boltfile.ErrLocked), errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("state file %s: %w; gave up after %s", s.path, ErrLocked, s.cfg.lockTimeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum):
		return &CorruptError{Path: s.path, Err: fmt.Errorf("not a bbolt file, or both of its meta pages are damaged (%v)", err)}
	case errors.Is(err, berrors.ErrVersionMismatch):
		return &CorruptError{Path: s.path, Err: fmt.Errorf("a bbolt file of another bbolt version (%v)", err)}
	}
	return fmt.Errorf("state file %s: %w", s.path, err)
}

// guard runs f, turning a panic or a memory fault in it into a *CorruptError: bbolt panics
// on pages that do not make sense and faults on pages past the file's end, and a bad file
// must not take the hub down (on every restart).
func (s *Store) guard(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &CorruptError{Path: s.path, Err: fmt.Errorf("bbolt failed on it: %v", r)}
		}
	}()
	return f()
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
	moved := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if rerr := os.Rename(path, moved); rerr != nil {
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
	var r *scanResult
	err := s.guard(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			var err error
			r, err = s.scan(tx)
			return err
		})
	})
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return nil, ErrClosed
	}
	if err != nil {
		return nil, err
	}
	if ce := r.first(); ce != nil {
		return nil, ce
	}
	return r.clusters, nil
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
	// "closed" only when everything reached the file; else the marker keeps "failing" (or
	// "open"): the next start must not take this file as current.
	if err == nil {
		s.closeRunMarker(runClosed)
	} else {
		s.closeRunMarker(runFailing)
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
		Failing: s.failing, LastError: s.lastError, LastErrorAt: s.lastErrorAt, FileSize: s.fileSize, ReadOnly: s.readOnly}
}
