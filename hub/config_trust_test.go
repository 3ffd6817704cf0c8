package hub

import (
	"strings"
	"testing"
)

// Routing selects only by what is proven. With TLS, a trust domain proves a sink's kind and
// its node id (the name in its certificate); without one, every sink must be named by its
// exact identity, none a cluster's, and there is no default. Annotations, and node ids that
// nothing proves, only narrow what identities give. Each refusal names the field and the fix.
func TestSinkTrustRules(t *testing.T) {
	const (
		tlsFiles    = "tls: {certFile: c, keyFile: k, caFile: a}\n"
		withTD      = tlsFiles + "trustDomain: mesh.example.com\nclusters: [{name: east, namespaces: [shop]}]\n"
		noTD        = tlsFiles + "clusters: [{name: east, identities: [spiffe://mesh.example.com/cluster/east], namespaces: [shop]}]\n"
		insecureCfg = "insecure: true\nclusters: [{name: east, identities: [east], namespaces: [shop]}]\n"
		devCA       = "devCA: true\nclusters: [{name: east, namespaces: [shop]}]\n"
	)
	for _, tc := range []struct{ name, yaml, want string }{
		// The findings: a sink claiming team=pay got what the pay sinks get; with tls and no
		// trust domain a sink claiming node id prod-1, and a minion's certificate, got
		// another cluster's data.
		{"annotations alone", withTD + "routing: {rules: [{name: pay, annotations: {team: pay}, namespaces: [pay]}]}",
			"routing.rules[0].annotations: annotations are what the sink claims, and select nothing by themselves: name identities too"},
		{"node ids without a trust domain", noTD + "routing: {rules: [{name: prod, nodeIds: [prod-*]}]}",
			"routing.rules[0].nodeIds: a SinkNode id is what the sink claims here, nothing proves it: name identities too (the node ids then narrow what they give), or set the hub's trustDomain"},
		{"a default without a trust domain", noTD + "routing: {default: {name: all}}",
			"trustDomain: required with tls unless every sink is named by its exact identity"},
		{"a default without a trust domain names it", noTD + "routing: {default: {name: all}}", "routing.default would serve any of them"},
		{"a rule naming no identity without a trust domain", noTD + "routing: {rules: [{name: shop, clusters: [east]}]}",
			`trustDomain: required with tls unless every sink is named by its exact identity (without a trust domain a certificate's identity says nothing of its kind, so any certificate the CA issued, a minion's too, may subscribe as a sink): routing.rules[0] ("shop") names no identities`},
		{"an identity pattern without a trust domain", noTD + "routing: {rules: [{name: shop, identities: ['spiffe://mesh.example.com/sink/*']}]}",
			`routing.rules[0] ("shop").identities[0] "spiffe://mesh.example.com/sink/*" is a pattern`},
		{"a dialed sink without an identity, without a trust domain", noTD + "routing: {rules: [{name: shop, identities: [istiod-1]}]}\ndialSinks: [{name: d, addr: 'h:1', nodeId: x}]",
			`dialSinks[0] ("d").identity is empty`},
		{"a cluster's identity in a rule for sinks", withTD + "routing: {rules: [{name: east, identities: [spiffe://mesh.example.com/cluster/east]}]}",
			`routing.rules[0] ("east").identities[0]: "spiffe://mesh.example.com/cluster/east" is cluster "east"'s identity: a cluster subscribes only as a relay, which only rules with relays: true select`},
		{"a cluster's identity, without a trust domain", noTD + "routing: {rules: [{name: east, identities: [spiffe://mesh.example.com/cluster/east]}]}",
			`is cluster "east"'s identity`},
		{"annotations alone, insecure", insecureCfg + "routing: {rules: [{name: pay, annotations: {team: pay}}]}", "routing.rules[0].annotations:"},
		{"annotations alone, development CA", devCA + "routing: {rules: [{name: pay, annotations: {team: pay}}]}", "routing.rules[0].annotations:"},
		{"a default selecting by a claim", withTD + "routing: {default: {name: d, annotations: {team: pay}}}", "routing.default.annotations: the default selects every sink no rule selects, by nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s\n  err = %v\n  want it to say %q", tc.yaml, err, tc.want)
			}
		})
	}

	for _, tc := range []struct{ name, yaml string }{
		// Node ids are the certificates' names under a trust domain, so they select alone.
		{"node ids under a trust domain", withTD + "routing: {rules: [{name: prod, nodeIds: [prod-*], annotations: {team: pay}}], default: {name: all}}"},
		{"node ids under the development CA's trust domain", devCA + "routing: {rules: [{name: prod, nodeIds: [prod-*]}]}"},
		{"claims narrowing identities", withTD + "routing: {rules: [{name: pay, identities: ['spiffe://mesh.example.com/sink/pay-*'], annotations: {team: pay}}]}"},
		// Insecure proves nothing: an identity is a header, no better than a node id.
		{"node ids, insecure", insecureCfg + "routing: {rules: [{name: prod, nodeIds: [prod-*]}], default: {name: all}}"},
		// The explicit identity list: every sink by its exact identity (a SPIFFE ID or a
		// common name); relays and unauthenticated sinks have rules and listeners of their own.
		{"exact identities without a trust domain", noTD + `serveUnauthenticated: 127.0.0.1:0
routing:
  rules:
  - {name: prod, identities: [spiffe://mesh.example.com/sink/prod-1, istiod-2], annotations: {team: pay}}
  - {name: relays, relays: true, identities: ["*"]}
  - {name: direct, unauthenticated: true, nodeIds: ["sidecar~*"]}
dialSinks: [{name: d, addr: 'h:1', identity: istiod-2}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseConfig([]byte(tc.yaml)); err != nil {
				t.Errorf("%s\n  err = %v", tc.yaml, err)
			}
		})
	}
}
