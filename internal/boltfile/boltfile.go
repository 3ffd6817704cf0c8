// Package boltfile opens a bbolt file that a program keeps its state in so that a damaged
// file is an error the program can act on, never a crash: the file is checked before bbolt
// maps it, every call into bbolt that reads it can run behind Guard, and a damaged file can
// be moved aside as evidence. The hub's state file (hub/durable) and the minion relay's
// (minion) both open theirs with it; what a file holds, and what to do when it is damaged,
// is theirs to decide.
//
// Why: bbolt trusts its file. It reports some damage as errors (both meta pages invalid,
// another format version), but panics on pages that do not make sense and, on a file shorter
// than its metadata says, faults reading past the end of its mapping (a "fatal error: fault"
// that no recover catches). A program that opens such a file at start would then crash on
// every restart.
package boltfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// DamagedError says a file cannot be read as a bbolt file of the caller's: Err says what is
// wrong (not a bbolt file, truncated, damaged pages, another bbolt format version, bbolt
// failed reading it; or, from the caller, a layout or record it does not recognize). It
// names no path: the caller's error does.
type DamagedError struct {
	Err error
}

func (e *DamagedError) Error() string { return e.Err.Error() }

func (e *DamagedError) Unwrap() error { return e.Err }

// Damaged wraps what is wrong with a file as a *DamagedError.
func Damaged(format string, args ...any) error {
	return &DamagedError{Err: fmt.Errorf(format, args...)}
}

// IsDamaged reports whether err is, or wraps, a *DamagedError.
func IsDamaged(err error) bool {
	var de *DamagedError
	return errors.As(err, &de)
}

// ErrLocked: another process holds the file's lock (bbolt's flock). It is not damage: the
// file is in use.
var ErrLocked = errors.New("locked by another process")

// ErrEmpty: Open without Create found a file of zero bytes.
var ErrEmpty = errors.New("the file is empty")

// Options say how Open opens a file.
type Options struct {
	// LockTimeout is how long Open waits for the file's lock before ErrLocked; 0: one
	// attempt.
	LockTimeout time.Duration
	// Create makes a missing file (0600, and its directory 0700 when missing) and lets bbolt
	// initialize an empty one. Without it both are errors (ErrEmpty for an empty file).
	Create bool
	// OpenFile opens the file for bbolt; nil: os.OpenFile. Tests keep the handle to break it.
	OpenFile func(name string, flag int, perm os.FileMode) (*os.File, error)
}

// smallest is the size of two meta pages of bbolt's smallest page size: a shorter file that
// is not empty cannot be a bbolt file.
const smallest = 2 * 1024

// Open opens the bbolt file at path and holds its lock until the DB is closed. Before bbolt
// maps the file it checks, with plain reads under the lock, what bbolt would fault or panic
// on (checkFile), and it runs bbolt's own opening behind Guard. A file that is not a bbolt
// file bbolt can read is a *DamagedError; a file another process holds, ErrLocked; anything
// else (a permission, a directory at path, an I/O error) is returned as it is. It returns
// the file's FileInfo as opened, so that a caller can tell whether a later Open finds the
// same file.
func Open(path string, o Options) (*bolt.DB, os.FileInfo, error) {
	openFile := o.OpenFile
	if openFile == nil {
		openFile = os.OpenFile
	}
	flag := os.O_RDWR
	if o.Create {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, nil, err
		}
		flag |= os.O_CREATE
	}
	f, err := openFile(path, flag, 0o600)
	if err != nil {
		return nil, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = f.Close() // bbolt may have closed it already
		}
	}()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("not a regular file (%s)", info.Mode().Type())
	}
	if err := lockFile(f, o.LockTimeout); err != nil {
		return nil, nil, err
	}
	if info, err = f.Stat(); err != nil { // again: its last holder may have written it meanwhile
		return nil, nil, err
	}
	if err := checkSize(f, info.Size(), o.Create); err != nil {
		return nil, nil, err
	}
	opts := &bolt.Options{
		// The lock is held already (lockFile), on the handle bbolt locks again; where there
		// is no flock, bbolt's own lock waits this long (its 0 would wait forever).
		Timeout:  max(o.LockTimeout, time.Millisecond),
		OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil },
	}
	var db *bolt.DB
	if err := Guard(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, opts)
		return err
	}); err != nil {
		return nil, nil, classify(err)
	}
	ok = true
	return db, info, nil
}

// checkSize refuses what cannot be a bbolt file, and runs checkFile and WalkTree on what
// may be one.
func checkSize(f *os.File, size int64, create bool) error {
	switch {
	case size == 0 && !create:
		return ErrEmpty
	case size == 0:
		return nil // bbolt initializes it
	case size < smallest:
		return Damaged("the file is %d bytes: truncated, or not a bbolt file", size)
	case preflight:
		if err := checkFile(f, size); err != nil {
			return &DamagedError{Err: err}
		}
		// A damaged tree can make bbolt loop forever, which no guard catches: an owner
		// that has no use for the rest of a file with one takes the file as damaged.
		bad, err := WalkTree(f, size)
		if err == nil && len(bad) > 0 {
			for root, why := range bad {
				err = fmt.Errorf("the tree at page %d: %s", root, why)
				break
			}
		}
		if err != nil {
			return &DamagedError{Err: err}
		}
	}
	return nil
}

// classify turns bbolt's errors of a file it cannot read into a *DamagedError, and its lock
// timeout into ErrLocked.
func classify(err error) error {
	switch {
	case IsDamaged(err):
		return err
	case errors.Is(err, berrors.ErrTimeout):
		return ErrLocked
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum):
		return Damaged("not a bbolt file, or both of its meta pages are damaged (%v)", err)
	case errors.Is(err, berrors.ErrVersionMismatch):
		return Damaged("a bbolt file of another bbolt version (%v)", err)
	}
	return err
}

// Guard runs f, turning a panic or a memory fault in it into a *DamagedError: bbolt panics
// on pages that do not make sense and faults on pages past the file's end, and a bad file
// must not take the program down. Every call into bbolt that reads pages (Open, View,
// Update) belongs behind it; the fault is turned into a panic for the calling goroutine only
// (debug.SetPanicOnFault), so f must not hand the work to another goroutine.
func Guard(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = Damaged("bbolt failed on it: %v", r)
		}
	}()
	return f()
}

// MoveAside renames the file at path to <path>.corrupt-<UTC time>, next to it, and returns
// the new name: a damaged file is kept as evidence, and the program goes on with a new one.
func MoveAside(path string) (string, error) {
	moved := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := os.Rename(path, moved); err != nil {
		return "", err
	}
	return moved, nil
}

// The primitives Open is made of, for an owner that opens its bbolt file its own way (the
// hub's state file: a read-only fallback, a tree walk, a rebuild).

// Lock takes f's exclusive lock (the one bbolt takes), before anything reads it, or
// returns ErrLocked after timeout.
func Lock(f *os.File, timeout time.Duration) error { return lockFile(f, timeout) }

// Check reads f's meta and freelist pages with plain reads and refuses what bbolt would
// fault or panic on while opening it (see checkFile). The caller holds f's lock; where
// files are not locked (Preflight is false) it must not run.
func Check(f *os.File, size int64) error { return checkFile(f, size) }

// StaleMeta says why bbolt, reading f, may be one commit behind its last ("" if not): one
// of its two meta pages is damaged and it reads the other.
func StaleMeta(f *os.File, size int64) string { return staleMeta(f, size) }

// Preflight reports whether Check and WalkTree run here: where files are locked (unix), so
// that they read a file no other process writes.
const Preflight = preflight
