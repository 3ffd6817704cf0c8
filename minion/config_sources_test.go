package minion

import (
	"reflect"
	"strings"
	"testing"
)

// What one source reads: its collections, typed as users do and stored as collection names,
// a subset of the minion's; fullState for an mcp:// upstream only.
func TestSourceCollectionsAndFullState(t *testing.T) {
	const vs = "istio/networking/v1alpha3/virtualservices"
	const base = "destinations: {push: ['push://h:1']}\ninsecure: true\n"
	cfg, err := ParseConfig([]byte(base + "sources: [{url: 'mcp://u:1', collections: [vs], fullState: true}, {url: 'fs:///x'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Sources[0].Collections; !reflect.DeepEqual(got, []string{vs}) || !cfg.Sources[0].FullState {
		t.Errorf("sources[0] = %+v", cfg.Sources[0])
	}
	all, err := cfg.ResolveKinds()
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Sources[0].sourceKinds(all); len(got) != 1 || got[0].Collection != vs {
		t.Errorf("sources[0] reads %+v", got)
	}
	if got := cfg.Sources[1].sourceKinds(all); len(got) != len(all) {
		t.Errorf("sources[1] reads %d kinds, want all %d", len(got), len(all))
	}
	for _, tc := range []struct{ yaml, want string }{
		{"sources: [{url: 'fs:///x', collections: [vss]}]", `sources[0].collections[0]: unknown collection "vss": known: `},
		{"collections: [vs]\nsources: [{url: 'fs:///x', collections: [dr]}]", `sources[0].collections[0]: "istio/networking/v1alpha3/destinationrules" is not one of the minion's collections`},
		{"sources: [{url: 'fs:///x', fullState: true}]", "sources[0].fullState: applies to mcp:// sources only"},
	} {
		_, err := ParseConfig([]byte(base + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
}

// The relay: its collections typed as anywhere, and what it needs named when missing.
func TestRelayConfig(t *testing.T) {
	const base = "sources: [{url: 'fs:///x'}]\ninsecure: true\n"
	cfg, err := ParseConfig([]byte(base + "destinations: {push: ['push://h:1']}\nrelay: {listen: '127.0.0.1:15010', collections: [vs]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Relay.Collections; !reflect.DeepEqual(got, []string{"istio/networking/v1alpha3/virtualservices"}) {
		t.Errorf("relay.collections = %v", got)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"destinations: {listen: '127.0.0.1:1'}\nrelay: {listen: '127.0.0.1:15010'}", "relay: needs destinations.push"},
		{"destinations: {push: ['push://h:1']}\nrelay: {listen: nowhere}", "relay.listen:"},
		{"destinations: {push: ['push://h:1']}\nrelay: {listen: ':1', tls: {certFile: c}}", "relay.tls: keyFile is required"},
		{"destinations: {push: ['push://h:1']}\nrelay: {listen: ':1', collections: [vss]}", `relay.collections[0]: unknown collection "vss"`},
	} {
		_, err := ParseConfig([]byte(base + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  err = %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
}
