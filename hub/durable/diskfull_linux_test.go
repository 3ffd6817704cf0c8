package durable

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const diskFullEnv = "MESHFED_DURABLE_DISK_FULL_CHILD"

// TestDiskFull fills the disk for real: the file may not grow past its size (RLIMIT_FSIZE,
// so bbolt's growth and writes fail with EFBIG, as they would with ENOSPC). The limit is
// the process's, so the test runs itself in a child process.
func TestDiskFull(t *testing.T) {
	if os.Getenv(diskFullEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDiskFull$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), diskFullEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestDiskFull") {
			t.Fatalf("the child: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "queue_test.go") {
				t.Log("child:", strings.TrimSpace(l))
			}
		}
		return
	}

	log, logs := newLogs(t)
	path := statePath(t)
	s := openT(t, path, log, testConfig())
	put := func(from, to int) {
		for i := from; i < to; i++ {
			n := fmt.Sprintf("ns/r%d", i)
			s.Put("east", vs, n, entry(t, n, "1", 1000).Encoded)
		}
	}
	put(0, 50)
	flush(t, s)
	st, _ := os.Stat(path)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: uint64(st.Size()), Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old) })

	put(50, 2050) // 2 MB more: the file must grow
	waitFailures(t, s, 3)
	stats := s.Stats()
	t.Logf("with the file held at %d bytes: %+v", st.Size(), stats)
	if !stats.Failing || !strings.Contains(stats.LastError, "file too large") || stats.Queued == 0 || stats.Queued > 2000 {
		t.Errorf("stats: %+v; want failing with EFBIG and what did not fit queued", stats)
	}
	// Once per kind of error: bbolt reports a failed growth (its own message) and a failed
	// write (the errno) differently, and either may come first.
	if n := logs.count("cannot write", "file too large"); n < 1 || n > 2 {
		t.Errorf("the failure logged %d times over %d attempts, want once per kind", n, s.Stats().Failures)
	}

	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	flush(t, s)
	if stats := s.Stats(); stats.Failing || stats.Queued != 0 {
		t.Errorf("after the disk has room again: %+v", stats)
	}
	if res, _ := flat(reload(t, s)); len(res) != 2050 {
		t.Errorf("%d resources on disk, want 2050", len(res))
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
		t.Errorf("files moved aside: %v", m)
	}
}
