package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub"
	admincli "github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/adstest"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	vs = "istio/networking/v1alpha3/virtualservices"
	dr = "istio/networking/v1alpha3/destinationrules"
)

// logger writes to t.Log until the test ends.
func logger(t testing.TB) *slog.Logger { return testlog.New(t) }

// waitFor polls cond for up to d (testwait.For).
var waitFor = testwait.For

func writeFile(t testing.TB, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
}

func vsYAML(name, ns, created string, hosts ...string) string {
	ts := ""
	if created != "" {
		ts = "\n  creationTimestamp: " + created
	}
	return fmt.Sprintf("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: %s\n  namespace: %s%s\nspec:\n  hosts: [%s]\n",
		name, ns, ts, strings.Join(hosts, ", "))
}

// hubCLI returns a function that runs the hub command `hub ARGS[0] -admin admin ARGS[1:]...`
// (package hub/admin) and returns its output, failing t if it fails.
func hubCLI(t *testing.T, admin string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := admincli.Run(context.Background(), append(args[:1:1], append([]string{"-admin", admin}, args[1:]...)...), &out); err != nil {
			t.Fatalf("hub %v: %v", args, err)
		}
		return out.String()
	}
}

// runHub starts a hub on loopback with cfg (ports chosen by the OS).
func runHub(t *testing.T, cfg *hub.Config) *hub.Hub {
	t.Helper()
	cfg.Ingest, cfg.Serve, cfg.HTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	if cfg.StateDir == hub.Defaults().StateDir {
		cfg.StateDir = t.TempDir() // the clusters' state file: one hub per directory
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(cfg, logger(t).With("side", "hub"), hub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub Run", h.Run)
	waitFor(t, 10*time.Second, "hub listening", func() bool { _, s, a := h.Addrs(); return s != "" && a != "" })
	return h
}

// minionConfig is a minion configuration for cluster: source (an fs:// or k8s:// URL)
// pushed to the hub at push (unless empty), with fast redials.
func minionConfig(cluster, source, push string) *minion.Config {
	cfg := minion.Defaults()
	cfg.Cluster, cfg.Sources, cfg.Collections, cfg.Insecure, cfg.HTTP = cluster, []minion.SourceConfig{{URL: source}}, []string{vs, dr}, true, ""
	cfg.Destinations.Backoff = ops.Backoff{Initial: ops.D(20 * time.Millisecond), Max: ops.D(300 * time.Millisecond)}
	if push != "" {
		cfg.Destinations.Push = []string{"push://" + push}
	}
	return cfg
}

// startMinion runs a minion with cfg until stop is called or the test ends.
func startMinion(t *testing.T, cfg *minion.Config) (m *minion.Minion, stop func()) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := minion.New(cfg, logger(t).With("side", "minion-"+cfg.Cluster), minion.NewTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	return m, testrun.Start(t, "minion Run", m.Run)
}

// runMinion runs a development-mode minion for cluster publishing root to the hub, until
// stop is called or the test ends.
func runMinion(t *testing.T, cluster, root, hubAddr string) (m *minion.Minion, stop func()) {
	t.Helper()
	return startMinion(t, minionConfig(cluster, "fs://"+root, hubAddr))
}

// sinkClient is a real MCP sink pulling from the hub's ResourceSource; it keeps the state
// it applied and every removal it saw.
type sinkClient struct {
	mu      sync.Mutex
	state   map[string]map[string]*mcpapi.Resource
	removed []string
	pushes  int
}

func (s *sinkClient) Apply(_ context.Context, c *mcp.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pushes++
	old := s.state[c.Collection]
	if old == nil || !c.Incremental {
		next := map[string]*mcpapi.Resource{}
		if c.Incremental {
			for k, v := range old {
				next[k] = v
			}
		}
		for n := range old {
			found := false
			for _, r := range c.Resources {
				found = found || r.GetMetadata().GetName() == n
			}
			if !found && !c.Incremental {
				s.removed = append(s.removed, c.Collection+" "+n)
			}
		}
		s.state[c.Collection] = next
	}
	for _, n := range c.Removed {
		delete(s.state[c.Collection], n)
		s.removed = append(s.removed, c.Collection+" "+n)
	}
	for _, r := range c.Resources {
		s.state[c.Collection][r.GetMetadata().GetName()] = r
	}
	return nil
}

// view renders the state as "name@origin" per collection, sorted.
func (s *sinkClient) view(collection string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n, r := range s.state[collection] {
		out = append(out, n+"@"+r.GetMetadata().GetAnnotations()[api.OriginAnnotation])
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// got reports whether the sink has had a push of collection.
func (s *sinkClient) got(collection string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[collection] != nil
}

func (s *sinkClient) removals() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.removed...)
}

// runSink subscribes to the hub as node with identity (development mode header) and keeps
// redialling until the test ends (a hub warming up refuses streams with Unavailable).
func runSink(t *testing.T, serveAddr, identity, node string, incremental bool) *sinkClient {
	t.Helper()
	sc := &sinkClient{state: map[string]map[string]*mcpapi.Resource{}}
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Applier: sc, Node: &mcppb.SinkNode{Id: node},
		FullStateOnly: !incremental, Logger: logger(t).With("side", "sink", "node", node)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(serveAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			sctx := metadata.AppendToOutgoingContext(ctx, hub.DevIdentityHeader, identity)
			_ = sink.PullFrom(sctx, conn)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
	return sc
}

// pullOnce runs one stream of sink from addr over creds until the test ends (no redial:
// a test that counts streams sees each one).
func pullOnce(t *testing.T, addr string, creds credentials.TransportCredentials, sink *mcp.Sink) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sink.PullFrom(ctx, conn) }()
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
}

// federate runs a hub of twoClusterConfig with the minions of east and west publishing
// those directories, and waits until it is ready.
func federate(t *testing.T, east, west string) *hub.Hub {
	t.Helper()
	h := runHub(t, twoClusterConfig())
	ingest, _, _ := h.Addrs()
	runMinion(t, "east", east, ingest)
	runMinion(t, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)
	return h
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v: %s", url, err, b)
	}
}

func twoClusterConfig() *hub.Config {
	cfg := hub.Defaults()
	cfg.Insecure = true
	cfg.Clusters = []hub.ClusterConfig{
		{Name: "east", Identities: []string{"east"}, Namespaces: []string{"shop", "shared"}, Hosts: []string{"*.shop.example.com", "*.shared.example.com"}},
		{Name: "west", Identities: []string{"west"}, Namespaces: []string{"pay", "shared"}, Hosts: []string{"*.pay.example.com", "*.shared.example.com"}},
	}
	cfg.SharedNamespaces = []string{"shared"}
	cfg.Collections = []string{vs, dr}
	cfg.WarmUp = hub.Duration{Duration: time.Minute}
	cfg.Routing.Rules = []routing.Rule{
		{Name: "east-only", NodeIDs: []string{"east-istiod"}, Clusters: []string{"east"}},
		{Name: "all", NodeIDs: []string{"global-*"}},
	}
	return cfg
}

func TestHubFederatesTwoClusters(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, east, "pay/steal.yaml", vsYAML("steal", "pay", "", "api.pay.example.com"))                              // namespace not owned
	writeFile(t, east, "shop/hijack.yaml", vsYAML("hijack", "shop", "", "api.pay.example.com"))                          // host not owned
	writeFile(t, east, "shared/common.yaml", vsYAML("common", "shared", "2024-01-02T00:00:00Z", "c.shared.example.com")) // newer
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	writeFile(t, west, "shared/common.yaml", vsYAML("common", "shared", "2024-01-01T00:00:00Z", "c.shared.example.com")) // older: wins

	h := runHub(t, twoClusterConfig())
	ingest, serve, admin := h.Addrs()

	// Until every configured cluster has synced, sinks are refused rather than served a
	// partial state.
	conn, err := grpc.NewClient(serve, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := mcppb.NewResourceSourceClient(conn).EstablishResourceStream(context.Background())
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "warming up") {
		t.Fatalf("a sink before the warm-up: %v, want Unavailable (warming up)", err)
	}

	eastSink := runSink(t, serve, "", "east-istiod", false)
	globalSink := runSink(t, serve, "", "global-istiod", true)
	_, _ = runMinion(t, "east", east, ingest)
	_, stopWest := runMinion(t, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	waitFor(t, 10*time.Second, "global view", func() bool {
		return globalSink.view(vs) == "pay/api@west,shared/common@west,shop/cart@east"
	})
	waitFor(t, 10*time.Second, "east-only view", func() bool { return eastSink.view(vs) == "shop/cart@east" })
	if got := globalSink.view(dr); got != "" {
		t.Errorf("destinationrules = %q, want empty (answered with an empty state)", got)
	}

	// Rejections: in the API, and back at the minion as NACK detail.
	var clusters []api.ClusterStatus
	getJSON(t, "http://"+admin+"/api/clusters", &clusters)
	rej := clusters[0].Rejections[vs]
	if clusters[0].Name != "east" || !strings.Contains(rej["pay/steal"], `namespace "pay" is not owned by cluster "east"`) ||
		!strings.Contains(rej["shop/hijack"], `host "api.pay.example.com" is not owned by cluster "east"`) || len(rej) != 2 {
		t.Errorf("east's rejections = %v", rej)
	}
	if got := clusters[0].Conflicts[vs]["shared/common"]; got != "west" {
		t.Errorf("east's lost conflicts = %v", clusters[0].Conflicts)
	}
	var conflicts []api.Conflict
	getJSON(t, "http://"+admin+"/api/conflicts", &conflicts)
	if len(conflicts) != 1 || conflicts[0].Winner != "west" || conflicts[0].Losers[0] != "east" || conflicts[0].Why != "older create_time" {
		t.Errorf("conflicts = %+v", conflicts)
	}
	if got := metric(t, h, "meshfed_hub_conflicts"); got != 1 {
		t.Errorf("conflicts gauge = %v", got)
	}
	var owners api.Owners
	getJSON(t, "http://"+admin+"/api/owners?host=x.pay.example.com", &owners)
	if strings.Join(owners.Clusters, ",") != "west" {
		t.Errorf("owners of x.pay.example.com = %v", owners.Clusters)
	}
	var sinks []api.SinkStatus
	waitFor(t, 10*time.Second, "sinks ACKed", func() bool {
		getJSON(t, "http://"+admin+"/api/sinks", &sinks)
		acked := 0
		for _, s := range sinks {
			if c := s.Collections[vs]; c != nil && c.AckedVersion > 0 && c.AckedVersion == c.PushedVersion && !c.Pending {
				acked++
			}
		}
		return len(sinks) == 2 && acked == 2
	})
	for _, s := range sinks {
		if want := map[string]string{"east-istiod": "east-only", "global-istiod": "all"}[s.NodeID]; strings.Join(s.Rules, ",") != want || s.Transport != "server" {
			t.Errorf("sink %+v: rules %v, want %s", s, s.Rules, want)
		}
	}
	var dry api.DryRun
	getJSON(t, "http://"+admin+"/api/dryrun?node=east-istiod", &dry)
	if strings.Join(dry.Rules, ",") != "east-only" || len(dry.Resources[vs]) != 1 || dry.Resources[vs]["shop/cart"] == "" {
		t.Errorf("dry run = %+v", dry)
	}

	// A dry run of a candidate configuration: the diff for a sink it would route elsewhere.
	cand := twoClusterConfig()
	cand.Routing.Rules[0].Clusters = []string{"west"}
	body, err := json.Marshal(cand)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+admin+"/api/dryrun?node=east-istiod", "application/yaml", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var cd api.DryRun
	if err := json.Unmarshal(raw, &cd); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if !cd.Candidate || strings.Join(cd.Added[vs], ",") != "pay/api,shared/common" || strings.Join(cd.Removed[vs], ",") != "shop/cart" {
		t.Errorf("candidate dry run = %s", raw)
	}
	resp, err = http.Post("http://"+admin+"/api/dryrun?node=x", "application/yaml", strings.NewReader("clusters: []"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "candidate configuration:") {
		t.Errorf("invalid candidate: %d %s", resp.StatusCode, raw)
	}

	// The operator's commands.
	run := hubCLI(t, admin)
	if out := run("status"); !strings.Contains(out, "east ") || !strings.Contains(out, "west ") || !strings.Contains(out, "east-only") {
		t.Errorf("hub status:\n%s", out)
	}
	if out := run("why", vs, "shared/common"); !strings.Contains(out, "served from cluster west") || !strings.Contains(out, "also published by east") ||
		!strings.Contains(out, "rules all): up to date") {
		t.Errorf("hub why shared/common:\n%s", out)
	}
	if out := run("why", vs, "shop/hijack"); !strings.Contains(out, "not served") || !strings.Contains(out, `refused from cluster east: host "api.pay.example.com" is not owned`) {
		t.Errorf("hub why shop/hijack:\n%s", out)
	}
	if out := run("whatif", "-node", "east-istiod"); !strings.Contains(out, "rules [east-only]") || !regexp.MustCompile(regexp.QuoteMeta(vs)+` +1\n`).MatchString(out) {
		t.Errorf("hub whatif:\n%s", out)
	}
	var whyJSON api.Why
	if err := json.Unmarshal([]byte(run("why", "-o", "json", vs, "pay/api")), &whyJSON); err != nil || whyJSON.Served == nil || whyJSON.Served.Cluster != "west" {
		t.Errorf("hub why -o json: %+v %v", whyJSON, err)
	}

	// The winner goes away: the held loser is served, with its own origin.
	writeFile(t, west, "shared/common.yaml", "")
	waitFor(t, 10*time.Second, "loser promoted", func() bool {
		return globalSink.view(vs) == "pay/api@west,shared/common@east,shop/cart@east"
	})

	// A cluster disconnecting keeps its resources served (staleness: keep).
	stopWest()
	waitFor(t, 10*time.Second, "west disconnected", func() bool {
		getJSON(t, "http://"+admin+"/api/clusters", &clusters)
		return !clusters[1].Connected
	})
	// A change from east after the disconnect: once the sink has it, it has every push the
	// disconnect could have caused (pushes of a collection are ordered).
	writeFile(t, east, "shop/after.yaml", vsYAML("after", "shop", "", "after.shop.example.com"))
	waitFor(t, 10*time.Second, "east's change after west left", func() bool {
		return strings.Contains(globalSink.view(vs), "shop/after@east")
	})
	if got := globalSink.view(vs); got != "pay/api@west,shared/common@east,shop/after@east,shop/cart@east" {
		t.Fatalf("after west disconnected the sink holds %q", got)
	}
	for _, r := range globalSink.removals() {
		if strings.HasSuffix(r, "pay/api") {
			t.Fatalf("the sink saw a removal of a disconnected cluster's resource: %v", globalSink.removals())
		}
	}
	// West comes back with a change: it resumes (unchanged resources are not re-sent).
	writeFile(t, west, "pay/more.yaml", vsYAML("more", "pay", "", "more.pay.example.com"))
	runMinion(t, "west", west, ingest)
	waitFor(t, 10*time.Second, "west's change", func() bool {
		return globalSink.view(vs) == "pay/api@west,pay/more@west,shared/common@east,shop/after@east,shop/cart@east"
	})
}

func TestHubDropsStaleClustersAfterTTL(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	cfg := twoClusterConfig()
	cfg.Staleness = hub.StalenessConfig{Collections: map[string]string{vs: "1s"}}
	h := runHub(t, cfg)
	ingest, serve, _ := h.Addrs()
	sink := runSink(t, serve, "", "global-x", false)
	runMinion(t, "east", east, ingest)
	_, stopWest := runMinion(t, "west", west, ingest)
	waitFor(t, 20*time.Second, "both", func() bool { return sink.view(vs) == "pay/api@west,shop/cart@east" })
	stopWest()
	waitFor(t, 10*time.Second, "west dropped after its TTL", func() bool { return sink.view(vs) == "shop/cart@east" })
}

func TestHubRefusesUnknownClusters(t *testing.T) {
	h := runHub(t, twoClusterConfig())
	ingest, _, _ := h.Addrs()
	conn, err := grpc.NewClient(ingest, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), hub.DevIdentityHeader, "north")
	st, err := mcppb.NewResourceSinkClient(conn).EstablishResourceStream(ctx)
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `"north" is not a configured cluster`) {
		t.Fatalf("unknown cluster: %v", err)
	}
}

// TestHubServesMCPOverXDS: an istiod-like ADS client gets the same subset as an MCP sink
// with the same node id, with origin annotations, and an empty MeshConfig.
func TestHubServesMCPOverXDS(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	h := federate(t, east, west)
	_, serve, _ := h.Addrs()
	mcpSink := runSink(t, serve, "", "east-istiod", false)
	waitFor(t, 10*time.Second, "mcp sink", func() bool { return mcpSink.view(vs) == "shop/cart@east" })

	c := adstest.Dial(t, serve, nil, &corepb.Node{Id: "east-istiod"})
	for _, url := range []string{"networking.istio.io/v1/VirtualService", "core/v1alpha1/MeshConfig"} {
		c.Subscribe(url)
	}
	got := map[string]string{}
	for range 2 {
		r := c.Recv()
		var names []string
		for _, res := range adstest.Resources(t, r) {
			names = append(names, res.GetMetadata().GetName()+"@"+res.GetMetadata().GetAnnotations()[api.OriginAnnotation])
		}
		got[r.GetTypeUrl()] = strings.Join(names, ",")
		c.ACK(r)
	}
	if got["networking.istio.io/v1/VirtualService"] != "shop/cart@east" || got["core/v1alpha1/MeshConfig"] != "" || len(got) != 2 {
		t.Fatalf("xds client got %v, want the MCP sink's subset", got)
	}
	// A change reaches both.
	writeFile(t, east, "shop/more.yaml", vsYAML("more", "shop", "", "more.shop.example.com"))
	r := c.Recv()
	if len(r.GetResources()) != 2 || r.GetTypeUrl() != "networking.istio.io/v1/VirtualService" {
		t.Fatalf("after a change the xds client got %d resources of %s", len(r.GetResources()), r.GetTypeUrl())
	}
	waitFor(t, 10*time.Second, "mcp sink", func() bool { return mcpSink.view(vs) == "shop/cart@east,shop/more@east" })
}

// TestHubPollsAndDialsOut: the hub dials a minion that only listens (poll) and a sink that
// only listens (dialSinks), and the sink receives the polled cluster's resources.
func TestHubPollsAndDialsOut(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))

	eastAddr := listeningMinion(t, "east", east)
	sc, sinkAddr := listeningSink(t, mcp.Hooks{})

	cfg := twoClusterConfig()
	cfg.Poll = []hub.PollCluster{{Cluster: "east", Addr: eastAddr}}
	cfg.DialSinks = []hub.DialSink{{Name: "listener", Addr: sinkAddr, NodeID: "global-dialed"}}
	cfg.Backoff = ops.Backoff{Initial: ops.D(20 * time.Millisecond), Max: ops.D(200 * time.Millisecond)}
	h := runHub(t, cfg)
	ingest, _, _ := h.Addrs()
	runMinion(t, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready (east polled, west pushed)", h.Ready)
	waitFor(t, 10*time.Second, "the listening sink's view", func() bool { return sc.view(vs) == "pay/api@west,shop/cart@east" })
	writeFile(t, east, "shop/more.yaml", vsYAML("more", "shop", "", "more.shop.example.com"))
	waitFor(t, 10*time.Second, "a polled change reaches the dialed sink", func() bool {
		return sc.view(vs) == "pay/api@west,shop/cart@east,shop/more@east"
	})
}

// listeningMinion runs a minion for cluster publishing dir that only listens (for a hub
// that polls) and returns its address.
func listeningMinion(t *testing.T, cluster, dir string) string {
	t.Helper()
	cfg := minionConfig(cluster, "fs://"+dir, "")
	cfg.Destinations.Listen = "127.0.0.1:0"
	m, _ := startMinion(t, cfg)
	waitFor(t, 10*time.Second, cluster+"'s minion listening", func() bool { return m.ListenAddr() != "" })
	return m.ListenAddr()
}

// listeningSink runs a sink that only listens (serves ResourceSink, for a hub that dials
// it), with hooks on its streams, until the test ends.
func listeningSink(t *testing.T, hooks mcp.Hooks) (*sinkClient, string) {
	t.Helper()
	sc := &sinkClient{state: map[string]map[string]*mcpapi.Resource{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(mcp.ServerOptions()...)
	mcp.NewSinkServer(func(context.Context, *mcp.StreamInfo) (*mcp.Sink, error) {
		return mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Applier: sc, Logger: logger(t).With("side", "listening-sink"), Hooks: hooks})
	}, mcp.ServerConfig{Logger: logger(t)}).Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return sc, lis.Addr().String()
}

// TestHubReload: routing, ownership and restart-only changes applied to a running hub with
// real minions and sinks.
func TestHubReload(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, east, "shop/hijack.yaml", vsYAML("hijack", "shop", "", "api.pay.example.com"))
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	cfg := twoClusterConfig()
	h := runHub(t, cfg)
	ingest, serve, _ := h.Addrs()
	eastSink := runSink(t, serve, "", "east-istiod", false)
	globalSink := runSink(t, serve, "", "global-istiod", true)
	runMinion(t, "east", east, ingest)
	runMinion(t, "west", west, ingest)
	waitFor(t, 20*time.Second, "converged", func() bool {
		return globalSink.view(vs) == "pay/api@west,shop/cart@east" && eastSink.view(vs) == "shop/cart@east" &&
			globalSink.got(dr) && eastSink.got(dr) // the (empty) other collection's push too, before counting pushes
	})
	next := func(mut func(c *hub.Config)) *hub.Config {
		c := twoClusterConfig()
		c.Ingest, c.Serve, c.HTTP, c.StateDir = cfg.Ingest, cfg.Serve, cfg.HTTP, cfg.StateDir
		mut(c)
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	pushes := func(s *sinkClient) int { s.mu.Lock(); defer s.mu.Unlock(); return s.pushes }

	// A rule keeps its name and changes what it gives: its view is recomputed in place; the
	// other sinks get nothing, and no stream is closed.
	before := pushes(globalSink)
	res, err := h.Reload(next(func(c *hub.Config) { c.Routing.Rules[0].Clusters = []string{"west"} }))
	if err != nil || res.ClosedSinks != 0 || res.ClosedIngest != 0 || res.Refused != 0 {
		t.Fatalf("routing reload: %+v, %v", res, err)
	}
	waitFor(t, 10*time.Second, "east-istiod's view recomputed", func() bool { return eastSink.view(vs) == "pay/api@west" })
	if got := pushes(globalSink) - before; got != 0 {
		t.Errorf("an unaffected sink got %d pushes", got)
	}

	// Ownership widened: east may now claim api.pay.example.com; its stream is closed, the
	// minion resumes and resends what was refused.
	res, err = h.Reload(next(func(c *hub.Config) {
		c.Routing.Rules[0].Clusters = []string{"west"}
		c.Clusters[0].Hosts = append(c.Clusters[0].Hosts, "api.pay.example.com")
	}))
	if err != nil || res.ClosedIngest == 0 {
		t.Fatalf("ownership reload: %+v, %v", res, err)
	}
	waitFor(t, 10*time.Second, "the refused resource resent and served", func() bool {
		return globalSink.view(vs) == "pay/api@west,shop/cart@east,shop/hijack@east"
	})

	// Ownership narrowed: west loses namespace pay; what it stored there is no longer served.
	res, err = h.Reload(next(func(c *hub.Config) {
		c.Routing.Rules[0].Clusters = []string{"west"}
		c.Clusters[0].Hosts = append(c.Clusters[0].Hosts, "api.pay.example.com")
		c.Clusters[1].Namespaces = []string{"shared"}
	}))
	if err != nil || res.Refused != 1 {
		t.Fatalf("narrowing reload: %+v, %v", res, err)
	}
	waitFor(t, 10*time.Second, "west's pay/api withdrawn", func() bool {
		return globalSink.view(vs) == "shop/cart@east,shop/hijack@east" && eastSink.view(vs) == ""
	})

	// A rule renamed: the sinks it selects are routed to a new view (their streams are
	// closed, they reconnect and converge).
	res, err = h.Reload(next(func(c *hub.Config) {
		c.Routing.Rules[0].Clusters = []string{"west"}
		c.Routing.Rules[1].Name = "everything"
		c.Clusters[0].Hosts = append(c.Clusters[0].Hosts, "api.pay.example.com")
		c.Clusters[1].Namespaces = []string{"shared"}
	}))
	if err != nil || res.ClosedSinks != 1 {
		t.Fatalf("rename reload: %+v, %v", res, err)
	}
	var sinks []api.SinkStatus
	_, _, admin := h.Addrs()
	waitFor(t, 10*time.Second, "the renamed rule's sink back", func() bool {
		getJSON(t, "http://"+admin+"/api/sinks", &sinks)
		for _, s := range sinks {
			if s.NodeID == "global-istiod" && strings.Join(s.Rules, ",") == "everything" {
				return globalSink.view(vs) == "shop/cart@east,shop/hijack@east"
			}
		}
		return false
	})

	// Fields that shape listeners need a restart: the change is refused whole.
	if _, err := h.Reload(next(func(c *hub.Config) { c.Serve = "127.0.0.1:1" })); err == nil || !strings.Contains(err.Error(), "serve: changing it needs a restart") {
		t.Fatalf("restart-only change: %v", err)
	}
}

// metric returns the value of a hub gauge or counter without labels.
func metric(t *testing.T, h *hub.Hub, name string) float64 {
	t.Helper()
	mfs, err := h.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return -1
}

// A cluster removed by a reload is no longer listed by the admin API or `hub status`, and
// the warm-up no longer waits for it.
func TestClusterRemovedByReload(t *testing.T) {
	cfg := twoClusterConfig()
	cfg.WarmUp = hub.Duration{Duration: time.Hour}
	h := runHub(t, cfg)
	ingest, _, admin := h.Addrs()
	east := t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	runMinion(t, "east", east, ingest)
	waitFor(t, 10*time.Second, "east synced", func() bool {
		var cl []api.ClusterStatus
		getJSON(t, "http://"+admin+"/api/clusters", &cl)
		return cl[0].Synced
	})
	if h.Ready() {
		t.Fatal("ready before west synced")
	}
	next := twoClusterConfig()
	next.Ingest, next.Serve, next.HTTP, next.WarmUp, next.StateDir = cfg.Ingest, cfg.Serve, cfg.HTTP, cfg.WarmUp, cfg.StateDir
	next.Clusters = next.Clusters[:1]
	if _, err := h.Reload(next); err != nil {
		t.Fatal(err)
	}
	var cl []api.ClusterStatus
	getJSON(t, "http://"+admin+"/api/clusters", &cl)
	if len(cl) != 1 || cl[0].Name != "east" {
		t.Errorf("/api/clusters after west was removed: %+v", cl)
	}
	if out := hubCLI(t, admin)("status"); strings.Contains(out, "west") {
		t.Errorf("hub status lists the removed cluster:\n%s", out)
	}
	if !h.Ready() {
		t.Error("the warm-up still waits for the removed cluster")
	}
}

// `hub why` says that a sink refused (NACKed) the served version, with its reason, and why
// a held copy is held: which cluster's copy is served, with the values compared.
func TestWhyExplainsNACKsAndHeldCopies(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shared/common.yaml", vsYAML("common", "shared", "2024-01-02T00:00:00Z", "c.shared.example.com"))
	writeFile(t, west, "shared/common.yaml", vsYAML("common", "shared", "2024-01-01T00:00:00Z", "c.shared.example.com"))
	h := federate(t, east, west)
	_, serve, admin := h.Addrs()

	refusing := mcp.ApplierFunc(func(_ context.Context, c *mcp.Change) error {
		if c.Collection == vs {
			return status.Error(codes.InvalidArgument, "host c.shared.example.com is not allowed here")
		}
		return nil
	})
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Applier: refusing, Logger: logger(t), Node: &mcppb.SinkNode{Id: "global-refuser"}})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, serve, insecure.NewCredentials(), sink)

	var why api.Why
	waitFor(t, 10*time.Second, "the sink's NACK", func() bool {
		getJSON(t, "http://"+admin+"/api/why?collection="+vs+"&name=shared/common", &why)
		return len(why.Sinks) == 1 && why.Sinks[0].NACK != ""
	})
	out := hubCLI(t, admin)("why", vs, "shared/common")
	for _, want := range []string{
		"served from cluster west",
		`also published by east (version east/`,
		`held: cluster "west"'s copy is served: its create_time 2024-01-01T00:00:00Z is older than "east"'s 2024-01-02T00:00:00Z`,
		"rules all): refused the latest push (NACK InvalidArgument: host c.shared.example.com is not allowed here)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("hub why does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not yet acknowledged") {
		t.Errorf("a sink that NACKed reads as not yet acknowledged:\n%s", out)
	}
}
