package minion

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

var fastBackoff = ops.Backoff{Initial: ops.D(10 * time.Millisecond), Max: ops.D(200 * time.Millisecond)}

// testConfig is a plaintext configuration of cluster with sources, publishing to the
// given push addresses with fast redials.
func testConfig(cluster string, sources []SourceConfig, push ...string) *Config {
	c := Defaults()
	c.Cluster, c.Sources, c.Collections, c.Insecure, c.HTTP = cluster, sources, []string{vsColl, drColl}, true, ""
	c.Destinations = DestinationsConfig{Push: push, Backoff: fastBackoff}
	return c
}

// fsConfig publishes root's files to the given push addresses.
func fsConfig(root string, push ...string) *Config {
	return testConfig("east", []SourceConfig{{URL: "fs://" + root}}, push...)
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestMinionPushFailoverReconnectResume(t *testing.T) {
	root := t.TempDir()
	write(t, root, "shop/a.yaml", vsDoc("a", "", "a.shop"))
	write(t, root, "shop/b.yaml", vsDoc("b", "", "b.shop"))
	write(t, root, "shop/dr.yaml", "apiVersion: networking.istio.io/v1alpha3\nkind: DestinationRule\nmetadata: {name: d}\nspec: {host: d}\n")
	hub := startHubSim(t, vsColl, drColl)
	dead := deadAddr(t)
	// The first address is down: the minion moves on to the next one.
	m := runMinion(t, fsConfig(root, "push://"+dead+","+hub.Addr))
	waitFor(t, 10*time.Second, "initial push", func() bool { return hub.names(vsColl) == "shop/a,shop/b" && hub.names(drColl) == "shop/d" })
	waitFor(t, 5*time.Second, "connected gauge", func() bool {
		return promtest.Sum(t, m.reg, "meshfed_minion_destination_connected", map[string]string{"destination": hub.Addr}) == 1
	})
	if got := promtest.Sum(t, m.reg, "meshfed_minion_destination_connects_total", map[string]string{"destination": dead, "result": "failed"}); got < 1 {
		t.Errorf("failed attempts to the dead address = %v", got)
	}
	bVersion := hub.get(vsColl, "shop/b").GetMetadata().GetVersion()

	// The hub goes away; changes made meanwhile accumulate and go out on reconnect.
	hub.Stop()
	waitFor(t, 5*time.Second, "disconnected gauge", func() bool {
		return promtest.Sum(t, m.reg, "meshfed_minion_destination_connected", map[string]string{"destination": hub.Addr}) == 0
	})
	streams := hub.streamCount()
	n := hub.pushes()
	write(t, root, "shop/a.yaml", vsDoc("a", "", "a2.shop"))
	write(t, root, "shop/c.yaml", vsDoc("c", "", "c.shop"))
	waitFor(t, 5*time.Second, "minion saw the edits", func() bool { return len(published(m.Cache(), vsColl)) == 3 })
	write(t, root, "shop/a.yaml", vsDoc("a", "", "a3.shop")) // the newest state wins
	waitFor(t, 5*time.Second, "minion saw the last edit", func() bool {
		return m.Cache().Get(vsColl, "shop/a") != nil && strings.Contains(string(m.Cache().Get(vsColl, "shop/a").Encoded), "a3.shop")
	})
	hub.Restart(t)
	waitFor(t, 10*time.Second, "resumed push", func() bool {
		return hub.names(vsColl) == "shop/a,shop/b,shop/c" && hostsOf(t, hub, "shop/a") == "a3.shop"
	})
	if hub.streamCount() <= streams {
		t.Fatal("no new stream")
	}
	// Resume: the hub declared what it holds, so only what differs was sent.
	for _, c := range hub.changesSince(n) {
		for _, e := range c.Entries {
			if e.Name == "shop/b" || e.Name == "shop/d" {
				t.Errorf("unchanged %s resent after reconnect (change: incremental=%v, %d entries)", e.Name, c.Incremental, len(c.Entries))
			}
		}
	}
	if got := hub.get(vsColl, "shop/b").GetMetadata().GetVersion(); got != bVersion {
		t.Errorf("shop/b version changed across the reconnect: %s -> %s", bVersion, got)
	}
}

// upstreamSource serves an mcp.Cache as a ResourceSource on 127.0.0.1:0.
func upstreamSource(t *testing.T, cache *mcp.Cache) string {
	t.Helper()
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: cache, Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(mcp.ServerOptions()...)
	mcp.NewSourceServer(src, mcp.ServerConfig{Logger: testLog(t)}).Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

func vsEntry(t testing.TB, name, version, host string) *mcp.Entry {
	t.Helper()
	b, err := anypb.New(&networking.VirtualService{Hosts: []string{host}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := mcp.NewEntry(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: version}, Body: b})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestMinionForwardsAnUpstreamMCPSource(t *testing.T) {
	up := mcp.NewCache(vsColl, drColl)
	up.Put(vsColl, vsEntry(t, "ns/one", "1", "one"), vsEntry(t, "ns/two", "1", "two"))
	addr := upstreamSource(t, up)
	hub := startHubSim(t, vsColl, drColl)
	m := runMinion(t, testConfig("edge", []SourceConfig{{URL: "mcp://" + addr}}, "push://"+hub.Addr))
	waitFor(t, 10*time.Second, "forwarded", func() bool { return hub.names(vsColl) == "ns/one,ns/two" })
	if !m.Ready() {
		t.Error("not ready after the upstream synced")
	}
	// Forwarding keeps the upstream's resources byte for byte (name, version, body).
	if got := hub.get(vsColl, "ns/one").GetMetadata().GetVersion(); got != "1" {
		t.Errorf("forwarded version = %q", got)
	}
	up.Update(vsColl, []*mcp.Entry{vsEntry(t, "ns/one", "2", "one2"), vsEntry(t, "ns/three", "1", "three")}, []string{"ns/two"})
	waitFor(t, 10*time.Second, "forwarded update", func() bool {
		return hub.names(vsColl) == "ns/one,ns/three" && hostsOf(t, hub, "ns/one") == "one2"
	})
}

func TestMinionServesAPollingHub(t *testing.T) {
	root := t.TempDir()
	write(t, root, "ns/a.yaml", vsDoc("a", "", "a"))
	cfg := fsConfig(root)
	cfg.Destinations.Listen = "127.0.0.1:0"
	m := runMinion(t, cfg)
	waitFor(t, 10*time.Second, "listener", func() bool { return m.ListenAddr() != "" })

	var mu sync.Mutex
	got := map[string]bool{}
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vsColl, drColl}, Logger: testLog(t),
		Applier: mcp.ApplierFunc(func(_ context.Context, c *mcp.Change) error {
			mu.Lock()
			defer mu.Unlock()
			if c.Collection == vsColl && !c.Incremental {
				got = map[string]bool{}
			}
			for _, e := range c.Entries {
				got[e.Name] = true
			}
			for _, n := range c.Removed {
				delete(got, n)
			}
			return nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(m.ListenAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sink.PullFrom(ctx, conn) }()
	defer func() { cancel(); <-done }()
	has := func(names ...string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(got) != len(names) {
				return false
			}
			for _, n := range names {
				if !got[n] {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 10*time.Second, "polled state", has("ns/a"))
	write(t, root, "ns/b.yaml", vsDoc("b", "", "b"))
	waitFor(t, 10*time.Second, "polled change", has("ns/a", "ns/b"))
}

func TestRunWithReload(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	write(t, dir1, "ns/one.yaml", vsDoc("one", "", "one"))
	write(t, dir2, "ns/two.yaml", vsDoc("two", "", "two"))
	hub := startHubSim(t, vsColl, drColl)
	cfgDir := t.TempDir()
	path := filepath.Join(cfgDir, "minion.yaml")
	conf := func(dir string) string {
		return "cluster: east\nsources: [{url: 'fs://" + dir + "'}]\ncollections: [" + vsColl + ", " + drColl + "]\n" +
			"destinations: {push: ['push://" + hub.Addr + "'], backoff: {initial: 10ms, max: 200ms}}\nhttp: ''\ninsecure: true\n"
	}
	write(t, cfgDir, "minion.yaml", conf(dir1))
	tel := NewTelemetry()
	testrun.Start(t, "RunWithReload", func(ctx context.Context) error { return RunWithReload(ctx, path, testLog(t), tel) })
	waitFor(t, 10*time.Second, "first config", func() bool { return hub.names(vsColl) == "ns/one" })

	// An invalid file is refused and the running configuration keeps publishing.
	write(t, cfgDir, "minion.yaml", conf(dir1)+"surprise: true\n")
	waitFor(t, 10*time.Second, "refusal", func() bool {
		return promtest.Sum(t, tel.Registry, "meshfed_minion_config_reloads_total", map[string]string{"result": "refused"}) == 1
	})
	write(t, dir1, "ns/more.yaml", vsDoc("more", "", "more"))
	waitFor(t, 10*time.Second, "still running", func() bool { return hub.names(vsColl) == "ns/more,ns/one" })

	// A valid change applies without a restart of the process.
	write(t, cfgDir, "minion.yaml", conf(dir2))
	waitFor(t, 10*time.Second, "second config", func() bool { return hub.names(vsColl) == "ns/two" })
	if got := promtest.Sum(t, tel.Registry, "meshfed_minion_config_reloads_total", map[string]string{"result": "applied"}); got != 1 {
		t.Errorf("applied reloads = %v", got)
	}
}

func TestRunWithReloadRefusesABadFirstConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "minion.yaml")
	if err := os.WriteFile(path, []byte("sources: [{url: 'ftp://x'}]\ndestinations: {push: ['push://h:1']}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := RunWithReload(context.Background(), path, testLog(t), NewTelemetry())
	if err == nil || !strings.Contains(err.Error(), "sources[0].url") || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want it to name the file and the field", err)
	}
}

func TestHTTPEndpoints(t *testing.T) {
	root := t.TempDir()
	write(t, root, "ns/a.yaml", vsDoc("a", "", "a"))
	write(t, root, "ns/broken.yaml", "kind: [\n")
	cfg := fsConfig(root, "push://"+deadAddr(t))
	// A second source that never syncs: an upstream nobody serves.
	cfg.Sources = append(cfg.Sources, SourceConfig{URL: "mcp://" + deadAddr(t)})
	cfg.HTTP = "127.0.0.1:0"
	m := runMinion(t, cfg)
	waitFor(t, 10*time.Second, "http", func() bool { return m.HTTPAddr() != "" })
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + m.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get("/"); code != 200 || !strings.Contains(body, "/status") || !strings.Contains(body, "dashboard is the hub's") {
		t.Errorf("/ = %d %q: want what the minion serves, and where the dashboard is", code, body)
	}
	if code, _ := get("/nothing"); code != http.StatusNotFound {
		t.Errorf("/nothing = %d, want 404", code)
	}
	// The files sync at once, the upstream never: once the files have (on a loaded machine
	// that takes a moment), /readyz names only the upstream.
	var code int
	var body string
	waitFor(t, 10*time.Second, "the file source synced", func() bool {
		code, body = get("/readyz")
		return !strings.Contains(body, "fs://")
	})
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "mcp://") {
		t.Errorf("/readyz = %d %q, want 503 naming only the unsynced upstream", code, body)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{`meshfed_minion_objects{collection="` + vsColl + `",source="fs://`, "meshfed_minion_source_problems", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, _ := get("/debug/pprof/"); code != 200 {
		t.Errorf("/debug/pprof/ = %d", code)
	}
	_, st := get("/status")
	var status Status
	if err := json.Unmarshal([]byte(st), &status); err != nil {
		t.Fatalf("/status: %v: %s", err, st)
	}
	if status.Ready || status.Objects[vsColl] != 1 || len(status.Sources) != 2 || len(status.Sources[0].Problems) != 1 ||
		!strings.HasPrefix(status.Sources[0].Problems[0].Where, "ns/broken.yaml:") {
		t.Errorf("/status = %s", st)
	}
}

func TestMinionMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "mesh-ca")
	bundle := filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, bundle, ca)
	hc, hk, _ := ca.Issue(t, dir, "hub", "127.0.0.1")
	hubTLS, err := meshtls.NewSource(meshtls.Files{Cert: hc, Key: hk, CA: bundle}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	hub := startHubSimWith(t, credentials.NewTLS(hubTLS.ServerConfig()), vsColl, drColl)

	root := t.TempDir()
	write(t, root, "ns/a.yaml", vsDoc("a", "", "a"))
	mc, mk, _ := ca.Issue(t, dir, "minion-east", "minion.east")
	cfg := fsConfig(root, "push://"+hub.Addr)
	cfg.TLS, cfg.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: mc, Key: mk, CA: bundle}}, false
	runMinion(t, cfg)
	waitFor(t, 10*time.Second, "push over mutual TLS", func() bool { return hub.names(vsColl) == "ns/a" })
	if p := hub.peerNames(); len(p) == 0 || p[0] != "minion-east" {
		t.Fatalf("hub saw client certificates %v", p)
	}

	// A minion whose certificate comes from another CA never gets a stream.
	other := tlstest.NewCA(t, "other-ca")
	oc, ok, _ := other.Issue(t, dir, "intruder", "intruder")
	bad := fsConfig(root, "push://"+hub.Addr)
	bad.TLS, bad.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: oc, Key: ok, CA: bundle}}, false
	m := runMinion(t, bad)
	waitFor(t, 10*time.Second, "failed attempts", func() bool {
		return promtest.Sum(t, m.reg, "meshfed_minion_destination_connects_total", map[string]string{"destination": hub.Addr, "result": "failed"}) >= 2
	})
	if p := hub.peerNames(); len(p) != 1 {
		t.Fatalf("hub admitted streams from %v", p)
	}

	// Bad TLS files are a configuration error naming the file.
	broken := fsConfig(root, "push://"+hub.Addr)
	broken.TLS, broken.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: mc, Key: filepath.Join(dir, "missing.key"), CA: bundle}}, false
	if _, err := New(broken, testLog(t), NewTelemetry()); err == nil || !strings.Contains(err.Error(), "missing.key") {
		t.Fatalf("New with a missing key: %v", err)
	}
}
