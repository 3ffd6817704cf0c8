package hub

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/mcp/kinds"
)

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
ingest: 0.0.0.0:9901
serve: 0.0.0.0:9900
http: 127.0.0.1:9990
tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key, caFile: /tls/ca.crt}
trustDomain: mesh.example.com
clusters:
- name: east
  identities: [spiffe://mesh.example.com/cluster/east]
  namespaces: [shop, shared]
  hosts: ["*.shop.example.com"]
- name: west
  identities: [spiffe://mesh.example.com/cluster/west]
  namespaces: [pay, shared]
sharedNamespaces: [shared]
conflicts: {priority: [west]}
staleness: {default: keep, collections: {istio/networking/v1alpha3/serviceentries: 10m}}
warmUp: 45s
routing:
  rules:
  - {name: prod, identities: ["spiffe://mesh.example.com/sink/*"], clusters: [east]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.WarmUp.Duration != 45*time.Second || len(cfg.Collections) != 15 || cfg.Staleness.ttl("istio/networking/v1alpha3/serviceentries") != 10*time.Minute ||
		cfg.Staleness.ttl("istio/networking/v1alpha3/virtualservices") != 0 {
		t.Errorf("cfg = %+v", cfg)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
	rc, err := ParseConfig([]byte("trustDomain: mesh.example.com\ntls: {certFile: c, keyFile: k, caFile: a}\nclusters: [{name: a}]\nreplicas: {seedDNS: 'hubs.meshfed.svc:7946'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := rc.Replicas; r.Name == "" || r.Gossip != "0.0.0.0:7946" || r.Profile != "lan" || r.SeedDNS != "hubs.meshfed.svc:7946" {
		t.Errorf("replicas defaults: %+v", r)
	}
}

// A file is read on top of Defaults: what it leaves out keeps the default, what it says
// wins; Validate changes nothing.
func TestDefaultsAndValidate(t *testing.T) {
	cfg, err := ParseConfig([]byte("insecure: true\nclusters: [{name: a, identities: [a]}]\nlimits: {streamBurst: 7}\nsharedNamespaces: ['team-*']\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Defaults()
	if cfg.Ingest != want.Ingest || cfg.WarmUp != want.WarmUp || cfg.MaxMessageSize != want.MaxMessageSize || cfg.Backoff != want.Backoff ||
		cfg.Limits.StreamsPerSecond != want.Limits.StreamsPerSecond || cfg.Limits.StreamBurst != 7 || len(cfg.Collections) != len(want.Collections) {
		t.Errorf("parsed %+v\nwant the defaults but streamBurst", cfg)
	}
	before := *cfg
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, *cfg) {
		t.Errorf("Validate changed the configuration")
	}
	dev := DefaultConfig()
	if err := dev.Validate(); err != nil || dev.TrustDomain != "" || dev.SPIFFETrustDomain() != DevTrustDomain || dev.HTTP == "" {
		t.Errorf("DefaultConfig: %v, %+v", err, dev)
	}
	if Defaults() == Defaults() || &Defaults().Collections[0] == &Defaults().Collections[0] {
		t.Error("Defaults shares state between calls")
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	base := "insecure: true\nclusters: [{name: a, identities: [a], namespaces: [x]}]\n"
	for _, tc := range []struct{ yaml, want string }{
		{"clusters: [{name: a, identities: [a]}]", "tls: required unless devCA or insecure"},
		{base + "devCA: true", "devCA: cannot be combined with tls or insecure"},
		{base + "trustDomain: Mesh/X", "trustDomain:"},
		{base + "tls: {certFile: a}", "insecure: cannot be combined with tls"},
		{"insecure: true", "clusters: at least one"},
		{"insecure: true\nclusters: [{name: a}]", `clusters[0] ("a").identities`},
		{"insecure: true\nclusters: [{name: a, identities: [i]}, {name: b, identities: [i]}]", `clusters[1] ("b").identities[0]: "i" is empty or already cluster "a"'s`},
		{"insecure: true\nclusters: [{name: a, identities: [i]}, {name: a, identities: [j]}]", `clusters[1].name: "a" is used twice`},
		{base + "warmUp: soon", "warmUp:"},
		{base + "serveUnauthenticated: 127.0.0.1:1", "serveUnauthenticated: needs tls or devCA"},
		{"devCA: true\nclusters: [{name: a, identities: [a]}]\nserveUnauthenticated: nowhere", "serveUnauthenticated:"},
		{base + "staleness: {default: sometimes}", "staleness.default"},
		{base + "staleness: {collections: {nope: 1m}}", `staleness.collections[nope]: unknown collection "nope": known: `},
		{base + "conflicts: {priority: [zz]}", "conflicts.priority[0]"},
		{base + "routing: {rules: [{name: ''}]}", "routing.rules[0].name"},
		{base + "ingest: nowhere", "ingest:"},
		{base + "surprise: 1", `unknown field "surprise"`},
		{"insecure: true\nclusters: [{name: a, identities: [a], hosts: ['*foo.com']}]", "hosts[0]"},
		{"insecure: true\nclusters: [{name: a, identities: [a], namespaces: ['*']}, {name: b, identities: [b], namespaces: [x]}]", `both own namespaces "x"`},
		{"tls: {certFile: c, keyFile: k, caFile: a}\nclusters: [{name: a, identities: [a]}]\nreplicas: {name: r1}", "replicas: trustDomain is required"},
		{base + "replicas: {name: 'a/b'}", `replicas.name: "a/b"`},
		// Names that become SPIFFE IDs are what tls.CheckID accepts back (issue 25, finding 9).
		{base + "replicas: {name: '..'}", `replicas.name: ".." is not a valid replica name (it becomes spiffe://<trustDomain>/hub/<name>): ".." is not a name`},
		{base + "trustDomain: user@mesh.test", `trustDomain: "user@mesh.test" is not a SPIFFE trust domain: "@" is not allowed in a trust domain`},
		{base + "operators: ['a%62']", `operators[0]: "a%62" is not an operator's name (spiffe://<trustDomain>/operator/NAME): "a%62" has "%"`},
		{"insecure: true\ntrustDomain: mesh.test\nclusters: [{name: a, identities: ['spiffe://mesh.test/cluster/a/']}]",
			`clusters[0] ("a").identities[0]: "spiffe://mesh.test/cluster/a/" is not a cluster identity of trust domain "mesh.test" (spiffe://mesh.test/cluster/NAME): its path "/cluster/a/" is not /KIND/NAME`},
		{"insecure: true\ntrustDomain: mesh.test\nclusters: [{name: 'a?b'}]",
			`clusters[0] ("a?b").identities[0]: "spiffe://mesh.test/cluster/a?b" is not a cluster identity of trust domain "mesh.test" (spiffe://mesh.test/cluster/NAME): its path "/cluster/a?b": "a?b" has "?"`},
		{"insecure: true\ntrustDomain: mesh.test\nclusters: [{name: a, identities: ['spiffe://mesh.test/sink/a']}]",
			`clusters[0] ("a").identities[0]: "spiffe://mesh.test/sink/a" is not a cluster identity of trust domain "mesh.test" (spiffe://mesh.test/cluster/NAME): its kind is "sink"`},
		{base + "replicas: {name: r1, profile: wan}", `replicas.profile: "wan"`},
		{base + "replicas: {name: r1, seeds: [nowhere]}", "replicas.seeds[0]"},
		{base + "replicas: {name: r1, seedDNS: hubs}", "replicas.seedDNS"},
		{base + "replicas: {name: r1, probeInterval: often}", "replicas.probeInterval"},
		{base + "replicas: {name: r1, suspicionMult: -1}", "replicas.suspicionMult"},
		{base + "replicas: {name: r1, gossip: 7946}", "replicas.gossip"},
		// One namespace grammar everywhere: what clusters[].namespaces refuses, sharedNamespaces
		// and the routing rules refuse too, naming the field.
		{base + "sharedNamespaces: ['*-prod', '']", `sharedNamespaces[0]: "*-prod": "*" may only end the pattern, or stand alone`},
		{base + "sharedNamespaces: [shared, '']", `sharedNamespaces[1]: "": empty pattern`},
		{base + "routing: {rules: [{name: r, namespaces: ['*-prod']}]}", `routing.rules[0].namespaces[0]: "*-prod": "*" may only end`},
		{base + "routing: {rules: [{name: r, namespaces: [Shop]}]}", `routing.rules[0].namespaces[0]: "Shop": invalid character 'S'`},
		{base + "maxMessageSize: 0", "maxMessageSize: 0 is not positive"},
		{base + "backoff: {initial: 0s}", "backoff.initial: must be positive"},
		{base + "backoff: {initial: 2s, max: 1s}", "backoff: max 1s is below initial 2s"},
		{base + "limits: {streamsPerSecond: 0}", "limits:"},
		{base + "limits: {handshakeTimeout: soon}", "limits.handshakeTimeout: "},
		{base + "limits: {maxPendingPerIP: -1}", "limits.maxPendingPerIP: -1 is negative"},
		{base + "limits: {maxConnections: -5}", "limits.maxConnections: -5 is negative"},
		{base + "replicas: {name: r1, bogus: 1}", `replicas: unknown field "bogus"`},
		{base + "warmUp: 5", "warmUp:"},
		{base + "ingest: ''", "ingest: required"},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
}

// FuzzParseConfig: any input is a configuration or an error, never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("insecure: true\nclusters: [{name: a, identities: [a], namespaces: ['team-*'], hosts: ['*.a.com']}]\n"))
	f.Add([]byte("clusters: [{name: a}]\nrouting: {rules: [{name: r, labels: 'a in (b)'}]}\n"))
	f.Add([]byte("insecure: true\nclusters: [{name: a, identities: [a]}]\nreplicas: {name: r1, gossip: '0.0.0.0:7946', seeds: ['h:7946'], profile: local, probeInterval: 200ms}\n"))
	f.Add([]byte("insecure: true\ntenants: [{name: t, sinks: ['s-*'], clusters: [{name: a, identities: [a]}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err == nil && len(cfg.allClusters()) == 0 {
			t.Fatal("accepted a configuration without clusters")
		}
	})
}

// Collections are typed as users type them and stored as collection names; what no kind
// answers to is refused with the known names, never served empty.
func TestConfigCollectionsAsTyped(t *testing.T) {
	const base = "insecure: true\nclusters: [{name: a, identities: [a], namespaces: [x]}]\n"
	const vs = "istio/networking/v1alpha3/virtualservices"
	for _, typed := range []string{"vs", "VirtualService", "networking.istio.io/v1/VirtualService", "virtualservices", "virtualservices.networking.istio.io", vs} {
		cfg, err := ParseConfig([]byte(base + "collections: [" + typed + ", dr]\nstaleness: {collections: {'" + typed + "': 10m}}\n"))
		if err != nil {
			t.Errorf("%s: %v", typed, err)
			continue
		}
		if !reflect.DeepEqual(cfg.Collections, []string{vs, "istio/networking/v1alpha3/destinationrules"}) ||
			!reflect.DeepEqual(cfg.Staleness.Collections, map[string]string{vs: "10m"}) || cfg.Staleness.ttl(vs) != 10*time.Minute {
			t.Errorf("%s: collections %v, staleness %v", typed, cfg.Collections, cfg.Staleness.Collections)
		}
		before := *cfg
		if err := cfg.Validate(); err != nil || !reflect.DeepEqual(before, *cfg) {
			t.Errorf("%s: Validate: %v, or it changed the configuration", typed, err)
		}
	}

	// A configured kind: served by default beside the built-in ones, and named as users do.
	const kindsYAML = "kinds: [{collection: example/widgets, group: example.com, version: v1, resource: widgets, kind: Widget, shortNames: [wd]}]\n"
	cfg, err := ParseConfig([]byte(base + kindsYAML))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Collections) != 16 || !slices.Contains(cfg.Collections, "example/widgets") || !slices.Contains(cfg.Collections, "istio/extensions/v1alpha1/trafficextensions") {
		t.Errorf("default collections with a configured kind: %v", cfg.Collections)
	}
	cfg, err = ParseConfig([]byte(base + kindsYAML + "collections: [wd, TrafficExtension]\n"))
	if err != nil || !reflect.DeepEqual(cfg.Collections, []string{"example/widgets", "istio/extensions/v1alpha1/trafficextensions"}) {
		t.Errorf("collections [wd, TrafficExtension]: %v, %v", cfg, err)
	}

	for _, tc := range []struct{ yaml, want string }{
		{base + "collections: [vs, dr, vss]", `collections[2]: unknown collection "vss": known: `},
		{base + "collections: [vs, dr, vss]", `istio/networking/v1alpha3/virtualservices (VirtualService, vs); `},
		{base + "collections: [vs, VirtualService]", `collections[1]: "VirtualService" is istio/networking/v1alpha3/virtualservices, already listed as collections[0] ("vs")`},
		{base + "collections: []", "collections: at least one collection is required"},
		{base + "collections: [wd]", `collections[0]: unknown collection "wd"`},
		{base + "staleness: {collections: {vs: 1m, VirtualService: 2m}}", `staleness.collections[vs]: "vs" is istio/networking/v1alpha3/virtualservices, already listed as "VirtualService"`},
		{base + "collections: [vs]\nstaleness: {collections: {dr: 1m}}", `staleness.collections: "istio/networking/v1alpha3/destinationrules" is not a served collection`},
		{base + "kinds: [{collection: example/widgets, version: v1}]", "kinds[0]: collection example/widgets: version, resource and kind are required"},
		{base + "kinds: [{collection: x, group: networking.istio.io, version: v1, resource: virtualservices, kind: VirtualService}]", "kinds[0]: VirtualService.networking.istio.io is both collection"},
		{base + "kinds: [{collection: x, version: v1, resource: r, kind: K, bogus: 1}]", `unknown field "bogus"`},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}

	// A program building a configuration writes collection names: Validate changes nothing
	// and says what to write.
	built := Defaults()
	built.Insecure, built.Clusters = true, []ClusterConfig{{Name: "a", Identities: []string{"a"}}}
	built.Collections = []string{"istio/networking/v1alpha3/gateways", "vs"}
	if err := built.Validate(); err == nil || err.Error() != `collections[1]: "vs": want the collection name, `+vs {
		t.Errorf("Validate of a typed name: %v", err)
	}
	built.Collections = []string{"example/widgets"}
	if err := built.Validate(); err == nil || !strings.Contains(err.Error(), `collections[0]: unknown collection "example/widgets"`) {
		t.Errorf("Validate of an unconfigured kind: %v", err)
	}
	built.Kinds = []kinds.Kind{{Collection: "example/widgets", Group: "example.com", Version: "v1", Resource: "widgets", Kind: "Widget"}}
	if err := built.Validate(); err != nil {
		t.Errorf("Validate with the kind configured: %v", err)
	}
}

// Kinds shape what the hub requests and serves: changing them needs a restart.
func TestKindsNeedARestart(t *testing.T) {
	const yaml = "insecure: true\nclusters: [{name: a, identities: [a]}]\n"
	old, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	next, err := ParseConfig([]byte(yaml + "kinds: [{collection: example/widgets, group: example.com, version: v1, resource: widgets, kind: Widget}]\ncollections: [vs]\n"))
	if err != nil {
		t.Fatal(err)
	}
	next.Collections = old.Collections
	if err := restartOnly(old, next); err == nil || !strings.Contains(err.Error(), "kinds: changing it needs a restart") {
		t.Errorf("restartOnly: %v", err)
	}
}
