package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
)

// istiod's config source client speaks TLS that verifies the server only (mode SIMPLE) and
// presents no client certificate. The hub's serveUnauthenticated listener admits such sinks,
// as an explicit choice: they have no identity, only rules marked unauthenticated select
// them (by the node id they claim), and the mutually authenticated listener still refuses
// them.
func TestServeUnauthenticated(t *testing.T) {
	h, simple := unauthenticatedHub(t, "istiod-east-*", "istiod-*")
	_, serve, _ := h.Addrs()
	open := h.UnauthenticatedAddr()

	subscribe := func(node string) *mcp.Sink {
		sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs}, Node: &mcppb.SinkNode{Id: node}, FullStateOnly: true,
			Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error { return nil }), Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		pullOnce(t, open, simple, sink)
		return sink
	}
	eastSink, westSink := subscribe("istiod-east-1"), subscribe("istiod-west-1")
	waitFor(t, 10*time.Second, "istiod-east-1 holding east's VirtualService only", func() bool {
		v := eastSink.Versions(vs)
		return len(v) == 1 && v["shop/cart"] != ""
	})
	waitFor(t, 10*time.Second, "istiod-west-1 answered, with nothing", westSink.Synced)
	if v := westSink.Versions(vs); len(v) != 0 {
		t.Errorf("istiod-west-1, selected by no unauthenticated rule, holds %v", v)
	}

	// The mutually authenticated listener still wants a certificate. The client may see the
	// refusal as a TLS alert or as the connection closing; the hub says why.
	if err := openStream(t, serve, simple, true); err == nil {
		t.Error("server-only TLS on the serve listener: admitted, want a refused handshake")
	}
	waitFor(t, 10*time.Second, "the hub counting a handshake without a certificate", func() bool {
		return promtest.Sum(t, h.Registry(), "meshfed_hub_tls_rejections_total", map[string]string{"reason": "no_certificate"}) >= 1
	})
}

// unauthenticatedHub runs a hub with mutual TLS (a new PKI) and a serveUnauthenticated
// listener, routing by rule istiod-east (unauthenticated: sinks whose node id matches
// eastNodes get cluster east), rule any-istiod (node ids anyNodes, not for unauthenticated
// sinks) and a default rule everything (nor this), fed as tlsEastWest does. It returns the
// hub, ready, and client credentials that verify the server only and present no
// certificate, as istiod's tlsSettings {mode: SIMPLE, caCertificates}.
func unauthenticatedHub(t *testing.T, eastNodes, anyNodes string) (*hub.Hub, credentials.TransportCredentials) {
	t.Helper()
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.ServeUnauthenticated = "127.0.0.1:0"
	cfg.Routing = routing.Config{
		Rules: []routing.Rule{
			{Name: "istiod-east", Unauthenticated: true, NodeIDs: []string{eastNodes}, Clusters: []string{"east"}},
			{Name: "any-istiod", NodeIDs: []string{anyNodes}}, // not for unauthenticated sinks
		},
		Default: &routing.Rule{Name: "everything"}, // nor this
	}
	h := tlsEastWest(t, p, cfg)
	pem, err := os.ReadFile(p.bundle)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return h, credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
}

// tlsEastWest runs a hub with cfg (p.hubConfig's, changed as the test needs) and minions east
// (VirtualService shop/cart) and west (pay/api) publishing to it over mutual TLS, and
// returns it once it is ready.
func tlsEastWest(t *testing.T, p *pki, cfg *hub.Config) *hub.Hub {
	t.Helper()
	h := runHub(t, cfg)
	ingest, _, _ := h.Addrs()
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)
	return h
}
