// Package testwait waits in tests for a condition that other goroutines or processes make
// true, polling it, and fails the test with what it waited for when it does not come.
//
// It is test infrastructure; nothing in the product imports it.
package testwait

import "time"

// TB is what For needs of a test: testing.TB has it, and so has a benchmark command that is
// not a test.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// For polls cond every 20 ms until it holds, and fails t after d naming what it waited for.
func For(t TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
