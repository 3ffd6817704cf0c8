package bench

import (
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub"
)

// TestNoisyTenantRuns runs the noisy-tenant scenario at a tiny size, so that it cannot rot.
// It checks what the scenario counts, not how fast anything is.
func TestNoisyTenantRuns(t *testing.T) {
	defer stopsItsGoroutines(t)()
	r, err := NoisyTenant(TenantsConfig{AClusters: 2, ASinks: 5, LoopWorkers: 1, LoopIdentities: 3, BSinks: 3,
		Changes: 8, Rounds: 2, Resources: 5, Size: 64, Gap: time.Millisecond,
		ALimits: &hub.TenantLimits{PushesPerSecond: 200, PushBurst: 5, StreamsPerSecond: 50, StreamBurst: 20}, WarmUp: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Idle.N != 8*3 || r.Noisy.N != 8*3 {
		t.Errorf("%d receipts with A idle and %d with A noisy, want %d each", r.Idle.N, r.Noisy.N, 8*3)
	}
	// Rates are not checked: B's blocks here last a few milliseconds.
	if r.AChangesPerPush <= 0 {
		t.Errorf("A made %.2f changes per push: the flood did not run", r.AChangesPerPush)
	}
	if r.LoopStreams <= 0 {
		t.Errorf("the loop opened %d streams: it did not run", r.LoopStreams)
	}
}
