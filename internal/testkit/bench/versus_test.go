package bench

import (
	"fmt"
	"testing"
	"time"
)

// TestVersusPlumbing runs the versus table's machinery small, so that it cannot rot
// silently: the load process (cmd/mcpload) with 5 sinks against each server (the bare
// source, a hub process, Istio's peer: built by make testbins, as for test/interop),
// full-state and incremental, and every sink must report the initial state and every
// change.
func TestVersusPlumbing(t *testing.T) {
	for _, server := range VersusServers {
		for _, incremental := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/incremental=%v", server, incremental), func(t *testing.T) {
				versusPlumbing(t, server, incremental)
			})
		}
	}
}

// versusPlumbing is one server and mode of TestVersusPlumbing.
func versusPlumbing(t *testing.T, server string, incremental bool) {
	cfg := VersusConfig{Resources: 10, Size: 64, Sinks: 5, Changes: 3, Incremental: incremental, Gap: time.Millisecond}
	r := versusOne(t, cfg, server)
	if r.Connect.Sinks != cfg.Sinks || r.Connect.Last <= 0 {
		t.Errorf("%s, incremental %v: connect %+v, want %d sinks", server, incremental, r.Connect, cfg.Sinks)
	}
	if len(r.Changes) != cfg.Changes {
		t.Fatalf("%s: %d changes, want %d", server, len(r.Changes), cfg.Changes)
	}
	for _, c := range r.Changes {
		if c.Sinks != cfg.Sinks || c.Last <= 0 || c.P50 > c.Last || c.Bytes <= 0 {
			t.Errorf("%s, incremental %v: change %+v, want every one of %d sinks", server, incremental, c, cfg.Sinks)
		}
	}
	// A full state carries the 10 resources, an incremental push the changed one.
	full, one := r.Connect.Bytes, r.Bytes()
	if incremental && one*3 > full || !incremental && one < full {
		t.Errorf("%s, incremental %v: a change's message is %d bytes, the initial state's %d", server, incremental, one, full)
	}
	if r.RSSAfterKiB <= 0 || r.RSSBeforeKiB <= 0 || r.NoFile == 0 {
		t.Errorf("%s: RSS %d -> %d KiB, nofile %d", server, r.RSSBeforeKiB, r.RSSAfterKiB, r.NoFile)
	}
}
