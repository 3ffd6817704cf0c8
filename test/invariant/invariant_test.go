package invariant

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var (
	seqs    = flag.Int("invariant.seqs", 12, "random sequences TestInvariant runs")
	seed    = flag.Uint64("invariant.seed", 1, "the first sequence's seed (0: from the clock)")
	length  = flag.Int("invariant.len", 40, "events per sequence after its prelude")
	trace   = flag.Bool("invariant.trace", false, "print every step: the hub's readiness, what it holds, what each sink holds")
	without = flag.String("invariant.without", "", "events the generator leaves out, comma-separated (e.g. crash,damage)")
	reports = flag.String("invariant.reports", "", "with -invariant.survey, a directory to write each failing sequence's report to")
	survey  = flag.Bool("invariant.survey", false, "run every sequence and print each failing one's first violation, instead of stopping at the first")
	shrink  = flag.Bool("invariant.shrink", false, "with -invariant.script: print the shortest sequence found that still fails (events removed greedily)")
	script  = flag.String("invariant.script", "", "a script TestInvariantRegressions replays instead of testdata/regressions")
	logTo   = flag.String("invariant.log", "", "a file to append the whole log of the hubs, minions and sinks to, each step marked (a failure's report has its last lines only)")
)

// TestMain checks that the worlds left no goroutine behind. memberlist's Shutdown does not
// wait for a probe in flight (a killed replica's, a peer's probe of it): that goroutine ends
// at its probe's timeout, which the node's awareness scales up to seconds on a loaded
// machine. So the check waits for them, bounded, before it calls anything a leak.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		var err error
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
			if err = goleak.Find(); err == nil {
				break
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left behind: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestInvariant runs random sequences of events against the hub and checks the invariant
// after every step (see the package doc). A failure prints the sequence as a script.
func TestInvariant(t *testing.T) {
	base := *seed
	if base == 0 {
		base = uint64(time.Now().UnixNano())
	}
	start := time.Now()
	steps, failures := 0, 0
	for i := range *seqs {
		s := base + uint64(i)
		events := sequence(rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15)), *length, strings.Split(*without, ","))
		vs, failed, h := runSequence(t.TempDir(), events)
		steps += failed
		if len(vs) == 0 {
			continue
		}
		failures++
		if !*survey {
			t.Fatalf("seed %d: %s", s, report(events, failed, vs, h))
		}
		t.Errorf("seed %d: step %d (%s): %s", s, failed, events[failed], vs[0].msg)
		if *reports != "" {
			_ = os.WriteFile(filepath.Join(*reports, fmt.Sprintf("seed-%d.txt", s)), []byte(report(events, failed, vs, h)), 0o644)
		}
	}
	t.Logf("%d sequences (%d failed), %d steps, in %v", *seqs, failures, steps, time.Since(start).Round(time.Millisecond))
}

// TestInvariantRegressions replays the sequences kept in testdata/regressions: each
// failed once. -invariant.script=FILE replays one file instead (a sequence just printed).
func TestInvariantRegressions(t *testing.T) {
	files, _ := filepath.Glob("testdata/regressions/*.seq")
	if *script != "" {
		files = []string{*script}
	}
	if *shrink {
		shrinkScript(t, files[0])
		return
	}
	if len(files) == 0 {
		t.Skip("no regression sequences kept")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			events, err := parseScript(string(b))
			if err != nil {
				t.Fatal(err)
			}
			if vs, failed, h := runScript(t.TempDir(), events); len(vs) > 0 {
				t.Fatal(report(events, failed, vs, h))
			}
		})
	}
}

// FuzzInvariant drives the generator from the fuzzer's input (its first 16 bytes seed it,
// the rest choose the length), for runs longer than make test's.
func FuzzInvariant(f *testing.F) {
	f.Add([]byte("meshfed invariant"))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 40})
	f.Fuzz(func(t *testing.T, in []byte) {
		var s [16]byte
		copy(s[:], in)
		a := uint64(0)
		b := uint64(0)
		for i := range 8 {
			a = a<<8 | uint64(s[i])
			b = b<<8 | uint64(s[8+i])
		}
		n := 30
		if len(in) > 16 {
			n = 10 + int(in[16])%60
		}
		events := sequence(rand.New(rand.NewPCG(a, b)), n, nil)
		if vs, failed, h := runSequence(t.TempDir(), events); len(vs) > 0 {
			t.Fatal(report(events, failed, vs, h))
		}
	})
}

// shrinkScript removes events from a failing script, in chunks then one by one, while it
// still fails, and prints what is left: the regression case to keep.
func shrinkScript(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	events, err := parseScript(string(b))
	if err != nil {
		t.Fatal(err)
	}
	fails := func(es []event) bool {
		vs, _, _ := runScript(t.TempDir(), es)
		return len(vs) > 0
	}
	if !fails(events) {
		t.Fatal("the script does not fail")
	}
	first := 0
	if events[0].op == "replicas" {
		first = 1 // the world's line stays
	}
	for chunk := len(events) / 2; chunk >= 1; chunk /= 2 {
		for i := first; i+chunk <= len(events); {
			try := append(append([]event(nil), events[:i]...), events[i+chunk:]...)
			if fails(try) {
				events = try
				continue
			}
			i += chunk
		}
	}
	vs, failed, h := runScript(t.TempDir(), events)
	if len(vs) == 0 {
		t.Fatalf("the shrunk sequence passed on a second run (the failure depends on timing):\n%s", formatScript(events))
	}
	t.Logf("shrunk to %d events:\n%s", len(events), report(events, failed, vs, h))
}
