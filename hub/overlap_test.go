package hub

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/meshfed/meshfed/hub/pattern"
)

// The configuration's overlap checks (issue 25): they ran on every pair of patterns,
// O(clusters² × patterns²), which a 1.3 MB candidate made 7.8 s of the hub's CPU. They now
// go through pattern.Index; the pairwise checks below are the code they replaced, kept only
// as the reference the new ones must agree with, error for error.

// checkNamespaceOverlapPairwise is checkNamespaceOverlap as it was: every pair.
func checkNamespaceOverlapPairwise(clusters []ClusterConfig, shared []pattern.Namespace) error {
	owned := make([][]pattern.Namespace, len(clusters))
	for i, c := range clusters {
		owned[i], _ = pattern.ParseNamespaces("", c.Namespaces)
	}
	for i := range clusters {
		for j := i + 1; j < len(clusters); j++ {
			for _, a := range owned[i] {
				for _, b := range owned[j] {
					ov, ok := a.Overlap(b)
					if !ok || coveredByPairwise(shared, ov) {
						continue
					}
					return fmt.Errorf("clusters %q and %q both own namespaces %q (%q, %q): list it under sharedNamespaces if that is intended",
						clusters[i].Name, clusters[j].Name, ov, a, b)
				}
			}
		}
	}
	return nil
}

func coveredByPairwise(shared []pattern.Namespace, p pattern.Namespace) bool {
	for _, s := range shared {
		if s.Covers(p) {
			return true
		}
	}
	return false
}

// checkTenantClaimsPairwise is checkTenantClaims as it was: every pair.
func checkTenantClaimsPairwise(groups []tenantGroup) error {
	type claims struct {
		field      string
		namespaces []pattern.Namespace
		hosts      []pattern.Host
		scoped     []string
	}
	of := func(g tenantGroup, j int) claims {
		cl := g.Clusters[j]
		c := claims{field: fmt.Sprintf("%sclusters[%d] (%q)", g.field, j, cl.Name), scoped: cl.ClusterScoped}
		c.namespaces, _ = pattern.ParseNamespaces("", cl.Namespaces)
		for _, h := range cl.Hosts {
			p, _ := pattern.ParseHost(h)
			c.hosts = append(c.hosts, p)
		}
		return c
	}
	tenants := make([][]claims, len(groups))
	for i, g := range groups {
		for j := range g.Clusters {
			tenants[i] = append(tenants[i], of(g, j))
		}
	}
	for i, a := range tenants {
		for _, b := range tenants[i+1:] {
			for _, x := range a {
				for _, y := range b {
					for k, p := range x.namespaces {
						for l, q := range y.namespaces {
							if ov, ok := p.Overlap(q); ok {
								return fmt.Errorf("%s.namespaces[%d] (%q) and %s.namespaces[%d] (%q) both match namespaces %q: tenants may not share a namespace; export objects instead",
									x.field, k, p, y.field, l, q, ov)
							}
						}
					}
					for k, p := range x.hosts {
						for l, q := range y.hosts {
							if ov, ok := p.Overlap(q); ok {
								return fmt.Errorf("%s.hosts[%d] (%q) and %s.hosts[%d] (%q) both match hosts %q: tenants may not share a host",
									x.field, k, p, y.field, l, q, ov)
							}
						}
					}
					for k, p := range x.scoped {
						for l, q := range y.scoped {
							if p == q || p == "*" || q == "*" {
								both := p
								if p == "*" {
									both = q
								}
								return fmt.Errorf("%s.clusterScoped[%d] (%q) and %s.clusterScoped[%d] (%q) both grant cluster-scoped %s: tenants may not publish the same cluster-scoped names",
									x.field, k, p, y.field, l, q, both)
							}
						}
					}
				}
			}
		}
	}
	return nil
}

// Random claims over small alphabets, so that random configurations overlap often (and in
// several places at once, which is where the order of the first error matters).
func randomNamespaces(r *rand.Rand, n int) []string {
	out := make([]string, n)
	for i := range out {
		if r.IntN(25) == 0 {
			out[i] = "*"
			continue
		}
		var b strings.Builder
		for range 1 + r.IntN(3) {
			b.WriteByte("ab-"[r.IntN(3)])
		}
		if r.IntN(2) == 0 {
			b.WriteByte('*')
		}
		out[i] = b.String()
	}
	return out
}

func randomHosts(r *rand.Rand, n int) []string {
	out := make([]string, n)
	for i := range out {
		if r.IntN(25) == 0 {
			out[i] = "*"
			continue
		}
		labels := make([]string, 1+r.IntN(3))
		for j := range labels {
			labels[j] = []string{"a", "b", "ab"}[r.IntN(3)]
		}
		out[i] = strings.Join(labels, ".")
		if r.IntN(2) == 0 {
			out[i] = "*." + out[i]
		}
	}
	return out
}

func randomScoped(r *rand.Rand, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = []string{"x", "y", "z", "*"}[r.IntN(4)]
	}
	return out
}

// The index-based checks give the pairwise checks' answers, error for error (the same pair
// reported first, in the same words), on random configurations: a property test over
// thousands of them, sparse and dense.
func TestOverlapChecksAgreeWithPairwise(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 8))
	errs, tenantErrs := 0, map[string]int{}
	for round := range 3000 {
		dense := round%2 == 0
		perCluster := 1 + r.IntN(4)
		if !dense {
			perCluster = 1 + r.IntN(2)
		}
		clusters := make([]ClusterConfig, r.IntN(8))
		for i := range clusters {
			clusters[i] = ClusterConfig{Name: fmt.Sprintf("c%d", i), Namespaces: randomNamespaces(r, r.IntN(perCluster+1)),
				Hosts: randomHosts(r, r.IntN(perCluster+1)), ClusterScoped: randomScoped(r, r.IntN(2))}
		}
		shared, err := pattern.ParseNamespaces("", randomNamespaces(r, r.IntN(4)))
		if err != nil {
			t.Fatal(err)
		}
		want, got := checkNamespaceOverlapPairwise(clusters, shared), checkNamespaceOverlap(context.Background(), clusters, shared)
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("round %d: clusters %+v, shared %v:\n got %v\nwant %v", round, clusters, shared, got, want)
		}
		if want != nil {
			errs++
		}

		// The same clusters spread over tenants.
		var groups []tenantGroup
		for i := 0; i < len(clusters); {
			n := 1 + r.IntN(3)
			tc := &TenantConfig{Name: fmt.Sprintf("t%d", len(groups)), Clusters: clusters[i:min(i+n, len(clusters))]}
			groups = append(groups, tenantGroup{TenantConfig: tc, field: fmt.Sprintf("tenants[%d] (%q).", len(groups), tc.Name)})
			i += n
		}
		want, got = checkTenantClaimsPairwise(groups), checkTenantClaims(context.Background(), groups)
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("round %d: tenants %+v:\n got %v\nwant %v", round, clusters, got, want)
		}
		for _, kind := range []string{"namespaces", "hosts", "clusterScoped"} {
			if want != nil && strings.Contains(want.Error(), ")."+kind+"[") {
				tenantErrs[kind]++
			}
		}
	}
	if errs < 500 || errs > 2500 || tenantErrs["namespaces"] < 100 || tenantErrs["hosts"] < 100 || tenantErrs["clusterScoped"] < 100 {
		t.Errorf("of 3000 random configurations, %d overlap within a tenant, and across tenants %v: the property test should see plenty of each", errs, tenantErrs)
	}
}

// largeClusters are clusters clusters with patterns namespace and host patterns each (half
// exact, half prefixes or "*."), none overlapping another cluster's: the valid
// configuration, where every pair must be looked at.
func largeClusters(clusters, patterns int) []ClusterConfig {
	out := make([]ClusterConfig, clusters)
	for i := range out {
		c := ClusterConfig{Name: fmt.Sprintf("c%04d", i)}
		for j := range patterns {
			if j%2 == 0 {
				c.Namespaces = append(c.Namespaces, fmt.Sprintf("c%04d-n%04d", i, j))
				c.Hosts = append(c.Hosts, fmt.Sprintf("h%04d.c%04d.example.com", j, i))
			} else {
				c.Namespaces = append(c.Namespaces, fmt.Sprintf("c%04d-p%04d-*", i, j))
				c.Hosts = append(c.Hosts, fmt.Sprintf("*.w%04d.c%04d.example.com", j, i))
			}
		}
		out[i] = c
	}
	return out
}

// BenchmarkNamespaceOverlap: the pairwise check (the baseline, as it was) against the index
// at growing sizes. Pairwise grows with the square of the patterns, the index with n log n.
func BenchmarkNamespaceOverlap(b *testing.B) {
	for _, size := range []struct{ clusters, patterns int }{{25, 50}, {50, 50}, {100, 50}, {100, 100}, {200, 100}} {
		clusters := largeClusters(size.clusters, size.patterns)
		name := fmt.Sprintf("clusters=%d/patterns=%d", size.clusters, size.patterns)
		b.Run("pairwise/"+name, func(b *testing.B) {
			for b.Loop() {
				if err := checkNamespaceOverlapPairwise(clusters, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("index/"+name, func(b *testing.B) {
			for b.Loop() {
				if err := checkNamespaceOverlap(context.Background(), clusters, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTenantClaims: the same, across tenants (one cluster each), namespaces and hosts.
func BenchmarkTenantClaims(b *testing.B) {
	for _, size := range []struct{ tenants, patterns int }{{50, 50}, {100, 50}, {200, 50}} {
		clusters := largeClusters(size.tenants, size.patterns)
		groups := make([]tenantGroup, len(clusters))
		for i := range clusters {
			groups[i] = tenantGroup{TenantConfig: &TenantConfig{Name: fmt.Sprintf("t%d", i), Clusters: clusters[i : i+1]}, field: fmt.Sprintf("tenants[%d].", i)}
		}
		name := fmt.Sprintf("tenants=%d/patterns=%d", size.tenants, size.patterns)
		b.Run("pairwise/"+name, func(b *testing.B) {
			for b.Loop() {
				if err := checkTenantClaimsPairwise(groups); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("index/"+name, func(b *testing.B) {
			for b.Loop() {
				if err := checkTenantClaims(context.Background(), groups); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
