package hub

import (
	"slices"
	"strings"
	"testing"
)

// A dry run of a candidate names the changed fields a reload cannot apply, by the same
// function Reload decides with: a candidate changing serve says it needs a restart, and
// Reload indeed refuses it and keeps the running configuration; one changing only what a
// reload applies needs none, and Reload takes it.
func TestDryRunNeedsRestartAsReloadDecides(t *testing.T) {
	h := testHub(t, twoClusters)
	candidate := func(edit func(string) string) *Config {
		t.Helper()
		cfg, err := ParseConfig([]byte(edit(twoClusters)))
		if err != nil {
			t.Fatal(err)
		}
		cfg.StateDir = h.cfg.StateDir
		return cfg
	}
	moved := candidate(func(y string) string {
		return y + "serve: 127.0.0.1:1\nlimits: {streamsPerSecond: 9, streamBurst: 9}\n"
	})
	d, err := h.DryRun("", "global-a", nil, moved)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.NeedsRestart, []string{"serve", "limits"}) {
		t.Errorf("NeedsRestart = %v, want [serve limits]", d.NeedsRestart)
	}
	if _, err := h.Reload(moved); err == nil || err.Error() != "serve, limits: changing them needs a restart of the hub; the running configuration stays" {
		t.Errorf("Reload of the candidate: %v", err)
	}
	if h.current().cfg.Serve == "127.0.0.1:1" {
		t.Error("the refused candidate became the running configuration")
	}

	warm := candidate(func(y string) string { return strings.Replace(y, "warmUp: 1h", "warmUp: 1m", 1) })
	if d, err := h.DryRun("", "global-a", nil, warm); err != nil || len(d.NeedsRestart) != 0 {
		t.Errorf("a change a reload applies: NeedsRestart %v, %v", d.NeedsRestart, err)
	}
	if _, err := h.Reload(warm); err != nil {
		t.Errorf("Reload: %v", err)
	}
}
