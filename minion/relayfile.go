package minion

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshfed/meshfed/internal/boltfile"
	"github.com/meshfed/meshfed/mcp"
)

// The relay's state file (RelayConfig.StateFile) keeps what the relay serves, so that a
// restarted relay serves istiod before the hub answers. What a restart serves from it must
// never be a state older than one istiod has already seen, as if it were whole: istiod would
// delete what its proxies run that the older state lacks. Everything below follows from that
// and from the relay never stopping the minion's publishing:
//
//   - A push from the hub is written before it is served. The file is marked whole (for the
//     collections relayed) once every collection has arrived, and only then does a restart
//     serve it before the hub answers.
//   - A file that cannot be read as the relay's (not a bbolt file, truncated, damaged pages,
//     another layout, a record that does not decode) is moved aside as evidence
//     (boltfile.MoveAside), logged and counted, and a new one is started: the relay serves
//     nothing until the hub answers. bbolt's panics and memory faults on such a file are
//     caught (boltfile.Guard) and are damage like the rest.
//   - A push that cannot be written (a full disk, an I/O error) is served from memory all the
//     same, once the file can no longer claim an older state: it is removed first (or, if it
//     cannot be removed, emptied). A restart then serves nothing until the hub answers, which
//     is what the invariant asks. Every relayFileRetry the relay opens a new file and writes
//     what it serves into it, marked whole when it is.
//   - Only when the file can be neither written nor removed nor emptied, or another process
//     holds it, are the hub's pushes refused (the stream ends, the hub resends on the next):
//     serving them would leave a restart to serve that file's state. istiod keeps what it has.
//
// The file's layout, unchanged since the relay's first release, is its format: top-level
// buckets "meta" (key "whole": the relayed collections, sorted and joined by commas, once the
// state held is whole for them) and "collection/<collection>" (resource name → the Resource
// as received), and nothing else. A later layout adds a bucket, which this one refuses as not
// its own.

// relayFileRetry is how often the relay tries again to take a state file it does not hold.
const relayFileRetry = 5 * time.Second

var (
	metaBucket = []byte("meta")
	wholeKey   = []byte("whole")
)

const collectionPrefix = "collection/"

func collectionBucket(c string) []byte { return []byte(collectionPrefix + c) }

// RelayStateFile is the relay's state file as /status reports it.
type RelayStateFile struct {
	Path string `json:"path"`
	// Kept: the file holds what the relay serves (each push is written before it is
	// served), so a restart serves it until the hub answers.
	Kept bool `json:"kept"`
	// Problem says why it does not, while it does not: it could not be opened or written.
	// The relay serves from memory meanwhile, and takes the file again when it can.
	Problem string `json:"problem,omitempty"`
	// RefusingPushes: a file is at the path that the relay can neither write nor remove, or
	// that another process holds, so the relay refuses the hub's pushes rather than serve a
	// state newer than one that file may hold as whole.
	RefusingPushes bool `json:"refusingPushes,omitempty"`
	// MovedAside is where the last damaged file was moved.
	MovedAside string `json:"movedAside,omitempty"`
}

// relayFile is the relay's state file. Its methods other than status are called one at a
// time (the relay's keepMu).
type relayFile struct {
	path    string
	colls   []string // relayed, sorted: the whole marker names them
	log     *slog.Logger
	metrics *Metrics

	db *bolt.DB // held: the file holds what the relay serves; nil otherwise
	// claim: db is nil and a file may be at path that a restart would read; it must be
	// withdrawn before the relay serves a push it has not written.
	claim bool
	held  bool // the claim is another process's, which holds the file: it is never withdrawn
	stuck bool // the claim could not be withdrawn: the relay refuses the hub's pushes
	tidy  bool // collections no longer relayed have been dropped from the file

	mu sync.Mutex // guards st
	st RelayStateFile
}

func newRelayFile(path string, colls []string, log *slog.Logger, metrics *Metrics) *relayFile {
	f := &relayFile{path: path, colls: colls, log: log, metrics: metrics}
	f.st.Path = path
	metrics.relayFileCounters()
	return f
}

// open takes the file and returns what it holds of the relayed collections, and whether it
// is whole for them; ok: the file is held (the caller reports it kept once it holds what
// the relay serves). A damaged file is moved aside and a new one opened in its place; a file
// that cannot be opened is left as it is, reported, and tried again later.
func (f *relayFile) open() (state map[string][]*mcp.Entry, whole, ok bool) {
	db, state, whole, err := f.openRead()
	if boltfile.IsDamaged(err) {
		if !f.moveAside(err) {
			return nil, false, false
		}
		db, state, whole, err = f.openRead()
	}
	if err != nil {
		f.cannotOpen(err)
		return nil, false, false
	}
	f.db, f.claim, f.held, f.stuck, f.tidy = db, false, false, false, false
	return state, whole, true
}

// holds reports whether the file is open.
func (f *relayFile) holds() bool { return f.db != nil }

// kept reports that the file holds what the relay serves.
func (f *relayFile) kept() { f.report("") }

// openRead opens the file (boltfile.Open: a missing or empty file is a new one) and reads it
// in a read transaction: a good file is opened without writing (a full disk must not stop it
// from being served).
func (f *relayFile) openRead() (*bolt.DB, map[string][]*mcp.Entry, bool, error) {
	db, _, err := boltfile.Open(f.path, boltfile.Options{Create: true})
	if err != nil {
		return nil, nil, false, err
	}
	var state map[string][]*mcp.Entry
	var whole bool
	err = boltfile.Guard(func() error {
		return db.View(func(tx *bolt.Tx) error {
			var err error
			state, whole, err = f.read(tx)
			return err
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, nil, false, err
	}
	return db, state, whole, nil
}

// read checks the file's layout and reads the relayed collections: every record must decode
// as the relay's sink decodes a resource from the hub, under its own name.
func (f *relayFile) read(tx *bolt.Tx) (map[string][]*mcp.Entry, bool, error) {
	if err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		switch {
		case !bytes.Equal(name, metaBucket) && !bytes.HasPrefix(name, []byte(collectionPrefix)):
			return boltfile.Damaged("not a relay state file: an unexpected top-level bucket %q", name)
		case b == nil:
			return boltfile.Damaged("a value where the bucket %q belongs", name)
		}
		return nil
	}); err != nil {
		return nil, false, err
	}
	whole := false
	if m := tx.Bucket(metaBucket); m != nil {
		if err := m.ForEach(func(k, v []byte) error {
			if !bytes.Equal(k, wholeKey) || v == nil {
				return boltfile.Damaged("not a relay state file: an unexpected entry %q in its meta bucket", k)
			}
			return nil
		}); err != nil {
			return nil, false, err
		}
		whole = string(m.Get(wholeKey)) == f.collectionSet()
	}
	state := map[string][]*mcp.Entry{}
	for _, c := range f.colls {
		b := tx.Bucket(collectionBucket(c))
		if b == nil {
			continue
		}
		if err := b.ForEach(func(k, v []byte) error {
			e, err := decodeRecord(k, v)
			if err != nil {
				return boltfile.Damaged("collection %s, resource %q: %v", c, k, err)
			}
			state[c] = append(state[c], e)
			return nil
		}); err != nil {
			return nil, false, err
		}
	}
	return state, whole, nil
}

// decodeRecord checks a stored resource as the relay's sink checks one from the hub
// (mcp.DecodeEntry: wire format, UTF-8, metadata, name), stored under its own name. Its Entry
// keeps a copy of v: bbolt's bytes live only as long as the transaction.
func decodeRecord(key, v []byte) (*mcp.Entry, error) {
	if v == nil {
		return nil, errors.New("a bucket where a resource belongs")
	}
	e, err := mcp.DecodeEntry(bytes.Clone(v))
	if err != nil {
		return nil, err
	}
	if e.Name != string(key) {
		return nil, fmt.Errorf("the resource stored under this name is named %q", e.Name)
	}
	return e, nil
}

// collectionSet names the relayed collections, as the whole marker records them.
func (f *relayFile) collectionSet() string { return strings.Join(f.colls, ",") }

// moveAside moves a damaged file aside, kept as evidence, and reports it; ok: the path is
// free for a new file. A damaged file never loads, so one that cannot be moved claims
// nothing: the relay goes on without a file until it can.
func (f *relayFile) moveAside(damage error) bool {
	moved, err := boltfile.MoveAside(f.path)
	if err != nil {
		f.report(fmt.Sprintf("damaged (%v), and moving it aside failed (%v); %s", damage, err, fromMemory))
		return false
	}
	f.metrics.relayFileReset()
	f.mu.Lock()
	f.st.MovedAside = moved
	f.mu.Unlock()
	f.log.Error("relay state file damaged: moved aside; what it held is not served", "file", f.path, "err", damage, "moved_to", moved)
	return true
}

// cannotOpen records why the file could not be opened. A file another process holds is
// that process's (another minion configured with this file): never withdrawn, and taken when
// it is released. Any other file that is there may hold a state a restart would read.
func (f *relayFile) cannotOpen(err error) {
	if errors.Is(err, boltfile.ErrLocked) {
		f.claim, f.held = true, true
		f.report("held by another process (another minion with this relay.stateFile?): refusing the hub's pushes until it is released")
		return
	}
	f.claim, f.held = mayHoldState(f.path), false
	switch {
	case !f.claim:
		f.stuck = false
		f.report(fmt.Sprintf("cannot be opened (%v); %s", err, fromMemory))
	case f.stuck: // still: what withdraw reported stands
	default:
		f.report(fmt.Sprintf("cannot be opened (%v); it is removed before the relay serves a push of the hub's (a restart must not serve what it holds), then %s", err, fromMemory))
	}
}

// fromMemory is what the relay does while it does not hold its state file.
const fromMemory = "the relay serves the hub's pushes from memory, and a restart serves nothing until the hub answers"

// mayHoldState reports whether something is at path that a restart could read as a state: a
// regular file, or something that cannot be looked at.
func mayHoldState(path string) bool {
	st, err := os.Stat(path)
	switch {
	case err == nil:
		return st.Mode().IsRegular()
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return false
	}
	return true
}

// write writes a push from the hub; false: the file is not held, or the write failed.
func (f *relayFile) write(c *mcp.Change) bool {
	return f.update(func(tx *bolt.Tx) error {
		name := collectionBucket(c.Collection)
		if !c.Incremental {
			if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return err
			}
		}
		b, err := tx.CreateBucketIfNotExists(name)
		if err != nil {
			return err
		}
		for _, e := range c.Entries {
			if err := b.Put([]byte(e.Name), e.Encoded); err != nil {
				return err
			}
		}
		for _, n := range c.Removed {
			if err := b.Delete([]byte(n)); err != nil {
				return err
			}
		}
		return nil
	})
}

// markWhole records that what the file holds is whole for the relayed collections.
func (f *relayFile) markWhole() {
	f.update(func(tx *bolt.Tx) error { return putWhole(tx, f.collectionSet()) })
}

func putWhole(tx *bolt.Tx, set string) error {
	b, err := tx.CreateBucketIfNotExists(metaBucket)
	if err != nil {
		return err
	}
	return b.Put(wholeKey, []byte(set))
}

// rewrite makes the file hold state and nothing else, marked whole when whole; false: the
// write failed.
func (f *relayFile) rewrite(state map[string][]*mcp.Entry, whole bool) bool {
	return f.update(func(tx *bolt.Tx) error {
		var names [][]byte
		if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			names = append(names, bytes.Clone(name))
			return nil
		}); err != nil {
			return err
		}
		for _, name := range names {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		for c, entries := range state {
			b, err := tx.CreateBucket(collectionBucket(c))
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := b.Put([]byte(e.Name), e.Encoded); err != nil {
					return err
				}
			}
		}
		if whole {
			return putWhole(tx, f.collectionSet())
		}
		return nil
	})
}

// update runs fn in a write transaction behind the guard, after dropping, once per open, the
// collections no longer relayed. ok: committed; a failure gives the file up (failed).
func (f *relayFile) update(fn func(*bolt.Tx) error) (ok bool) {
	if f.db == nil {
		return false
	}
	err := boltfile.Guard(func() error {
		return f.db.Update(func(tx *bolt.Tx) error {
			if !f.tidy {
				if err := f.dropUnrelayed(tx); err != nil {
					return err
				}
			}
			return fn(tx)
		})
	})
	if err != nil {
		f.failed(err)
		return false
	}
	f.tidy = true
	return true
}

// dropUnrelayed deletes the buckets of collections no longer relayed.
func (f *relayFile) dropUnrelayed(tx *bolt.Tx) error {
	relayed := map[string]bool{}
	for _, c := range f.colls {
		relayed[string(collectionBucket(c))] = true
	}
	var stale [][]byte
	if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		if bytes.HasPrefix(name, []byte(collectionPrefix)) && !relayed[string(name)] {
			stale = append(stale, bytes.Clone(name))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, name := range stale {
		if err := tx.DeleteBucket(name); err != nil {
			return err
		}
	}
	return nil
}

// failed gives the file up after a failed write, counted and reported. bbolt rolls a failed
// commit back in memory, but the file may hold it all the same (etcd-io/bbolt#233): only a
// new open reads what the file holds. So the DB is closed, and the file may claim a state
// until it is withdrawn or taken again. A file found damaged while writing is moved aside.
func (f *relayFile) failed(err error) {
	f.metrics.relayFileWriteFailed()
	_ = f.db.Close() // a handle that failed may fail to close too; the file is what matters
	f.db = nil
	if boltfile.IsDamaged(err) && f.moveAside(err) {
		f.report("damaged, found while writing: moved aside; " + fromMemory)
		return
	}
	f.claim, f.held = true, false
	f.report(fmt.Sprintf("cannot be written (%v); %s", err, fromMemory))
}

// withdraw makes sure no file at the path claims a state, before the relay serves a push it
// could not write: a restart must not serve an older state as whole. The file is removed —
// it is behind what the relay serves, and on a full disk its space is what the next write
// needs — or, when it cannot be, emptied (an empty file is a new one). It is an error when
// neither works, or when another process holds the file: the push must then not be served.
func (f *relayFile) withdraw() error {
	if !f.claim {
		return nil
	}
	if f.held {
		return errors.New("the state file is held by another process")
	}
	if err := os.Remove(f.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		if terr := os.Truncate(f.path, 0); terr != nil {
			f.stuck = true
			f.report(fmt.Sprintf("can be neither written nor removed (%v) nor emptied (%v): refusing the hub's pushes until it can", err, terr))
			return fmt.Errorf("the state file can be neither written nor removed (%v) nor emptied (%v)", err, terr)
		}
	}
	f.claim, f.stuck = false, false
	f.log.Info("relay state file removed: it is behind what the relay serves", "file", f.path)
	f.report(f.status().Problem) // no longer refusing
	return nil
}

// close closes the file, if held. Its kept gauge goes with it: the next configuration may
// have no state file.
func (f *relayFile) close() {
	if f.db != nil {
		_ = f.db.Close()
		f.db = nil
	}
	f.metrics.relayFileClosed()
}

// report records the file's state: problem "" when it holds what the relay serves. A new
// problem is logged once, and so is its end.
func (f *relayFile) report(problem string) {
	f.mu.Lock()
	was := f.st.Problem
	f.st.Kept, f.st.Problem, f.st.RefusingPushes = problem == "", problem, f.held || f.stuck
	f.mu.Unlock()
	f.metrics.relayFileKept(problem == "")
	switch {
	case problem != "" && problem != was:
		f.log.Error("relay state file "+problem, "file", f.path)
	case problem == "" && was != "":
		f.log.Info("relay state file kept again", "file", f.path)
	}
}

func (f *relayFile) status() RelayStateFile {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}
