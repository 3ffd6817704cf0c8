package testproc

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU returns process pid's user+system CPU time so far (from /proc, at USER_HZ's 10 ms).
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may contain spaces) start after the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ut, st int64
	if _, err := fmt.Sscan(f[11], &ut); err != nil {
		return 0, err
	}
	if _, err := fmt.Sscan(f[12], &st); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil // USER_HZ is 100 on Linux
}

// RSSKiB returns process pid's resident set (VmRSS) in KiB.
func RSSKiB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// FDs returns how many files process pid has open (the entries of /proc/PID/fd).
func FDs(pid int) (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(entries), err
}

// FDLimit returns process pid's soft limit of open files (RLIMIT_NOFILE, from
// /proc/PID/limits).
func FDLimit(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Max open files"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, fmt.Errorf("no open files limit in /proc/%d/limits", pid)
}

// Listening reads one line of a hub process's JSON log: the listener's name and bound
// address when it is the line the hub logs once a listener is bound ("listening"), ok false
// for any other line. Tests learn the addresses of a hub started on 127.0.0.1:0 this way.
func Listening(line []byte) (listener, addr string, ok bool) {
	var ev struct{ Msg, Listener, Addr string }
	if json.Unmarshal(line, &ev) != nil || ev.Msg != "listening" || ev.Listener == "" {
		return "", "", false
	}
	return ev.Listener, ev.Addr, true
}
