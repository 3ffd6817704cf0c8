package bench

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// BenchmarkDryRunLoop prints the dry-run row's figures (MESHFED_DRYRUN_KB sizes the
// candidate: clusters of 100 namespace and 100 host patterns, ~4.2 KB each).
func BenchmarkDryRunLoop(b *testing.B) {
	kb := 1000
	if s := os.Getenv("MESHFED_DRYRUN_KB"); s != "" {
		kb, _ = strconv.Atoi(s)
	}
	cand := DryRunCandidate(kb*1000/4160, 100)
	for b.Loop() {
		r, err := DryRunLoop(DryRunConfig{Clusters: 10, Sinks: 100, Changes: 100, Rounds: 5, Clients: 3, Candidate: cand, Gap: 10 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("candidate %d bytes: p99 %v (loop) vs %v (idle) = %.2fx; p50 %v vs %v; answers %v (%d unanswered), mean 200 took %v; cores %.2f vs %.2f over %.1f s; busy %v after the clients left",
			len(cand), r.Looping.P99, r.Idle.P99, float64(r.Looping.P99)/float64(r.Idle.P99), r.Looping.P50, r.Idle.P50, r.Answers, r.Errors, r.Took, r.LoopCores, r.IdleCores, r.LoopSeconds, r.Settle)
	}
}
