package hub

import (
	"reflect"
	"strings"
	"testing"
)

// What the hub asks one cluster's source for: its collections, typed as users do and stored
// as collection names, a subset of the hub's; and fullState, for the cluster and per poll.
func TestClusterCollectionsAndFullState(t *testing.T) {
	const vs, dr = "istio/networking/v1alpha3/virtualservices", "istio/networking/v1alpha3/destinationrules"
	cfg, err := ParseConfig([]byte(`insecure: true
clusters:
- {name: a, identities: [a], namespaces: [x], collections: [vs, DestinationRule], fullState: true}
- {name: b, identities: [b], namespaces: [why]}
poll: [{cluster: b, addr: "h:1", fullState: true}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Clusters[0].Collections; !reflect.DeepEqual(got, []string{vs, dr}) || !cfg.Clusters[0].FullState || !cfg.Poll[0].FullState {
		t.Errorf("clusters[0] = %+v, poll[0] = %+v", cfg.Clusters[0], cfg.Poll[0])
	}
	comp, err := cfg.compile()
	if err != nil {
		t.Fatal(err)
	}
	if got := comp.collections("a"); !reflect.DeepEqual(got, []string{vs, dr}) {
		t.Errorf("a's collections = %v", got)
	}
	if got := comp.collections("b"); len(got) != 15 {
		t.Errorf("b's collections = %v, want the hub's 15", got)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"clusters: [{name: a, identities: [a], collections: [vss]}]", `clusters[0] ("a").collections[0]: unknown collection "vss": known: `},
		{"collections: [vs]\nclusters: [{name: a, identities: [a], collections: [dr]}]", `clusters[0] ("a").collections[0]: "istio/networking/v1alpha3/destinationrules" is not one of the hub's collections`},
		{"clusters: [{name: a, identities: [a], collections: [vs, VirtualService]}]", `clusters[0] ("a").collections[1]: "VirtualService" is istio/networking/v1alpha3/virtualservices, already listed`},
	} {
		_, err := ParseConfig([]byte("insecure: true\n" + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
}

// clusterScoped and a routing rule's collections without a wildcard are typed like any
// collection; a pattern stays a pattern.
func TestClusterScopedAndRoutingCollectionsAsTyped(t *testing.T) {
	cfg, err := ParseConfig([]byte(`insecure: true
clusters: [{name: a, identities: [a], namespaces: [x], clusterScoped: [gw]}]
routing: {rules: [{name: r, nodeIds: ["*"], collections: [vs, "istio/security/*"]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Clusters[0].ClusterScoped; !reflect.DeepEqual(got, []string{"istio/networking/v1alpha3/gateways"}) {
		t.Errorf("clusterScoped = %v", got)
	}
	if got := cfg.Routing.Rules[0].Collections; !reflect.DeepEqual(got, []string{"istio/networking/v1alpha3/virtualservices", "istio/security/*"}) {
		t.Errorf("routing collections = %v", got)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"clusters: [{name: a, identities: [a], clusterScoped: [gws]}]", `clusters[0] ("a").clusterScoped[0]: unknown collection "gws"`},
		{"clusters: [{name: a, identities: [a]}]\nrouting: {rules: [{name: r, collections: [vss]}]}", `routing.rules[0].collections[0]: unknown collection "vss"`},
	} {
		_, err := ParseConfig([]byte("insecure: true\n" + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
}
