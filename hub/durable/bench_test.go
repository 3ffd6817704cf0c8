package durable

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/meshfed/meshfed/mcp"
)

// The caller's side: what Put costs the hub's push path, with the writer committing
// concurrently (as it does under load). 1000 names of 1 KB, written round-robin.
func BenchmarkPut(b *testing.B) {
	s := openT(b, statePath(b), slog.New(slog.DiscardHandler), defaultConfig())
	const keys = 1000
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("ns/r%d", i)
	}
	e := entry(b, "ns/r", "1", 1000).Encoded
	for i := range keys { // the maps have grown: this is the steady state
		s.Put("east", vs, names[i], e)
	}
	flush(b, s)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Put("east", vs, names[i%keys], e)
		i++
	}
	b.StopTimer()
	flush(b, s)
	st := s.Stats()
	b.ReportMetric(float64(st.Batches)/float64(i), "commits/op")
}

// BenchmarkApply: one change of 10 resources (a push), as StateChanged reports it.
func BenchmarkApply(b *testing.B) {
	s := openT(b, statePath(b), slog.New(slog.DiscardHandler), defaultConfig())
	const keys = 1000
	entries := make([]*mcp.Entry, keys)
	for i := range entries {
		entries[i] = entry(b, fmt.Sprintf("ns/r%d", i), "1", 1000)
	}
	s.Apply("east", vs, entries, nil)
	flush(b, s)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j := (i * 10) % keys
		s.Apply("east", vs, entries[j:j+10], nil)
		i++
	}
	b.StopTimer()
	flush(b, s)
}

// BenchmarkDiskThroughput: sustained writing to disk. Each op writes 10,000 distinct
// resources of 1 KB (the same names each op, with new content: the file's size stays that
// of 10,000 resources) as fast as Put takes them, and waits until they are on disk. Nothing
// coalesces (distinct names within an op, a Flush between ops): resources/s is what reaches
// the disk, in the batches the writer forms by itself.
func BenchmarkDiskThroughput(b *testing.B) {
	for _, size := range []int{1000} {
		forDigests(b, fmt.Sprintf("%dB", size), func(b *testing.B, cfg config) {
			s := openT(b, statePath(b), slog.New(slog.DiscardHandler), cfg)
			const n = 10000
			var versions [2][]*mcp.Entry
			for v := range versions {
				for i := range n {
					versions[v] = append(versions[v], entry(b, fmt.Sprintf("ns/r%d", i), fmt.Sprint(v), size))
				}
			}
			ops := 0
			start := time.Now()
			for b.Loop() {
				for _, e := range versions[ops%2] {
					s.Put("east", vs, e.Name, e.Encoded)
				}
				flush(b, s)
				ops++
			}
			took := time.Since(start)
			st := s.Stats()
			if st.Coalesced != 0 || st.Written != uint64(ops*n) {
				b.Fatalf("coalesced %d, wrote %d for %d puts: the measure is not of writes to disk", st.Coalesced, st.Written, ops*n)
			}
			b.ReportMetric(float64(ops*n)/took.Seconds(), "resources/s")
			b.ReportMetric(float64(ops*n*size)/took.Seconds()/1e6, "MB/s")
			b.ReportMetric(float64(st.Batches)/float64(ops), "commits/op")
			b.ReportMetric(float64(st.FileSize)/1e6, "file-MB")
		})
	}
}

// BenchmarkCommitLatency: one resource put and waited for: the cost of one commit (its
// fsyncs) when the hub is quiet, the least a batch takes.
func BenchmarkCommitLatency(b *testing.B) {
	forDigests(b, "", func(b *testing.B, cfg config) {
		s := openT(b, statePath(b), slog.New(slog.DiscardHandler), cfg)
		e := entry(b, "ns/r", "1", 1000).Encoded
		for b.Loop() {
			s.Put("east", vs, "ns/r", e)
			flush(b, s)
		}
	})
}

// forDigests runs f with and without the integrity digests (config.noDigests), in the same
// run, for comparing what they cost a commit.
func forDigests(b *testing.B, name string, f func(b *testing.B, cfg config)) {
	for _, on := range []bool{false, true} {
		cfg := defaultConfig()
		cfg.noDigests = !on
		n := fmt.Sprintf("digests=%v", on)
		if name != "" {
			n = name + "/" + n
		}
		b.Run(n, func(b *testing.B) { f(b, cfg) })
	}
}

// BenchmarkCommitByStored: one resource changed and committed (Flush), with 1,000 to
// 1,000,000 resources in the file, loaded first as a minion's first push fills it: every
// name new, enqueued faster than the writer commits.
// The hub's CPU per change must not grow with what is stored; this is the state file's
// share of it.
func BenchmarkCommitByStored(b *testing.B) {
	for _, n := range []int{1000, 100000, 1000000} {
		forDigests(b, fmt.Sprintf("stored=%d", n), func(b *testing.B, cfg config) {
			s := openT(b, statePath(b), slog.New(slog.DiscardHandler), cfg)
			e := entry(b, "ns/r", "1", 256).Encoded
			start := time.Now()
			for j := range n { // as fast as the hub enqueues them: the writer takes what is queued
				s.Put("east", vs, fmt.Sprintf("ns/r%07d", j), e)
			}
			flush(b, s)
			b.Logf("%d resources loaded in %v", n, time.Since(start))
			i := 0
			for b.Loop() {
				s.Put("east", vs, fmt.Sprintf("ns/r%07d", i%n), e)
				flush(b, s)
				i++
			}
		})
	}
}

// BenchmarkLoad: a start, on a file of 100,000 resources of 256 bytes in 10 clusters:
// open, load every record (decoded, checked, hashed) and close.
func BenchmarkLoad(b *testing.B) {
	path := statePath(b)
	s := openT(b, path, slog.New(slog.DiscardHandler), defaultConfig())
	for c := range 10 {
		for j := range 10000 {
			n := fmt.Sprintf("ns/r%07d", j)
			s.Put(fmt.Sprintf("c%d", c), vs, n, entry(b, n, "1", 256).Encoded)
		}
	}
	flush(b, s)
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s, err := open(path, nil, defaultConfig())
		if err != nil {
			b.Fatal(err)
		}
		state, err := s.Load()
		if err != nil || len(state) != 10 {
			b.Fatalf("load: %d clusters, %v", len(state), err)
		}
		_ = s.Close()
	}
}
