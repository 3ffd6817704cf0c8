// Package testrun runs a component (a hub, a minion: anything with Run(ctx) error) for a
// test: until the test ends or the caller stops it, whichever is first, and then waits for
// it, failing the test if it returned an error. Every goroutine it starts has ended when
// the test does.
package testrun

import (
	"context"
	"sync"
	"testing"
)

// Start runs run in a goroutine. stop cancels its context and waits for it (once; later
// calls return at once); the test's cleanup calls it too. An error run returns fails the
// test, named what.
func Start(t testing.TB, what string, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
