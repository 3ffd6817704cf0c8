package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
)

// A minion's relay subscribes on the ingest listener it already pushes to, with its
// cluster's identity, and receives what routing gives that identity (here: east gets west's
// objects, as an export); the ingest listener's ResourceSource admits only clusters (and a
// replica layer's peers).
func TestRelaySubscribesOnIngest(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Routing = routing.Config{Rules: []routing.Rule{
		{Name: "east-gets-west", Identities: []string{hub.ClusterIdentity(td, "east")}, Clusters: []string{"west"}},
	}}
	h := runHub(t, cfg)
	ingest, _, _ := h.Addrs()
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	relay, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs}, Node: &mcppb.SinkNode{Id: "meshfed-relay/east"},
		Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error { return nil }), Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, ingest, p.creds(t, "relay-east", hub.ClusterIdentity(td, "east")), relay)
	waitFor(t, 10*time.Second, "east's relay holding west's VirtualService only", func() bool {
		v := relay.Versions(vs)
		return len(v) == 1 && v["pay/api"] != ""
	})

	// A sink's identity is no relay.
	err = openStream(t, ingest, p.creds(t, "sink-x", hub.SinkIdentity(td, "x")), true)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not a cluster identity") {
		t.Errorf("a sink subscribing on ingest: %v, want PermissionDenied naming the identity kind", err)
	}
}
