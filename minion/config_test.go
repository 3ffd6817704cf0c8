package minion

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
cluster: east
sources:
- url: k8s:///etc/kube/config?context=east
  namespaces: [shop]
  labelSelector: "mesh in (shared)"
  resync: 30s
- url: fs:///etc/meshfed
- url: mcp://upstream:9901
collections: [istio/networking/v1alpha3/virtualservices, k8s/core/v1/configmaps]
kinds:
- {collection: k8s/core/v1/configmaps, version: v1, resource: configmaps, kind: ConfigMap}
destinations:
  push: ["push://hub-a:9901,hub-b:9901"]
  listen: 127.0.0.1:0
  backoff: {initial: 50ms, max: 5s}
tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key, caFile: /tls/ca.crt, serverName: hub.example.com}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS == nil || cfg.TLS.ServerName != "hub.example.com" || cfg.TLS.Files.CA != "/tls/ca.crt" {
		t.Errorf("tls = %+v", cfg.TLS)
	}
	if cfg.Sources[0].Resync.Duration != 30*time.Second || cfg.Destinations.Backoff.Max.Duration != 5*time.Second || cfg.HTTP != "127.0.0.1:9902" {
		t.Errorf("cfg = %+v", cfg)
	}
	kinds, err := cfg.ResolveKinds()
	if err != nil || len(kinds) != 2 || kinds[1].Kind != "ConfigMap" {
		t.Errorf("kinds = %+v, %v", kinds, err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
}

func TestParseConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{`sources: []`, "sources: at least one"},
		{`{sources: [{url: "ftp://x"}], destinations: {push: ["push://h:1"]}}`, "sources[0].url"},
		{`{sources: [{url: "k8s://host/x"}], destinations: {push: ["push://h:1"]}}`, "must be absolute"},
		{`{sources: [{url: "fs:///x", namespaces: [a]}], destinations: {push: ["push://h:1"]}}`, "k8s:// sources only"},
		{`{sources: [{url: "k8s://", labelSelector: "a in ("}], destinations: {push: ["push://h:1"]}}`, "sources[0].labelSelector"},
		{`{sources: [{url: "k8s://", resync: "soon"}], destinations: {push: ["push://h:1"]}}`, "resync"},
		{`{sources: [{url: "fs:///x"}], destinations: {}}`, "destinations: set push"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["hub:1"]}}`, "destinations.push[0]"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, collections: [nope]}`, "collections[0]"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, kinds: [{collection: c, version: v1, resource: r, kind: K, messageType: no.Such}]}`, "kinds[0]"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, sourcez: 1}`, "unknown field \"sourcez\""},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"], backoff: {initial: 2s, max: 1s}}, insecure: true}`, "destinations.backoff"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}}`, "tls: required unless insecure is true"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, insecure: true, devCA: x}`, "set only one"},
		{"sources:\n  - url: a\n url: b", "not valid YAML"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, tls: {certFile: a, caFile: c}}`, "tls: keyFile is required"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"], backoff: {max: forever}}, insecure: true}`, "destinations.backoff.max"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, insecure: true, limits: {handshakeTimeout: 5}}`, "limits.handshakeTimeout: "},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, insecure: true, limits: {maxPendingPerIP: -1}}`, "limits.maxPendingPerIP: -1 is negative"},
		{`{sources: [{url: "fs:///x"}], destinations: {push: ["push://h:1"]}, insecure: true, limits: {maxConnections: -1}}`, "limits.maxConnections: -1 is negative"},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
}

// FuzzParseConfig: any input is a config or an error; never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("sources: [{url: fs:///x}]\ndestinations: {push: [push://h:1]}\n"))
	f.Add([]byte("sources: [{url: 'k8s:///a?context=b&x=1'}]\n"))
	f.Add([]byte("{kinds: [{collection: c}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err == nil && len(cfg.Sources) == 0 {
			t.Fatal("accepted a config without sources")
		}
	})
}

// Collections are typed as users type them and stored as collection names; what no kind
// answers to is refused with the known names.
func TestConfigCollectionsAsTyped(t *testing.T) {
	const base = "sources: [{url: 'fs:///x'}]\ndestinations: {push: ['push://h:1']}\ninsecure: true\n"
	const vs = "istio/networking/v1alpha3/virtualservices"
	for _, typed := range []string{"vs", "VirtualService", "networking.istio.io/v1/VirtualService", "virtualservices", vs} {
		cfg, err := ParseConfig([]byte(base + "collections: [" + typed + ", TrafficExtension]\n"))
		if err != nil {
			t.Errorf("%s: %v", typed, err)
			continue
		}
		if !reflect.DeepEqual(cfg.Collections, []string{vs, "istio/extensions/v1alpha1/trafficextensions"}) {
			t.Errorf("%s: collections %v", typed, cfg.Collections)
		}
		before := *cfg
		if err := cfg.Validate(); err != nil || !reflect.DeepEqual(before, *cfg) {
			t.Errorf("%s: Validate: %v, or it changed the configuration", typed, err)
		}
		if ks, err := cfg.ResolveKinds(); err != nil || len(ks) != 2 || ks[0].Kind != "VirtualService" || ks[1].Kind != "TrafficExtension" {
			t.Errorf("%s: ResolveKinds = %+v, %v", typed, ks, err)
		}
	}
	cfg, err := ParseConfig([]byte(base + "kinds: [{collection: k8s/core/v1/configmaps, version: v1, resource: configmaps, kind: ConfigMap, shortNames: [cm]}]\ncollections: [cm, core/v1/ConfigMap.x]\n"))
	if err == nil || !strings.Contains(err.Error(), `collections[1]: unknown collection "core/v1/ConfigMap.x": known: `) || !strings.Contains(err.Error(), "k8s/core/v1/configmaps (ConfigMap, cm)") {
		t.Errorf("unknown collection with a configured kind: %v, %v", cfg, err)
	}
	cfg, err = ParseConfig([]byte(base + "kinds: [{collection: k8s/core/v1/configmaps, version: v1, resource: configmaps, kind: ConfigMap, shortNames: [cm]}]\ncollections: [cm, core/v1/ConfigMap]\n"))
	if err == nil || !strings.Contains(err.Error(), `collections[1]: "core/v1/ConfigMap" is k8s/core/v1/configmaps, already listed as collections[0] ("cm")`) {
		t.Errorf("a collection listed twice: %v, %v", cfg, err)
	}
	// Without collections: every built-in kind and the configured ones.
	cfg, err = ParseConfig([]byte(base + "kinds: [{collection: k8s/core/v1/configmaps, version: v1, resource: configmaps, kind: ConfigMap}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ks, err := cfg.ResolveKinds(); err != nil || len(ks) != 16 {
		t.Errorf("default kinds: %d, %v", len(ks), err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{base + "collections: [vs, dr, vss]", `collections[2]: unknown collection "vss": known: `},
		{base + "collections: [vs, dr, vss]", "istio/networking/v1alpha3/virtualservices (VirtualService, vs); "},
		{base + "collections: [vs, VirtualService]", `collections[1]: "VirtualService" is istio/networking/v1alpha3/virtualservices, already listed as collections[0] ("vs")`},
		{base + "collections: [vs]\nkinds: [{collection: x, version: v1}]", "kinds[0]: collection x: version, resource and kind are required"},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
	// A program building a configuration writes collection names.
	built := DefaultConfig()
	built.Collections = []string{"vs"}
	if err := built.Validate(); err == nil || err.Error() != `collections[0]: "vs": want the collection name, `+vs {
		t.Errorf("Validate of a typed name: %v", err)
	}
}
