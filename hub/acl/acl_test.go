package acl

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

const (
	vsColl  = "istio/networking/v1alpha3/virtualservices"
	seColl  = "istio/networking/v1alpha3/serviceentries"
	drColl  = "istio/networking/v1alpha3/destinationrules"
	gwColl  = "istio/networking/v1alpha3/gateways"
	scColl  = "istio/networking/v1alpha3/sidecars"
	apColl  = "istio/security/v1beta1/authorizationpolicies"
	cspColl = "istio/networking/v1alpha3/envoyfilters"
)

// testClusters is the configuration most tests use.
var testClusters = []Cluster{
	{
		Name:          "east",
		Namespaces:    []string{"shop", "team-*"},
		Hosts:         []string{"api.example.com", "*.east.example.com", "reviews.shop.svc.cluster.local"},
		ClusterScoped: []string{cspColl},
	},
	{
		Name:       "west",
		Namespaces: []string{"payments", "team-west"},
		Hosts:      []string{"api.pay.example.com", "*.example.org"},
	},
	{
		Name:       "wide",
		Namespaces: []string{"wide"},
		Hosts:      []string{"*.com"},
	},
	{
		Name:          "admin",
		Namespaces:    []string{"*"},
		Hosts:         []string{"*"},
		ClusterScoped: []string{"*"},
	},
}

func mustNew(t testing.TB, clusters []Cluster, opts Options) *Policy {
	t.Helper()
	p, err := New(clusters, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheck(t *testing.T) {
	// Without admin: admin owns everything and would appear in every owner list.
	p := mustNew(t, testClusters[:3], Options{})
	vs := func(name string, hosts ...string) Object { return Object{Collection: vsColl, Name: name, Hosts: hosts} }
	gw := func(name string, hosts ...string) Object { return Object{Collection: gwColl, Name: name, Hosts: hosts} }
	sc := func(name string, hosts ...string) Object { return Object{Collection: scColl, Name: name, Hosts: hosts} }

	tests := []struct {
		name    string
		cluster string
		obj     Object
		want    string // "" = accepted; else the exact reason
	}{
		// Rule 1: unknown cluster.
		{"unknown cluster", "north", vs("shop/a"), `cluster "north" is not in the hub's configuration`},
		{"empty cluster name", "", vs("shop/a"), `cluster "" is not in the hub's configuration`},

		// Rule 2: namespaces.
		{"exact namespace", "east", Object{Collection: apColl, Name: "shop/a"}, ""},
		{"prefix namespace", "east", Object{Collection: apColl, Name: "team-a/x"}, ""},
		{"prefix matches the bare prefix", "east", Object{Collection: apColl, Name: "team-/x"}, ""},
		{"overlapping namespace, first owner", "east", Object{Collection: apColl, Name: "team-west/x"}, ""},
		{"overlapping namespace, second owner", "west", Object{Collection: apColl, Name: "team-west/x"}, ""},
		{"namespace of another cluster", "east", Object{Collection: apColl, Name: "payments/x"},
			`namespace "payments" is not owned by cluster "east" (owned by "west")`},
		{"namespace of nobody", "east", Object{Collection: apColl, Name: "nobody/x"},
			`namespace "nobody" is not owned by cluster "east"`},
		{"prefix is not a glob elsewhere", "east", Object{Collection: apColl, Name: "my-team-a/x"},
			`namespace "my-team-a" is not owned by cluster "east"`},
		{"namespace is case sensitive", "east", Object{Collection: apColl, Name: "Shop/x"},
			`namespace "Shop" is not owned by cluster "east"`},
		{"empty namespace", "east", Object{Collection: apColl, Name: "/x"},
			`namespace "" is not owned by cluster "east"`},
		{"name split at the first slash", "east", Object{Collection: apColl, Name: "shop/a/b"}, ""},
		{"owners name every other owner", "west", Object{Collection: apColl, Name: "team-x/y"},
			`namespace "team-x" is not owned by cluster "west" (owned by "east")`},

		// Rule 3: cluster-scoped.
		{"cluster-scoped with grant", "east", Object{Collection: cspColl, Name: "global"}, ""},
		{"cluster-scoped without grant", "west", Object{Collection: cspColl, Name: "global"},
			`cluster-scoped istio/networking/v1alpha3/envoyfilters "global" needs an explicit grant for cluster "west"`},
		{"grant is per collection", "east", Object{Collection: apColl, Name: "global"},
			`cluster-scoped istio/security/v1beta1/authorizationpolicies "global" needs an explicit grant for cluster "east"`},

		// Rule 4: hosts.
		{"no hosts", "east", vs("shop/a"), ""},
		{"exact host", "east", vs("shop/a", "api.example.com"), ""},
		{"uppercase host", "east", vs("shop/a", "API.Example.COM"), ""},
		{"trailing dot", "east", vs("shop/a", "api.example.com."), ""},
		{"wildcard pattern covers one level", "east", vs("shop/a", "x.east.example.com"), ""},
		{"wildcard pattern covers any depth", "east", vs("shop/a", "a.b.c.east.example.com"), ""},
		{"wildcard pattern does not cover its base", "east", vs("shop/a", "east.example.com"),
			`host "east.example.com" is not owned by cluster "east" (owned by "wide")`},
		{"label boundary", "east", vs("shop/a", "xeast.example.com"),
			`host "xeast.example.com" is not owned by cluster "east" (owned by "wide")`},
		{"host of another cluster", "east", vs("shop/a", "api.pay.example.com"),
			`host "api.pay.example.com" is not owned by cluster "east" (owned by "west", "wide")`},
		{"host of nobody", "east", vs("shop/a", "api.example.net"),
			`host "api.example.net" is not owned by cluster "east"`},
		{"normalized host shown with what was written", "east", vs("shop/a", "API.Pay.Example.com."),
			`host "api.pay.example.com" (written "API.Pay.Example.com.") is not owned by cluster "east" (owned by "west", "wide")`},
		{"short name resolves in the namespace", "east", vs("shop/a", "reviews"), ""},
		{"short name with trailing dot", "east", vs("shop/a", "Reviews."), ""},
		{"short name in another namespace", "east", vs("team-a/a", "reviews"),
			`host "reviews.team-a.svc.cluster.local" (written "reviews") is not owned by cluster "east"`},
		{"short name not owned", "east", vs("shop/a", "ratings"),
			`host "ratings.shop.svc.cluster.local" (written "ratings") is not owned by cluster "east"`},
		{"fqdn of a short name", "east", vs("shop/a", "reviews.shop.svc.cluster.local"), ""},
		{"wildcard claim owned by itself", "east", vs("shop/a", "*.east.example.com"), ""},
		{"wildcard claim owned by a wider wildcard", "east", vs("shop/a", "*.x.east.example.com"), ""},
		{"wildcard claim wider than the pattern", "east", vs("shop/a", "*.example.com"),
			`host "*.example.com" is not owned by cluster "east" (owned by "wide")`},
		{"wildcard claim not owned by an exact host", "west", vs("payments/a", "*.pay.example.com"),
			`host "*.pay.example.com" is not owned by cluster "west" (owned by "wide")`},
		{"wildcard claim under a wide wildcard", "wide", vs("wide/a", "*.pay.example.com"), ""},
		{"wide wildcard covers a two-label name", "wide", vs("wide/a", "example.com"), ""},
		{"wide wildcard claim owned by itself", "wide", vs("wide/a", "*.com"), ""},
		{"star claim needs star", "east", vs("shop/a", "*"),
			`host "*" is not owned by cluster "east"`},
		{"star claim with trailing dot", "east", vs("shop/a", "*."),
			`host "*" (written "*.") is not owned by cluster "east"`},
		{"empty host", "east", vs("shop/a", ""), `host "" is not a valid host name (cluster "east")`},
		{"dot host", "east", vs("shop/a", "."), `host "." is not a valid host name (cluster "east")`},
		{"bad wildcard claim", "wide", vs("wide/a", "*foo.com"), `host "*foo.com" is not a valid host name (cluster "wide")`},
		{"inner star claim", "wide", vs("wide/a", "a.*.com"), `host "a.*.com" is not a valid host name (cluster "wide")`},
		{"two wildcards claim", "wide", vs("wide/a", "*.*.com"), `host "*.*.com" is not a valid host name (cluster "wide")`},
		{"star short name claim", "east", vs("shop/a", "rev*"), `host "rev*" is not a valid host name (cluster "east")`},
		{"slash in a virtualservice host is not a namespace", "east", vs("shop/a", "shop/api.example.com"),
			`host "shop/api.example.com" is not owned by cluster "east" (owned by "wide")`},
		{"serviceentry", "east", Object{Collection: seColl, Name: "shop/se", Hosts: []string{"api.example.com", "x.example.org"}},
			`host "x.example.org" is not owned by cluster "east" (owned by "west")`},
		{"destinationrule", "west", Object{Collection: drColl, Name: "payments/dr", Hosts: []string{"api.pay.example.com"}}, ""},

		// Rule 5: the first problem.
		{"namespace before hosts", "east", vs("payments/a", "nope.example.net"),
			`namespace "payments" is not owned by cluster "east" (owned by "west")`},
		{"hosts in order", "east", vs("shop/a", "api.example.com", "one.example.net", "two.example.net"),
			`host "one.example.net" is not owned by cluster "east"`},

		// Gateway and Sidecar "namespace/host".
		{"gateway own namespace", "east", gw("shop/gw", "./*"), ""},
		{"gateway own namespace any host", "east", gw("shop/gw", "./anything.example.net"), ""},
		{"gateway owned namespace", "east", gw("shop/gw", "team-a/*"), ""},
		{"gateway owned namespace short host", "east", gw("shop/gw", "team-a/ratings"), ""},
		{"gateway any namespace star", "east", gw("shop/gw", "*/*"),
			`host "*" (written "*/*") is not owned by cluster "east"`},
		{"gateway unowned namespace star", "east", gw("shop/gw", "istio-system/*"),
			`host "*" (written "istio-system/*") is not owned by cluster "east"`},
		{"gateway unowned namespace owned host", "east", gw("shop/gw", "istio-system/api.example.com"), ""},
		{"gateway unowned namespace owned wildcard", "east", gw("shop/gw", "payments/*.east.example.com"), ""},
		{"gateway unowned namespace other's host", "east", gw("shop/gw", "payments/api.pay.example.com"),
			`host "api.pay.example.com" (written "payments/api.pay.example.com") is not owned by cluster "east" (owned by "west", "wide")`},
		{"gateway any namespace owned host", "east", gw("shop/gw", "*/api.example.com"), ""},
		{"gateway bare host means any namespace", "east", gw("shop/gw", "api.example.com"), ""},
		{"gateway bare host not owned", "east", gw("shop/gw", "x.example.org"),
			`host "x.example.org" is not owned by cluster "east" (owned by "west")`},
		{"gateway bare star", "east", gw("shop/gw", "*"), `host "*" is not owned by cluster "east"`},
		{"gateway short name resolves in the namespace part", "east", gw("shop/gw", "payments/reviews"),
			`host "reviews.payments.svc.cluster.local" (written "payments/reviews") is not owned by cluster "east"`},
		{"gateway short name with star namespace resolves in own", "east", gw("shop/gw", "*/reviews"), ""},
		{"gateway uppercase host part", "east", gw("shop/gw", "istio-system/API.example.com"), ""},
		{"gateway exclusion claims nothing", "east", gw("shop/gw", "~/*"), ""},
		{"sidecar own namespace", "east", sc("team-a/default", "./*"), ""},
		{"sidecar owned namespace", "east", sc("team-a/default", "shop/*"), ""},
		{"sidecar istio-system", "east", sc("team-a/default", "./*", "istio-system/*"),
			`host "*" (written "istio-system/*") is not owned by cluster "east"`},
		{"sidecar exclusions", "east", sc("team-a/default", "~/*", "~payments/*", "~/x.example.org"), ""},
		{"sidecar bad host in unowned namespace", "east", sc("shop/default", "payments/*foo"),
			`host "payments/*foo" is not a valid host name (cluster "east")`},
		{"sidecar first problem in order", "east", sc("shop/default", "./*", "*/x.example.org", "*/*"),
			`host "x.example.org" (written "*/x.example.org") is not owned by cluster "east" (owned by "west")`},

		// Kind forms.
		{"v1 collection", "east", Object{Collection: "istio/networking/v1/gateways", Name: "shop/gw", Hosts: []string{"./*"}}, ""},
		{"kind form", "east", Object{Collection: "networking.istio.io/v1beta1/Sidecar", Name: "shop/gw", Hosts: []string{"./*"}}, ""},
		{"other group's gateways are not namespace/host", "east", Object{Collection: "k8s/gateway_api/v1/gateways", Name: "shop/gw", Hosts: []string{"./*"}},
			`host "./*" is not a valid host name (cluster "east")`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Check(tc.cluster, tc.obj)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check(%q, %+v) = %v, want accepted", tc.cluster, tc.obj, err)
				}
				return
			}
			var r *Rejection
			if !errors.As(err, &r) {
				t.Fatalf("Check(%q, %+v) = %v (%T), want *Rejection %q", tc.cluster, tc.obj, err, err, tc.want)
			}
			if r.Reason != tc.want || err.Error() != tc.want {
				t.Fatalf("Check(%q, %+v):\n got %q\nwant %q", tc.cluster, tc.obj, r.Reason, tc.want)
			}
		})
	}
}

func TestCheckClusterScoped(t *testing.T) {
	p := mustNew(t, testClusters, Options{})
	tests := []struct {
		cluster string
		obj     Object
		want    string
	}{
		{"admin", Object{Collection: "anything/at/all", Name: "global"}, ""},
		{"admin", Object{Collection: vsColl, Name: "global", Hosts: []string{"api.example.com", "*"}}, ""},
		{"admin", Object{Collection: vsColl, Name: "global", Hosts: []string{"reviews"}},
			`short host name "reviews" cannot be resolved: cluster-scoped istio/networking/v1alpha3/virtualservices "global" has no namespace`},
		{"admin", Object{Collection: gwColl, Name: "global", Hosts: []string{"*/*", "istio-system/reviews"}}, ""},
		{"admin", Object{Collection: gwColl, Name: "global", Hosts: []string{"./reviews"}},
			`short host name "./reviews" cannot be resolved: cluster-scoped istio/networking/v1alpha3/gateways "global" has no namespace`},
		{"east", Object{Collection: cspColl, Name: "global"}, ""},
		// "." in a cluster-scoped resource is no owned namespace: the host part is checked.
		{"admin", Object{Collection: gwColl, Name: "global", Hosts: []string{"./api.example.com"}}, ""},
	}
	for _, tc := range tests {
		err := p.Check(tc.cluster, tc.obj)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("Check(%q, %+v):\n got %q\nwant %q", tc.cluster, tc.obj, got, tc.want)
		}
	}

	// A cluster-scoped gateway granted to a cluster without "*": "./x" is checked as a host.
	p2 := mustNew(t, []Cluster{{Name: "c", Hosts: []string{"api.example.com"}, ClusterScoped: []string{gwColl}}}, Options{})
	if err := p2.Check("c", Object{Collection: gwColl, Name: "g", Hosts: []string{"./api.example.com"}}); err != nil {
		t.Errorf("owned host under \".\" in a cluster-scoped gateway: %v", err)
	}
	want := `host "*" (written "./*") is not owned by cluster "c"`
	if err := p2.Check("c", Object{Collection: gwColl, Name: "g", Hosts: []string{"./*"}}); err == nil || err.Error() != want {
		t.Errorf("\"./*\" in a cluster-scoped gateway: %v, want %q", err, want)
	}
}

func TestCheckDomainSuffix(t *testing.T) {
	p := mustNew(t, []Cluster{{Name: "c", Namespaces: []string{"shop"}, Hosts: []string{"*.shop.svc.mesh.internal"}}},
		Options{DomainSuffix: "mesh.internal"})
	if err := p.Check("c", Object{Collection: vsColl, Name: "shop/a", Hosts: []string{"reviews"}}); err != nil {
		t.Fatal(err)
	}
	want := `host "reviews.shop.svc.cluster.local" is not owned by cluster "c"`
	if err := p.Check("c", Object{Collection: vsColl, Name: "shop/a", Hosts: []string{"reviews.shop.svc.cluster.local"}}); err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestOwnersShownAreBounded(t *testing.T) {
	var cs []Cluster
	for i := range 8 {
		cs = append(cs, Cluster{Name: fmt.Sprintf("c%d", i), Namespaces: []string{"shared"}, Hosts: []string{"*.example.com"}})
	}
	cs = append(cs, Cluster{Name: "me", Namespaces: []string{"mine"}})
	p := mustNew(t, cs, Options{})
	want := `namespace "shared" is not owned by cluster "me" (owned by "c0", "c1", "c2", "c3", "c4" and 3 more)`
	if err := p.Check("me", Object{Collection: apColl, Name: "shared/x"}); err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %q", err, want)
	}
}

func TestOwnersOfNamespace(t *testing.T) {
	p := mustNew(t, testClusters, Options{})
	tests := []struct {
		ns   string
		want []string
	}{
		{"shop", []string{"admin", "east"}},
		{"team-a", []string{"admin", "east"}},
		{"team-west", []string{"admin", "east", "west"}},
		{"payments", []string{"admin", "west"}},
		{"nobody", []string{"admin"}},
		{"", nil},
	}
	for _, tc := range tests {
		if got := p.OwnersOfNamespace(tc.ns); !slices.Equal(got, tc.want) {
			t.Errorf("OwnersOfNamespace(%q) = %q, want %q", tc.ns, got, tc.want)
		}
	}
	p2 := mustNew(t, testClusters[:3], Options{})
	if got := p2.OwnersOfNamespace("nobody"); got != nil {
		t.Errorf("OwnersOfNamespace(nobody) = %q, want nil", got)
	}
}

func TestOwnersOfHost(t *testing.T) {
	p := mustNew(t, testClusters, Options{})
	tests := []struct {
		host string
		want []string
	}{
		{"api.example.com", []string{"admin", "east", "wide"}},
		{"API.example.com.", []string{"admin", "east", "wide"}},
		{"x.east.example.com", []string{"admin", "east", "wide"}},
		{"east.example.com", []string{"admin", "wide"}},
		{"api.pay.example.com", []string{"admin", "west", "wide"}},
		{"a.example.org", []string{"admin", "west"}},
		{"example.org", []string{"admin"}},
		{"*.east.example.com", []string{"admin", "east", "wide"}},
		{"*.a.east.example.com", []string{"admin", "east", "wide"}},
		{"*.example.com", []string{"admin", "wide"}},
		{"*.pay.example.com", []string{"admin", "wide"}},
		{"*.com", []string{"admin", "wide"}},
		{"*", []string{"admin"}},
		{"reviews", []string{"admin"}},
		{"reviews.shop.svc.cluster.local", []string{"admin", "east"}},
		{"", nil},
		{"*foo.com", nil},
	}
	for _, tc := range tests {
		if got := p.OwnersOfHost(tc.host); !slices.Equal(got, tc.want) {
			t.Errorf("OwnersOfHost(%q) = %q, want %q", tc.host, got, tc.want)
		}
	}
}

func TestNewValidation(t *testing.T) {
	ok := Cluster{Name: "ok", Namespaces: []string{"a"}, Hosts: []string{"a.com"}}
	tests := []struct {
		name     string
		clusters []Cluster
		opts     Options
		want     string
	}{
		{"empty name", []Cluster{ok, {}}, Options{}, `clusters[1].name: must not be empty`},
		{"duplicate", []Cluster{ok, {Name: "x"}, {Name: "ok"}}, Options{}, `clusters[2] ("ok").name: duplicate of clusters[0]`},
		{"empty namespace", []Cluster{{Name: "e", Namespaces: []string{"a", ""}}}, Options{}, `clusters[0] ("e").namespaces[1]: "": empty pattern`},
		{"uppercase namespace", []Cluster{{Name: "e", Namespaces: []string{"Shop"}}}, Options{}, `clusters[0] ("e").namespaces[0]: "Shop": invalid character 'S'`},
		{"dot namespace", []Cluster{{Name: "e", Namespaces: []string{"a.b"}}}, Options{}, `clusters[0] ("e").namespaces[0]: "a.b": invalid character '.'`},
		{"inner star namespace", []Cluster{{Name: "e", Namespaces: []string{"a*b"}}}, Options{}, `clusters[0] ("e").namespaces[0]: "a*b": "*" may only end the pattern`},
		{"leading star namespace", []Cluster{{Name: "e", Namespaces: []string{"*a"}}}, Options{}, `namespaces[0]: "*a": "*" may only end the pattern`},
		{"double star namespace", []Cluster{{Name: "e", Namespaces: []string{"**"}}}, Options{}, `namespaces[0]: "**": "*" may only end`},
		{"long namespace", []Cluster{{Name: "e", Namespaces: []string{strings.Repeat("a", 64)}}}, Options{}, `namespaces[0]: "` + strings.Repeat("a", 64) + `": longer than 63 characters`},
		{"bad wildcard host", []Cluster{ok, {Name: "west", Hosts: []string{"*foo.com"}}}, Options{}, `clusters[1] ("west").hosts[0]: "*foo.com": a wildcard must be "*" or start with "*."`},
		{"inner star host", []Cluster{{Name: "w", Hosts: []string{"a.*.com"}}}, Options{}, `clusters[0] ("w").hosts[0]: "a.*.com": "*" may only appear`},
		{"trailing star host", []Cluster{{Name: "w", Hosts: []string{"a.com*"}}}, Options{}, `hosts[0]: "a.com*": "*" may only appear`},
		{"star dot only", []Cluster{{Name: "w", Hosts: []string{"*."}}}, Options{}, `hosts[0]: "*.": empty label`},
		{"uppercase host", []Cluster{{Name: "w", Hosts: []string{"ok.com", "API.com"}}}, Options{}, `clusters[0] ("w").hosts[1]: "API.com": must be lowercase`},
		{"trailing dot host", []Cluster{{Name: "w", Hosts: []string{"a.com."}}}, Options{}, `hosts[0]: "a.com.": must not end with "."`},
		{"empty label host", []Cluster{{Name: "w", Hosts: []string{"a..com"}}}, Options{}, `hosts[0]: "a..com": empty label`},
		{"leading dot host", []Cluster{{Name: "w", Hosts: []string{".a.com"}}}, Options{}, `hosts[0]: ".a.com": empty label`},
		{"empty host", []Cluster{{Name: "w", Hosts: []string{""}}}, Options{}, `hosts[0]: "": empty pattern`},
		{"underscore host", []Cluster{{Name: "w", Hosts: []string{"a_b.com"}}}, Options{}, `hosts[0]: "a_b.com": invalid character '_'`},
		{"hyphen host", []Cluster{{Name: "w", Hosts: []string{"-a.com"}}}, Options{}, `hosts[0]: "-a.com": label "-a" must start and end with a letter or digit`},
		{"long label", []Cluster{{Name: "w", Hosts: []string{strings.Repeat("a", 64) + ".com"}}}, Options{}, `is longer than 63 characters`},
		{"long host", []Cluster{{Name: "w", Hosts: []string{strings.Repeat("a.", 127) + "com"}}}, Options{}, `longer than 253 characters`},
		{"empty grant", []Cluster{{Name: "w", ClusterScoped: []string{""}}}, Options{}, `clusters[0] ("w").clusterScoped[0]: must not be empty`},
		{"glob grant", []Cluster{{Name: "w", ClusterScoped: []string{"istio/*"}}}, Options{}, `clusters[0] ("w").clusterScoped[0]: "istio/*": a collection name, or "*" alone`},
		{"bad suffix", []Cluster{ok}, Options{DomainSuffix: "Cluster.local"}, `options.DomainSuffix: "Cluster.local": must be lowercase`},
		{"wildcard suffix", []Cluster{ok}, Options{DomainSuffix: "*.local"}, `options.DomainSuffix: "*.local": must not be a wildcard`},
		{"star suffix", []Cluster{ok}, Options{DomainSuffix: "*"}, `options.DomainSuffix: "*": must not be a wildcard`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.clusters, tc.opts)
			if err == nil {
				t.Fatalf("New = %v, nil; want an error containing %q", p, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error:\n %v\nwant it to contain\n %s", err, tc.want)
			}
		})
	}
}

func TestNewReportsEveryProblem(t *testing.T) {
	_, err := New([]Cluster{{Name: "a", Namespaces: []string{"A"}, Hosts: []string{"B.com"}}, {}}, Options{})
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{`clusters[0] ("a").namespaces[0]`, `clusters[0] ("a").hosts[0]`, `clusters[1].name`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestNewAcceptsValid(t *testing.T) {
	valid := []Cluster{
		{Name: "a", Namespaces: []string{"*", "a", "team-*", "0-9", strings.Repeat("a", 63), strings.Repeat("a", 63) + "*"},
			Hosts:         []string{"*", "*.com", "a.b.c", "localhost", "x-1.example.com", "*." + strings.Repeat("a", 63) + ".com"},
			ClusterScoped: []string{"*", vsColl}},
		{Name: "empty"},
	}
	if _, err := New(valid, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(nil, Options{DomainSuffix: "mesh.internal"}); err != nil {
		t.Fatal(err)
	}
}

func TestClusterIsACopy(t *testing.T) {
	in := []Cluster{{Name: "a", Namespaces: []string{"shop"}, Hosts: []string{"a.com"}, ClusterScoped: []string{cspColl}}}
	p := mustNew(t, in, Options{})
	in[0].Namespaces[0] = "other"
	in[0].Hosts[0] = "b.com"

	got, ok := p.Cluster("a")
	if !ok || got.Name != "a" || !slices.Equal(got.Namespaces, []string{"shop"}) || !slices.Equal(got.Hosts, []string{"a.com"}) ||
		!slices.Equal(got.ClusterScoped, []string{cspColl}) {
		t.Fatalf("Cluster(a) = %+v, %v", got, ok)
	}
	got.Namespaces[0] = "mutated"
	if again, _ := p.Cluster("a"); again.Namespaces[0] != "shop" {
		t.Fatal("Cluster returned the policy's own slice")
	}
	if err := p.Check("a", Object{Collection: vsColl, Name: "shop/x", Hosts: []string{"a.com"}}); err != nil {
		t.Fatalf("mutating New's input changed the policy: %v", err)
	}
	if _, ok := p.Cluster("b"); ok {
		t.Fatal("Cluster(b) found")
	}
}

func TestCheckAcceptDoesNotAllocate(t *testing.T) {
	p := mustNew(t, testClusters, Options{})
	objs := []struct {
		cluster string
		obj     Object
	}{
		{"east", Object{Collection: vsColl, Name: "shop/a", Hosts: []string{"API.example.com.", "x.y.east.example.com", "reviews", "*.east.example.com"}}},
		{"east", Object{Collection: gwColl, Name: "shop/gw", Hosts: []string{"./*", "team-a/*", "*/api.example.com", "~/*"}}},
		{"admin", Object{Collection: cspColl, Name: "global"}},
	}
	for _, o := range objs {
		if n := testing.AllocsPerRun(100, func() {
			if err := p.Check(o.cluster, o.obj); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("Check(%q, %+v): %v allocations, want 0", o.cluster, o.obj, n)
		}
	}
}

func TestRejectionIsAnError(t *testing.T) {
	var err error = &Rejection{Reason: "because"}
	if err.Error() != "because" {
		t.Fatal(err)
	}
}

func TestKindOf(t *testing.T) {
	tests := map[string]kind{
		"istio/networking/v1alpha3/virtualservices": kindVirtualService,
		"istio/networking/v1beta1/serviceentries":   kindServiceEntry,
		"istio/networking/v1/destinationrules":      kindDestinationRule,
		"istio/networking/v1alpha3/gateways":        kindGateway,
		"istio/networking/v1alpha3/sidecars":        kindSidecar,
		"networking.istio.io/v1/VirtualService":     kindVirtualService,
		"networking.istio.io/v1beta1/ServiceEntry":  kindServiceEntry,
		"networking.istio.io/v1alpha3/Gateway":      kindGateway,
		"networking.istio.io/v1/DestinationRule":    kindDestinationRule,
		"networking.istio.io/v1/Sidecar":            kindSidecar,
		"istio/networking/v1alpha3/envoyfilters":    kindNone,
		"istio/networking/virtualservices":          kindNone,
		"istio/networking//virtualservices":         kindNone,
		"istio/networking/v1/x/virtualservices":     kindNone,
		"k8s/gateway_api/v1/gateways":               kindNone,
		"gateway.networking.k8s.io/v1/Gateway":      kindNone,
		"networking.istio.io/v1/virtualservices":    kindNone,
		"istio/networking/v1alpha3/VirtualService":  kindNone,
		"":                kindNone,
		"virtualservices": kindNone,
		"istio/security/v1beta1/authorizationpolicy": kindNone,
	}
	for c, want := range tests {
		if got := kindOf(c); got != want {
			t.Errorf("kindOf(%q) = %v, want %v", c, got, want)
		}
		if got := ClaimsHosts(c); got != (want != kindNone) {
			t.Errorf("ClaimsHosts(%q) = %v", c, got)
		}
	}
}

// TestCheckHostileSizes: whatever a cluster pushes, Check's work and its reason stay bounded.
func TestCheckHostileSizes(t *testing.T) {
	p := mustNew(t, testClusters, Options{})
	dots := strings.Repeat("a.", 1<<20) + "com" // 2 MiB, a million labels
	longNS := strings.Repeat("n.", 1<<19) + "n"
	tests := []struct {
		cluster string
		obj     Object
		want    string
	}{
		{"admin", Object{Collection: vsColl, Name: "shop/a", Hosts: []string{dots}}, `is longer than 253 characters (cluster "admin")`},
		{"east", Object{Collection: vsColl, Name: "shop/a", Hosts: []string{strings.Repeat("a.", 126) + "com"}}, `is longer than 253 characters`},
		{"admin", Object{Collection: vsColl, Name: longNS + "/a", Hosts: []string{"reviews"}}, `host "reviews" is longer than 253 characters (cluster "admin")`},
		{"east", Object{Collection: gwColl, Name: "shop/a", Hosts: []string{longNS + "/reviews"}}, `is longer than 253 characters`},
		{"east", Object{Collection: vsColl, Name: longNS + "/a"}, `..." is not owned by cluster "east"`},
		{"east", Object{Collection: vsColl, Name: longNS}, `..." needs an explicit grant`},
		{longNS, Object{Collection: vsColl, Name: "shop/a"}, `..." is not in the hub's configuration`},
	}
	for _, tc := range tests {
		err := p.Check(tc.cluster, tc.obj)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %.200v, want it to contain %q", err, tc.want)
			continue
		}
		if len(err.Error()) > 600 {
			t.Errorf("reason is %d bytes long", len(err.Error()))
		}
	}
	// The longest acceptable name is accepted.
	max := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 57) + ".com"
	if len(max) != 253 {
		t.Fatal(len(max))
	}
	if err := p.Check("admin", Object{Collection: vsColl, Name: "shop/a", Hosts: []string{max + "."}}); err != nil {
		t.Fatal(err)
	}
	if got := p.OwnersOfHost(dots); got != nil {
		t.Fatalf("OwnersOfHost(huge) = %q", got)
	}
}

func TestClip(t *testing.T) {
	s := strings.Repeat("é", 100) // 200 bytes
	c := clip(s)
	if !strings.HasSuffix(c, "...") || len(c) > maxShown+3 || !utf8ValidPrefix(c) {
		t.Fatalf("clip = %q", c)
	}
	if clip("short") != "short" {
		t.Fatal("clip changed a short string")
	}
}

func utf8ValidPrefix(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }
