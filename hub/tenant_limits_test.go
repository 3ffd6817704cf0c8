package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// tenantHub is a hub of two tenants, acme (east, west) and globex (north), whose clusters
// own what push and bigVS publish in their namespaces; ACME is replaced by acme's limits.
const tenantHub = `
insecure: true
collections: [istio/networking/v1alpha3/virtualservices]
warmUp: 1h
tenants:
- name: acme
  sinks: ["acme-*"]
  clusters:
  - {name: east, identities: [east], namespaces: [shop], hosts: ["*.shop.svc.cluster.local"]}
  - {name: west, identities: [west], namespaces: [cart], hosts: ["*.cart.svc.cluster.local"]}
  routing: {rules: [{name: all, identities: ["*"]}]}
  ACME
- name: globex
  sinks: ["globex-*"]
  clusters:
  - {name: north, identities: [north], namespaces: [bank], hosts: ["*.bank.svc.cluster.local"]}
  routing: {rules: [{name: all, identities: ["*"]}]}
`

func tenantHubWith(acmeLimits string) string {
	return strings.Replace(tenantHub, "ACME", "limits: "+acmeLimits, 1)
}

// tenantMetric is a tenant's series of name.
func tenantMetric(t *testing.T, h *Hub, name, tenant string) float64 {
	t.Helper()
	return promtest.Sum(t, h.Registry(), name, map[string]string{"tenant": tenant})
}

// tenantSeries counts the series with label tenant, in every family.
func tenantSeries(t *testing.T, h *Hub, tenant string) int {
	t.Helper()
	fams, err := h.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenant {
					n++
				}
			}
		}
	}
	return n
}

// mentionsAnother fails the test if reason names globex or its cluster.
func mentionsAnother(t *testing.T, reason string) {
	t.Helper()
	for _, other := range []string{"globex", "north"} {
		if strings.Contains(reason, other) {
			t.Errorf("acme's refusal %q names %s, another tenant's", reason, other)
		}
	}
}

// A tenant's clusters share its push rate: once east has spent acme's, west (another of
// acme's clusters, far under its own quota) waits on its stream, while north (globex's)
// pushes at once; the wait is counted for acme.
func TestTenantPushRateSpansItsClustersOnly(t *testing.T) {
	h := testHub(t, tenantHubWith("{pushesPerSecond: 0.001, pushBurst: 1}"))
	east, west, north := ownSession(t, h, "east", "e"), ownSession(t, h, "west", "w"), ownSession(t, h, "north", "n")
	if err := h.applyPaced(context.Background(), east.s, push(t, vsColl, "shop/a")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.applyPaced(ctx, west.s, push(t, vsColl, "cart/a")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("west's push once acme's rate is spent: %v, want it to wait (until the stream ends)", err)
	}
	// globex (its default rate) is not held back by acme's: none of its pushes waits.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 5 {
		if err := h.applyPaced(ctx, north.s, push(t, vsColl, objects("bank", i+1)...)); err != nil {
			t.Fatalf("north's push %d: %v", i, err)
		}
	}
	if n := tenantMetric(t, h, "meshfed_tenant_pushes_delayed_total", "acme"); n != 1 {
		t.Errorf("acme's pushes delayed = %v, want 1", n)
	}
	if n := tenantMetric(t, h, "meshfed_tenant_pushes_delayed_total", "globex"); n != 0 {
		t.Errorf("globex's pushes delayed = %v, want 0", n)
	}
}

// A tenant's maxObjects and maxBytes bound its clusters together: the object over the bound
// is refused (ResourceExhausted) by a reason naming acme's bound only, while globex's
// cluster publishes more than acme may; the gauges follow.
func TestTenantObjectBoundsSpanItsClustersOnly(t *testing.T) {
	h := testHub(t, tenantHubWith("{maxObjects: 5, maxBytes: 100000}"))
	sink := watchAs(t, h, "globex-istiod", "g")
	mustApply(t, h, "east", push(t, vsColl, objects("shop", 3)...))
	err := h.Apply("west", push(t, vsColl, objects("cart", 4)...))
	rj := rejectionsOf(t, err)
	if status.Code(err) != codes.ResourceExhausted || len(rj) != 2 || !strings.Contains(rj[0].Reason, `tenant "acme"'s clusters hold 5 objects, all together: its maxObjects`) {
		t.Fatalf("west's 4 objects beside east's 3, acme's maxObjects 5: %v", err)
	}
	for _, r := range rj {
		mentionsAnother(t, r.Reason)
		if strings.Contains(r.Reason, "east") {
			t.Errorf("the refusal %q told to west names east", r.Reason)
		}
	}
	mustApply(t, h, "north", push(t, vsColl, objects("bank", 20)...))
	if got := countNames(sink.names(vsColl)); got != 20 {
		t.Errorf("globex's sink receives %d objects, want north's 20", got)
	}
	if a, g := tenantMetric(t, h, "meshfed_tenant_objects", "acme"), tenantMetric(t, h, "meshfed_tenant_objects", "globex"); a != 5 || g != 20 {
		t.Errorf("objects: acme %v, globex %v; want 5 and 20", a, g)
	}

	e, r := bigVS(t, "shop/o00", "2", 100000) // an edit: not a new object
	err = h.Apply("east", incremental(t, e, r))
	if rj := rejectionsOf(t, err); status.Code(err) != codes.ResourceExhausted || len(rj) != 1 || !strings.Contains(rj[0].Reason, "its maxBytes 100000 (tenantLimits)") {
		t.Fatalf("an object past acme's maxBytes: %v", err)
	}
	e, r = bigVS(t, "bank/big", "1", 100000)
	if err := h.Apply("north", incremental(t, e, r)); err != nil {
		t.Errorf("the same object from globex's cluster: %v", err)
	}
	if b := tenantMetric(t, h, "meshfed_tenant_bytes", "globex"); b < 100000 {
		t.Errorf("globex's bytes = %v, want its objects' size", b)
	}
}

// The collection budget (what a sink can receive in one push) is each tenant's: acme's
// objects filling it for acme's sinks do not make globex's refused, and acme's refusal
// names acme, not the tenants beside it.
func TestCollectionBudgetIsPerTenant(t *testing.T) {
	h := testHub(t, strings.Replace(tenantHub, "  ACME\n", "", 1)+"maxMessageSize: 8192\n")
	// acme's two clusters fill its bound, each its share.
	for cluster, names := range map[string][]string{"east": {"shop/a", "shop/b"}, "west": {"cart/a", "cart/b"}} {
		for _, name := range names {
			e, r := bigVS(t, name, "1", 1550)
			mustApply(t, h, cluster, incremental(t, e, r))
		}
	}
	e, r := bigVS(t, "bank/d", "1", 1600)
	if err := h.Apply("north", incremental(t, e, r)); err != nil {
		t.Fatalf("globex's first object, acme's collection full: %v", err)
	}
	e, r = bigVS(t, "cart/d", "1", 1600)
	err := h.Apply("west", incremental(t, e, r))
	rj := rejectionsOf(t, err)
	if len(rj) != 1 || !strings.Contains(rj[0].Reason, `cluster "west"'s objects in it would add up to`) || !strings.Contains(rj[0].Reason, "its share of the collection's bound") {
		t.Fatalf("acme's fifth object: %v", err)
	}
	mentionsAnother(t, rj[0].Reason)
}

// A reload that moves a cluster to another tenant moves what it holds: the tenant it left
// has room again, the one it joined counts it; a tenant removed leaves no series behind.
func TestReloadMovesAClusterBetweenTenants(t *testing.T) {
	const third = `- name: initech
  sinks: ["initech-*"]
  clusters:
  - {name: south, identities: [south], namespaces: [lab], hosts: ["*.lab.svc.cluster.local"]}
  routing: {rules: [{name: all, identities: ["*"]}]}
`
	h := testHub(t, tenantHubWith("{maxObjects: 5}")+third)
	mustApply(t, h, "east", push(t, vsColl, objects("shop", 3)...))
	mustApply(t, h, "west", push(t, vsColl, objects("cart", 2)...))
	mustApply(t, h, "north", push(t, vsColl, objects("bank", 1)...))
	mustApply(t, h, "south", push(t, vsColl, objects("lab", 1)...))
	if err := h.Apply("east", push(t, vsColl, objects("shop", 4)...)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("east's fourth object, acme full: %v", err)
	}
	if tenantMetric(t, h, "meshfed_tenant_objects", "initech") != 1 {
		t.Fatal("initech's objects are not counted")
	}

	// west moves to globex; initech goes.
	moved := strings.Replace(tenantHubWith("{maxObjects: 5}"),
		"  - {name: west, identities: [west], namespaces: [cart], hosts: [\"*.cart.svc.cluster.local\"]}\n", "", 1)
	moved = strings.Replace(moved, "  - {name: north,", "  - {name: west, identities: [west], namespaces: [cart], hosts: [\"*.cart.svc.cluster.local\"]}\n  - {name: north,", 1)
	reload(t, h, moved)
	if a, g := tenantMetric(t, h, "meshfed_tenant_objects", "acme"), tenantMetric(t, h, "meshfed_tenant_objects", "globex"); a != 3 || g != 3 {
		t.Errorf("after west moved: acme %v, globex %v objects; want 3 and 3", a, g)
	}
	mustApply(t, h, "east", push(t, vsColl, objects("shop", 5)...)) // acme has room for two more
	if err := h.Apply("east", push(t, vsColl, objects("shop", 6)...)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("east's sixth object: %v, want acme's maxObjects", err)
	}
	h.store.mu.Lock()
	for name, u := range h.store.usage {
		n := 0
		for _, d := range h.store.clusters {
			if d.usage.Load() == u {
				n += d.objects
			}
		}
		if n != u.objects {
			t.Errorf("tenant %q counts %d objects, its clusters hold %d", name, u.objects, n)
		}
	}
	if u := h.store.usage["initech"]; u != nil {
		t.Errorf("the removed tenant's usage is kept: %+v", u)
	}
	h.store.mu.Unlock()
	if n := tenantSeries(t, h, "initech"); n != 0 {
		t.Errorf("the removed tenant still has %d series", n)
	}
}

// Writers of the store take turns by tenant: with the write path busy and acme's writers
// queued, globex's write is the second one applied, not the last.
func TestStoreWritesTakeTurnsByTenant(t *testing.T) {
	h := testHub(t, strings.Replace(tenantHub, "  ACME\n", "", 1))
	var mu sync.Mutex
	var order []string
	h.store.changed = func(cluster, _ string, _ []*mcp.Entry, _ []string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, cluster)
	}
	g := h.store.gate
	g.enter("test") // the write path is busy
	var wg sync.WaitGroup
	write := func(cluster, name string) {
		c := push(t, vsColl, name)
		c.Incremental = true
		want := g.waiting() + 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.Apply(cluster, c); err != nil {
				t.Error(err)
			}
		}()
		testwait.For(t, 10*time.Second, "the write queued", func() bool { return g.waiting() == want })
	}
	for i := range 6 {
		write("east", fmt.Sprintf("shop/o%d", i))
	}
	write("north", "bank/a")
	g.leave()
	wg.Wait()
	if got := strings.Join(order, ","); got != "east,north,east,east,east,east,east" {
		t.Errorf("writes applied in the order %s, want globex's second", got)
	}
}

// runnableConfig is yaml's configuration on loopback, ready at once, its peers bounded by
// their tenants' limits and not their own, its state in stateDir.
func runnableConfig(t *testing.T, yaml, stateDir string) *Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ingest, cfg.Serve, cfg.WarmUp, cfg.StateDir = "127.0.0.1:0", "127.0.0.1:0", Duration{Duration: time.Millisecond}, stateDir
	cfg.Limits.StreamsPerSecond, cfg.Limits.StreamBurst = 1e6, 1e6
	return cfg
}

// runTenantHub runs yaml's hub (runnableConfig) until the test ends, once it is ready.
func runTenantHub(t *testing.T, yaml string) (h *Hub, ingest, serve string) {
	t.Helper()
	h, err := New(runnableConfig(t, yaml, t.TempDir()), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub", h.Run)
	testwait.For(t, 10*time.Second, "the hub ready", func() bool {
		ingest, serve, _ = h.Addrs()
		return ingest != "" && serve != "" && h.Ready()
	})
	return h, ingest, serve
}

// openAs opens a ResourceSource stream on cc as identity (development mode takes it on
// trust), subscribes, and returns once the hub has admitted or refused it: nil and a stop
// function, or the refusal.
func openAs(t *testing.T, h *Hub, cc *grpc.ClientConn, identity, tenant string) (stop func(), err error) {
	t.Helper()
	before := h.store.load.open(tenant)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), DevIdentityHeader, identity))
	st, err := mcppb.NewResourceSourceClient(cc).EstablishResourceStream(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := st.Send(&mcppb.RequestResources{Collection: vsColl}); err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, err // on io.EOF the stream has ended: Recv says why
	}
	refused := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				refused <- err
				return
			}
		}
	}()
	deadline := time.After(10 * time.Second)
	for {
		if h.store.load.open(tenant) > before {
			return func() { cancel(); <-refused }, nil
		}
		select {
		case err := <-refused:
			cancel()
			return nil, err
		case <-deadline:
			cancel()
			<-refused
			t.Fatalf("%s's stream neither admitted nor refused", identity)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A tenant's peers share its maxStreams across the hub's listeners: a minion's relay on
// ingest and a sink on serve fill acme's two, and acme's next sink is refused with
// ResourceExhausted, counted as tenant_too_many_streams for acme; globex's sinks and a
// stranger (no tenant's) are admitted. A reload raising acme's bound admits the next.
func TestTenantMaxStreamsSpansListeners(t *testing.T) {
	h, ingest, serve := runTenantHub(t, tenantHubWith("{maxStreams: 2}"))
	dialTo := func(addr string) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	in, out := dialTo(ingest), dialTo(serve)
	var stops []func()
	t.Cleanup(func() {
		for _, s := range stops {
			s()
		}
	})
	hold := func(cc *grpc.ClientConn, identity, tenant string) {
		t.Helper()
		stop, err := openAs(t, h, cc, identity, tenant)
		if err != nil {
			t.Fatalf("%s: %v", identity, err)
		}
		stops = append(stops, stop)
	}
	hold(in, "east", "acme") // east's relay
	hold(out, "acme-istiod-1", "acme")
	_, err := openAs(t, h, out, "acme-istiod-2", "acme")
	if s := status.Convert(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), `tenant "acme": 2 open, at most 2`) {
		t.Fatalf("acme's third stream: %v, want ResourceExhausted naming acme's bound", err)
	}
	if n := promtest.Sum(t, h.Registry(), "meshfed_tenant_streams_rejected_total", map[string]string{"tenant": "acme", "reason": "tenant_too_many_streams"}); n != 1 {
		t.Errorf("acme's refusals = %v, want 1", n)
	}
	if n := rejected(t, h, "tenant_too_many_streams"); n != 1 {
		t.Errorf("meshfed_mcp_streams_rejected_total{reason=tenant_too_many_streams} = %v, want 1", n)
	}
	hold(out, "globex-istiod-1", "globex")
	hold(out, "globex-istiod-2", "globex")
	hold(out, "stranger", noTenant)
	for tenant, want := range map[string]float64{"acme": 2, "globex": 2, noTenant: 1} {
		if n := tenantMetric(t, h, "meshfed_tenant_streams", tenant); n != want {
			t.Errorf("meshfed_tenant_streams{tenant=%q} = %v, want %v", tenant, n, want)
		}
	}

	if _, err := h.Reload(runnableConfig(t, tenantHubWith("{maxStreams: 3}"), h.cfg.StateDir)); err != nil {
		t.Fatal(err)
	}
	hold(out, "acme-istiod-2", "acme")
}

// A tenant's peers opening streams faster than its rate, all together, are refused
// (tenant_rate_limited) though each peer opens one; another tenant's are not.
func TestTenantStreamRateSpansItsPeers(t *testing.T) {
	h, _, serve := runTenantHub(t, tenantHubWith("{streamsPerSecond: 0.001, streamBurst: 2}"))
	cc, err := grpc.NewClient(serve, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	var stops []func()
	t.Cleanup(func() {
		for _, s := range stops {
			s()
		}
	})
	for i := range 2 {
		stop, err := openAs(t, h, cc, fmt.Sprintf("acme-%d", i), "acme")
		if err != nil {
			t.Fatalf("acme's stream %d: %v", i, err)
		}
		stops = append(stops, stop)
	}
	_, err = openAs(t, h, cc, "acme-2", "acme")
	if s := status.Convert(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), `peers of tenant "acme": at most 0.001 per second, burst 2`) {
		t.Fatalf("acme's third new stream: %v, want ResourceExhausted naming acme's rate", err)
	}
	for i := range 3 {
		stop, err := openAs(t, h, cc, fmt.Sprintf("globex-%d", i), "globex")
		if err != nil {
			t.Fatalf("globex's stream %d: %v", i, err)
		}
		stops = append(stops, stop)
	}
	if n := promtest.Sum(t, h.Registry(), "meshfed_tenant_streams_rejected_total", map[string]string{"tenant": "acme", "reason": "tenant_rate_limited"}); n != 1 {
		t.Errorf("acme's refusals = %v, want 1", n)
	}
}
