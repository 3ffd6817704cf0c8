package routing

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/internal/testkit/golden"
)

// scenarioSink and scenarioResource are the YAML forms of a golden file's sinks and
// resources.
type scenarioSink struct {
	Identity    string            `json:"identity"`
	Node        string            `json:"node"`
	Annotations map[string]string `json:"annotations"`
}

type scenarioResource struct {
	Collection string            `json:"collection"`
	Cluster    string            `json:"cluster"`
	Name       string            `json:"name"`
	Labels     map[string]string `json:"labels"`
}

// TestGolden runs testdata/*.txtar: a routing config, sinks and resources in; for each sink
// its subset and the resources it receives out. `go test -update` rewrites the want sections.
func TestGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txtar")
	if len(files) == 0 {
		t.Fatal("no golden files")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f := golden.Parse(data)
			cfgText, _ := f.Get("config.yaml")
			var cfg Config
			if err := yaml.UnmarshalStrict([]byte(cfgText), &cfg); err != nil {
				t.Fatalf("config.yaml: %v", err)
			}
			var sinks []scenarioSink
			var resources []scenarioResource
			sinksText, _ := f.Get("sinks.yaml")
			resText, _ := f.Get("resources.yaml")
			if err := yaml.UnmarshalStrict([]byte(sinksText), &sinks); err != nil {
				t.Fatalf("sinks.yaml: %v", err)
			}
			if err := yaml.UnmarshalStrict([]byte(resText), &resources); err != nil {
				t.Fatalf("resources.yaml: %v", err)
			}
			var b strings.Builder
			// As the hub routes without a trust domain: node ids are claims.
			table, err := New(cfg, Options{})
			if err != nil {
				fmt.Fprintf(&b, "config error: %v\n", err)
			} else {
				for _, s := range sinks {
					sub := table.Select(Sink{Identity: s.Identity, NodeID: s.Node, Annotations: s.Annotations})
					fmt.Fprintf(&b, "sink identity=%q node=%q -> rules [%s]\n", s.Identity, s.Node, sub.Key())
					var lines []string
					for _, r := range resources {
						ns, _, ok := strings.Cut(r.Name, "/")
						if !ok {
							ns = ""
						}
						if sub.Includes(r.Collection, r.Cluster, ns, r.Labels) {
							lines = append(lines, fmt.Sprintf("  %s %s %s", r.Collection, r.Cluster, r.Name))
						}
					}
					sort.Strings(lines)
					for _, l := range lines {
						b.WriteString(l + "\n")
					}
				}
			}
			diff, err := golden.Check(path, f, b.String())
			if err != nil {
				t.Fatal(err)
			}
			if diff != "" {
				t.Errorf("%s differs (go test -update rewrites it):\n%s", path, diff)
			}
		})
	}
}

func TestSameRulesShareOneSubset(t *testing.T) {
	table, err := New(Config{Rules: []Rule{
		{Name: "prod", Identities: []string{"spiffe://m/sink/prod-*"}},
		{Name: "istio", Identities: []string{"spiffe://m/sink/*"}, NodeIDs: []string{"istiod-*"}, Collections: []string{"istio/*"}},
	}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := table.Select(Sink{Identity: "spiffe://m/sink/prod-1", NodeID: "istiod-a"})
	b := table.Select(Sink{Identity: "spiffe://m/sink/prod-2", NodeID: "istiod-b"})
	c := table.Select(Sink{Identity: "spiffe://m/sink/prod-3", NodeID: "other"})
	if a != b || a.Key() != "istio,prod" || c == a || c.Key() != "prod" {
		t.Fatalf("subsets %p %q, %p %q, %p %q", a, a.Key(), b, b.Key(), c, c.Key())
	}
	if none := table.Select(Sink{Identity: "spiffe://m/other"}); !none.Empty() || none.WantsCollection("istio/x") || none.Includes("istio/x", "c", "ns", nil) {
		t.Fatal("an unmatched sink got something without a default rule")
	}
}

func TestNewErrorsNameTheField(t *testing.T) {
	proven := Options{NodeIDsProven: true}
	for _, tc := range []struct {
		cfg  Config
		opts Options
		want string
	}{
		{Config{Rules: []Rule{{}}}, proven, "rules[0].name: required"},
		{Config{Rules: []Rule{{Name: "a"}, {Name: "a"}}}, proven, `rules[1].name: "a" is used twice`},
		{Config{Rules: []Rule{{Name: "a", Labels: "x in ("}}}, proven, "rules[0].labels"},
		{Config{Rules: []Rule{{Name: "a", Clusters: []string{""}}}}, proven, "rules[0].clusters[0]: empty pattern"},
		// Namespaces use the ownership's grammar (package hub/pattern).
		{Config{Rules: []Rule{{Name: "a", Namespaces: []string{"*-prod"}}}}, proven, `rules[0].namespaces[0]: "*-prod": "*" may only end the pattern`},
		{Config{Rules: []Rule{{Name: "a", Namespaces: []string{"shop", ""}}}}, proven, `rules[0].namespaces[1]: "": empty pattern`},
		{Config{Rules: []Rule{{Name: "a"}}, Default: &Rule{Name: "a"}}, proven, "default.name"},
		// A Subset's key joins its rules' names with ",": a rule named "a,b" would share the
		// Subset of the sinks that rules a and b select.
		{Config{Rules: []Rule{{Name: "a"}, {Name: "b"}, {Name: "a,b"}}}, proven, `rules[2].name: "a,b" contains ","`},
		{Config{Default: &Rule{Name: "x,y"}}, proven, `default.name: "x,y" contains ","`},
		{Config{Rules: []Rule{{Name: "a", Identities: []string{"*"}, Annotations: map[string]string{"": "x"}}}}, proven, "rules[0].annotations: empty key"},
		{Config{Rules: []Rule{{Name: "a", Unauthenticated: true, Identities: []string{"*"}}}}, proven, "rules[0].identities: an unauthenticated rule selects sinks that have no identity"},
		{Config{Default: &Rule{Unauthenticated: true}}, proven, "default: the default never serves"},
		{Config{Rules: []Rule{{Name: "a", Unauthenticated: true, Relays: true}}}, proven, "rules[0]: relays subscribe with their cluster's identity"},
		// Claims select nothing by themselves: annotations always, node ids unless proven,
		// relays' rules too.
		{Config{Rules: []Rule{{Name: "a", Identities: []string{"*"}}, {Name: "pay", Annotations: map[string]string{"team": "pay"}}}}, proven,
			"rules[1].annotations: annotations are what the sink claims, and select nothing by themselves: name identities too"},
		{Config{Rules: []Rule{{Name: "prod", NodeIDs: []string{"prod-*"}}}}, Options{},
			"rules[0].nodeIds: a SinkNode id is what the sink claims here, nothing proves it: name identities too"},
		{Config{Rules: []Rule{{Name: "prod", NodeIDs: []string{"prod-*"}, Annotations: map[string]string{"team": "pay"}}}}, Options{}, "rules[0].nodeIds:"},
		{Config{Rules: []Rule{{Name: "r", Relays: true, NodeIDs: []string{"east"}}}}, Options{}, "rules[0].nodeIds:"},
		{Config{Rules: []Rule{{Name: "r", Relays: true, Annotations: map[string]string{"a": "b"}}}}, proven, "rules[0].annotations:"},
		// The default selects by nothing: a condition on it would not hold.
		{Config{Default: &Rule{Name: "d", Identities: []string{"spiffe://m/sink/prod-*"}}}, proven, "default.identities: the default selects every sink no rule selects, by nothing"},
		{Config{Default: &Rule{Name: "d", NodeIDs: []string{"prod-*"}}}, proven, "default.nodeIds:"},
		{Config{Default: &Rule{Name: "d", Annotations: map[string]string{"team": "pay"}}}, proven, "default.annotations:"},
	} {
		if _, err := New(tc.cfg, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// Claims narrow, never grant: a sink whose identity some rule gives three objects and which
// claims the annotation and node id of a richer rule gets its three; a sink whose identity the
// richer rule names gets it only if it also claims the annotation. Node ids the caller proves
// select alone; unauthenticated rules alone select by claims.
func TestClaimsOnlyNarrow(t *testing.T) {
	rules := []Rule{
		{Name: "shop", Identities: []string{"spiffe://m/sink/*"}, Namespaces: []string{"shop"}},
		{Name: "pay-team", Identities: []string{"spiffe://m/sink/pay-*"}, Annotations: map[string]string{"team": "pay"}, Namespaces: []string{"pay"}},
		{Name: "pay-node", Identities: []string{"spiffe://m/sink/pay-*"}, NodeIDs: []string{"pay-istiod"}, Namespaces: []string{"pay"}},
		{Name: "anon", Unauthenticated: true, Annotations: map[string]string{"team": "pay"}, Namespaces: []string{"public"}},
	}
	claims := map[string]string{"team": "pay"}
	strict, err := New(Config{Rules: rules}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	proven, err := New(Config{Rules: append(rules, Rule{Name: "prod-name", NodeIDs: []string{"prod-*"}, Annotations: claims, Namespaces: []string{"ops"}})},
		Options{NodeIDsProven: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		table *Table
		sink  Sink
		want  string
	}{
		{strict, Sink{Identity: "spiffe://m/sink/shop-1", NodeID: "pay-istiod", Annotations: claims}, "shop"},
		{strict, Sink{Identity: "spiffe://m/sink/pay-1", Annotations: claims}, "pay-team,shop"},
		{strict, Sink{Identity: "spiffe://m/sink/pay-1"}, "shop"},
		{strict, Sink{Identity: "spiffe://m/sink/pay-1", NodeID: "pay-istiod"}, "pay-node,shop"},
		{strict, Sink{NodeID: "pay-istiod", Annotations: claims, Unauthenticated: true}, "anon"},
		// Proven node ids: the caller made the node id the certificate's name.
		{proven, Sink{Identity: "spiffe://m/sink/prod-1", NodeID: "prod-1", Annotations: claims}, "prod-name,shop"},
		{proven, Sink{Identity: "spiffe://m/sink/prod-1", NodeID: "prod-1"}, "shop"},
	} {
		if got := tc.table.Select(tc.sink).Key(); got != tc.want {
			t.Errorf("Select(%+v) = %q, want %q", tc.sink, got, tc.want)
		}
	}
}

// A sink without an authenticated identity is selected only by unauthenticated rules (by
// what it claims), never by others or the default; such rules select no other sink. (Node
// ids are proven here, as the hub proves them under a trust domain.)
func TestUnauthenticatedSinks(t *testing.T) {
	tab, err := New(Config{
		Rules: []Rule{
			{Name: "istiod-east", Unauthenticated: true, NodeIDs: []string{"istiod-east-*"}, Clusters: []string{"east"}},
			{Name: "by-node", NodeIDs: []string{"istiod-*"}},
		},
		Default: &Rule{Name: "everything"},
	}, Options{NodeIDsProven: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sink Sink
		want string
	}{
		{Sink{NodeID: "istiod-east-1", Unauthenticated: true}, "istiod-east"},
		{Sink{NodeID: "istiod-west-1", Unauthenticated: true}, ""},
		{Sink{NodeID: "istiod-east-1", Identity: "spiffe://td/sink/x"}, "by-node"},
		{Sink{NodeID: "other", Identity: "spiffe://td/sink/x"}, "everything"},
	} {
		if got := tab.Select(tc.sink).Key(); got != tc.want {
			t.Errorf("Select(%+v) = %q, want %q", tc.sink, got, tc.want)
		}
	}
}

// A relay (a cluster subscribing for its istiod) is selected only by rules for relays: a
// rule written for sinks, even one matching every identity or a node id of the same name,
// gives it nothing, nor does the default; a rule for relays selects no sink. (Node ids are
// proven, as under a trust domain.)
func TestRelaysOnlyByRelayRules(t *testing.T) {
	tab, err := New(Config{
		Rules: []Rule{
			{Name: "sink-east", NodeIDs: []string{"east"}},
			{Name: "every-identity", Identities: []string{"*"}},
			{Name: "east-relay", Relays: true, Identities: []string{"spiffe://td/cluster/east"}},
		},
		Default: &Rule{Name: "everything"},
	}, Options{NodeIDsProven: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sink Sink
		want string
	}{
		{Sink{Identity: "spiffe://td/cluster/east", NodeID: "east", Relay: true}, "east-relay"},
		{Sink{Identity: "spiffe://td/cluster/west", NodeID: "west", Relay: true}, ""},
		{Sink{Identity: "spiffe://td/sink/east", NodeID: "east"}, "every-identity,sink-east"},
		{Sink{Identity: "spiffe://td/cluster/east", NodeID: "east"}, "every-identity,sink-east"},
	} {
		if got := tab.Select(tc.sink).Key(); got != tc.want {
			t.Errorf("Select(%+v) = %q, want %q", tc.sink, got, tc.want)
		}
	}
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"a", "a", true}, {"a", "ab", false}, {"*", "", true}, {"*", "x/y", true},
		{"a*", "a", true}, {"a*", "abc", true}, {"*c", "abc", true}, {"a*c", "ac", true},
		{"a*c", "abbc", true}, {"a*c", "ab", false}, {"a*b*c", "a-b-c", true}, {"a*b*c", "a-c", false},
		{"spiffe://m/*/prod", "spiffe://m/x/y/prod", true}, {"ab*ba", "aba", false},
	} {
		if got := newGlob(tc.p).match(tc.s); got != tc.want {
			t.Errorf("%q ~ %q = %v, want %v", tc.p, tc.s, got, tc.want)
		}
	}
}

// FuzzSelect: any rules and sink never panic; a resource included by the subset is included
// by at least one of its rules' conditions, and Select is deterministic.
func FuzzSelect(f *testing.F) {
	f.Add("spiffe://m/*", "istiod-*", "istio/*", "c*", "ns", "a=b", "spiffe://m/x", "istiod-1", "istio/v", "c1", "ns")
	f.Fuzz(func(t *testing.T, idP, nodeP, collP, clP, nsP, sel, id, node, coll, cl, ns string) {
		table, err := New(Config{Rules: []Rule{{Name: "r", Identities: []string{idP}, NodeIDs: []string{nodeP},
			Collections: []string{collP}, Clusters: []string{clP}, Namespaces: []string{nsP}, Labels: sel}}}, Options{})
		if err != nil {
			return
		}
		s := Sink{Identity: id, NodeID: node}
		a, b := table.Select(s), table.Select(s)
		if a != b {
			t.Fatal("Select not deterministic")
		}
		in := a.Includes(coll, cl, ns, map[string]string{"a": "b"})
		if in && (!newGlob(collP).match(coll) || !newGlob(clP).match(cl) || !newGlob(nsP).match(ns)) {
			t.Fatal("included a resource its rule excludes")
		}
	})
}

func BenchmarkIncludes(b *testing.B) {
	var rules []Rule
	for i := range 20 {
		rules = append(rules, Rule{Name: fmt.Sprintf("r%02d", i), Collections: []string{"istio/networking/*"},
			Clusters: []string{fmt.Sprintf("c%02d-*", i)}, Namespaces: []string{"team-*"}, Labels: "mesh=shared"})
	}
	table, err := New(Config{Rules: rules}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	sub := table.Select(Sink{})
	lbls := map[string]string{"mesh": "shared", "app": "x"}
	b.ReportAllocs()
	for b.Loop() {
		sub.Includes("istio/networking/v1alpha3/virtualservices", "c19-east", "team-a", lbls)
	}
}
