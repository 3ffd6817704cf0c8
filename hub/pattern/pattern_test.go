package pattern

import (
	"strings"
	"testing"
)

func TestParseNamespace(t *testing.T) {
	for _, tc := range []struct {
		p, err string
		kind   Kind
	}{
		{p: "shop", kind: Exact}, {p: "team-*", kind: Prefix}, {p: "*", kind: Any}, {p: "a1-b", kind: Exact},
		{p: "", err: "empty pattern"}, {p: "*-prod", err: `"*" may only end the pattern`}, {p: "a*b", err: `"*" may only end`},
		{p: "Shop", err: "invalid character 'S'"}, {p: "a.b", err: "invalid character '.'"}, {p: strings.Repeat("a", 64), err: "longer than 63"},
	} {
		n, err := ParseNamespace(tc.p)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseNamespace(%q) = %v, want an error mentioning %q", tc.p, err, tc.err)
		case tc.err == "" && (err != nil || n.Kind() != tc.kind || n.String() != tc.p):
			t.Errorf("ParseNamespace(%q) = %v (%v, %q), want kind %v", tc.p, err, n.Kind(), n, tc.kind)
		}
	}
	if _, err := ParseNamespaces("sharedNamespaces", []string{"*-prod", ""}); err == nil ||
		err.Error() != `sharedNamespaces[0]: "*-prod": "*" may only end the pattern, or stand alone` {
		t.Errorf("ParseNamespaces: %v", err)
	}
}

func TestNamespaceMatchOverlapCovers(t *testing.T) {
	ns := func(p string) Namespace {
		n, err := ParseNamespace(p)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		p, ns string
		want  bool
	}{
		{"shop", "shop", true}, {"shop", "shops", false}, {"team-*", "team-a", true}, {"team-*", "team-", true},
		{"team-*", "team", false}, {"*", "x", true}, {"*", "", true}, {"team-*", "", false}, {"x", "", false},
	} {
		if got := ns(tc.p).Match(tc.ns); got != tc.want {
			t.Errorf("%q.Match(%q) = %v", tc.p, tc.ns, got)
		}
	}
	for _, tc := range []struct {
		a, b, ov string
		ok       bool
	}{
		{"x", "x", "x", true}, {"x", "y", "", false}, {"team-*", "team-a", "team-a", true}, {"team-a", "team-*", "team-a", true},
		{"team-*", "team-pay-*", "team-pay-*", true}, {"team-*", "ops-*", "", false}, {"*", "x", "x", true}, {"x", "*", "x", true},
		{"*", "*", "*", true}, {"team-*", "ops", "", false},
	} {
		ov, ok := ns(tc.a).Overlap(ns(tc.b))
		if ok != tc.ok || (ok && ov.String() != tc.ov) {
			t.Errorf("%q.Overlap(%q) = %q, %v", tc.a, tc.b, ov, ok)
		}
	}
	for _, tc := range []struct {
		s, p string
		want bool
	}{
		{"team-*", "team-pay-*", true}, {"team-pay", "team-*", false}, {"*", "x", true}, {"*", "*", true}, {"team-*", "*", false},
		{"x", "x", true}, {"x", "x*", false}, {"team-*", "team-a", true},
	} {
		if got := ns(tc.s).Covers(ns(tc.p)); got != tc.want {
			t.Errorf("%q.Covers(%q) = %v", tc.s, tc.p, got)
		}
	}
}

func TestParseHost(t *testing.T) {
	for _, tc := range []struct {
		p, err, body string
		kind         Kind
	}{
		{p: "api.example.com", kind: Exact, body: "api.example.com"}, {p: "*.example.com", kind: Suffix, body: ".example.com"}, {p: "*", kind: Any},
		{p: "", err: "empty pattern"}, {p: "*foo.com", err: `a wildcard must be "*" or start with "*."`}, {p: "a.*.com", err: `"*" may only appear`},
		{p: "a.com.", err: `must not end with "."`}, {p: "A.com", err: "lowercase"}, {p: "a..com", err: "empty label"},
		{p: "-a.com", err: "must start and end"}, {p: "a_b.com", err: "invalid character '_'"},
		{p: strings.Repeat("a", 64) + ".com", err: "longer than 63"}, {p: strings.Repeat("a.", 127) + "com", err: "longer than 253"},
	} {
		h, err := ParseHost(tc.p)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseHost(%q) = %v, want an error mentioning %q", tc.p, err, tc.err)
		case tc.err == "" && (err != nil || h.Kind() != tc.kind || h.Body() != tc.body || h.String() != tc.p):
			t.Errorf("ParseHost(%q) = %v (%v, %q)", tc.p, err, h.Kind(), h.Body())
		}
	}
}

// FuzzParse: any input is a pattern or an error, never a panic; a parsed pattern prints
// as written, parses again to the same, and a namespace pattern matches its own body.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"shop", "team-*", "*", "*.example.com", "a.b", "", "*-x", "A"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if n, err := ParseNamespace(p); err == nil {
			if n.String() != p {
				t.Fatalf("namespace %q prints as %q", p, n)
			}
			if n.Kind() != Any && !n.Match(n.Body()) {
				t.Fatalf("namespace %q does not match %q", p, n.Body())
			}
			if !n.Covers(n) {
				t.Fatalf("namespace %q does not cover itself", p)
			}
		}
		if h, err := ParseHost(p); err == nil {
			if h.String() != p {
				t.Fatalf("host %q prints as %q", p, h)
			}
			if again, err := ParseHost(h.String()); err != nil || again != h {
				t.Fatalf("host %q reparses as %v, %v", p, again, err)
			}
		}
	})
}

func TestHostOverlap(t *testing.T) {
	for _, tc := range []struct {
		a, b, want string // want "" : no overlap
	}{
		{"*", "api.a.com", "api.a.com"}, {"*.a.com", "*", "*.a.com"}, {"*", "*", "*"},
		{"api.a.com", "api.a.com", "api.a.com"}, {"api.a.com", "api.b.com", ""},
		{"api.a.com", "*.a.com", "api.a.com"}, {"*.a.com", "x.y.a.com", "x.y.a.com"}, {"a.com", "*.a.com", ""},
		{"*.a.com", "*.b.a.com", "*.b.a.com"}, {"*.b.a.com", "*.a.com", "*.b.a.com"}, {"*.a.com", "*.b.com", ""},
		{"*.a.com", "*.xa.com", ""},
	} {
		a, _ := ParseHost(tc.a)
		b, _ := ParseHost(tc.b)
		got, ok := a.Overlap(b)
		if tc.want == "" {
			if ok {
				t.Errorf("%q overlaps %q in %q; want none", tc.a, tc.b, got)
			}
			continue
		}
		if !ok || got.String() != tc.want {
			t.Errorf("%q ∩ %q = %q, %v; want %q", tc.a, tc.b, got, ok, tc.want)
		}
	}
}
