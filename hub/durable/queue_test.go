package durable

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

// faults makes commits fail while an error is set.
type faults struct{ err atomic.Pointer[error] }

func (f *faults) set(err error) {
	if err == nil {
		f.err.Store(nil)
		return
	}
	f.err.Store(&err)
}

func (f *faults) check() error {
	if p := f.err.Load(); p != nil {
		return *p
	}
	return nil
}

func waitFailures(t *testing.T, s *Store, n uint64) {
	t.Helper()
	testwait.For(t, 10*time.Second, fmt.Sprintf("%d failed commits", n), func() bool { return s.Stats().Failures >= n })
}

func TestSlowDiskCoalesces(t *testing.T) {
	g := &gate{}
	cfg := testConfig()
	cfg.beforeCommit = g.wait
	s := openT(t, statePath(t), nil, cfg)
	const keys, rounds = 100, 1000
	names := make([]string, keys)
	var versions [3][]*mcp.Entry
	for k := range keys {
		names[k] = fmt.Sprintf("ns/r%d", k)
	}
	for v := range versions {
		for k := range keys {
			versions[v] = append(versions[v], entry(t, names[k], fmt.Sprint(v), 1000))
		}
	}

	blockWriter(t, s, g) // the disk is stuck in a commit from here on
	start := time.Now()
	for r := range rounds {
		for k := range keys {
			s.Put("east", vs, names[k], versions[r%2][k].Encoded)
		}
	}
	for k := range keys {
		s.Put("east", vs, names[k], versions[2][k].Encoded)
	}
	took := time.Since(start)
	st := s.Stats()
	t.Logf("%d puts while the writer was held: %v (%v each); queued %d, coalesced %d", rounds*keys+keys, took, took/time.Duration(rounds*keys+keys), st.Queued, st.Coalesced)
	if st.Queued > keys+1 { // the names, and the write the writer holds
		t.Errorf("queued %d writes for %d keys: the queue does not coalesce", st.Queued, keys)
	}
	if st.Coalesced < rounds*keys {
		t.Errorf("coalesced %d, want at least %d", st.Coalesced, rounds*keys)
	}

	g.open()
	flush(t, s)
	res, _ := flat(reload(t, s))
	for _, n := range names {
		if v := res["east|"+vs+"|"+n]; v != "2" {
			t.Fatalf("%s is at version %q on disk, want the last one written (2)", n, v)
		}
	}
}

func TestWriteErrorsReportedAndRecovered(t *testing.T) {
	log, logs := newLogs(t)
	var f faults
	cfg := testConfig()
	cfg.beforeCommit = f.check
	s := openT(t, statePath(t), log, cfg)
	s.Put("east", vs, "ns/a", entry(t, "ns/a", "0", 10).Encoded)
	flush(t, s)

	injected := errors.New("injected: no space left on device")
	for episode := 1; episode <= 2; episode++ {
		f.set(injected)
		base := s.Stats().Failures
		for i := range 50 {
			s.Put("east", vs, "ns/a", entry(t, "ns/a", fmt.Sprint(i), 10).Encoded)
			s.Put("east", vs, fmt.Sprintf("ns/b%d", i%5), entry(t, fmt.Sprintf("ns/b%d", i%5), fmt.Sprint(i), 10).Encoded)
		}
		waitFailures(t, s, base+3)
		st := s.Stats()
		if !st.Failing || !strings.Contains(st.LastError, "injected") || st.LastErrorAt.IsZero() || st.Queued > 6 {
			t.Errorf("stats while failing: %+v; want failing, the error, and the 6 keys queued", st)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := s.Flush(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "injected") {
			t.Errorf("Flush while failing: %v, want the deadline and the write error", err)
		}
		if n := logs.count("cannot write", "injected"); n != episode {
			t.Errorf("the failure logged %d times after %d episodes of %d+ attempts, want once per episode", n, episode, st.Failures-base)
		}

		f.set(nil)
		flush(t, s)
		if st := s.Stats(); st.Failing || st.Queued != 0 {
			t.Errorf("stats after recovering: %+v", st)
		}
		if n := logs.count("writes recovered"); n != episode {
			t.Errorf("the recovery logged %d times, want %d", n, episode)
		}
	}
	res, _ := flat(reload(t, s))
	if res["east|"+vs+"|ns/a"] != "49" || res["east|"+vs+"|ns/b4"] != "49" || len(res) != 6 {
		t.Errorf("on disk after recovering: %v, want the last writes", res)
	}
}

// TestFailurePrunesDeletions: while the disk fails, a cluster that creates and deletes names
// must not grow the queue with deletions of names that never reached the file.
func TestFailurePrunesDeletions(t *testing.T) {
	var f faults
	cfg := testConfig()
	cfg.beforeCommit = f.check
	s := openT(t, statePath(t), nil, cfg)
	for i := range 10 {
		n := fmt.Sprintf("ns/live%d", i)
		s.Put("east", vs, n, entry(t, n, "1", 10).Encoded)
	}
	flush(t, s)

	f.set(errors.New("injected"))
	s.Remove("east", vs, "ns/live0") // on disk: this deletion must stay queued
	churn := entry(t, "ns/x", "1", 10).Encoded
	for i := range 5000 {
		n := fmt.Sprintf("ns/churn%d", i)
		s.Put("east", vs, n, churn)
		s.Remove("east", vs, n)
	}
	waitFailures(t, s, s.Stats().Failures+2) // an attempt that took all of the churn has failed
	if q := s.Stats().Queued; q != 1 {
		t.Errorf("%d writes queued after the churn, want 1 (the deletion of a name on disk)", q)
	}
	f.set(nil)
	flush(t, s)
	res, _ := flat(reload(t, s))
	if _, ok := res["east|"+vs+"|ns/live0"]; ok || len(res) != 9 {
		t.Errorf("on disk: %v, want live1..9", res)
	}
}

func TestCloseWhileFailing(t *testing.T) {
	var f faults
	cfg := testConfig()
	cfg.beforeCommit = f.check
	s := openT(t, statePath(t), nil, cfg)
	f.set(errors.New("injected"))
	s.Put("east", vs, "ns/a", entry(t, "ns/a", "1", 10).Encoded)
	waitFailures(t, s, 1)
	err := s.Close()
	if err == nil || !strings.Contains(err.Error(), "closed with 1 writes not on disk") || !strings.Contains(err.Error(), "injected") {
		t.Errorf("Close while failing: %v, want how many writes were lost and why", err)
	}
}

// TestBrokenFileHandle: the file's handle fails (closed under bbolt); the writer reopens
// the file and writes on.
func TestBrokenFileHandle(t *testing.T) {
	var mu sync.Mutex
	var files []*os.File
	cfg := testConfig()
	path := statePath(t)
	cfg.openFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		if err == nil && name == path { // the state file's handles (not its run marker's)
			mu.Lock()
			files = append(files, f)
			mu.Unlock()
		}
		return f, err
	}
	s := openT(t, path, nil, cfg)
	s.Put("east", vs, "ns/a", entry(t, "ns/a", "1", 10).Encoded)
	flush(t, s)
	mu.Lock()
	_ = files[0].Close()
	mu.Unlock()

	s.Put("east", vs, "ns/b", entry(t, "ns/b", "1", 10).Encoded)
	flush(t, s)
	if st := s.Stats(); st.Failures == 0 || !strings.Contains(st.LastError, "file already closed") || st.Failing {
		t.Errorf("stats: %+v; want a failure on the closed file, then none", st)
	}
	if res, _ := flat(reload(t, s)); len(res) != 2 {
		t.Errorf("on disk: %v, want both writes", res)
	}
}

// TestReopenFindsAnotherFile: after a failed write, the file at the path is not the one
// the store had (replaced, or deleted): the writer writes nothing into it, and says so.
func TestReopenFindsAnotherFile(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		change     func(t *testing.T, path string)
	}{
		{"replaced", "another file", func(t *testing.T, path string) {
			if err := os.Rename(goodFile(t, 1), path); err != nil {
				t.Fatal(err)
			}
		}},
		{"deleted", "no such file", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f faults
			cfg := testConfig()
			cfg.beforeCommit = f.check
			path := statePath(t)
			s := openT(t, path, nil, cfg)
			f.set(errors.New("injected"))
			s.Put("west", vs, "ns/a", entry(t, "ns/a", "1", 10).Encoded)
			waitFailures(t, s, 1)
			// Changed while commits still fail: every retry from here reopens first and
			// finds the change (with the fault lifted first, a retry that had reopened
			// just before the change could commit into the old file, and none would follow).
			tc.change(t, path)
			testwait.For(t, 10*time.Second, "the reopen's refusal", func() bool { return strings.Contains(s.Stats().LastError, tc.want) })
			f.set(nil)
			if err := s.Close(); err == nil || !strings.Contains(err.Error(), "not on disk") {
				t.Errorf("Close: %v, want the writes not on disk", err)
			}
			if _, err := os.Stat(path); tc.name == "replaced" && err == nil {
				s2 := openT(t, path, nil, testConfig())
				if res, _ := flat(load(t, s2)); len(res) != 1 || res["east|"+vs+"|ns/ra"] != "1" {
					t.Errorf("the replacing file holds %v, want only its own resource", res)
				}
			} else if tc.name == "deleted" && err == nil {
				t.Errorf("the deleted file was created again")
			}
		})
	}
}
