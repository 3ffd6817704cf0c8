package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/testkit/adstest"
	"github.com/meshfed/meshfed/routing"
)

// istiod's MCP-over-xDS client (pkg/adsc, as pilot/pkg/bootstrap starts it for an xds://
// config source) sends this node: sidecar~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local and
// its NodeMetadata as metadata.
const istiodNodeID = "sidecar~10.0.0.7~istiod-7d9f.istio-system~istio-system.svc.cluster.local"

const meshConfigTypeURL = "core/v1alpha1/MeshConfig"

// TestXDSSinkListedInSinksStatusAndWhy: istiod over MCP-over-xDS is a sink like an MCP one:
// /api/sinks lists it with its node, rules and per-type ACK/NACK state (the MeshConfig type,
// which resolves to no collection, by its type URL), `hub status` shows it with its
// protocol, `hub why` names it among the sinks that receive an object (and its NACK), and
// once it disconnects it is gone.
func TestXDSSinkListedInSinksStatusAndWhy(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, east, "shop/cart-dr.yaml", "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: cart\n  namespace: shop\nspec:\n  host: cart.shop.example.com\n")
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	cfg := twoClusterConfig()
	cfg.Routing.Rules = append([]routing.Rule{{Name: "istiod", NodeIDs: []string{"sidecar~*~istiod-*"}, Clusters: []string{"east"}}}, cfg.Routing.Rules...)
	h := runHub(t, cfg)
	ingest, serve, admin := h.Addrs()
	runMinion(t, "east", east, ingest)
	runMinion(t, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)
	mcpSink := runSink(t, serve, "", "global-mcp", false)
	waitFor(t, 10*time.Second, "mcp sink", func() bool { return mcpSink.view(vs) == "pay/api@west,shop/cart@east" })

	md, err := structpb.NewStruct(map[string]any{"GENERATOR": "api", "ISTIO_VERSION": "1.31.0", "ISTIO_REVISION": "default"})
	if err != nil {
		t.Fatal(err)
	}
	c := adstest.Dial(t, serve, nil, &corepb.Node{Id: istiodNodeID, Metadata: md})
	vsURL, drURL := "networking.istio.io/v1/VirtualService", "networking.istio.io/v1/DestinationRule"
	for _, url := range []string{meshConfigTypeURL, vsURL, drURL} {
		c.Subscribe(url)
	}
	for range 3 {
		r := c.Recv()
		if r.GetTypeUrl() == drURL { // istiod's store refuses it
			c.NACK(r, "DestinationRule shop/cart: bad subset")
		} else {
			c.ACK(r)
		}
	}

	var sinks []api.SinkStatus
	var xds *api.SinkStatus
	waitFor(t, 10*time.Second, "the xds sink's ACKs and NACK in /api/sinks", func() bool {
		sinks, xds = nil, nil
		getJSON(t, "http://"+admin+"/api/sinks", &sinks)
		for i := range sinks {
			if sinks[i].NodeID == istiodNodeID {
				xds = &sinks[i]
			}
		}
		if xds == nil {
			return false
		}
		v, d, m := xds.Collections[vs], xds.Collections[dr], xds.Collections[meshConfigTypeURL]
		return v != nil && !v.Pending && v.AckedVersion > 0 && d != nil && !d.Pending && d.LastNACK != "" && m != nil && !m.Pending
	})
	if len(sinks) != 2 {
		t.Errorf("/api/sinks = %+v, want the MCP sink and the xds sink", sinks)
	}
	if xds.Protocol != "xds" || xds.Transport != "server" || strings.Join(xds.Rules, ",") != "istiod" || xds.Annotations["GENERATOR"] != "api" {
		t.Errorf("xds sink = %+v, want protocol xds, transport server, rules [istiod], the node's metadata as annotations", *xds)
	}
	for _, s := range sinks {
		if s.NodeID == "global-mcp" && s.Protocol != "mcp" {
			t.Errorf("MCP sink = %+v, want protocol mcp", s)
		}
	}
	if v := xds.Collections[vs]; v.AckedVersion != v.PushedVersion || v.Resources != 1 || v.TypeURL != vsURL || v.LastNACK != "" {
		t.Errorf("xds sink's %s = %+v, want ACKed at the pushed version, 1 resource, type URL %s", vs, *v, vsURL)
	}
	if d := xds.Collections[dr]; d.LastNACK != "InvalidArgument: DestinationRule shop/cart: bad subset" || d.NACKedVersion != d.PushedVersion || d.AckedVersion != 0 {
		t.Errorf("xds sink's %s = %+v, want the NACK with its message at the pushed version", dr, *d)
	}
	if m := xds.Collections[meshConfigTypeURL]; m.TypeURL != meshConfigTypeURL || m.Resources != 0 || m.LastPush.IsZero() {
		t.Errorf("xds sink's MeshConfig = %+v, want it answered (empty) and ACKed", *m)
	}

	run := hubCLI(t, admin)
	sinkLine := "sink " + itoa(xds.Stream) + " over xds (-, node " + istiodNodeID + ", rules istiod): "
	if out := run("why", "vs", "shop/cart"); !strings.Contains(out, sinkLine+"up to date") || !strings.Contains(out, "over mcp (-, node global-mcp, rules all): up to date") {
		t.Errorf("hub why vs shop/cart does not name the xds sink as up to date (%q):\n%s", sinkLine, out)
	}
	if out := run("why", "DestinationRule", "shop/cart"); !strings.Contains(out, sinkLine+"refused the latest push (NACK InvalidArgument: DestinationRule shop/cart: bad subset)") {
		t.Errorf("hub why DestinationRule shop/cart does not name the xds sink's NACK:\n%s", out)
	}
	if out := run("why", "vs", "pay/api"); strings.Contains(out, istiodNodeID) {
		t.Errorf("hub why pay/api names the xds sink, whose rules do not give it:\n%s", out)
	}
	status := run("status", "-o", "wide") // with each sink's state per collection (over xDS, per type URL that resolves to none)
	for _, want := range []string{"PROTOCOL", istiodNodeID, "xds", "NACKED",
		`MeshConfig +\w+ +0 +0 `, `virtualservices +Synced +` + itoa(xds.Collections[vs].AckedVersion) + " +" + itoa(xds.Collections[vs].PushedVersion) + " ",
		`destinationrules +NACKed +0 +` + itoa(xds.Collections[dr].PushedVersion) + " "} {
		if !regexp.MustCompile(want).MatchString(status) {
			t.Errorf("hub status -o wide does not match %q:\n%s", want, status)
		}
	}

	// Disconnected, it is gone.
	c.Close()
	waitFor(t, 10*time.Second, "the xds sink gone from /api/sinks", func() bool {
		getJSON(t, "http://"+admin+"/api/sinks", &sinks)
		return len(sinks) == 1 && sinks[0].NodeID == "global-mcp"
	})
	if out := run("why", "vs", "shop/cart"); strings.Contains(out, istiodNodeID) {
		t.Errorf("hub why names the disconnected xds sink:\n%s", out)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// TestXDSSinkUnauthenticatedListedByItsRules: istiod on the serveUnauthenticated listener
// (server-only TLS, no client certificate) is listed, and named by `hub why`, with the rules
// that route it, the unauthenticated ones: /api/sinks and why ask who the sink is as the
// serving router does.
func TestXDSSinkUnauthenticatedListedByItsRules(t *testing.T) {
	h, simple := unauthenticatedHub(t, "sidecar~*~istiod-*", "sidecar~*")
	_, _, admin := h.Addrs()

	c := adstest.Dial(t, h.UnauthenticatedAddr(), simple, &corepb.Node{Id: istiodNodeID})
	c.Subscribe("networking.istio.io/v1/VirtualService")
	r := c.Recv()
	if len(r.GetResources()) != 1 {
		t.Fatalf("the unauthenticated xds sink got %d VirtualServices, want east's one", len(r.GetResources()))
	}
	c.ACK(r)
	var sinks []api.SinkStatus
	waitFor(t, 10*time.Second, "the xds sink's ACK in /api/sinks", func() bool {
		getJSON(t, "http://"+admin+"/api/sinks", &sinks)
		return len(sinks) == 1 && sinks[0].Collections[vs] != nil && sinks[0].Collections[vs].AckedVersion > 0
	})
	if s := sinks[0]; s.Protocol != "xds" || s.Identity != "" || !s.Unauthenticated || strings.Join(s.Rules, ",") != "istiod-east" {
		t.Errorf("/api/sinks lists %+v, want the xds sink unauthenticated, without identity, rules [istiod-east]", s)
	}
	run := hubCLI(t, admin)
	if out := run("why", "vs", "shop/cart"); !strings.Contains(out, "over xds (-, node "+istiodNodeID+", rules istiod-east): up to date") {
		t.Errorf("hub why vs shop/cart:\n%s", out)
	}
	if out := run("why", "vs", "pay/api"); strings.Contains(out, istiodNodeID) {
		t.Errorf("hub why pay/api names the xds sink, which does not receive it:\n%s", out)
	}
}
