package testproc

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

type lines struct {
	mu sync.Mutex
	l  []string
}

func (w *lines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.l = append(w.l, string(p))
	return len(p), nil
}

func (w *lines) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.l...)
}

func TestProcOutputAndExit(t *testing.T) {
	var log, seen lines
	p := Start(t, Options{Path: "/bin/sh", Args: []string{"-c", `i=0; while [ $i -lt 450 ]; do echo "line $i"; i=$((i+1)); done; echo "$GREETING" >&2`},
		Env: []string{"GREETING=bound at 127.0.0.1:1"}, Log: &log, OnLine: func(l string) { _, _ = seen.Write([]byte(l)) }})
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("sh did not end")
	}
	if !p.Exited() {
		t.Fatal("Exited after Done")
	}
	l, s := log.get(), seen.get()
	if len(l) != 451 || l[0] != "line 0\n" || l[450] != "bound at 127.0.0.1:1\n" {
		t.Errorf("log got %d lines: %q ... %q", len(l), l[0], l[len(l)-1])
	}
	if len(s) != 451 || s[450] != "bound at 127.0.0.1:1" {
		t.Errorf("OnLine got %d lines, last %q", len(s), s[len(s)-1])
	}
	want := "sh (exit status 0) output:\nline 448\nline 449\nbound at 127.0.0.1:1"
	if got := p.Tail(3); got != want {
		t.Errorf("Tail(3) = %q, want %q", got, want)
	}
	if got := p.Tail(1000); strings.Count(got, "\n") < Kept || !strings.HasSuffix(got, "bound at 127.0.0.1:1") {
		t.Errorf("Tail(1000) has %d lines, want at least %d", strings.Count(got, "\n"), Kept)
	}
	p.Kill() // after the end: harmless
}

func TestProcKill(t *testing.T) {
	up := make(chan struct{})
	p := Start(t, Options{Path: "/bin/sh", Args: []string{"-c", "echo up; exec sleep 60"}, Name: "sleeper", OnLine: func(string) { close(up) }})
	select {
	case <-up:
	case <-time.After(10 * time.Second):
		t.Fatal("no output")
	}
	if p.Exited() {
		t.Fatal("exited before Kill")
	}
	p.Kill()
	if !p.Exited() {
		t.Fatal("not exited after Kill")
	}
	p.Kill()
	if got, want := p.Tail(5), "sleeper (signal: killed) output:\nup"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
}

type fatalTB struct {
	testing.TB
	msg string
}

// Fatalf ends the calling goroutine, as t.Fatalf does.
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestStartFails(t *testing.T) {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(f, Options{Path: "/nonexistent/prog"})
		t.Error("Start returned")
	}()
	<-done
	if !strings.HasPrefix(f.msg, "start prog: ") {
		t.Errorf("Fatalf(%q), want start prog: ...", f.msg)
	}
}

// fatals records Fatalf instead of ending the test, to test what fails it.
type fatals struct {
	testing.TB
	msg string
}

func (f *fatals) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestExit(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := Exit(t, "/bin/sh", dir, time.Minute, "-c", "pwd; echo err >&2; exit 3")
	if code != 3 || strings.TrimSpace(out) != dir || errOut != "err\n" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// A program that does not end by itself fails the test, and is killed.
	f := &fatals{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Exit(f, "/bin/sleep", dir, 100*time.Millisecond, "60")
	}()
	<-done
	if !strings.Contains(f.msg, "did not end within 100ms") {
		t.Errorf("a program still running: %q", f.msg)
	}
}

// TestProcStdin: a process reads what Stdin writes, ends when it is closed, and Pid is its.
func TestProcStdin(t *testing.T) {
	var seen lines
	p := Start(t, Options{Path: "/bin/sh", Args: []string{"-c", `echo "pid $$"; read l; echo "got $l"; cat`}, Stdin: true,
		OnLine: func(l string) { _, _ = seen.Write([]byte(l)) }})
	if _, err := fmt.Fprintln(p.Stdin(), "hello"); err != nil {
		t.Fatal(err)
	}
	p.Stdin().Close()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("sh did not end when its input was closed")
	}
	if got, want := strings.Join(seen.get(), "|"), fmt.Sprintf("pid %d|got hello", p.Pid()); got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}

// TestCPUAndRSS read this process's own figures.
func TestCPUAndRSS(t *testing.T) {
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; { // some CPU to see
	}
	if c, err := CPU(os.Getpid()); err != nil || c <= 0 {
		t.Errorf("CPU = %v, %v", c, err)
	}
	if r, err := RSSKiB(os.Getpid()); err != nil || r <= 0 {
		t.Errorf("RSSKiB = %v, %v", r, err)
	}
}

func TestListening(t *testing.T) {
	for _, tc := range []struct {
		line           string
		listener, addr string
		ok             bool
	}{
		{`{"time":"x","level":"INFO","msg":"listening","listener":"serve","addr":"127.0.0.1:4242"}`, "serve", "127.0.0.1:4242", true},
		{`{"msg":"listening"}`, "", "", false},
		{`{"msg":"stream opened","listener":"serve","addr":"127.0.0.1:1"}`, "", "", false},
		{`msg=listening listener=serve addr=127.0.0.1:1`, "", "", false},
	} {
		l, a, ok := Listening([]byte(tc.line))
		if l != tc.listener || a != tc.addr || ok != tc.ok {
			t.Errorf("Listening(%s) = %q, %q, %v; want %q, %q, %v", tc.line, l, a, ok, tc.listener, tc.addr, tc.ok)
		}
	}
}
