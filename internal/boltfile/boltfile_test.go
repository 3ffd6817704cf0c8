package boltfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGuardTurnsAPanicIntoDamage(t *testing.T) {
	err := Guard(func() error { panic("page 7: invalid page type") })
	if !IsDamaged(err) || !strings.Contains(err.Error(), "bbolt failed on it: page 7: invalid page type") {
		t.Errorf("Guard of a panic: %v, want a DamagedError saying what bbolt said", err)
	}
	want := errors.New("as it is")
	if err := Guard(func() error { return want }); err != want {
		t.Errorf("Guard of an error: %v, want it as it is", err)
	}
}

// A read of a mapping past its file's end is a memory fault, which no recover catches
// unless the goroutine asked for a panic instead: what bbolt does on a truncated file.
func TestGuardTurnsAFaultIntoDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 2*os.Getpagesize()), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, 2*os.Getpagesize(), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(m)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	var got byte
	err = Guard(func() error { got = m[os.Getpagesize()]; return nil })
	if !IsDamaged(err) {
		t.Errorf("Guard of a read past the end of the file: %v (read %d), want a DamagedError", err, got)
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "state.db")
	db, info, err := Open(path, Options{Create: true})
	if err != nil {
		t.Fatalf("Open with Create of a path whose directory is missing: %v", err)
	}
	if !info.Mode().IsRegular() {
		t.Errorf("FileInfo %v", info.Mode())
	}
	if _, _, err := Open(path, Options{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		t.Errorf("a second Open while the first holds it: %v, want ErrLocked", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, _, err = Open(path, Options{}); err != nil {
		t.Fatalf("Open without Create of the file once closed: %v", err)
	}
	db.Close()

	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(empty, Options{}); !errors.Is(err, ErrEmpty) {
		t.Errorf("Open without Create of an empty file: %v, want ErrEmpty", err)
	}
	if _, _, err := Open(filepath.Join(dir, "missing.db"), Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open without Create of a missing file: %v, want ErrNotExist", err)
	}
	if _, _, err := Open(dir, Options{Create: true}); err == nil || IsDamaged(err) {
		t.Errorf("Open of a directory: %v, want an error that is not damage", err)
	}
	for name, b := range map[string][]byte{
		"short":   []byte("hello"),
		"garbage": bytes.Repeat([]byte{0xa5}, 16<<10),
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Open(p, Options{Create: true}); !IsDamaged(err) {
			t.Errorf("Open of %s: %v, want a DamagedError", name, err)
		}
	}
}

// The preflight refuses a file shorter than its metadata says before bbolt maps it: bbolt
// would fault reading past the end.
func TestOpenTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, _, err := Open(path, Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("b"))
		for i := 0; err == nil && i < 200; i++ {
			err = b.Put([]byte{byte(i), byte(i >> 8)}, bytes.Repeat([]byte{'x'}, 500))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	st, _ := os.Stat(path)
	if err := os.Truncate(path, st.Size()/2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path, Options{Create: true}); !IsDamaged(err) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("Open of a truncated file: %v, want a DamagedError saying it is truncated", err)
	}
}

func TestMoveAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, []byte("evidence"), 0o600); err != nil {
		t.Fatal(err)
	}
	moved, err := MoveAside(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(moved, path+".corrupt-") || !strings.HasSuffix(moved, "Z") {
		t.Errorf("moved to %s, want %s.corrupt-<UTC time>", moved, path)
	}
	if b, err := os.ReadFile(moved); err != nil || string(b) != "evidence" {
		t.Errorf("the file moved aside holds %q (%v)", b, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file is still at %s: %v", path, err)
	}
}
