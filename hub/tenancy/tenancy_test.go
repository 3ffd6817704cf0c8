package tenancy

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// two is a valid pair of tenants the refusals below break one field of.
func two() []Tenant {
	return []Tenant{
		{Name: "acme", Clusters: []string{"east", "west"}, Sinks: []string{"acme-*"}, Operators: []string{"acme-ops"}},
		{Name: "globex", Clusters: []string{"north"}, Sinks: []string{"globex-*"}, Operators: []string{"globex-ops"},
			Exports: []Export{{Name: "gw", To: []string{"acme"}}}},
	}
}

func TestNewAccepts(t *testing.T) {
	s, err := New("tenants", two())
	if err != nil {
		t.Fatal(err)
	}
	if s.Single() {
		t.Error("a Set from New is Single")
	}
}

// Every refusal names the field at fault, as a path into the configuration: the list, the
// tenant (index and name), the export (index and name) and the entry (index).
func TestNewRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(ts []Tenant) []Tenant
		want   string // the whole error
	}{
		{"empty name", func(ts []Tenant) []Tenant { ts[1].Name = ""; return ts },
			`tenants[1].name: "": a tenant's name is 1 to 63 characters`},
		{"long name", func(ts []Tenant) []Tenant { ts[1].Name = strings.Repeat("a", 64); return ts },
			`tenants[1].name: "` + strings.Repeat("a", 64) + `": a tenant's name is 1 to 63 characters`},
		{"upper case name", func(ts []Tenant) []Tenant { ts[0].Name = "Acme"; return ts },
			`tenants[0].name: "Acme": a tenant's name uses a-z, 0-9 and "-"`},
		{"a slash in a name", func(ts []Tenant) []Tenant { ts[0].Name = "a/b"; return ts },
			`tenants[0].name: "a/b": a tenant's name uses a-z, 0-9 and "-"`},
		{"name used twice", func(ts []Tenant) []Tenant { ts[1].Name = "acme"; return ts },
			`tenants[1].name: "acme" is used twice`},
		{"no sinks", func(ts []Tenant) []Tenant { ts[1].Sinks = nil; return ts },
			`tenants[1] ("globex").sinks: required: the identities of the tenant's sinks (exact, or a prefix ending in "*")`},
		{"empty sink pattern", func(ts []Tenant) []Tenant { ts[1].Sinks = []string{"globex-a", ""}; return ts },
			`tenants[1] ("globex").sinks[1]: "": want an exact value, or a prefix ending in one "*"`},
		{"inner star in a sink pattern", func(ts []Tenant) []Tenant { ts[1].Sinks = []string{"globex-*-istiod"}; return ts },
			`tenants[1] ("globex").sinks[0]: "globex-*-istiod": want an exact value, or a prefix ending in one "*"`},
		{"two stars", func(ts []Tenant) []Tenant { ts[1].Sinks = []string{"globex**"}; return ts },
			`tenants[1] ("globex").sinks[0]: "globex**": want an exact value, or a prefix ending in one "*"`},
		{"cluster in two tenants", func(ts []Tenant) []Tenant { ts[1].Clusters = []string{"north", "west"}; return ts },
			`tenants[1] ("globex").clusters[1]: cluster "west" is also tenant "acme"'s`},
		{"cluster twice in one tenant", func(ts []Tenant) []Tenant { ts[0].Clusters = []string{"east", "east"}; return ts },
			`tenants[0] ("acme").clusters[1]: cluster "east" is listed twice`},
		{"empty operator", func(ts []Tenant) []Tenant { ts[1].Operators = []string{""}; return ts },
			`tenants[1] ("globex").operators[0]: "" is not an operator's name (spiffe://<trustDomain>/operator/NAME): the name is empty`},
		{"operator as an identity", func(ts []Tenant) []Tenant {
			ts[1].Operators = []string{"globex-ops", "spiffe://td/operator/x"}
			return ts
		}, `tenants[1] ("globex").operators[1]: "spiffe://td/operator/x" is not an operator's name (spiffe://<trustDomain>/operator/NAME): "spiffe://td/operator/x" has ":": a name is ASCII letters, digits, '.', '-' and '_'`},
		{"operator pattern", func(ts []Tenant) []Tenant { ts[1].Operators = []string{"ops-*"}; return ts },
			`tenants[1] ("globex").operators[0]: "ops-*" is not an operator's name (spiffe://<trustDomain>/operator/NAME): "ops-*" has "*": a name is ASCII letters, digits, '.', '-' and '_'`},
		{"operator in two tenants", func(ts []Tenant) []Tenant { ts[1].Operators = []string{"acme-ops"}; return ts },
			`tenants[1] ("globex").operators[0]: operator "acme-ops" is also tenant "acme"'s`},
		{"sinks: the same identity", func(ts []Tenant) []Tenant {
			ts[0].Sinks = []string{"istiod"}
			ts[1].Sinks = []string{"istiod"}
			return ts
		},
			`tenants[1] ("globex").sinks[0]: "istiod" and tenant "acme"'s "istiod" could both match one identity: a sink belongs to one tenant`},
		{"sinks: a prefix and an identity it matches", func(ts []Tenant) []Tenant { ts[1].Sinks = []string{"globex-*", "acme-istiod"}; return ts },
			`tenants[1] ("globex").sinks[1]: "acme-istiod" and tenant "acme"'s "acme-*" could both match one identity: a sink belongs to one tenant`},
		{"sinks: an identity and a prefix that matches it", func(ts []Tenant) []Tenant { ts[0].Sinks = []string{"globex-x"}; return ts },
			`tenants[1] ("globex").sinks[0]: "globex-*" and tenant "acme"'s "globex-x" could both match one identity: a sink belongs to one tenant`},
		{"sinks: nested prefixes", func(ts []Tenant) []Tenant { ts[1].Sinks = []string{"acme-east-*"}; return ts },
			`tenants[1] ("globex").sinks[0]: "acme-east-*" and tenant "acme"'s "acme-*" could both match one identity: a sink belongs to one tenant`},
		{"sinks: every identity", func(ts []Tenant) []Tenant { ts[1].Sinks = []string{"*"}; return ts },
			`tenants[1] ("globex").sinks[0]: "*" and tenant "acme"'s "acme-*" could both match one identity: a sink belongs to one tenant`},
		{"export without a name", func(ts []Tenant) []Tenant { ts[1].Exports[0].Name = ""; return ts },
			`tenants[1] ("globex").exports[0].name: "" is empty or used twice`},
		{"export name used twice", func(ts []Tenant) []Tenant {
			ts[1].Exports = append(ts[1].Exports, Export{Name: "gw", To: []string{"acme"}})
			return ts
		}, `tenants[1] ("globex").exports[1].name: "gw" is empty or used twice`},
		{"export to nobody", func(ts []Tenant) []Tenant { ts[1].Exports[0].To = nil; return ts },
			`tenants[1] ("globex").exports[0] ("gw").to: required: the tenants it shares with`},
		{"export to an unknown tenant", func(ts []Tenant) []Tenant { ts[1].Exports[0].To = []string{"acme", "initech"}; return ts },
			`tenants[1] ("globex").exports[0] ("gw").to[1]: "initech" is not a tenant`},
		{"export to itself", func(ts []Tenant) []Tenant { ts[1].Exports[0].To = []string{"globex"}; return ts },
			`tenants[1] ("globex").exports[0] ("gw").to[0]: "globex" is the exporting tenant itself`},
		{"export of another tenant's cluster", func(ts []Tenant) []Tenant { ts[1].Exports[0].Clusters = []string{"north", "east"}; return ts },
			`tenants[1] ("globex").exports[0] ("gw").clusters[1]: "east" matches none of tenant "globex"'s clusters`},
		{"export of a prefix of another tenant's clusters", func(ts []Tenant) []Tenant { ts[1].Exports[0].Clusters = []string{"we*"}; return ts },
			`tenants[1] ("globex").exports[0] ("gw").clusters[0]: "we*" matches none of tenant "globex"'s clusters`},
		{"export of a bad cluster pattern", func(ts []Tenant) []Tenant { ts[1].Exports[0].Clusters = []string{"*th"}; return ts },
			`tenants[1] ("globex").exports[0] ("gw").clusters[0]: "*th": want an exact value, or a prefix ending in one "*"`},
		{"export of a bad collection pattern", func(ts []Tenant) []Tenant { ts[1].Exports[0].Collections = []string{""}; return ts },
			`tenants[1] ("globex").exports[0] ("gw").collections[0]: "": want an exact value, or a prefix ending in one "*"`},
		{"export of a bad namespace pattern", func(ts []Tenant) []Tenant { ts[1].Exports[0].Namespaces = []string{"edge", "*-prod"}; return ts },
			`tenants[1] ("globex").exports[0] ("gw").namespaces[1]: "*-prod": "*" may only end the pattern, or stand alone`},
		{"export with a bad label selector", func(ts []Tenant) []Tenant { ts[1].Exports[0].Labels = "a in (b"; return ts },
			`tenants[1] ("globex").exports[0] ("gw").labels: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New("tenants", tc.change(two()))
			if err == nil {
				t.Fatalf("accepted: %v", s.Names())
			}
			if got := err.Error(); got != tc.want && !(strings.HasSuffix(tc.want, ": ") && strings.HasPrefix(got, tc.want)) {
				t.Errorf("error\n  %s\nwant\n  %s", got, tc.want)
			}
		})
	}
}

// Patterns that no one identity could both match are two tenants'.
func TestNewSinksApart(t *testing.T) {
	for _, p := range [][2]string{
		{"acme-*", "acm"}, {"acme-*", "acme"}, {"acme-a*", "acme-b*"}, {"x", "y"}, {"acme-*", "globex-*"},
	} {
		ts := two()
		ts[0].Sinks, ts[1].Sinks = []string{p[0]}, []string{p[1]}
		if _, err := New("tenants", ts); err != nil {
			t.Errorf("sinks %q and %q: %v", p[0], p[1], err)
		}
	}
}

func TestMembership(t *testing.T) {
	s, err := New("tenants", []Tenant{
		{Name: "globex", Clusters: []string{"north", "edge"}, Sinks: []string{"globex-*", "spiffe://td/sink/g"}, Operators: []string{"g-ops"}},
		{Name: "acme", Clusters: []string{"west", "east"}, Sinks: []string{"acme-istiod"}, Operators: []string{"a-ops", "a-admin"}},
		{Name: "initech", Sinks: []string{"initech"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Names(); !reflect.DeepEqual(got, []string{"acme", "globex", "initech"}) {
		t.Errorf("Names = %v", got)
	}
	for _, tc := range []struct{ fn, arg, want string }{
		{"OfSink", "acme-istiod", "acme"},
		{"OfSink", "acme-istiod-2", ""}, // exact: not a prefix
		{"OfSink", "globex-", "globex"},
		{"OfSink", "globex-anything/at/all", "globex"},
		{"OfSink", "spiffe://td/sink/g", "globex"},
		{"OfSink", "spiffe://td/sink/gx", ""},
		{"OfSink", "initech", "initech"},
		{"OfSink", "", ""},
		{"OfSink", "globex", ""},
		{"OfCluster", "east", "acme"},
		{"OfCluster", "edge", "globex"},
		{"OfCluster", "south", ""},
		{"OfCluster", "", ""},
		{"OfOperator", "a-admin", "acme"},
		{"OfOperator", "g-ops", "globex"},
		{"OfOperator", "vendor", ""}, // no tenant names it: the vendor's
		{"OfOperator", "", ""},
	} {
		var got string
		switch tc.fn {
		case "OfSink":
			got = s.OfSink(tc.arg)
		case "OfCluster":
			got = s.OfCluster(tc.arg)
		case "OfOperator":
			got = s.OfOperator(tc.arg)
		}
		if got != tc.want {
			t.Errorf("%s(%q) = %q, want %q", tc.fn, tc.arg, got, tc.want)
		}
	}
	if !s.Has("initech") || s.Has("") || s.Has("default") {
		t.Error("Has: wrong")
	}
	if got := s.Clusters("acme"); !reflect.DeepEqual(got, []string{"east", "west"}) {
		t.Errorf("Clusters(acme) = %v, want them sorted", got)
	}
	if got := s.Clusters("initech"); len(got) != 0 {
		t.Errorf("Clusters(initech) = %v", got)
	}
	if got := s.Clusters("nobody"); got != nil {
		t.Errorf("Clusters(nobody) = %v", got)
	}
	if got := s.Sinks("globex"); !reflect.DeepEqual(got, []string{"globex-*", "spiffe://td/sink/g"}) {
		t.Errorf("Sinks(globex) = %v", got)
	}
	if got := s.Sinks("nobody"); got != nil {
		t.Errorf("Sinks(nobody) = %v", got)
	}
}

// Clusters() hands out a copy: the caller's changes do not reach the Set.
func TestClustersIsACopy(t *testing.T) {
	s, err := New("tenants", two())
	if err != nil {
		t.Fatal(err)
	}
	s.Clusters("acme")[0] = "mine"
	if got := s.Clusters("acme"); !reflect.DeepEqual(got, []string{"east", "west"}) {
		t.Errorf("Clusters(acme) after a caller's change = %v", got)
	}
}

const (
	vs = "istio/networking/v1alpha3/virtualservices"
	gw = "istio/networking/v1alpha3/gateways"
	se = "istio/networking/v1alpha3/serviceentries"
)

// exporting is globex (clusters north, north-2, south) sharing with acme and initech by
// every kind of condition, and acme sharing nothing; hooli receives nothing.
func exporting(t *testing.T) *Set {
	t.Helper()
	s, err := New("tenants", []Tenant{
		{Name: "acme", Clusters: []string{"east"}, Sinks: []string{"acme"}},
		{Name: "globex", Clusters: []string{"north", "north-2", "south"}, Sinks: []string{"globex"}, Exports: []Export{
			{Name: "gateways", To: []string{"acme"}, Collections: []string{gw}, Namespaces: []string{"edge"}},
			{Name: "north", To: []string{"initech"}, Clusters: []string{"north*"}, Collections: []string{"istio/networking/*"}, Namespaces: []string{"pub-*"}},
			{Name: "labelled", To: []string{"acme", "initech"}, Clusters: []string{"south"}, Labels: "share=yes,tier in (web)"},
			{Name: "scoped", To: []string{"initech"}, Clusters: []string{"south"}, Collections: []string{se}, Namespaces: []string{"*"}},
		}},
		{Name: "initech", Sinks: []string{"initech"}},
		{Name: "hooli", Sinks: []string{"hooli"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSees(t *testing.T) {
	s := exporting(t)
	web := map[string]string{"share": "yes", "tier": "web"}
	for _, tc := range []struct {
		tenant, cluster, coll, ns string
		lbls                      map[string]string
		want                      bool
	}{
		// Its own clusters: everything.
		{"acme", "east", vs, "shop", nil, true},
		{"acme", "east", se, "", nil, true},
		{"globex", "south", vs, "bank", nil, true},
		{"globex", "north-2", gw, "", nil, true},
		// gateways: by collection and namespace, of any of globex's clusters.
		{"acme", "north", gw, "edge", nil, true},
		{"acme", "south", gw, "edge", nil, true},
		{"acme", "north", vs, "edge", nil, false},
		{"acme", "north", gw, "edge-2", nil, false},
		{"acme", "north", gw, "", nil, false}, // cluster-scoped: only "*" includes it
		// north: by cluster prefix, collection prefix, namespace prefix.
		{"initech", "north", vs, "pub-a", nil, true},
		{"initech", "north-2", gw, "pub-", nil, true},
		{"initech", "north", "istio/security/v1beta1/authorizationpolicies", "pub-a", nil, false},
		{"initech", "north", vs, "pub", nil, false},
		{"initech", "north", vs, "", nil, false},
		{"acme", "north", vs, "pub-a", nil, false}, // shared with initech only
		// labelled: by labels, of south only.
		{"acme", "south", vs, "bank", web, true},
		{"initech", "south", se, "bank", web, true},
		{"acme", "south", vs, "bank", map[string]string{"share": "yes", "tier": "db"}, false},
		{"acme", "south", vs, "bank", map[string]string{"share": "yes"}, false},
		{"acme", "south", vs, "bank", nil, false},
		{"acme", "north", vs, "bank", web, false}, // not of south
		{"acme", "south", se, "", web, true},      // no namespace condition: cluster-scoped too
		// scoped: "*" includes the cluster-scoped objects.
		{"initech", "south", se, "", nil, true},
		{"initech", "south", se, "any", nil, true},
		{"initech", "south", vs, "", nil, false},
		// Nothing is shared with hooli; acme shares nothing; nobody and unknown clusters.
		{"hooli", "north", gw, "edge", web, false},
		{"hooli", "south", se, "", web, false},
		{"globex", "east", vs, "shop", web, false},
		{"initech", "east", vs, "shop", nil, false},
		{"", "east", vs, "shop", nil, false},
		{"", "north", gw, "edge", nil, false},
		{"nobody", "north", gw, "edge", nil, false},
		{"acme", "nowhere", vs, "shop", nil, false},
	} {
		if got := s.Sees(tc.tenant, tc.cluster, tc.coll, tc.ns, tc.lbls); got != tc.want {
			t.Errorf("Sees(%q, %q, %s, %q, %v) = %v, want %v", tc.tenant, tc.cluster, tc.coll[strings.LastIndex(tc.coll, "/")+1:], tc.ns, tc.lbls, got, tc.want)
		}
	}
}

// An export with no condition shares everything of every cluster of its tenant, the
// cluster-scoped objects included.
func TestSeesEverythingExported(t *testing.T) {
	s, err := New("tenants", []Tenant{
		{Name: "a", Clusters: []string{"c1", "c2"}, Sinks: []string{"a"}, Exports: []Export{{Name: "all", To: []string{"b"}}}},
		{Name: "b", Clusters: []string{"c3"}, Sinks: []string{"b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c1", "c2"} {
		for _, ns := range []string{"x", ""} {
			if !s.Sees("b", c, se, ns, nil) {
				t.Errorf("b does not see %s %q", c, ns)
			}
		}
	}
	if s.Sees("a", "c3", se, "x", nil) {
		t.Error("a sees b's: exports go one way")
	}
}

func TestSeesCluster(t *testing.T) {
	s := exporting(t)
	for _, tc := range []struct {
		tenant, cluster string
		want            bool
	}{
		{"acme", "east", true}, {"globex", "north", true}, {"globex", "east", false},
		{"acme", "north", true}, {"acme", "north-2", true}, {"acme", "south", true}, // gateways: every cluster of globex
		{"initech", "north", true}, {"initech", "north-2", true}, {"initech", "south", true},
		{"hooli", "north", false}, {"hooli", "south", false}, {"hooli", "east", false},
		{"", "east", false}, {"nobody", "north", false}, {"acme", "nowhere", false},
	} {
		if got := s.SeesCluster(tc.tenant, tc.cluster); got != tc.want {
			t.Errorf("SeesCluster(%q, %q) = %v, want %v", tc.tenant, tc.cluster, got, tc.want)
		}
	}
	// SeesCluster is what Sees could be true for: never false where Sees is true.
	for _, tenant := range []string{"acme", "initech", "hooli"} {
		for _, cluster := range []string{"north", "north-2", "south", "east"} {
			if s.Sees(tenant, cluster, se, "", map[string]string{"share": "yes", "tier": "web"}) && !s.SeesCluster(tenant, cluster) {
				t.Errorf("%s sees an object of %s, SeesCluster says it sees none", tenant, cluster)
			}
		}
	}
	// By clusters: initech receives only north* from north, and south's labelled and scoped.
	s2, err := New("tenants", []Tenant{
		{Name: "a", Clusters: []string{"c1", "c2"}, Sinks: []string{"a"}, Exports: []Export{{Name: "one", To: []string{"b"}, Clusters: []string{"c1"}}}},
		{Name: "b", Sinks: []string{"b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !s2.SeesCluster("b", "c1") || s2.SeesCluster("b", "c2") {
		t.Errorf("SeesCluster(b, c1) = %v, (b, c2) = %v; want true, false", s2.SeesCluster("b", "c1"), s2.SeesCluster("b", "c2"))
	}
}

// A tenant learns which exports concern it, and of one shared with it, not who else it is
// shared with.
func TestExports(t *testing.T) {
	s := exporting(t)
	names := func(sh []Shared) []string {
		var out []string
		for _, x := range sh {
			out = append(out, x.From+"/"+x.Name+"->"+strings.Join(x.To, ","))
		}
		return out
	}
	for _, tc := range []struct {
		tenant string
		want   []string
	}{
		{"", []string{"globex/gateways->acme", "globex/north->initech", "globex/labelled->acme,initech", "globex/scoped->initech"}},
		{"globex", []string{"globex/gateways->acme", "globex/north->initech", "globex/labelled->acme,initech", "globex/scoped->initech"}},
		{"acme", []string{"globex/gateways->acme", "globex/labelled->acme"}},
		{"initech", []string{"globex/north->initech", "globex/labelled->initech", "globex/scoped->initech"}},
		{"hooli", nil},
		{"nobody", nil},
	} {
		if got := names(s.Exports(tc.tenant)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Exports(%q) = %q, want %q", tc.tenant, got, tc.want)
		}
	}
}

func TestSingle(t *testing.T) {
	s := Single("default", []string{"west", "east"})
	if !s.Single() {
		t.Error("Single() = false")
	}
	if got := s.Names(); !reflect.DeepEqual(got, []string{"default"}) {
		t.Errorf("Names = %v", got)
	}
	for _, id := range []string{"", "anyone", "spiffe://td/sink/x"} {
		if got := s.OfSink(id); got != "default" {
			t.Errorf("OfSink(%q) = %q: every sink is the implicit tenant's", id, got)
		}
	}
	if got := s.OfCluster("east"); got != "default" {
		t.Errorf("OfCluster(east) = %q", got)
	}
	if got := s.OfCluster("south"); got != "" {
		t.Errorf("OfCluster(south) = %q", got)
	}
	if got := s.OfOperator("ops"); got != "" {
		t.Errorf("OfOperator(ops) = %q: every operator is the vendor's", got)
	}
	if !s.Sees("default", "west", vs, "", nil) || !s.SeesCluster("default", "east") {
		t.Error("the implicit tenant does not see its own clusters")
	}
	if s.Sees("default", "south", vs, "x", nil) || s.SeesCluster("default", "south") || s.Sees("", "west", vs, "x", nil) {
		t.Error("sees what is no cluster's, or for no tenant")
	}
	if got := s.Sinks("default"); !reflect.DeepEqual(got, []string{"*"}) {
		t.Errorf("Sinks = %v", got)
	}
	if got := s.Clusters("default"); !reflect.DeepEqual(got, []string{"east", "west"}) {
		t.Errorf("Clusters = %v", got)
	}
	if got := s.Exports(""); got != nil {
		t.Errorf("Exports = %v", got)
	}
	ts, err := New("tenants", nil)
	if err != nil || ts.Single() || len(ts.Names()) != 0 {
		t.Errorf("New with no tenants: %v, %v", ts, err)
	}
}

// FuzzTenancyNew: any tenants are a Set or an error, never a panic; an accepted Set keeps
// tenants apart: no sampled identity matches the sink patterns of two tenants, a cluster is
// its one tenant's, a tenant sees all of its own clusters and nothing of a cluster that
// SeesCluster says it sees none of, and Exports(t) are those that concern t.
func FuzzTenancyNew(f *testing.F) {
	f.Add([]byte(`[{"name":"acme","clusters":["east","west"],"sinks":["acme-*"],"operators":["o"]},
		{"name":"globex","clusters":["north"],"sinks":["globex-*","x"],"exports":[{"name":"gw","to":["acme"],"clusters":["no*"],"collections":["istio/*"],"namespaces":["edge","*"],"labels":"a=b"}]}]`))
	f.Add([]byte(`[{"name":"a","sinks":["*"]},{"name":"b","sinks":[""]}]`))
	f.Add([]byte(`[{"name":"a","sinks":["ab*"]},{"name":"b","sinks":["a*"]}]`))
	f.Add([]byte(`[{"name":"a","sinks":["a"],"clusters":["c","c"]}]`))
	f.Add([]byte(`[{"name":"a","sinks":["a"],"clusters":["c"],"exports":[{"name":"e","to":["b","b"],"labels":"x notin (y),!z"}]},{"name":"b","sinks":["b"]}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var specs []Tenant
		if json.Unmarshal(data, &specs) != nil {
			return
		}
		s, err := New("tenants", specs)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "tenants[") {
				t.Fatalf("an error that names no field: %v", err)
			}
			return
		}
		var ids []string
		for _, sp := range specs {
			for _, p := range sp.Sinks {
				body := strings.TrimSuffix(p, "*")
				ids = append(ids, body, body+"x", body+"-", strings.TrimSuffix(body, body[len(body)/2:]))
			}
		}
		for _, id := range ids {
			var of []string
			for _, sp := range specs {
				for _, p := range sp.Sinks {
					if body, prefix := strings.CutSuffix(p, "*"); id == p || prefix && strings.HasPrefix(id, body) {
						of = append(of, sp.Name)
						break
					}
				}
			}
			if len(of) > 1 {
				t.Fatalf("identity %q matches the sinks of tenants %v", id, of)
			}
			if want := strings.Join(of, ""); s.OfSink(id) != want {
				t.Fatalf("OfSink(%q) = %q, want %q", id, s.OfSink(id), want)
			}
		}
		for _, sp := range specs {
			for _, c := range sp.Clusters {
				if s.OfCluster(c) != sp.Name || !s.Sees(sp.Name, c, "any", "", nil) || !s.SeesCluster(sp.Name, c) {
					t.Fatalf("cluster %q: of %q, want %q, or its tenant does not see it", c, s.OfCluster(c), sp.Name)
				}
				for _, other := range s.Names() {
					if other != sp.Name && !s.SeesCluster(other, c) && s.Sees(other, c, "istio/x", "", nil) {
						t.Fatalf("%s sees an object of %s, SeesCluster says none", other, c)
					}
				}
			}
			for _, x := range s.Exports(sp.Name) {
				if x.From != sp.Name && !reflect.DeepEqual(x.To, []string{sp.Name}) {
					t.Fatalf("Exports(%q) holds %s/%s to %v", sp.Name, x.From, x.Name, x.To)
				}
			}
		}
	})
}
