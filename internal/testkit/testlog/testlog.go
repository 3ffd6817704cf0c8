// Package testlog routes logs and child-process output into a test's own log: line by line,
// with a prefix, capped, and silent once the test has ended (goroutines that outlive it must
// not call t.Log). MESHFED_TEST_DEBUG=1 turns New's loggers to debug level.
//
// It is test infrastructure; nothing in the product imports it.
package testlog

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// MaxLines bounds the lines one Writer passes to t.Log; further lines are dropped (and
// that is said once).
const MaxLines = 3000

// New returns a logger writing to t's log.
func New(t testing.TB) *slog.Logger {
	level := slog.LevelInfo
	if os.Getenv("MESHFED_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(Writer(t, ""), &slog.HandlerOptions{Level: level}))
}

// Writer returns a writer that passes each complete line to t.Log with prefix, until the
// test ends.
func Writer(t testing.TB, prefix string) io.Writer {
	w := &writer{t: t, prefix: prefix}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.buf) > 0 && !w.done {
			w.t.Log(w.prefix + string(w.buf))
		}
		w.done = true
	})
	return w
}

type writer struct {
	t      testing.TB
	prefix string

	mu    sync.Mutex // guards the following fields
	done  bool
	lines int
	buf   []byte
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		w.lines++
		switch {
		case w.lines < MaxLines:
			w.t.Log(w.prefix + line)
		case w.lines == MaxLines:
			w.t.Log(w.prefix + "... (further lines dropped)")
		}
	}
	return len(p), nil
}
