package durable

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
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

const diskFullKillEnv = "MESHFED_DURABLE_DISK_FULL_KILL_CHILD"

// TestDiskFullThenKilled: the last case. A hub whose disk is full is killed (-9);
// the next start must be told that the file may be older than what was served
// (State.Failing), which the run marker says although the disk was full: it is overwritten
// in place, never grown. The child fills its disk (RLIMIT_FSIZE, as TestDiskFull), waits
// until its commits fail, says so, and is SIGKILLed.
func TestDiskFullThenKilled(t *testing.T) {
	if path := os.Getenv(diskFullKillEnv); path != "" {
		diskFullKillChild(t, path)
		return
	}
	path := statePath(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestDiskFullThenKilled$", "-test.count=1")
	cmd.Env = append(os.Environ(), diskFullKillEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testlog.Writer(t, "child: ")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(kill)
	said := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); l == "failing" || strings.Contains(l, ":") {
				said <- l
				break
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l := <-said:
		if l != "failing" {
			t.Fatalf("the child: %s", l)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the child's writes did not fail within a minute")
	}
	kill()

	s, st := openStateT(t, path, testConfig())
	if !st.Failing || !st.Unclean || st.Reset != nil || len(st.Damaged) != 0 {
		t.Errorf("after a kill while the disk was full: failing %v unclean %v (want both), reset %v, damaged %v", st.Failing, st.Unclean, st.Reset, st.Damaged)
	}
	if res, _ := flat(st.Clusters); len(res) < 50 || len(res) >= 2050 { // a few may fit in the file's free pages
		t.Errorf("%d resources in the file, want the 50 committed before the disk filled, and not all", len(res))
	}
	_ = s.Close()
	if _, st2 := openStateT(t, path, testConfig()); st2.Failing || st2.Unclean {
		t.Errorf("after a clean close: %+v", st2)
	}
}

func diskFullKillChild(t *testing.T, path string) {
	s, _, err := OpenState(path, testlog.New(t), nil)
	if err != nil {
		fmt.Println("open:", err)
		return
	}
	for i := range 50 {
		n := fmt.Sprintf("ns/r%d", i)
		s.Put("east", vs, n, entry(t, n, "1", 1000).Encoded)
	}
	flush(t, s)
	st, _ := os.Stat(path)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: uint64(st.Size()), Max: ^uint64(0)}); err != nil {
		var old syscall.Rlimit
		_ = syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old)
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: uint64(st.Size()), Max: old.Max}); err != nil {
			fmt.Println("setrlimit:", err)
			return
		}
	}
	for i := 50; i < 2050; i++ {
		n := fmt.Sprintf("ns/r%d", i)
		s.Put("east", vs, n, entry(t, n, "1", 1000).Encoded)
	}
	waitFailures(t, s, 3)
	testWaitMarker(t, path, runFailing)
	fmt.Println("failing")
	select {} // until killed
}
