package hub

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/internal/testkit/golden"
)

// tenantSeeds are the configurations of the golden scenarios with tenants: every section
// that is a hub configuration (the first, and those reload steps name).
func tenantSeeds(f *testing.F) [][]byte {
	f.Helper()
	files, err := filepath.Glob("testdata/tenants*.txtar")
	if err != nil || len(files) == 0 {
		f.Fatalf("no golden scenarios with tenants: %v", err)
	}
	var out [][]byte
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		for _, s := range golden.Parse(data).Sections {
			if strings.HasSuffix(s.Name, ".yaml") && s.Name != "pushes.yaml" && s.Name != "sinks.yaml" {
				out = append(out, []byte(s.Data))
			}
		}
	}
	return out
}

// FuzzTenantConfig: any configuration is refused or accepted, never a panic; one accepted
// keeps its tenants apart (checkTenantsApart).
func FuzzTenantConfig(f *testing.F) {
	for _, seed := range tenantSeeds(f) {
		f.Add(seed)
	}
	f.Add([]byte(`{"insecure": true, "collections": ["vs", "se"], "tenants": [` +
		`{"name": "a", "sinks": ["a-*"], "clusters": [{"name": "c1", "identities": ["c1"], "namespaces": ["x-*"], "hosts": ["*.a.com"], "clusterScoped": ["se"]}]},` +
		`{"name": "b", "sinks": ["b"], "clusters": [{"name": "c2", "identities": ["c2"], "namespaces": ["x"], "hosts": ["a.com"]}],` +
		` "exports": [{"name": "e", "to": ["a"], "labels": "k in (v)"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			return
		}
		checkTenantsApart(t, cfg)
	})
}

// FuzzTenantClaims writes the claims of two tenants' clusters and their sinks from the
// fuzzer's patterns into one configuration: whatever ParseConfig accepts keeps them apart.
func FuzzTenantClaims(f *testing.F) {
	// Apart, then each kind of overlap alone.
	f.Add("shop", "team-*", "*.shop.example.com", "api.bank.example.com", "acme-*", "globex-*", "vs", "se")
	f.Add("team-*", "team-a", "a.com", "b.com", "acme-*", "globex-*", "vs", "se")
	f.Add("shop", "bank", "*.example.com", "*.shop.example.com", "acme-*", "globex-*", "vs", "se")
	f.Add("shop", "bank", "a.com", "b.com", "acme-*", "acme-east-*", "vs", "se")
	f.Add("shop", "bank", "a.com", "b.com", "a", "b", "dr", "DestinationRule")
	f.Fuzz(func(t *testing.T, nsA, nsB, hostA, hostB, sinkA, sinkB, scopedA, scopedB string) {
		q := func(s string) string { return fmt.Sprintf("%q", s) } // a YAML double-quoted string
		cfg := "insecure: true\ncollections: [vs, se, gw, dr]\ntenants:\n" +
			"- name: acme\n  sinks: [" + q(sinkA) + "]\n  clusters:\n" +
			"  - {name: east, identities: [east], namespaces: [" + q(nsA) + "], hosts: [" + q(hostA) + "], clusterScoped: [" + q(scopedA) + "]}\n" +
			"- name: globex\n  sinks: [" + q(sinkB) + "]\n  clusters:\n" +
			"  - {name: north, identities: [north], namespaces: [" + q(nsB) + "], hosts: [" + q(hostB) + "], clusterScoped: [" + q(scopedB) + "]}\n"
		parsed, err := ParseConfig([]byte(cfg))
		if err != nil {
			if !strings.Contains(err.Error(), "tenants[") && !strings.Contains(err.Error(), "clusters[") {
				t.Fatalf("a refusal that names no tenant's field: %v\n%s", err, cfg)
			}
			return
		}
		checkTenantsApart(t, parsed)
	})
}

// checkTenantsApart checks what an accepted configuration with tenants promises: every
// cluster is the tenant's that lists it, and among names sampled from every pattern of the
// configuration, no identity is matched by the sink patterns of two tenants and no
// namespace, host or cluster-scoped collection is owned by clusters of two tenants (asked
// of each tenant's own ownership policy, the one that judges its clusters' pushes).
func checkTenantsApart(t *testing.T, cfg *Config) {
	t.Helper()
	if len(cfg.Tenants) == 0 {
		return
	}
	comp, err := cfg.compile()
	if err != nil {
		t.Fatalf("ParseConfig accepted what compile refuses: %v", err)
	}
	var identities, namespaces, hosts []string
	scoped := map[string]bool{}
	for _, tc := range cfg.Tenants {
		for _, p := range tc.Sinks {
			identities = append(identities, samples(strings.TrimSuffix(p, "*"))...)
		}
		for _, cl := range tc.Clusters {
			if got := comp.tenants.OfCluster(cl.Name); got != tc.Name {
				t.Fatalf("cluster %q of tenant %q is %q's", cl.Name, tc.Name, got)
			}
			for _, p := range cl.Namespaces {
				namespaces = append(namespaces, samples(strings.TrimSuffix(p, "*"))...)
			}
			for _, p := range cl.Hosts {
				body := strings.TrimPrefix(p, "*")
				hosts = append(hosts, p, "x"+body, strings.TrimPrefix(body, "."), "*"+body, "*.x"+body)
			}
			for _, c := range cl.ClusterScoped {
				scoped[c] = true
			}
		}
	}
	for _, id := range identities {
		var of []string
		for _, tc := range cfg.Tenants {
			for _, p := range tc.Sinks {
				if body, prefix := strings.CutSuffix(p, "*"); id == p || prefix && strings.HasPrefix(id, body) {
					of = append(of, tc.Name)
					break
				}
			}
		}
		if len(of) > 1 {
			t.Fatalf("identity %q is a sink of tenants %v", id, of)
		}
		if got := comp.tenants.OfSink(id); got != strings.Join(of, "") {
			t.Fatalf("OfSink(%q) = %q, want %q", id, got, strings.Join(of, ""))
		}
	}
	owners := func(what string, of func(p *acl.Policy) []string) {
		t.Helper()
		var tenants []string
		for _, tc := range cfg.Tenants {
			if len(of(comp.tenant[tc.Name].policy)) > 0 {
				tenants = append(tenants, tc.Name)
			}
		}
		if len(tenants) > 1 {
			t.Fatalf("%s is owned by clusters of tenants %v", what, tenants)
		}
	}
	for _, ns := range namespaces {
		owners("namespace "+ns, func(p *acl.Policy) []string { return p.OwnersOfNamespace(ns) })
	}
	for _, h := range hosts {
		owners("host "+h, func(p *acl.Policy) []string { return p.OwnersOfHost(h) })
	}
	for coll := range scoped {
		owners("cluster-scoped "+coll, func(p *acl.Policy) []string {
			var granted []string
			for _, c := range cfg.allClusters() {
				if p.Check(c.Name, acl.Object{Collection: coll, Name: "x"}) == nil {
					granted = append(granted, c.Name)
				}
			}
			return granted
		})
	}
}

// samples are names near a pattern's body: itself, longer, and a prefix of it.
func samples(body string) []string {
	return []string{body, body + "a", body + "-x", body[:len(body)/2], "x" + body}
}

// An export's collections are compared with the objects' collection names as they are: a
// name typed any other way would share nothing, so it is refused, naming the field and the
// name to write; patterns pass.
func TestExportCollectionsAreCollectionNames(t *testing.T) {
	const gw = "istio/networking/v1alpha3/gateways"
	cfg := func(coll string) string {
		return "insecure: true\ncollections: [vs, gw]\ntenants:\n" +
			"- {name: a, sinks: [a], clusters: [{name: c1, identities: [c1], namespaces: [x]}], exports: [{name: e, to: [b], collections: [" + gw + ", '" + coll + "']}]}\n" +
			"- {name: b, sinks: [b]}\n"
	}
	// A file names collections as users do; parsing stores the collection names.
	for _, tc := range []struct{ coll, stored, err string }{
		{coll: "gw", stored: gw},
		{coll: "Gateway", stored: gw},
		{coll: "networking.istio.io/v1/Gateway", stored: gw},
		{coll: "istio/networking/v1alpha3/virtualservices", stored: "istio/networking/v1alpha3/virtualservices"},
		{coll: "istio/*", stored: "istio/*"},
		{coll: "nope", err: `tenants[0] ("a").exports[0] ("e").collections[1]: unknown collection "nope": known: `},
	} {
		c, err := ParseConfig([]byte(cfg(tc.coll)))
		switch {
		case tc.err != "":
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %s", tc.coll, err, tc.err)
			}
			continue
		case err != nil:
			t.Errorf("%s: %v", tc.coll, err)
			continue
		}
		if got := c.Tenants[0].Exports[0].Collections[1]; got != tc.stored {
			t.Errorf("%s: stored as %q, want %q", tc.coll, got, tc.stored)
		}
		comp, err := c.compile()
		if err != nil || !comp.tenants.Sees("b", "c1", gw, "x", nil) || comp.tenants.Sees("b", "c1", "example/widgets", "x", nil) {
			t.Errorf("%s: b does not see what a exports, or sees more: %v", tc.coll, err)
		}
	}
	// A configuration built otherwise must hold collection names: tenancy compares them as
	// they are, so "gw" would share nothing, silently.
	c, err := ParseConfig([]byte(cfg(gw)))
	if err != nil {
		t.Fatal(err)
	}
	c.Tenants[0].Exports[0].Collections[1] = "gw"
	if err := c.Validate(); err == nil || err.Error() != `tenants[0] ("a").exports[0] ("e").collections[1]: "gw": want the collection name, `+gw {
		t.Errorf("Validate of an export naming gw: %v", err)
	}
}
