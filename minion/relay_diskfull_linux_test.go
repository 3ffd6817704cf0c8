package minion

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshfed/meshfed/mcp"
)

const relayDiskFullEnv = "MESHFED_MINION_RELAY_DISK_FULL_CHILD"

// TestRelayStateFileDiskFull fills the disk under a running relay for real: its state file
// may not grow (RLIMIT_FSIZE, so bbolt's growth and writes fail with EFBIG, as they would
// with ENOSPC). The relay goes on serving the hub's pushes, from memory, having removed the
// file that fell behind; a restart meanwhile serves nothing until the hub answers, never
// the older state the file held; once the disk has room, the relay writes what it serves
// into a new file, which a restart serves. The limit is the process's, so the test runs
// itself in a child process.
func TestRelayStateFileDiskFull(t *testing.T) {
	if os.Getenv(relayDiskFullEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRelayStateFileDiskFull$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), relayDiskFullEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestRelayStateFileDiskFull") {
			t.Fatalf("the child: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "relay state file") {
				t.Log("child:", strings.TrimSpace(l))
			}
		}
		return
	}

	path := filepath.Join(t.TempDir(), "relay.db")
	rc := startRelayCase(t, path)
	rc.hub.Answer()
	eventually(t, "istiod holding the hub's state through the relay", func() bool { return holds(rc.istiod(t), versionsOf(rc.hub.relayed)) })
	eventually(t, "the state file kept", func() bool { return rc.m.Status().Relay.StateFile.Kept })

	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	room := diskFull(t, st.Size())
	rc.hub.relayed.Put(vsColl, bulk(t, "big", 300)...) // 300 KB more: the file must grow
	eventually(t, "istiod holding the hub's new state, served from memory", func() bool { return holds(rc.istiod(t), versionsOf(rc.hub.relayed)) })
	if s := rc.m.Status().Relay.StateFile; s.Kept || !strings.Contains(s.Problem, "cannot be written") || !strings.Contains(s.Problem, "file too large") || s.RefusingPushes {
		t.Errorf("status of the state file on a full disk: %+v; want not kept, saying why, not refusing pushes", s)
	}
	if rc.metric(t, "write_failures_total") < 1 || rc.metric(t, "kept") != 0 {
		t.Errorf("write failures %v, kept %v; want at least 1 and 0", rc.metric(t, "write_failures_total"), rc.metric(t, "kept"))
	}
	if n := rc.logs.count("level=ERROR", "relay state file cannot be written", "file too large"); n != 1 {
		t.Errorf("the failure logged %d times at ERROR, want once:\n%s", n, rc.logs)
	}

	// A restart while the disk is full: what is on disk is not whole (the file that fell
	// behind was removed), so the relay serves nothing until the hub answers.
	rc.hub.answered.Store(false)
	rc.stop()
	log, logs := captureLog(t)
	tel := NewTelemetry()
	m, stop := startRelayMinion(t, rc.m.cfg, log, tel)
	rc.m, rc.stop, rc.tel, rc.logs, rc.sink = m, stop, tel, logs, nil
	eventually(t, "the restarted relay listening", func() bool { return m.Relay().Addr() != "" })
	rc.settled(t)
	rc.refused(t, "restarted on a full disk before the hub answers")
	rc.hub.Answer()
	eventually(t, "istiod holding the hub's state through the restarted relay", func() bool { return holds(rc.istiod(t), versionsOf(rc.hub.relayed)) })

	// Room again: the relay writes what it serves into its file.
	room()
	eventually(t, "the state file kept again", func() bool {
		s := rc.m.Status().Relay.StateFile
		return s.Kept && s.Problem == "" && rc.metric(t, "kept") == 1
	})
	if n := logs.count("level=INFO", "relay state file kept again"); n != 1 {
		t.Errorf("the recovery logged %d times, want once", n)
	}
	rc.restarted(t)
}

// diskFull keeps the files this process writes from growing past size until room is
// called.
func diskFull(t *testing.T, size int64) (room func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: uint64(size), Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	room = func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(room)
	return room
}

// bulk is n VirtualServices of about 1 KB, named prefix/rN.
func bulk(t testing.TB, prefix string, n int) []*mcp.Entry {
	t.Helper()
	out := make([]*mcp.Entry, n)
	for i := range out {
		out[i] = vsEntry(t, fmt.Sprintf("%s/r%03d", prefix, i), "1", fmt.Sprintf("r%03d.%s.%s", i, prefix, strings.Repeat("x", 1000)))
	}
	return out
}
