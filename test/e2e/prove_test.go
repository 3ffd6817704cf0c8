package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
)

// Routing only on what is proven, over real gRPC and mutual TLS. Under a trust domain, rule
// shop gives every sink identity east's three VirtualServices, pay-team gives pay-* sinks that
// say team=pay west's three, and prod-west gives sinks named prod-* (node ids are the names in
// their certificates) west's three. A sink claiming the annotation and a node id its
// certificate does not carry gets its three, not six; the sinks whose identities the rules
// name get six, a pay sink not claiming the team three (the claim narrows). The findings'
// configuration, a rule granting by the annotation alone, is refused at load.
func TestClaimsOnlyNarrowWhatIdentitiesGet(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Routing = routing.Config{Rules: []routing.Rule{
		{Name: "shop", Identities: []string{hub.SinkIdentity(td, "*")}, Clusters: []string{"east"}},
		{Name: "pay-team", Identities: []string{hub.SinkIdentity(td, "pay-*")}, Annotations: map[string]string{"team": "pay"}, Clusters: []string{"west"}},
		{Name: "prod-west", NodeIDs: []string{"prod-*"}, Clusters: []string{"west"}},
	}}

	// What the finding ran: the annotation alone granted west's objects.
	claimed := *cfg
	claimed.Routing = routing.Config{Rules: []routing.Rule{cfg.Routing.Rules[0], {Name: "pay-team", Annotations: map[string]string{"team": "pay"}, Clusters: []string{"west"}}}}
	if _, err := hub.New(&claimed, logger(t), hub.Options{}); err == nil || !strings.Contains(err.Error(), "routing.rules[1].annotations: annotations are what the sink claims") {
		t.Fatalf("a rule granting by an annotation alone: %v, want it refused naming routing.rules[1].annotations", err)
	}

	h := runHub(t, cfg)
	ingest, serve, admin := h.Addrs()
	east, west := t.TempDir(), t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, east, "shop/"+n+".yaml", vsYAML(n, "shop", "", n+".shop.example.com"))
		writeFile(t, west, "pay/"+n+".yaml", vsYAML(n, "pay", "", n+".pay.example.com"))
	}
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	team := map[string]string{"team": "pay"}
	for _, tc := range []struct {
		cert, node  string
		annotations map[string]string
		want        int
		rules       string
	}{
		{"shop-1", "prod-1", team, 3, "shop"}, // claims what prod-west and pay-team select: neither is its identity's
		{"pay-1", "", team, 6, "pay-team,shop"},
		{"pay-2", "", nil, 3, "shop"}, // its identity, without the claim pay-team narrows by
		{"prod-1", "someone-else", nil, 6, "prod-west,shop"},
	} {
		t.Run(tc.cert, func(t *testing.T) {
			sink := subscribeAs(t, serve, p, tc.cert, &mcppb.SinkNode{Id: tc.node, Annotations: tc.annotations})
			if got := len(sink.Versions(vs)); got != tc.want {
				t.Errorf("%s (node %q, annotations %v) received %d VirtualServices %v, want %d", tc.cert, tc.node, tc.annotations, got, slices.Sorted(maps.Keys(sink.Versions(vs))), tc.want)
			}
			if rules := sinkRules(t, admin, hub.SinkIdentity(td, tc.cert)); rules != tc.rules {
				t.Errorf("/api/sinks: %s has rules [%s], want [%s]", tc.cert, rules, tc.rules)
			}
		})
	}
}

// With mutual TLS and no trust domain, nothing tells a sink's certificate from a minion's:
// a configuration that would serve either by a pattern, a default or a claimed node id is
// refused at load, naming the field. What is accepted names every sink by its exact identity;
// then a minion's certificate subscribing on the serve listener, and a sink claiming the node
// id of a named one, get nothing, and the named sink gets what its rule gives.
func TestTLSWithoutTrustDomain(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.TrustDomain = ""
	cfg.Clusters[0].Identities = []string{hub.ClusterIdentity(td, "east")}
	cfg.Clusters[1].Identities = []string{hub.ClusterIdentity(td, "west")}

	for _, tc := range []struct {
		name    string
		routing routing.Config
		want    string
	}{
		// The findings: a sink claiming node id prod-1 got west's objects, and so did a
		// minion's certificate (no trust domain: nothing refused it on the serve listener).
		{"a rule on claimed node ids", routing.Config{Rules: []routing.Rule{{Name: "prod", NodeIDs: []string{"prod-*"}, Clusters: []string{"west"}}}},
			"routing.rules[0].nodeIds: a SinkNode id is what the sink claims here"},
		{"a default", routing.Config{Default: &routing.Rule{Name: "everything"}},
			"trustDomain: required with tls unless every sink is named by its exact identity"},
		{"a rule naming no identity", routing.Config{Rules: []routing.Rule{{Name: "west", Clusters: []string{"west"}}}},
			`routing.rules[0] ("west") names no identities`},
		{"an identity pattern", routing.Config{Rules: []routing.Rule{{Name: "sinks", Identities: []string{hub.SinkIdentity(td, "*")}}}},
			`routing.rules[0] ("sinks").identities[0] "spiffe://mesh.test/sink/*" is a pattern`},
		{"a cluster's identity", routing.Config{Rules: []routing.Rule{{Name: "east", Identities: []string{hub.ClusterIdentity(td, "east")}}}},
			`is cluster "east"'s identity`},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			bad := *cfg
			bad.Routing = tc.routing
			if _, err := hub.New(&bad, logger(t), hub.Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("hub.New: %v, want it refused saying %q", err, tc.want)
			}
		})
	}

	cfg.Routing = routing.Config{Rules: []routing.Rule{
		{Name: "istiod-1", Identities: []string{hub.SinkIdentity(td, "istiod-1")}, Clusters: []string{"west"}},
	}}
	h := tlsEastWest(t, p, cfg)
	_, serve, admin := h.Addrs()

	named := subscribeAs(t, serve, p, "istiod-1", nil)
	if v := named.Versions(vs); len(v) != 1 || v["pay/api"] == "" {
		t.Errorf("istiod-1, named by its rule: %v, want west's pay/api", v)
	}
	claimer := subscribeAs(t, serve, p, "istiod-2", &mcppb.SinkNode{Id: "istiod-1"})
	if v := claimer.Versions(vs); len(v) != 0 {
		t.Errorf("istiod-2 claiming node id istiod-1 received %v, want nothing", v)
	}
	// A minion's certificate, as a sink: admitted (without a trust domain its kind is
	// unknown), selected by no rule, answered with nothing.
	minion := subscribeWith(t, serve, p.creds(t, "east-as-sink", hub.ClusterIdentity(td, "east")), &mcppb.SinkNode{Id: "istiod-1"})
	if v := minion.Versions(vs); len(v) != 0 {
		t.Errorf("east's minion certificate subscribing received %v, want nothing", v)
	}
	if rules := sinkRules(t, admin, hub.ClusterIdentity(td, "east")); rules != "" {
		t.Errorf("/api/sinks: east's certificate has rules [%s], want none", rules)
	}
}

// subscribeAs subscribes to serve with a certificate for spiffe://<td>/sink/<cert> and node,
// and returns the sink once every collection has been answered.
func subscribeAs(t *testing.T, serve string, p *pki, cert string, node *mcppb.SinkNode) *mcp.Sink {
	t.Helper()
	return subscribeWith(t, serve, p.creds(t, "sink-"+cert, hub.SinkIdentity(td, cert)), node)
}

// subscribeWith subscribes to serve with creds and node (one stream: the hub is ready, so the
// first push of each collection is the whole of what the sink is given) and returns the sink
// once every collection has been answered.
func subscribeWith(t *testing.T, serve string, creds credentials.TransportCredentials, node *mcppb.SinkNode) *mcp.Sink {
	t.Helper()
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Node: node, FullStateOnly: true,
		Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error { return nil }), Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, serve, creds, sink)
	waitFor(t, 10*time.Second, fmt.Sprintf("node %q answered", node.GetId()), sink.Synced)
	return sink
}

// sinkRules is the rules /api/sinks lists for the connected sink with identity.
func sinkRules(t *testing.T, admin, identity string) string {
	t.Helper()
	var sinks []api.SinkStatus
	getJSON(t, "http://"+admin+"/api/sinks", &sinks)
	for _, s := range sinks {
		if s.Identity == identity {
			return strings.Join(s.Rules, ",")
		}
	}
	t.Fatalf("/api/sinks lists no sink %s: %+v", identity, sinks)
	return ""
}
