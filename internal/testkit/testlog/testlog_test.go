package testlog

import (
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what is logged.
type recorder struct {
	testing.TB
	lines    []string
	cleanups []func()
}

func (r *recorder) Log(args ...any)  { r.lines = append(r.lines, args[0].(string)) }
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

func TestWriter(t *testing.T) {
	r := &recorder{TB: t}
	w := Writer(r, "p: ")
	_, _ = w.Write([]byte("one\ntw"))
	_, _ = w.Write([]byte("o\nthree"))
	for _, f := range r.cleanups {
		f() // the test ends: the partial line is flushed, later writes are dropped
	}
	_, _ = w.Write([]byte("after\n"))
	if got := strings.Join(r.lines, "|"); got != "p: one|p: two|p: three" {
		t.Fatalf("logged %q", got)
	}
}
