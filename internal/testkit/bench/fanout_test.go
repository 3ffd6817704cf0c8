package bench

import (
	"fmt"
	"testing"
)

// BenchmarkFanout pushes one change to N streams; each op is one change delivered to and
// ACKed by every stream. The baseline is raw gRPC sending the same bytes.
func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		for _, kind := range []string{"engine", "baseline"} {
			b.Run(fmt.Sprintf("%s/streams=%d", kind, n), func(b *testing.B) {
				cfg := FanoutConfig{Streams: n, Resources: 100, Changes: b.N, Incremental: true, ResourceBytes: 256}
				run := EngineFanout
				if kind == "baseline" {
					run = BaselineFanout
				}
				b.ResetTimer()
				r, err := run(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(r.PerChange.Nanoseconds()), "ns/change")
				b.ReportMetric(r.AllocsPerChange, "allocs/change")
				if kind == "engine" {
					b.ReportMetric(r.ResourceEncodes, "resource-encodes/change")
					b.ReportMetric(r.BodyEncodes, "body-encodes/change")
				}
			})
		}
	}
}

// TestFanoutEncodesFlat checks the property the benchmark reports: the engine's encoding
// work per change does not grow with the number of streams.
func TestFanoutEncodesFlat(t *testing.T) {
	for _, n := range []int{1, 50} {
		r, err := EngineFanout(FanoutConfig{Streams: n, Resources: 10, Changes: 5, Incremental: true, ResourceBytes: 16})
		if err != nil {
			t.Fatal(err)
		}
		if r.ResourceEncodes != 1 || r.BodyEncodes != 1 {
			t.Errorf("%d streams: %.1f resource and %.1f body encodes per change, want 1 and 1", n, r.ResourceEncodes, r.BodyEncodes)
		}
	}
	if _, err := BaselineFanout(FanoutConfig{Streams: 3, Resources: 10, Changes: 5, Incremental: true, ResourceBytes: 16}); err != nil {
		t.Fatal(err)
	}
}
