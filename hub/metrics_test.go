package hub

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/tls/tlstest"
)

// The configuration the hub starts with counts as a successful load; a refused change of
// the file sets the gauge to 0 and keeps the time of the last success; a change applied
// after it sets both (the clock's part is procmetrics' TestReloads).
func TestReloadSuccessMetrics(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hub.yaml")
	put := func(content string) { tlstest.WriteAtomic(t, path, []byte(content)) } // never read half-written
	put(twoClusters)
	h, err := New(mustParse(t, twoClusters), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ok := func() float64 { return promtest.Sum(t, h.Registry(), "meshfed_hub_config_last_reload_successful", nil) }
	at := func() float64 {
		return promtest.Sum(t, h.Registry(), "meshfed_hub_config_last_reload_success_timestamp_seconds", nil)
	}
	started := at()
	if ok() != 1 || started == 0 {
		t.Fatalf("at the start: successful %v at %v; want 1 at the start time", ok(), started)
	}
	testrun.Start(t, "watchConfig", func(ctx context.Context) error { return h.watchConfig(ctx, path, time.Millisecond) })
	put(twoClusters + "surprise: true\n")
	testwait.For(t, 10*time.Second, "the refusal", func() bool { return ok() == 0 })
	if at() != started {
		t.Errorf("a refusal moved the time of the last success from %v to %v", started, at())
	}
	// The operator puts the running configuration back: the refusal is over, and the
	// running configuration is still the one of the start.
	put(twoClusters)
	testwait.For(t, 10*time.Second, "the file put back", func() bool { return ok() == 1 })
	if at() != started {
		t.Errorf("putting the file back moved the time of the last success from %v to %v", started, at())
	}
	put(twoClusters + "surprise: again\n")
	testwait.For(t, 10*time.Second, "the second refusal", func() bool { return ok() == 0 })
	put(strings.Replace(twoClusters, "warmUp: 1h", "warmUp: 2h", 1))
	testwait.For(t, 10*time.Second, "the change applied", func() bool { return ok() == 1 })
	if at() < started {
		t.Errorf("time of the last success %v after a change applied, want no earlier than the start (%v)", at(), started)
	}
}

// Refusals are counted by cluster and reason class, from the events the hub notes; every
// reason of a configured cluster has a series (0 until its first refusal), as has its
// connection (0 until its minion connects: one that never does is alerted on); a cluster
// removed by a reload takes its series with it once the removal is confirmed. rejections_total counts the same refusals
// by collection.
func TestRefusalMetrics(t *testing.T) {
	h := testHub(t, twoClusters)
	refusals := func(labels map[string]string) float64 {
		return promtest.Sum(t, h.Registry(), "meshfed_hub_refusals_total", labels)
	}
	if n := series(t, h, "meshfed_hub_refusals_total"); n != 2*len(api.RefusalReasons) {
		t.Errorf("%d refusal series of two configured clusters, want one per cluster and reason (%d)", n, 2*len(api.RefusalReasons))
	}
	if n := series(t, h, "meshfed_hub_cluster_connected"); n != 2 || promtest.Sum(t, h.Registry(), "meshfed_hub_cluster_connected", nil) != 0 {
		t.Errorf("%d cluster_connected series before any minion connected, want 2 at 0", n)
	}
	openSession(t, h, "east")
	if promtest.Sum(t, h.Registry(), "meshfed_hub_cluster_connected", map[string]string{"cluster": "east"}) != 1 {
		t.Error("east connected, its series is not 1")
	}
	if err := h.Apply("east", vsPush(t, "shop/a", "pay/x", "other/y")); err == nil {
		t.Fatal("east published namespaces it does not own")
	}
	if n := refusals(map[string]string{"cluster": "east", "reason": api.ReasonNotOwned}); n != 2 {
		t.Errorf("east's not_owned refusals: %v, want 2", n)
	}
	if n := refusals(map[string]string{"reason": api.ReasonInvalid}); n != 0 {
		t.Errorf("invalid refusals: %v, want 0", n)
	}
	if n := promtest.Sum(t, h.Registry(), "meshfed_hub_rejections_total", map[string]string{"cluster": "east", "collection": vsColl}); n != 2 {
		t.Errorf("east's rejections of %s: %v, want 2 (the same refusals)", vsColl, n)
	}
	reload(t, h, strings.Replace(twoClusters, "- {name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}\n", "", 1))
	if n := series(t, h, "meshfed_hub_refusals_total"); n != 2*len(api.RefusalReasons) {
		t.Errorf("%d refusal series after east left the configuration, want east's kept while its objects are (%d)", n, 2*len(api.RefusalReasons))
	}
	if _, err := h.ReleaseBreaker("east", "op", digestOf(t, h, "east")); err != nil {
		t.Fatal(err)
	}
	if n := series(t, h, "meshfed_hub_refusals_total"); n != len(api.RefusalReasons) {
		t.Errorf("%d refusal series after east's removal was confirmed, want west's alone (%d)", n, len(api.RefusalReasons))
	}
}

// series counts the series of family name.
func series(t *testing.T, h *Hub, name string) int {
	t.Helper()
	fams, err := h.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return len(f.GetMetric())
		}
	}
	return 0
}

// cluster_synced is 0 for a configured cluster until a session has delivered every
// collection, then 1.
func TestClusterSyncedMetric(t *testing.T) {
	h := testHub(t, twoClusters)
	synced := func(cluster string) float64 {
		return promtest.Sum(t, h.Registry(), "meshfed_hub_cluster_synced", map[string]string{"cluster": cluster})
	}
	if n := series(t, h, "meshfed_hub_cluster_synced"); n != 2 || synced("east") != 0 {
		t.Fatalf("before any session: %d series, east %v; want 2, 0", n, synced("east"))
	}
	if err := h.Apply("east", vsPush(t, "shop/a")); err != nil {
		t.Fatal(err)
	}
	if synced("east") != 1 || synced("west") != 0 {
		t.Errorf("after east delivered: east %v, west %v; want 1, 0", synced("east"), synced("west"))
	}
}

// Sinks are counted by tenant, fleet (the rules that select them) and state, every state of
// a fleet reported; the oldest unanswered push of a fleet is its age at scrape time.
func TestFleetMetrics(t *testing.T) {
	h := testHub(t, `
insecure: true
collections: [istio/networking/v1alpha3/virtualservices]
clusters: [{name: east, identities: [east], namespaces: [shop], hosts: ["*"]}]
routing:
  rules:
  - {name: prod, identities: ["prod-*"]}
  - {name: all, identities: ["*"]}
`)
	now := time.Now()
	h.sinks.now = func() time.Time { return now }
	hooks := h.sinks.hooks()
	open := func(identity string) *mcp.StreamInfo {
		info := mcp.NewStreamInfo(identity, &mcppb.SinkNode{Id: identity}, func() {})
		hooks.StreamOpened(info)
		t.Cleanup(func() { hooks.StreamClosed(info, nil) })
		hooks.Pushed(info, mcp.PushEvent{Collection: vsColl, Version: 1})
		return info
	}
	hooks.Acked(open("prod-1"), mcp.AckEvent{Collection: vsColl, Version: 1, Code: codes.OK})
	hooks.Acked(open("prod-2"), mcp.AckEvent{Collection: vsColl, Version: 1, Code: codes.InvalidArgument, Message: "no"})
	open("prod-3") // unanswered
	open("dev-1")  // unanswered
	sinks := func(fleet, state string) float64 {
		return promtest.Sum(t, h.Registry(), "meshfed_hub_fleet_sinks", map[string]string{"tenant": DefaultTenant, "fleet": fleet, "state": state})
	}
	for _, tc := range []struct {
		fleet, state string
		want         float64
	}{
		{"all,prod", api.SinkSynced, 1}, {"all,prod", api.SinkNACKed, 1}, {"all,prod", api.SinkSyncing, 1}, {"all,prod", api.SinkStale, 0},
		{"all", api.SinkSyncing, 1}, {"all", api.SinkSynced, 0},
	} {
		if got := sinks(tc.fleet, tc.state); got != tc.want {
			t.Errorf("fleet %s, %s: %v sinks, want %v", tc.fleet, tc.state, got, tc.want)
		}
	}
	if t.Failed() {
		fams, _ := h.Registry().Gather()
		for _, f := range fams {
			if strings.HasPrefix(f.GetName(), "meshfed_hub_fleet") {
				t.Log(f.String())
			}
		}
	}
	if n := series(t, h, "meshfed_hub_fleet_sinks"); n != 2*len(api.SinkStates) {
		t.Errorf("%d fleet_sinks series, want every state of the two fleets (%d)", n, 2*len(api.SinkStates))
	}
	now = now.Add(time.Hour) // the unanswered pushes are now an hour old, and stale
	if got := sinks("all,prod", api.SinkStale); got != 1 {
		t.Errorf("fleet all,prod: %v stale sinks an hour later, want 1", got)
	}
	behind := promtest.Sum(t, h.Registry(), "meshfed_hub_fleet_oldest_unacked_seconds", map[string]string{"tenant": DefaultTenant, "fleet": "all"})
	if behind < time.Hour.Seconds() {
		t.Errorf("fleet all's oldest unanswered push: %vs, want at least an hour", behind)
	}
}

// A hub with TLS reports when its certificate and its bundle expire.
func TestCertificateExpiryMetrics(t *testing.T) {
	h, _ := tlsHub(t, "[{name: all, identities: ['*']}]")
	for _, role := range []string{"identity", "ca"} {
		if v := promtest.Sum(t, h.Registry(), "meshfed_tls_certificate_expiry_timestamp_seconds", map[string]string{"role": role}); v < float64(time.Now().Unix()) {
			t.Errorf("%s certificate expires at %v, want a time to come", role, v)
		}
	}
	insecure, err := New(mustParse(t, twoClusters), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n := series(t, insecure, "meshfed_tls_certificate_expiry_timestamp_seconds"); n != 0 {
		t.Errorf("a hub without TLS reports %d certificates", n)
	}
}

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
