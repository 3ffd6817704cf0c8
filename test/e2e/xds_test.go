package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	admincli "github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/hub/api"
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

	conn, err := grpc.NewClient(serve, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := structpb.NewStruct(map[string]any{"GENERATOR": "api", "ISTIO_VERSION": "1.31.0", "ISTIO_REVISION": "default"})
	if err != nil {
		t.Fatal(err)
	}
	node := &corepb.Node{Id: istiodNodeID, Metadata: md}
	vsURL, drURL := "networking.istio.io/v1/VirtualService", "networking.istio.io/v1/DestinationRule"
	for _, url := range []string{meshConfigTypeURL, vsURL, drURL} {
		if err := st.Send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: url}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		req := &discoverypb.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}
		if r.GetTypeUrl() == drURL { // istiod's store refuses it
			req.VersionInfo, req.ErrorDetail = "", &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "DestinationRule shop/cart: bad subset"}
		}
		if err := st.Send(req); err != nil {
			t.Fatal(err)
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

	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := admincli.Run(context.Background(), append(args[:1:1], append([]string{"-admin", admin}, args[1:]...)...), &out); err != nil {
			t.Fatalf("hub %v: %v", args, err)
		}
		return out.String()
	}
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
	status := run("status")
	for _, want := range []string{"PROTOCOL", istiodNodeID, "xds", "MeshConfig 0/0", "virtualservices " + itoa(xds.Collections[vs].AckedVersion) + "/" + itoa(xds.Collections[vs].PushedVersion), "destinationrules 0/" + itoa(xds.Collections[dr].PushedVersion) + " NACK"} {
		if !strings.Contains(status, want) {
			t.Errorf("hub status lacks %q:\n%s", want, status)
		}
	}

	// Disconnected, it is gone.
	cancel()
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
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.ServeUnauthenticated = "127.0.0.1:0"
	cfg.Routing = routing.Config{
		Rules: []routing.Rule{
			{Name: "istiod-east", Unauthenticated: true, NodeIDs: []string{"sidecar~*~istiod-*"}, Clusters: []string{"east"}},
			{Name: "any-istiod", NodeIDs: []string{"sidecar~*"}}, // not for unauthenticated sinks
		},
		Default: &routing.Rule{Name: "everything"}, // nor this
	}
	h := runHub(t, cfg)
	ingest, _, admin := h.Addrs()
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	pem, err := os.ReadFile(p.bundle)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	conn, err := grpc.NewClient(h.UnauthenticatedAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: istiodNodeID}, TypeUrl: "networking.istio.io/v1/VirtualService"}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetResources()) != 1 {
		t.Fatalf("the unauthenticated xds sink got %d VirtualServices, want east's one", len(r.GetResources()))
	}
	if err := st.Send(&discoverypb.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}); err != nil {
		t.Fatal(err)
	}
	var sinks []api.SinkStatus
	waitFor(t, 10*time.Second, "the xds sink's ACK in /api/sinks", func() bool {
		getJSON(t, "http://"+admin+"/api/sinks", &sinks)
		return len(sinks) == 1 && sinks[0].Collections[vs] != nil && sinks[0].Collections[vs].AckedVersion > 0
	})
	if s := sinks[0]; s.Protocol != "xds" || s.Identity != "" || strings.Join(s.Rules, ",") != "istiod-east" {
		t.Errorf("/api/sinks lists %+v, want the xds sink without identity, rules [istiod-east]", s)
	}
	var out bytes.Buffer
	if err := admincli.Run(context.Background(), []string{"why", "-admin", admin, "vs", "shop/cart"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "over xds (-, node "+istiodNodeID+", rules istiod-east): up to date") {
		t.Errorf("hub why vs shop/cart:\n%s", out.String())
	}
	out.Reset()
	if err := admincli.Run(context.Background(), []string{"why", "-admin", admin, "vs", "pay/api"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), istiodNodeID) {
		t.Errorf("hub why pay/api names the xds sink, which does not receive it:\n%s", out.String())
	}
}
