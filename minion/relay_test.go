package minion

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshfed/meshfed/internal/boltfile"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
)

// A minion whose relay cannot listen does not run, and leaves nothing running behind it:
// not its HTTP endpoints (a reload that goes back to the previous configuration binds them
// again), nor its relay's state file, which the next configuration opens.
func TestRunRelayListenInUseStartsNothing(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := fsConfig(t.TempDir(), "push://"+deadAddr(t))
	cfg.HTTP = deadAddr(t)
	state := filepath.Join(t.TempDir(), "relay.db")
	cfg.Relay = &RelayConfig{Listen: taken.Addr().String(), StateFile: state}
	m, err := New(cfg, testLog(t), NewTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "relay.listen") {
		t.Fatalf("Run: %v, want the relay listener's error", err)
	}
	if c, err := net.Dial("tcp", cfg.HTTP); err == nil {
		c.Close()
		t.Errorf("the HTTP endpoints are still served at %s after Run returned", cfg.HTTP)
	}
	if db, _, err := boltfile.Open(state, boltfile.Options{Create: true}); err != nil {
		t.Errorf("the relay's state file after Run returned: %v", err)
	} else {
		db.Close()
	}
}

// fromHub says the relay has had every collection whole from the hub since the minion
// started: a new stream to the hub (a reconnect) that has not delivered them all again yet
// does not make what it serves any less the hub's.
func TestRelayStatusFromHubAcrossReconnects(t *testing.T) {
	table, err := kinds.NewTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRelay(RelayConfig{Listen: "127.0.0.1:0", Collections: []string{vsColl, drColl}}, "east", table, testLog(t), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	whole := func(coll string) {
		t.Helper()
		if err := r.apply(context.Background(), &mcp.Change{Collection: coll}); err != nil {
			t.Fatal(err)
		}
	}
	r.upstreamOpened(nil)
	whole(vsColl)
	if st := r.Status(); st.Serving || st.FromHub || st.LastSynced != nil || r.Ready() {
		t.Fatalf("one collection of two: %+v, want not serving", st)
	}
	whole(drColl)
	st := r.Status()
	if !st.Serving || !st.FromHub || st.LastSynced == nil || !st.HubConnected || !r.Ready() {
		t.Fatalf("both collections: %+v, want serving from the hub", st)
	}
	synced := *st.LastSynced
	r.upstreamClosed(nil, nil)
	r.upstreamOpened(nil)
	whole(vsColl)
	if st := r.Status(); !st.Serving || !st.FromHub || st.LastSynced == nil || !st.LastSynced.Equal(synced) || !st.HubConnected {
		t.Errorf("a new stream that delivered one collection of two: %+v, want serving from the hub, last synced %v", st, synced)
	}
	whole(drColl)
	if st := r.Status(); !st.FromHub || st.LastSynced == nil || st.LastSynced.Before(synced) {
		t.Errorf("the new stream delivered both: %+v, want synced again", st)
	}
}
