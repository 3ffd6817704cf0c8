package acl

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fuzzCollections are the collections the fuzzers pick from, with whether the reference
// implementation reads their hosts as "namespace/host".
var fuzzCollections = []struct {
	name   string
	nsForm bool
}{
	{vsColl, false},
	{seColl, false},
	{drColl, false},
	{gwColl, true},
	{scColl, true},
	{"networking.istio.io/v1/Gateway", true},
	{"istio/networking/v1beta1/sidecars", true},
	{"networking.istio.io/v1/VirtualService", false},
	{apColl, false},
	{"k8s/gateway_api/v1/gateways", false},
	{"", false},
}

// Reference grammars of the patterns New accepts (tests may use regexp; the package does not).
var (
	refNamespacePattern = regexp.MustCompile(`^(\*|[a-z0-9-]{1,63}\*?)$`)
	refHostPattern      = regexp.MustCompile(`^(\*|(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*)$`)
)

func refHostPatternOK(p string) bool {
	if !refHostPattern.MatchString(p) || len(p) > 253 {
		return false
	}
	for _, l := range strings.Split(strings.TrimPrefix(p, "*."), ".") {
		if len(l) > 63 {
			return false
		}
	}
	return true
}

// refOwnsNamespace is the namespace rule, written independently of the package.
func refOwnsNamespace(patterns []string, ns string) bool {
	if ns == "" {
		return false
	}
	for _, p := range patterns {
		if p == "*" || p == ns || strings.HasSuffix(p, "*") && strings.HasPrefix(ns, strings.TrimSuffix(p, "*")) {
			return true
		}
	}
	return false
}

func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, s)
}

// refOwnsHost is the host rule, written independently of the package: slow and simple.
func refOwnsHost(patterns []string, h, ns, suffix string) bool {
	h = asciiLower(strings.TrimSuffix(h, "."))
	switch {
	case h == "", len(h) > 253:
		return false
	case h == "*":
		return slices.Contains(patterns, "*")
	case strings.Contains(h, "*") && !(strings.HasPrefix(h, "*.") && len(h) > 2 && !strings.Contains(h[1:], "*")):
		return false
	}
	if !strings.HasPrefix(h, "*") && !strings.Contains(h, ".") {
		switch {
		case ns != "":
			if h = h + "." + ns + ".svc." + suffix; len(h) > 253 {
				return false
			}
		case suffix != "":
			return false // nothing to resolve against
		}
		// ns == "" && suffix == "": OwnersOfHost, which takes short names literally.
	}
	for _, p := range patterns {
		switch {
		case p == "*":
			return true
		case strings.HasPrefix(h, "*."):
			if strings.HasPrefix(p, "*.") && strings.HasSuffix(h[1:], p[1:]) {
				return true
			}
		case p == h, strings.HasPrefix(p, "*.") && strings.HasSuffix(h, p[1:]):
			return true
		}
	}
	return false
}

// refAccepts is Check's decision, written independently of the package.
func refAccepts(c Cluster, suffix string, o Object, nsForm bool) bool {
	ns, _, namespaced := strings.Cut(o.Name, "/")
	if namespaced {
		if !refOwnsNamespace(c.Namespaces, ns) {
			return false
		}
	} else {
		ns = ""
		if !slices.Contains(c.ClusterScoped, "*") && !slices.Contains(c.ClusterScoped, o.Collection) {
			return false
		}
	}
	for _, h := range o.Hosts {
		if !nsForm {
			if !refOwnsHost(c.Hosts, h, ns, suffix) {
				return false
			}
			continue
		}
		hns, hh, ok := strings.Cut(h, "/")
		if !ok {
			hns, hh = "*", h
		}
		switch {
		case hns == "." && namespaced, strings.HasPrefix(hns, "~"):
			continue
		case hns == "." || hns == "*":
			if !refOwnsHost(c.Hosts, hh, ns, suffix) {
				return false
			}
		case refOwnsNamespace(c.Namespaces, hns):
			continue
		default:
			if !refOwnsHost(c.Hosts, hh, hns, suffix) {
				return false
			}
		}
	}
	return true
}

func FuzzCheck(f *testing.F) {
	f.Add("shop", "team-*", "api.example.com", "*.east.example.com", cspColl, "shop/a", uint8(0), "api.example.com", "Reviews.", "x.east.example.com")
	f.Add("*", "", "*", "", "*", "global", uint8(3), "*/*", "./*", "istio-system/reviews")
	f.Add("team-*", "shop", "*.com", "a.b", "", "team-x/gw", uint8(4), "~/*", "team-y/*", "payments/api.example.com")
	f.Add("shop", "x", "*.a.com", "b.a.com", vsColl, "shop/v", uint8(0), "*.a.com", "*.b.a.com", "*.com")
	f.Add("shop", "x", "reviews.shop.svc.cluster.local", "", "", "shop/v", uint8(5), "reviews", "*/reviews", "shop/")
	f.Add("a", "b", "x.y", "*.y", "", "/", uint8(1), "", ".", "*.")
	f.Fuzz(func(t *testing.T, ns1, ns2, host1, host2, scoped, name string, coll uint8, h1, h2, h3 string) {
		// New must agree with the reference grammars, pattern by pattern.
		var nsPats, hostPats, scopedPats []string
		for _, p := range []string{ns1, ns2} {
			_, err := New([]Cluster{{Name: "x", Namespaces: []string{p}}}, Options{})
			if (err == nil) != refNamespacePattern.MatchString(p) {
				t.Fatalf("namespace pattern %q: New error %v, reference grammar says valid=%v", p, err, refNamespacePattern.MatchString(p))
			}
			if err == nil {
				nsPats = append(nsPats, p)
			}
		}
		for _, p := range []string{host1, host2} {
			_, err := New([]Cluster{{Name: "x", Hosts: []string{p}}}, Options{})
			if (err == nil) != refHostPatternOK(p) {
				t.Fatalf("host pattern %q: New error %v, reference grammar says valid=%v", p, err, refHostPatternOK(p))
			}
			if err == nil {
				hostPats = append(hostPats, p)
			}
		}
		if _, err := New([]Cluster{{Name: "x", ClusterScoped: []string{scoped}}}, Options{}); err == nil {
			scopedPats = append(scopedPats, scoped)
		}

		// The whole configuration as given: New errors or Check never panics.
		raw := []Cluster{{Name: "c", Namespaces: []string{ns1, ns2}, Hosts: []string{host1, host2}, ClusterScoped: []string{scoped}}}
		col := fuzzCollections[int(coll)%len(fuzzCollections)]
		obj := Object{Collection: col.name, Name: name, Hosts: []string{h1, h2, h3}}
		if p, err := New(raw, Options{}); err == nil {
			_ = p.Check("c", obj)
		}

		// The valid patterns: Check agrees with the reference, both ways.
		c := Cluster{Name: "c", Namespaces: nsPats, Hosts: hostPats, ClusterScoped: scopedPats}
		other := Cluster{Name: "other", Namespaces: []string{"*"}, Hosts: []string{"*.com", "x.org"}}
		p, err := New([]Cluster{c, other}, Options{})
		if err != nil {
			t.Fatalf("New with valid patterns: %v", err)
		}
		err = p.Check("c", obj)
		if err != nil {
			var r *Rejection
			if !errors.As(err, &r) || r.Reason == "" {
				t.Fatalf("Check returned %v (%T), want a *Rejection with a reason", err, err)
			}
			if err2 := p.Check("c", obj); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("Check is not deterministic: %v then %v", err, err2)
			}
		}
		if err == nil {
			if ns, _, ok := strings.Cut(name, "/"); ok && !refOwnsNamespace(nsPats, ns) {
				t.Fatalf("accepted %q in namespace %q, not matched by %q", name, ns, nsPats)
			}
		}
		if want := refAccepts(c, DefaultDomainSuffix, obj, col.nsForm); (err == nil) != want {
			t.Fatalf("cluster %+v, object %+v: Check = %v, reference accepts = %v", c, obj, err, want)
		}
		if err := p.Check("nobody", obj); err == nil {
			t.Fatal("unknown cluster accepted")
		}
		// The owner queries never panic and agree with the reference.
		for _, h := range obj.Hosts {
			owners := p.OwnersOfHost(h)
			if slices.Contains(owners, "c") != refOwnsHost(hostPats, h, "", "") {
				t.Fatalf("OwnersOfHost(%q) = %q, reference for %q disagrees", h, owners, hostPats)
			}
		}
		if ns, _, ok := strings.Cut(name, "/"); ok {
			if owners := p.OwnersOfNamespace(ns); slices.Contains(owners, "c") != refOwnsNamespace(nsPats, ns) {
				t.Fatalf("OwnersOfNamespace(%q) = %q, reference for %q disagrees", ns, owners, nsPats)
			}
		}
	})
}

func FuzzHosts(f *testing.F) {
	for _, m := range hostMessages(f) {
		for i, c := range fuzzCollections {
			if c.name == m.collection {
				f.Add(uint8(i), m.body)
			}
		}
	}
	f.Add(uint8(0), []byte{0xff, 0xff})
	f.Add(uint8(3), []byte{0x0a, 0x02, 0x1a, 0x00})
	f.Fuzz(func(t *testing.T, coll uint8, body []byte) {
		c := fuzzCollections[int(coll)%len(fuzzCollections)].name
		hosts, err := Hosts(c, body)
		if !ClaimsHosts(c) && (hosts != nil || err != nil) {
			t.Fatalf("Hosts(%q) = %q, %v for a collection that claims no hosts", c, hosts, err)
		}
		if err != nil && hosts != nil {
			t.Fatalf("Hosts returned both hosts and an error")
		}
	})
}
