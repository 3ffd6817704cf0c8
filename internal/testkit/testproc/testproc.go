// Package testproc runs a child process for a test: its output (stdout and stderr) is read
// line by line, each line written to an optional log (testlog.Writer, to pass it to the
// test's log), given to an optional callback (to read what the process says, e.g. the
// addresses it bound) and kept for failure messages (Tail). The process is killed with
// SIGKILL, and awaited, by Kill or by the test's cleanup, whichever comes first; it is
// also SIGKILLed if the test binary dies (Pdeathsig). CPU and RSSKiB read a process's
// figures from /proc (the benchmarks'), FDs and FDLimit its open files and their limit (the
// connection-flood test's); Listening reads a hub's "listening" log line.
//
// It is test infrastructure: nothing in the product imports it.
package testproc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// TB is the part of testing.TB this package uses (a benchmark command that is not a test
// can run processes too).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Options say what to run.
type Options struct {
	// Path is the program's file (required).
	Path string
	// Args are its arguments, without the program's name.
	Args []string
	// Env is its environment, "KEY=value"; nil: the test's own.
	Env []string
	// Dir is its working directory; "": the test's.
	Dir string
	// Name names the process in messages; default the base name of Path.
	Name string
	// Log, if set, gets every line of output (with its newline), as it is read: typically
	// testlog.Writer(t, prefix), which passes it to the test's log until the test ends. nil:
	// the output is only kept for Tail.
	Log io.Writer
	// Stdin, if set, gives the process a pipe as its standard input, written with
	// Proc.Stdin (closing it ends the input); otherwise its input is empty.
	Stdin bool
	// OnLine, if set, is called with every line of output (without its newline), after Log,
	// on the goroutine that reads the output: it must not block, nor call t.Fatal.
	OnLine func(line string)
}

// Kept is how many of the last lines of output are kept at the least: Tail shows up to as
// many.
const Kept = 200

// maxLine is the longest line read; past one longer, output is read and dropped.
const maxLine = 4 << 20

// Proc is a started child process.
type Proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser // nil without Options.Stdin
	done  chan struct{}  // closed once the process has ended and its output is read

	mu  sync.Mutex // guards out
	out []string   // the last lines of output, between Kept and 2*Kept of them
}

// Start starts the process, failing t if it cannot. The test's cleanup kills it.
func Start(t TB, o Options) *Proc {
	t.Helper()
	name := o.Name
	if name == "" {
		name = filepath.Base(o.Path)
	}
	cmd := exec.Command(o.Path, o.Args...)
	cmd.Env, cmd.Dir = o.Env, o.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &Proc{name: name, cmd: cmd, done: make(chan struct{})}
	if o.Stdin {
		w, err := cmd.StdinPipe() // an os.Pipe: Wait closes it, and never waits on a copy
		if err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		p.stdin = w
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), maxLine)
		for sc.Scan() {
			line := sc.Text()
			if o.Log != nil {
				_, _ = o.Log.Write([]byte(line + "\n"))
			}
			if o.OnLine != nil {
				o.OnLine(line)
			}
			p.mu.Lock()
			p.out = append(p.out, line)
			if len(p.out) > 2*Kept {
				p.out = append(p.out[:0:0], p.out[len(p.out)-Kept:]...)
			}
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr) // a line too long: let the process write on
	}()
	go func() {
		_ = cmd.Wait()
		pw.Close()
		<-readDone
		close(p.done)
	}()
	t.Cleanup(p.Kill)
	return p
}

// Kill kills the process with SIGKILL and waits until it has ended and its output is read.
// Killing it again, or after it ended, is harmless.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stdin is the process's standard input (Options.Stdin), nil without it.
func (p *Proc) Stdin() io.WriteCloser { return p.stdin }

// Pid is the process's ID: valid until Done is closed (then it may be another process's).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended (and its output been read).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed once the process has ended and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Tail returns, for a failure message, the process's name and state and its last n lines
// of output (at most Kept): "NAME (running) output:\n..." or "NAME (signal: killed)
// output:\n...".
func (p *Proc) Tail(n int) string {
	state := "running"
	if p.Exited() { // Wait has set ProcessState
		state = p.cmd.ProcessState.String()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	lines := p.out
	if n = max(n, 0); len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return p.name + " (" + state + ") output:\n" + strings.Join(lines, "\n")
}

// Exit runs the program at path with args in dir until it ends and returns its exit status
// and output, for a program that is to end by itself: one still running after limit is
// killed and fails t.
func Exit(t TB, path, dir string, limit time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %q did not end within %s:\n%s", filepath.Base(path), args, limit, e.String())
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), o.String(), e.String()
	case err != nil:
		t.Fatalf("run %s: %v", filepath.Base(path), err)
	}
	return 0, o.String(), e.String()
}
