package bench

import (
	"runtime"
	"testing"
	"time"
)

// stopsItsGoroutines fails t if, a few seconds after it returns, the process has more
// goroutines than when stopsItsGoroutines was called: every goroutine a scenario starts
// (hub, sources, sinks, the flood) must be stopped.
func stopsItsGoroutines(t *testing.T) func() {
	before := runtime.NumGoroutine()
	return func() {
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines left running (%d before):\n%s", n-before, before, buf[:runtime.Stack(buf, true)])
		}
	}
}

// TestNoisyNeighbourRuns runs the noisy-neighbour scenario at a tiny size, so that it
// cannot rot. It checks what the scenario counts, not how fast anything is.
func TestNoisyNeighbourRuns(t *testing.T) {
	defer stopsItsGoroutines(t)()
	r, err := NoisyNeighbour(NeighbourConfig{Sinks: 3, Changes: 8, Rounds: 2, Resources: 5, Size: 64,
		PushesPerSecond: 100, PushBurst: 5, Gap: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Idle.N != 8*3 || r.Flood.N != 8*3 {
		t.Errorf("%d receipts with A idle and %d with A flooding, want %d each", r.Idle.N, r.Flood.N, 8*3)
	}
	if r.AChangesPerPush <= 0 { // its rate is not checked: B's blocks here last a few milliseconds
		t.Errorf("A made %.2f changes per push: the flood did not run", r.AChangesPerPush)
	}
}

// TestStalledSinkRuns runs the stalled-sink scenario at a tiny size.
func TestStalledSinkRuns(t *testing.T) {
	defer stopsItsGoroutines(t)()
	r, err := StalledSink(StalledConfig{Resources: 10, Size: 64, Early: 5, Changes: 50})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{r.StalledEarlyMiB, r.StalledLateMiB, r.AckingEarlyMiB, r.AckingLateMiB} {
		if v <= 0 {
			t.Errorf("a heap of %.1f MiB: %+v", v, r)
		}
	}
}

func TestMaxMark(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"", -1},
		{"xx" + markOf('A', 7) + "yy" + markOf('A', 12) + markOf('B', 99), 12},
		{"A#123", -1},
		{"A#1234567x" + markOf('A', 3), 3},
	} {
		if got := maxMark([]byte(c.in), 'A'); got != c.want {
			t.Errorf("maxMark(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}
