package procmetrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfed/meshfed/internal/testkit/promtest"
)

// The start counts as applied but is no change of the file; a refusal sets the gauge to 0
// and keeps the time of the last success; an applied change sets both.
func TestReloads(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewReloads(reg, "hub")
	clock := time.Unix(5000, 0)
	r.now = func() time.Time { return clock }
	get := func(name string, labels map[string]string) float64 {
		return promtest.Sum(t, reg, "meshfed_hub_config_"+name, labels)
	}
	started := get("last_reload_success_timestamp_seconds", nil)
	if get("last_reload_successful", nil) != 1 || started == 0 || get("reloads_total", nil) != 0 {
		t.Fatalf("at the start: successful %v at %v, %v changes; want 1 at the start, none",
			get("last_reload_successful", nil), started, get("reloads_total", nil))
	}
	r.Record(ReloadRefused)
	if get("last_reload_successful", nil) != 0 || get("last_reload_success_timestamp_seconds", nil) != started {
		t.Errorf("after a refusal: successful %v at %v; want 0 at %v", get("last_reload_successful", nil), get("last_reload_success_timestamp_seconds", nil), started)
	}
	r.Record(ReloadApplied)
	if get("last_reload_successful", nil) != 1 || get("last_reload_success_timestamp_seconds", nil) != 5000 {
		t.Errorf("after an applied change: successful %v at %v; want 1 at 5000", get("last_reload_successful", nil), get("last_reload_success_timestamp_seconds", nil))
	}
	for result, want := range map[string]float64{ReloadApplied: 1, ReloadRefused: 1} { // so far
		if n := get("reloads_total", map[string]string{"result": result}); n != want {
			t.Errorf("reloads_total{result=%q} = %v, want %v", result, n, want)
		}
	}
	// The operator puts the running configuration back after a refused change: the alert
	// on the last reload clears, and the running configuration's time stays.
	r.Record(ReloadRefused)
	r.Current()
	if get("last_reload_successful", nil) != 1 || get("last_reload_success_timestamp_seconds", nil) != 5000 {
		t.Errorf("the file put back: successful %v at %v; want 1 at 5000", get("last_reload_successful", nil), get("last_reload_success_timestamp_seconds", nil))
	}
	// A change applied at 6000 fails to start: the one of 5000 runs again.
	clock = time.Unix(6000, 0)
	r.Record(ReloadApplied)
	r.FailedToStart()
	if get("last_reload_successful", nil) != 0 || get("last_reload_success_timestamp_seconds", nil) != 5000 {
		t.Errorf("after a change that failed to start: successful %v at %v; want 0 at 5000", get("last_reload_successful", nil), get("last_reload_success_timestamp_seconds", nil))
	}
	var none *Reloads
	none.Record(ReloadApplied) // records nothing, without panicking
	none.Current()
	none.FailedToStart()
}
