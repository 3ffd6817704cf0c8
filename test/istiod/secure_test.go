package istiod

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/hubproc"
	"github.com/meshfed/meshfed/internal/testkit/istiodtest"
	"github.com/meshfed/meshfed/internal/testkit/kubetest"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

const td = "mesh.test"

// vsFile is a VirtualService file istiod accepts (it drops one without routes).
func vsFile(t testing.TB, dir, name, ns, host string) {
	t.Helper()
	y := vsObject(name, ns, host)
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ns+"-"+name+".yaml")); err != nil {
		t.Fatal(err)
	}
}

// vsObject is a VirtualService object istiod accepts, as a manifest.
func vsObject(name, ns, host string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: %s, namespace: %s}
spec:
  hosts: [%s]
  http: [{route: [{destination: {host: %s}}]}]
`, name, ns, host, host)
}

// freeAddr is a loopback address that was free a moment ago: the relay must come back on
// the address istiod was given.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startHubProcess runs the hub as a process (meshfed-hub), so a test can kill it with
// SIGKILL, on a state directory in dir that stays the same across restarts.
func startHubProcess(t testing.TB, cfg *hub.Config, dir string) *hubproc.Hub {
	t.Helper()
	cfg.HTTP = "127.0.0.1:0"
	cfg.StateDir = filepath.Join(dir, "hub-state")
	return hubproc.Start(t, cfg, dir, testlog.Writer(t, "hub: "))
}

// getJSON decodes a GET of url into v.
func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

var vsGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}

// secureWorld is a hub (a process) with mutual TLS to two minions, no insecure anywhere:
// east's minion reads files and runs a relay (server TLS, a state file), west's reads a real
// kube-apiserver with the deployed RBAC. Its istiods connect through the relay or at the
// hub's serveUnauthenticated listener, over TLS mode SIMPLE.
type secureWorld struct {
	env        *kubetest.Env
	hub        *hubproc.Hub
	bundle     string
	files      func(prefix string, names ...string) meshtls.Files
	east       string // east's directory
	relayAddr  string
	eastMinion *minion.Minion
	minionCfg  func(cluster, source string, relay bool) *minion.Config
	startMin   func(mc *minion.Config) (*minion.Minion, *minion.Telemetry, func())
	stopEast   func()
}

// startSecureWorld runs it with routing rules, once the hub is ready and east's relay whole.
func startSecureWorld(t testing.TB, rules []routing.Rule) *secureWorld {
	t.Helper()
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	w := &secureWorld{}
	var minionSA kubetest.Identity
	w.env, minionSA = kubetest.StartForMinion(t, root)
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "mesh-ca")
	w.bundle = filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, w.bundle, ca)
	w.files = func(prefix string, names ...string) meshtls.Files {
		c, k, _ := ca.Issue(t, dir, prefix, names...)
		return meshtls.Files{Cert: c, Key: k, CA: w.bundle}
	}

	cfg := hub.Defaults()
	cfg.Ingest, cfg.Serve, cfg.HTTP, cfg.ServeUnauthenticated = "127.0.0.1:0", "127.0.0.1:0", "", "127.0.0.1:0"
	cfg.TLS = &meshtls.Config{Files: w.files("hub", "127.0.0.1", "spiffe://"+td+"/hub/h1")}
	cfg.TrustDomain = td
	cfg.Clusters = []hub.ClusterConfig{{Name: "east", Namespaces: []string{"shop"}, Hosts: []string{"*"}}, {Name: "west", Namespaces: []string{"pay"}, Hosts: []string{"*"}}}
	cfg.Routing = routing.Config{Rules: rules}
	cfg.WarmUp = hub.Duration{Duration: time.Hour}
	w.hub = startHubProcess(t, cfg, dir)
	ingest := w.hub.Addr(t, "ingest", 30*time.Second)

	w.east = t.TempDir()
	vsFile(t, w.east, "cart", "shop", "cart.shop.example.com")
	vsFile(t, w.east, "hijack", "pay", "hijack.pay.example.com") // not east's namespace: refused
	w.env.CreateNamespace("pay")
	w.env.Apply(vsObject("api", "pay", "api.pay.example.com"))
	w.relayAddr = freeAddr(t)
	state := filepath.Join(t.TempDir(), "relay.db")
	relayTLS := w.files("relay", "127.0.0.1")
	w.minionCfg = func(cluster, source string, relay bool) *minion.Config {
		mc := minion.Defaults()
		mc.Cluster, mc.HTTP = cluster, ""
		mc.Sources = []minion.SourceConfig{{URL: source}}
		mc.Collections = []string{vsColl}
		mc.TLS = &meshtls.Config{Files: w.files("minion-"+cluster, hub.ClusterIdentity(td, cluster))}
		mc.Destinations.Push = []string{"push://" + ingest}
		mc.Destinations.Backoff = ops.Backoff{Initial: ops.D(20 * time.Millisecond), Max: ops.D(300 * time.Millisecond)}
		if relay {
			mc.Relay = &minion.RelayConfig{Listen: w.relayAddr, TLS: &relayTLS, StateFile: state}
		}
		return mc
	}
	w.startMin = func(mc *minion.Config) (*minion.Minion, *minion.Telemetry, func()) {
		tel := minion.NewTelemetry()
		m, err := minion.New(mc, testlog.New(t).With("side", "minion-"+mc.Cluster), tel)
		if err != nil {
			t.Fatal(err)
		}
		return m, tel, testrun.Start(t, "minion Run", m.Run)
	}
	w.eastMinion, _, w.stopEast = w.startMin(w.minionCfg("east", "fs://"+w.east, true))
	w.startMin(w.minionCfg("west", "k8s://"+w.env.Kubeconfig(minionSA), false))
	testwait.For(t, 20*time.Second, "hub ready", w.hub.Ready)
	testwait.For(t, 20*time.Second, "east's relay whole", w.eastMinion.Relay().Ready)
	return w
}

// istiods starts an istiod behind east's relay and one at serveUnauthenticated, both ready.
func (w *secureWorld) istiods(t testing.TB) (relayed, direct *istiodtest.Istiod) {
	t.Helper()
	simple := &istiodtest.TLSSettings{CACertFile: w.bundle}
	relayed = istiodtest.Start(t, istiodtest.Options{Kubeconfig: w.env.Kubeconfig(w.env.Admin), ConfigSource: "xds://" + w.relayAddr, TLS: simple})
	direct = istiodtest.Start(t, istiodtest.Options{Kubeconfig: w.env.Kubeconfig(w.env.Admin), ConfigSource: "xds://" + w.hub.Addr(t, "serveUnauthenticated", 30*time.Second), TLS: simple})
	relayed.WaitReady(t, 3*time.Minute)
	direct.WaitReady(t, 3*time.Minute)
	return relayed, direct
}

// TestIstiodSecurePaths: mutual TLS between every minion and the hub, no insecure anywhere;
// east's minion reads files, west's a real kube-apiserver.
// One istiod follows east's relay (TLS mode SIMPLE to the relay's serving certificate) and
// gets what routing gives east; another is at the hub's serveUnauthenticated listener and
// gets what the unauthenticated rule gives it. Both follow an update and a deletion, never
// hold the object the ACL refused, and neither istiod's store changes when the hub's process
// is killed, nor the relayed one's when east's minion restarts while the hub is down.
func TestIstiodSecurePaths(t *testing.T) {
	w := startSecureWorld(t, []routing.Rule{
		{Name: "east-relay", Relays: true, Identities: []string{hub.ClusterIdentity(td, "east")}, Clusters: []string{"east"}},
		{Name: "direct-istiod", Unauthenticated: true, NodeIDs: []string{"*"}, Clusters: []string{"west"}},
	})
	relayed, direct := w.istiods(t)
	waitKeys := func(i *istiodtest.Istiod, what string, want ...string) istiodtest.Configz {
		t.Helper()
		var last istiodtest.Configz
		testwait.For(t, time.Minute, what, func() bool {
			c, err := i.FetchConfigz()
			if err != nil {
				return false
			}
			if _, ok := c.Get(vsType, "pay/hijack"); ok {
				t.Fatalf("istiod holds pay/hijack, which the hub refused")
			}
			last = c
			return fmt.Sprint(c.Keys(vsType)) == fmt.Sprint(want)
		})
		return last
	}
	waitKeys(relayed, "the relayed istiod holding east's subset", "shop/cart")
	// The hub lists the relayed istiod under east's relay, with its ACKs.
	testwait.For(t, 20*time.Second, "the hub listing the istiod behind east's relay", func() bool {
		var sinks []api.SinkStatus
		if err := getJSON("http://"+w.hub.Addr(t, "http", 30*time.Second)+"/api/sinks", &sinks); err != nil {
			return false
		}
		for _, s := range sinks {
			for _, d := range s.Downstream {
				if c := d.Collections[vsColl]; d.Protocol == "xds" && strings.HasPrefix(d.NodeID, "sidecar~") && c != nil && c.Acked > 0 {
					return true
				}
			}
		}
		return false
	})
	waitKeys(direct, "the direct istiod holding west's subset", "pay/api")

	// An update and a deletion reach the relayed istiod; a new object the direct one.
	vsFile(t, w.east, "basket", "shop", "basket.shop.example.com")
	waitKeys(relayed, "shop/basket relayed", "shop/basket", "shop/cart")
	if err := os.Remove(filepath.Join(w.east, "shop-cart.yaml")); err != nil {
		t.Fatal(err)
	}
	waitKeys(relayed, "shop/cart's deletion relayed", "shop/basket")
	w.env.Apply(vsObject("web", "pay", "web.pay.example.com"))
	waitKeys(direct, "pay/web served directly", "pay/api", "pay/web")
	if err := w.env.Dynamic().Resource(vsGVR).Namespace("pay").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitKeys(direct, "pay/web's deletion served directly", "pay/api")

	// The hub's process is killed (SIGKILL): neither istiod's store changes. Each is checked
	// once what could change it has happened: the direct istiod has lost its stream (its
	// store changes only with a response, which a dead hub cannot send), and the relay has
	// lost the hub and holds, version for version, what its istiod holds (it serves only that).
	before := waitKeys(relayed, "the relayed istiod settled", "shop/basket").Objects()
	beforeDirect := waitKeys(direct, "the direct istiod settled", "pay/api").Objects()
	directClosed := direct.SourceStreamsClosed()
	w.hub.Kill()
	sameStore := func(what string, i *istiodtest.Istiod, before map[string]map[string]string) {
		t.Helper()
		if got := i.Objects(t); !maps.EqualFunc(got, before, func(a, b map[string]string) bool { return maps.Equal(a, b) }) {
			t.Fatalf("%s: istiod's store changed: %v -> %v", what, before, got)
		}
	}
	testwait.For(t, time.Minute, "the direct istiod losing its stream to the hub", func() bool { return direct.SourceStreamsClosed() > directClosed })
	sameStore("the direct istiod, after the hub was killed", direct, beforeDirect)
	testwait.For(t, 20*time.Second, "east's relay losing the hub", func() bool { return !w.eastMinion.Relay().Status().HubConnected })
	relayHolds := map[string]string{}
	for _, e := range w.eastMinion.Relay().Cache().Entries(vsColl) {
		relayHolds[e.Name] = e.Version
	}
	if !maps.Equal(relayHolds, before[vsType]) {
		t.Fatalf("east's relay, after the hub was killed, holds %v; its istiod %v", relayHolds, before[vsType])
	}
	sameStore("the relayed istiod, after the hub was killed", relayed, before)

	// East's minion restarts while the hub is down: istiod reconnects to the relay, which
	// serves its kept state, and istiod's store, once it has taken (ACKed) that state, is
	// what it was.
	w.stopEast()
	restarted, tel, _ := w.startMin(w.minionCfg("east", "fs://"+w.east, true))
	testwait.For(t, 10*time.Second, "the restarted relay serving its kept state", func() bool { return restarted.Relay().Addr() != "" && restarted.Relay().Ready() })
	testwait.For(t, time.Minute, "istiod reconnected to the restarted relay", func() bool {
		return promtest.Sum(t, tel.Registry, "meshfed_mcp_streams_open", map[string]string{"role": "source", "transport": "server"}) >= 1
	})
	// The hub is down: the only ACKs this minion receives are istiod's, of its relay.
	testwait.For(t, time.Minute, "istiod ACKing the restarted relay's VirtualServices", func() bool {
		return promtest.Sum(t, tel.Registry, "meshfed_mcp_acks_total", map[string]string{"role": "source", "collection": vsColl}) >= 1
	})
	sameStore("the relayed istiod, after east's minion restarted", relayed, before)
}
