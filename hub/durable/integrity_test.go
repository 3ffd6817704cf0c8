package durable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/meshfed/meshfed/internal/boltfile"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// Issue 25, finding 4: a state file that cannot be used whole. These tests damage files the
// way disks and operators do — a flipped bit in a key, in a value, anywhere; a zero-length
// file; a read-only file system — and check that OpenState keeps what it can read, says
// which clusters are not whole, and moves a file aside only when it cannot be read at all.

var fleetClusters = []string{"east", "west", "north"}

// fleetName is resource i of a cluster: even ones in vs, odd ones in dr.
func fleetName(i int) string { return fmt.Sprintf("ns%d/obj-%03d", i%3, i) }

func fleetColl(i int) string {
	if i%2 == 1 {
		return dr
	}
	return vs
}

// fleetFile writes three clusters of 50 resources each (bodies of 300 to 790 bytes) with
// their metadata, as a hub does, and returns the file.
func fleetFile(t testing.TB) string {
	t.Helper()
	path := statePath(t)
	s := openT(t, path, nil, testConfig())
	for _, c := range fleetClusters {
		for i := range 50 {
			s.Put(c, fleetColl(i), fleetName(i), entry(t, fleetName(i), "1", 300+i*10).Encoded)
		}
		s.SetMeta(c, Meta{Synced: true, Epoch: 3, LastContact: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), Tenant: "t"})
	}
	flush(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// openStateT opens path with OpenState's code and cfg; the test's cleanup closes it.
func openStateT(t testing.TB, path string, cfg config) (*Store, *State) {
	t.Helper()
	log, _ := newLogs(t)
	s, st, err := openState(path, log, cfg)
	if err != nil {
		t.Fatalf("OpenState %s: %v", path, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, st
}

// clusterEqual compares two loaded clusters: metadata, and each resource's bytes.
func clusterEqual(a, b *Cluster) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	if a == nil {
		return true
	}
	if !metaEqual(a.Meta, b.Meta) || len(a.Collections) != len(b.Collections) {
		return false
	}
	for coll, ha := range a.Collections {
		hb := b.Collections[coll]
		if len(ha) != len(hb) {
			return false
		}
		for n, e := range ha {
			if eb := hb[n]; eb == nil || !bytes.Equal(e.Encoded, eb.Encoded) || e.Version != eb.Version {
				return false
			}
		}
	}
	return true
}

// livePageOf returns the offset, in the file at path, of a live leaf page holding needle
// (not a freed copy of it), and where in that page needle first is.
func livePageOf(t testing.TB, path string, needle []byte) (pageOff, at int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ps := db.Info().PageSize
	tx, err := db.Begin(true) // tx.Page needs the freelist: a write transaction, rolled back
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	for off := 0; ; {
		i := bytes.Index(b[off:], needle)
		if i < 0 {
			t.Fatalf("%q is in no live leaf page of %s", needle, path)
		}
		off += i
		page := off / ps
		if info, err := tx.Page(page); err == nil && info != nil && info.Type == "leaf" {
			start := page * ps
			return start, bytes.Index(b[start:start+ps], needle)
		}
		off = (page + 1) * ps
	}
}

func flipBit(t testing.TB, path string, off int, bit uint) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 1 << bit
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, b)
}

func quarantined(t testing.TB, path string) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := 0
	_ = db.View(func(tx *bolt.Tx) error {
		if qb := tx.Bucket(formatBucket).Bucket(quarantineBucket); qb != nil {
			return qb.ForEachBucket(func([]byte) error { n++; return nil })
		}
		return nil
	})
	return n
}

// TestFlippedBitInAKey is the first case: one flipped bit inside one record's key.
// OpenOrReset (what the hub used) moves the whole file aside; OpenState keeps every other
// record and every other cluster, names the damaged cluster, quarantines the record, and
// keeps the cluster marked damaged across restarts until the hub says it was repaired.
func TestFlippedBitInAKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int  // the byte of the key "ns1/obj-004" flipped
		bit  uint // and its bit
	}{
		{"the order of keys kept", 10, 0},  // ns1/obj-005: a name that is not the record's
		{"the order of keys broken", 0, 1}, // ls1/obj-004: before the keys it follows
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := fleetFile(t)
			s0 := openT(t, orig, nil, testConfig())
			want := load(t, s0)
			_ = s0.Close()

			path := statePath(t)
			copyFile(t, orig, path)
			page, at := livePageOf(t, path, []byte("ns1/obj-004"))
			flipBit(t, path, page+at+tc.at, tc.bit)

			// Before: the hub's OpenOrReset loses every cluster.
			old := filepath.Join(t.TempDir(), "old", "clusters.db")
			copyFile(t, path, old)
			so, state, reset, err := openOrReset(old, nil, testConfig())
			if err != nil {
				t.Fatal(err)
			}
			_ = so.Close()
			if reset == nil || len(state) != 0 {
				t.Fatalf("OpenOrReset: reset %v, %d clusters: expected the old behaviour (the whole file moved aside)", reset, len(state))
			}

			s, st := openStateT(t, path, testConfig())
			if st.Reset != nil {
				t.Fatalf("OpenState reset the file: %v", st.Reset)
			}
			// The three clusters hold the same names: the page found is one of them.
			if len(st.Damaged) != 1 {
				t.Fatalf("damaged: %v, want one cluster", st.Damaged)
			}
			hit := slices.Collect(maps.Keys(st.Damaged))[0]
			if !strings.Contains(st.Damaged[hit], vs) {
				t.Errorf("%s's damage %q does not name the collection", hit, st.Damaged[hit])
			}
			for _, c := range fleetClusters {
				if c != hit && !clusterEqual(st.Clusters[c], want[c]) {
					t.Errorf("%s is not as written", c)
				}
			}
			east := st.Clusters[hit]
			if _, ok := east.Collections[vs]["ns1/obj-004"]; ok {
				t.Errorf("the damaged record is in %s's state", hit)
			}
			if n, w := len(east.Collections[vs]), len(want[hit].Collections[vs]); n != w-1 || len(east.Collections[dr]) != 25 || !metaEqual(east.Meta, want[hit].Meta) {
				t.Errorf("%s holds %d+%d resources (want %d+25) and metadata %+v", hit, n, len(east.Collections[dr]), w-1, east.Meta)
			}
			if err := s.Close(); err != nil { // the repair commits, at the latest, with Close
				t.Fatal(err)
			}
			if n := quarantined(t, path); n != 1 {
				t.Errorf("%d quarantine entries, want 1", n)
			}

			// The next start: the record is gone from the tree, the cluster still damaged.
			s2, st2 := openStateT(t, path, testConfig())
			if st2.Reset != nil || len(st2.Damaged) != 1 || !strings.HasPrefix(st2.Damaged[hit], "marked: ") {
				t.Fatalf("after the repair: reset %v, damaged %v; want %s marked, nothing new", st2.Reset, st2.Damaged, hit)
			}
			if !clusterEqual(st2.Clusters[hit], east) {
				t.Errorf("%s after the repair is not what was read before it", hit)
			}
			s2.Repaired(hit) // its session replaced its state
			if err := s2.Close(); err != nil {
				t.Fatal(err)
			}
			s3, st3 := openStateT(t, path, testConfig())
			if len(st3.Damaged) != 0 || st3.Unclean || st3.Failing || st3.Migrated {
				t.Errorf("after Repaired: %+v", st3)
			}
			if _, err := s3.Load(); err != nil { // and the strict Load finds nothing wrong either
				t.Errorf("Load after the repair: %v", err)
			}
		})
	}
}

// TestSilentDamage: a flipped bit inside a resource's body leaves a record that decodes;
// the integrity digest is what tells.
func TestSilentDamage(t *testing.T) {
	orig := fleetFile(t)
	s0 := openT(t, orig, nil, testConfig())
	want := load(t, s0)
	_ = s0.Close()
	path := statePath(t)
	copyFile(t, orig, path)
	page, at := livePageOf(t, path, []byte("ns1/obj-004"))
	b, _ := os.ReadFile(path)
	body := bytes.Index(b[page+at:], []byte("xxxxxxxxxx"))
	flipBit(t, path, page+at+body+5, 0) // an x becomes a y

	s, st := openStateT(t, path, testConfig())
	if st.Reset != nil || st.Migrated {
		t.Fatalf("reset %v, migrated %v", st.Reset, st.Migrated)
	}
	if len(st.Damaged) != 1 {
		t.Fatalf("damaged: %v; want one cluster", st.Damaged)
	}
	hit := slices.Collect(maps.Keys(st.Damaged))[0]
	if d := st.Damaged[hit]; !strings.Contains(d, "integrity digest") || !strings.Contains(d, vs) {
		t.Fatalf("damaged: %v; want its collection %s, by its digest", st.Damaged, vs)
	}
	got := st.Clusters[hit].Collections[vs]["ns1/obj-004"]
	if got == nil || bytes.Equal(got.Encoded, want[hit].Collections[vs]["ns1/obj-004"].Encoded) {
		t.Fatalf("the changed record: %v; want it read, with its changed bytes", got)
	}
	if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), "integrity digest") {
		t.Errorf("the strict Load: %v, want the digest's mismatch", err)
	}
	_ = s.Close()
	_, st2 := openStateT(t, path, testConfig())
	if !strings.HasPrefix(st2.Damaged[hit], "marked: ") || len(st2.Damaged) != 1 {
		t.Errorf("the next start: %v; want %s still marked", st2.Damaged, hit)
	}
}

// TestRandomBitFlips: one random bit flipped anywhere in the file's pages (up to its high
// water mark), N times. Counted: the runs that lose the whole file (OpenOrReset, what the
// hub used; and OpenState), and the runs where OpenState returns a cluster that differs from
// what was written without naming it damaged (silent).
func TestRandomBitFlips(t *testing.T) {
	runs := 300
	if testing.Short() {
		runs = 60
	}
	orig := fleetFile(t)
	s0 := openT(t, orig, nil, testConfig())
	want := load(t, s0)
	_ = s0.Close()
	b, _ := os.ReadFile(orig)
	f, _ := os.Open(orig)
	m, _ := boltfile.FileMeta(f, int64(len(b)))
	f.Close()
	used := int(m.Pgid) * int(m.PageSize)

	r := rand.New(rand.NewPCG(25, 4))
	var oldLost, newLost, oldSilent, silent, damagedRuns, repairedOK, lastLost int
	dir := t.TempDir()
	for run := range runs {
		off, bit := r.IntN(used), uint(r.IntN(8))
		c := bytes.Clone(b)
		c[off] ^= 1 << bit
		pa := filepath.Join(dir, fmt.Sprintf("a%d", run), "clusters.db")
		pb := filepath.Join(dir, fmt.Sprintf("b%d", run), "clusters.db")
		writeFile(t, pa, c)
		writeFile(t, pb, c)

		so, state, reset, err := openOrReset(pa, nil, testConfig())
		if err != nil {
			t.Fatalf("run %d (byte %d bit %d): OpenOrReset: %v", run, off, bit, err)
		}
		_ = so.Close()
		if reset != nil {
			oldLost++
		} else {
			for _, cl := range fleetClusters {
				if !clusterEqual(state[cl], want[cl]) {
					oldSilent++
					break
				}
			}
		}

		s, st, err := openState(pb, testlog.New(t), testConfig())
		if err != nil {
			t.Fatalf("run %d (byte %d bit %d): OpenState: %v", run, off, bit, err)
		}
		if st.Reset != nil {
			newLost++
			t.Logf("run %d (byte %d, page %d, bit %d): reset: %v", run, off, off/int(m.PageSize), bit, st.Reset.Err)
			_ = s.Close()
			continue
		}
		if len(st.Damaged) > 0 {
			damagedRuns++
		}
		if st.LastCommitLost != "" {
			lastLost++ // every cluster may be older: reported as such
			if !st.Failing || !st.Unclean {
				t.Errorf("run %d: the last commit may be lost, and the state says %+v", run, st)
			}
		}
		for _, cl := range fleetClusters {
			if _, named := st.Damaged[cl]; !named && st.LastCommitLost == "" && !clusterEqual(st.Clusters[cl], want[cl]) {
				silent++
				t.Errorf("run %d (byte %d bit %d): %s differs from what was written and is not named damaged (damaged: %v)", run, off, bit, cl, st.Damaged)
			}
		}
		if err := s.Close(); err != nil {
			t.Errorf("run %d: close: %v", run, err)
		}
		// The repaired file opens again, whole, with the same clusters marked.
		s2, st2, err := openState(pb, testlog.New(t), testConfig())
		if err != nil {
			t.Fatalf("run %d: reopening: %v", run, err)
		}
		ok := st2.Reset == nil
		for c := range st.Damaged {
			if _, still := st2.Damaged[c]; !still {
				ok = false
				t.Errorf("run %d (byte %d bit %d): %s was damaged, and is not after the repair", run, off, bit, c)
			}
		}
		for _, cl := range fleetClusters {
			if _, named := st2.Damaged[cl]; !named && st.LastCommitLost == "" && !clusterEqual(st2.Clusters[cl], want[cl]) {
				ok = false
				t.Errorf("run %d: after the repair %s differs from what was written, unnamed", run, cl)
			}
		}
		if ok {
			repairedOK++
		}
		_ = s2.Close()
	}
	t.Logf("%d runs, one random bit flipped in the file's %d used bytes: the whole file lost: OpenOrReset %d, OpenState %d; "+
		"a cluster wrong and not reported: OpenOrReset %d, OpenState %d; OpenState named clusters damaged in %d runs, and the last commit possibly lost in %d; the repaired file reopened as reported in %d of %d",
		runs, used, oldLost, newLost, oldSilent, silent, damagedRuns, lastLost, repairedOK, runs-newLost)
	if newLost > oldLost {
		t.Errorf("OpenState lost the whole file %d times, OpenOrReset %d", newLost, oldLost)
	}
}

// TestZeroLengthFile: a zero-length file is not taken as new: it is reported (a Reset),
// kept aside, and logged. A file this package creates is never zero-length: it is
// created whole and linked into place.
func TestZeroLengthFile(t *testing.T) {
	path := statePath(t)
	writeFile(t, path, nil)
	log, logs := newLogs(t)
	s, st, err := openState(path, log, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st.Reset == nil || !strings.Contains(st.Reset.Error(), "zero length") || st.Reset.MovedTo == "" {
		t.Fatalf("reset: %v; want the zero-length file reported and moved aside", st.Reset)
	}
	if fi, err := os.Stat(st.Reset.MovedTo); err != nil || fi.Size() != 0 {
		t.Errorf("the file moved aside: %v %v", fi, err)
	}
	if logs.count("moved aside", "zero length") != 1 {
		t.Errorf("the reset is not logged")
	}
	writeFile(t, path+"-y", nil)
	var ce *CorruptError
	if _, err := open(path+"-y", nil, testConfig()); !errors.As(err, &ce) {
		t.Errorf("Open of a zero-length file: %v, want a CorruptError", err)
	}
}

func TestNewFileIsCreatedWhole(t *testing.T) {
	path := statePath(t)
	s, st := openStateT(t, path, testConfig())
	if st.Reset != nil || st.Unclean || st.Failing || st.Migrated || len(st.Damaged) != 0 || len(st.Clusters) != 0 {
		t.Errorf("a new file: %+v", st)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("the new file: %v %v", fi, err)
	}
	if m, _ := filepath.Glob(path + ".new-*"); len(m) > 0 {
		t.Errorf("temporary files left: %v", m)
	}
	_ = s.Close()

	// A bbolt file without the layout (an older release killed between bbolt's init and
	// the layout's commit) is not taken as new either.
	half := statePath(t)
	_ = os.MkdirAll(filepath.Dir(half), 0o700)
	db, err := bolt.Open(half, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	_, st2 := openStateT(t, half, testConfig())
	if st2.Reset == nil || !strings.Contains(st2.Reset.Error(), "no buckets") {
		t.Errorf("a half-initialized file: reset %v", st2.Reset)
	}

	// A file deleted under the hub: its run marker says it was in use.
	gone := fleetFile(t)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	_, st3 := openStateT(t, gone, testConfig())
	if st3.Reset == nil || st3.Reset.MovedTo != "" || !strings.Contains(st3.Reset.Error(), "missing") {
		t.Errorf("a deleted file: reset %v", st3.Reset)
	}
}

// readOnlyFaults fails the opens for writing while ro is set, as a read-only file system
// does (root ignores permission bits: chmod is no test here).
func readOnlyFaults(ro *atomic.Bool) config {
	cfg := testConfig()
	cfg.openFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		if ro.Load() && flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE) != 0 {
			return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EROFS}
		}
		return os.OpenFile(name, flag, perm)
	}
	return cfg
}

func TestReadOnly(t *testing.T) {
	path := fleetFile(t)
	s0 := openT(t, path, nil, testConfig())
	want := load(t, s0)
	_ = s0.Close()
	before, _ := os.ReadFile(path)
	marker, _ := os.ReadFile(runMarkerPath(path))

	var ro atomic.Bool
	ro.Store(true)
	s, st := openStateT(t, path, readOnlyFaults(&ro))
	if !st.ReadOnly || st.Reset != nil || len(st.Damaged) != 0 {
		t.Fatalf("state: read-only %v, reset %v, damaged %v", st.ReadOnly, st.Reset, st.Damaged)
	}
	for _, c := range fleetClusters {
		if !clusterEqual(st.Clusters[c], want[c]) {
			t.Errorf("%s is not as written", c)
		}
	}
	stats := s.Stats()
	if !stats.ReadOnly || !stats.Failing || !strings.Contains(stats.LastError, "read-only file system") {
		t.Errorf("stats: %+v; want read-only, failing, and why", stats)
	}
	s.Put("east", vs, "ns/new", entry(t, "ns/new", "1", 10).Encoded)
	waitFailures(t, s, 2)
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Errorf("the read-only file was written")
	}
	if m, _ := os.ReadFile(runMarkerPath(path)); !bytes.Equal(m, marker) {
		t.Errorf("the run marker was written: %q", m)
	}

	ro.Store(false) // remounted read-write: what is queued is written
	flush(t, s)
	if stats := s.Stats(); stats.ReadOnly || stats.Failing {
		t.Errorf("stats once writable: %+v", stats)
	}
	if res, _ := flat(reload(t, s)); res["east|"+vs+"|ns/new"] != "1" {
		t.Errorf("the write queued while read-only is not in the file")
	}

	// Read-only and unreadable: nothing is moved (it cannot be), every cluster unknown.
	bad := statePath(t)
	writeFile(t, bad, []byte("not a state file, and read-only"))
	ro.Store(true)
	s2, st2 := openStateT(t, bad, readOnlyFaults(&ro))
	if st2.Reset == nil || st2.Reset.MovedTo != "" || !st2.ReadOnly || len(st2.Clusters) != 0 {
		t.Errorf("read-only and unreadable: %+v", st2)
	}
	if _, err := os.Stat(bad); err != nil {
		t.Errorf("the unreadable read-only file: %v", err)
	}
	s2.Put("east", vs, "ns/x", entry(t, "ns/x", "1", 10).Encoded)
	waitFailures(t, s2, 1)
}

// TestRunMarker: the marker in-process (the crash and disk-full tests kill processes).
func TestRunMarker(t *testing.T) {
	var f faults
	cfg := testConfig()
	cfg.beforeCommit = f.check
	path := statePath(t)
	s, st := openStateT(t, path, cfg)
	if st.Unclean || st.Failing {
		t.Fatalf("a new file: %+v", st)
	}
	if w, err := readRunMarker(path); w != runOpen || err != nil {
		t.Errorf("marker while open: %q %v", w, err)
	}
	f.set(errors.New("injected: no space left on device"))
	s.Put("east", vs, "ns/a", entry(t, "ns/a", "1", 10).Encoded)
	waitFailures(t, s, 1)
	testWaitMarker(t, path, runFailing)
	f.set(nil)
	flush(t, s)
	testWaitMarker(t, path, runOpen)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if w, _ := readRunMarker(path); w != runClosed {
		t.Errorf("marker after Close: %q", w)
	}
	s2, st2 := openStateT(t, path, cfg)
	if st2.Unclean || st2.Failing {
		t.Errorf("after a clean close: %+v", st2)
	}
	// Closed with writes not on disk: failing.
	f.set(errors.New("injected"))
	s2.Put("east", vs, "ns/b", entry(t, "ns/b", "1", 10).Encoded)
	waitFailures(t, s2, 1)
	_ = s2.Close()
	f.set(nil)
	_, st3 := openStateT(t, path, cfg)
	if !st3.Failing || !st3.Unclean {
		t.Errorf("after a close that could not write everything: %+v", st3)
	}
	// A file whose marker is missing is taken as unclean.
	other := fleetFile(t)
	_ = os.Remove(runMarkerPath(other))
	_, st4 := openStateT(t, other, testConfig())
	if !st4.Unclean || st4.Failing {
		t.Errorf("no marker: %+v", st4)
	}
}

// testWaitMarker waits for the run marker to say want: the writer writes it right after
// the event the test waited for (a failed or a recovered commit).
func testWaitMarker(t *testing.T, path, want string) {
	t.Helper()
	testwait.For(t, 10*time.Second, "the run marker saying "+want, func() bool {
		w, _ := readRunMarker(path)
		return w == want
	})
}

// TestUpgradeComputesDigests: a file with no digests (the release before them) opens whole
// and is migrated by the first commit; an older release's writes after a rollback make the
// digests stale, which is a recomputation, not damage.
func TestUpgradeComputesDigests(t *testing.T) {
	path := fleetFile(t)
	edit(t, path, func(tx *bolt.Tx) error { // as the release before: no digests at all
		fb := tx.Bucket(formatBucket)
		for _, k := range [][]byte{digestsBucket, damagedBucket} {
			if err := fb.DeleteBucket(k); err != nil {
				return err
			}
		}
		return fb.Delete(digestedKey)
	})
	log, logs := newLogs(t)
	s, st, err := openState(path, log, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if !st.Migrated || st.Reset != nil || len(st.Damaged) != 0 || len(st.Clusters) != 3 {
		t.Fatalf("an old file: %+v", st)
	}
	_ = s.Close()
	if logs.count("one-time migration") != 1 {
		t.Errorf("the migration is not logged")
	}
	_, st2 := openStateT(t, path, testConfig())
	if st2.Migrated || len(st2.Damaged) != 0 {
		t.Errorf("after the migration: %+v", st2)
	}
}

// TestMutatedFiles: a good file mutated the ways a fuzzer does (bits, runs of random bytes,
// bytes inserted or deleted, shifting every page after them) must open with an error, a
// Reset or a State within seconds, take a write and close: never panic, fault, or loop
// (bbolt loops forever on a page loop; walkTree keeps it out of one).
func TestMutatedFiles(t *testing.T) {
	runs := 400
	if testing.Short() {
		runs = 100
	}
	good := smallFile(t)
	r := rand.New(rand.NewPCG(7, 7))
	dir := t.TempDir()
	for run := range runs {
		b := bytes.Clone(good)
		switch run % 5 {
		case 0:
			for range 1 + r.IntN(8) {
				b[r.IntN(len(b))] ^= byte(1 << r.IntN(8))
			}
		case 1:
			for range 1 + r.IntN(4) {
				i := r.IntN(len(b) - 8)
				for j := range 8 {
					b[i+j] = byte(r.Uint32())
				}
			}
		case 2:
			b[r.IntN(len(b))] = byte(r.Uint32())
		case 3:
			i := r.IntN(len(b))
			ins := make([]byte, 1+r.IntN(64))
			for j := range ins {
				ins[j] = byte(r.Uint32())
			}
			b = append(b[:i:i], append(ins, b[i:]...)...)
		case 4:
			i := r.IntN(len(b))
			b = append(b[:i:i], b[i+min(len(b)-i, 1+r.IntN(64)):]...)
		}
		path := filepath.Join(dir, fmt.Sprint(run), "clusters.db")
		writeFile(t, path, b)
		done := make(chan struct{})
		go func() {
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = os.WriteFile(filepath.Join(os.TempDir(), "meshfed-durable-hang.db"), b, 0o600)
				panic(fmt.Sprintf("run %d: OpenState, a write and Close took over 20 s (the file: %s)", run, filepath.Join(os.TempDir(), "meshfed-durable-hang.db")))
			}
		}()
		s, st, err := openState(path, nil, testConfig())
		if err == nil {
			if st == nil {
				t.Fatalf("run %d: no error and no state", run)
			}
			s.Put("east", vs, "ns/after", entryBytes("ns/after"))
			_ = s.Close()
		}
		close(done)
	}
}

// smallFile is a state file of two clusters of four resources.
func smallFile(t testing.TB) []byte {
	t.Helper()
	path := statePath(t)
	s := openT(t, path, nil, testConfig())
	for _, c := range []string{"east", "west"} {
		for i := range 4 {
			n := fmt.Sprintf("ns/r%d", i)
			s.Put(c, vs, n, entryBytes(n))
		}
		s.SetMeta(c, Meta{Synced: true, Epoch: 1})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pageOfBucket returns the root page of bucket path (clusters/cluster/collection...) and
// the page size.
func pageOfBucket(t testing.TB, path string, names ...string) (root uint64, ps int) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(names[0]))
		for _, n := range names[1:] {
			b = b.Bucket([]byte(n))
		}
		root = uint64(b.Root())
		return nil
	})
	return root, db.Info().PageSize
}

// TestPageLoop: a branch page of one collection made to point at itself (one page id
// changed). bbolt would loop forever reading it; the collection is reported unreadable, the
// other clusters are whole, and the repair moves the loop into the quarantine unread.
func TestPageLoop(t *testing.T) {
	path := fleetFile(t)
	s0 := openT(t, path, nil, testConfig())
	want := load(t, s0)
	_ = s0.Close()
	root, ps := pageOfBucket(t, path, "clusters", "west", vs)
	b, _ := os.ReadFile(path)
	p := b[int(root)*ps:]
	if binary.NativeEndian.Uint16(p[8:]) != boltfile.BranchPageFlag {
		t.Fatalf("west's %s root page %d is not a branch page: the test needs a larger collection", vs, root)
	}
	binary.NativeEndian.PutUint64(p[boltfile.PageHeaderSize+8:], root) // its first child: itself
	writeFile(t, path, b)

	s, st := openStateT(t, path, testConfig())
	if st.Reset != nil || len(st.Damaged) != 1 || !strings.Contains(st.Damaged["west"], "linked twice") {
		t.Fatalf("reset %v, damaged %v; want west's collection reported as a loop", st.Reset, st.Damaged)
	}
	for _, c := range []string{"east", "north"} {
		if !clusterEqual(st.Clusters[c], want[c]) {
			t.Errorf("%s is not as written", c)
		}
	}
	s.Put("west", vs, "ns/new", entry(t, "ns/new", "1", 10).Encoded) // after the repair, in the same commit
	s.DropCluster("north")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, st2 := openStateT(t, path, testConfig())
	if len(st2.Damaged) != 1 || !strings.HasPrefix(st2.Damaged["west"], "marked: ") || st2.Clusters["west"].Collections[vs]["ns/new"] == nil {
		t.Errorf("after the repair: damaged %v; west %v", st2.Damaged, st2.Clusters["west"])
	}
	if _, ok := st2.Clusters["north"]; ok {
		t.Errorf("north was dropped, and is still there")
	}
}

// TestFreelistNamesALivePage: the freelist (not checksummed) made to name a page a tree
// links: bbolt would hand it out and overwrite what it holds. The file is rebuilt from what
// it holds, nothing lost, the old one kept aside.
func TestFreelistNamesALivePage(t *testing.T) {
	path := fleetFile(t)
	s0 := openT(t, path, nil, testConfig())
	want := load(t, s0)
	_ = s0.Close()
	live, ps := pageOfBucket(t, path, "clusters", "east", dr)
	f, _ := os.Open(path)
	fi, _ := f.Stat()
	m, _ := boltfile.FileMeta(f, fi.Size())
	f.Close()
	b, _ := os.ReadFile(path)
	fl := b[int(m.Freelist)*ps:]
	n := binary.NativeEndian.Uint16(fl[10:])
	if n == 0xFFFF {
		t.Fatal("a freelist of more than 64k pages: not this test's file")
	}
	binary.NativeEndian.PutUint64(fl[boltfile.PageHeaderSize+int(n)*8:], live) // one more free page: a live one
	binary.NativeEndian.PutUint16(fl[10:], n+1)
	writeFile(t, path, b)

	log, logs := newLogs(t)
	s, st, err := openState(path, log, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st.Reset != nil || len(st.Damaged) != 0 {
		t.Fatalf("reset %v, damaged %v; want the file rebuilt, nothing lost", st.Reset, st.Damaged)
	}
	for _, c := range fleetClusters {
		if !clusterEqual(st.Clusters[c], want[c]) {
			t.Errorf("%s is not as written", c)
		}
	}
	if logs.count("rebuilt") != 1 {
		t.Errorf("the rebuild is not logged")
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 1 {
		t.Errorf("the old file is not kept: %v", m)
	}
	s.Put("east", dr, "ns/new", entry(t, "ns/new", "1", 10).Encoded)
	flush(t, s)
	res, _ := flat(reload(t, s))
	if len(res) != 151 {
		t.Errorf("%d resources after a write, want 151", len(res))
	}
	f, _ = os.Open(path)
	fi, _ = f.Stat()
	if _, err := boltfile.WalkTree(f, fi.Size()); err != nil {
		t.Errorf("the rebuilt file: %v", err)
	}
	f.Close()
}

// TestFlippedBitInAClusterName: the records of a cluster appear under a name the hub does
// not know, and disappear from the real cluster. The unknown name has neither metadata nor
// digests: its records are left out (quarantined); the real cluster's digests no longer
// match: it is damaged.
func TestFlippedBitInAClusterName(t *testing.T) {
	path := fleetFile(t)
	root, ps := pageOfBucket(t, path, "clusters")
	b, _ := os.ReadFile(path)
	at := bytes.Index(b[int(root)*ps:int(root+1)*ps], []byte("west"))
	if at < 0 {
		t.Fatal("no key west in the clusters bucket's page")
	}
	b[int(root)*ps+at+3] ^= 1 // west → wesu
	writeFile(t, path, b)

	s, st := openStateT(t, path, testConfig())
	if st.Reset != nil {
		t.Fatalf("reset: %v", st.Reset)
	}
	if d := st.Damaged["west"]; !strings.Contains(d, "integrity digest") {
		t.Errorf("west: %q; want its digests' mismatch", d)
	}
	if d := st.Damaged["wesu"]; !strings.Contains(d, "no metadata or digests") {
		t.Errorf("wesu: %q; want its records left out", d)
	}
	if c := st.Clusters["wesu"]; c == nil || len(c.Collections) != 0 {
		t.Errorf("wesu's records are served: %v", c)
	}
	if c := st.Clusters["west"]; c == nil || len(c.Collections) != 0 || !c.Synced {
		t.Errorf("west: %v; want its metadata, and no records", c)
	}
	if len(st.Damaged) != 2 {
		t.Errorf("damaged: %v", st.Damaged)
	}
	s.DropCluster("wesu") // the hub forgets a cluster it does not know
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, st2 := openStateT(t, path, testConfig())
	if _, ok := st2.Clusters["wesu"]; ok || !strings.HasPrefix(st2.Damaged["west"], "marked: ") || len(st2.Damaged) != 1 {
		t.Errorf("after the repair and the drop: damaged %v, clusters %v", st2.Damaged, slices.Sorted(maps.Keys(st2.Clusters)))
	}
}

// TestDamagedMetaPage: bbolt keeps two meta pages (checksummed) and reads the valid one of
// the higher transaction. With the newest one damaged it silently reads the one before:
// the file is at its commit before last, a valid state older than what was served. That is
// reported (LastCommitLost, with Failing and Unclean); the older one damaged is not.
func TestDamagedMetaPage(t *testing.T) {
	for _, newest := range []bool{true, false} {
		t.Run(fmt.Sprintf("newest=%v", newest), func(t *testing.T) {
			path := statePath(t)
			s := openT(t, path, nil, testConfig())
			s.Put("east", vs, "ns/a", entry(t, "ns/a", "1", 10).Encoded)
			flush(t, s)
			s.Put("east", vs, "ns/b", entry(t, "ns/b", "1", 10).Encoded) // the last commit
			flush(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			f, _ := os.Open(path)
			fi, _ := f.Stat()
			m, _ := boltfile.FileMeta(f, fi.Size())
			f.Close()
			slot := int(m.Txid % 2)
			if !newest {
				slot = 1 - slot
			}
			flipBit(t, path, slot*int(m.PageSize)+boltfile.PageHeaderSize+12, 3) // in its flags: only the checksum tells

			_, st := openStateT(t, path, testConfig())
			res, _ := flat(st.Clusters)
			_, hasB := res["east|"+vs+"|ns/b"]
			switch {
			case newest && (st.LastCommitLost == "" || !st.Failing || !st.Unclean || hasB || len(res) != 1):
				t.Errorf("the newest meta page damaged: %+v, resources %v; want the last commit reported lost (it is)", st, res)
			case !newest && (st.LastCommitLost != "" || st.Failing || st.Unclean || !hasB):
				t.Errorf("the older meta page damaged: %+v, resources %v; want the file whole and nothing reported", st, res)
			}
		})
	}
}
