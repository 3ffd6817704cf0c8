package configcheck

import (
	"reflect"
	"strings"
	"testing"

	"github.com/meshfed/meshfed/hub"
)

const base = `insecure: true
collections: [vs, dr]
clusters:
- name: east
  identities: [east]
  namespaces: [shop]
  hosts: ["*.shop.example.com"]
- name: west
  identities: [west]
  namespaces: [pay]
  hosts: ["*.pay.example.com"]
routing:
  rules:
  - {name: all, identities: ["*"]}
`

// A file the hub takes has no errors; a file it refuses has the hub's error, with the line
// of the field the error names (or the nearest enclosing field the file has).
func TestCheckErrorsWithLines(t *testing.T) {
	if got := Check([]byte(base)); len(got) != 3 || !got[0].Warning || !strings.HasPrefix(got[0].Message, "http: not set: ") {
		// no http, and east and west are identities without a trust domain: three warnings.
		t.Errorf("base: %+v", got)
	}
	for _, tc := range []struct {
		name, file, want string
		line             int
	}{
		{"a host pattern", strings.Replace(base, `"*.pay.example.com"`, `"*.pay.example.com", "Bad Host"]`+"\n  #", 1),
			`clusters[1] ("west").hosts`, 11},
		{"an unknown field", strings.Replace(base, "  namespaces: [pay]", "  namespace: [pay]", 1), `unknown field "namespace"`, 10},
		// namespaces is a field of clusters[], not of limits: the line is limits'.
		{"a key valid elsewhere", base + "limits:\n  namespaces: [x]\n", `unknown field "namespaces"`, 16},
		{"an unknown field of a rule", strings.Replace(base, `identities: ["*"]}`, `identities: ["*"], cluster: [east]}`, 1), `unknown field "cluster"`, 14},
		{"YAML", base + "routing: [\n", "not valid YAML", 0},
		{"a duration", base + "warmUp: soon\n", `warmUp: "soon" is not a duration`, 15},
		{"a type", base + "maxMessageSize: big\n", "maxMessageSize: want a int", 15},
		{"a missing field", strings.Replace(base, "- name: west\n", "- name: \"\"\n", 1), `clusters[1].name: required`, 8},
		{"the trust domain", "trustDomain: Mesh\n" + base, `trustDomain: "Mesh" is not a SPIFFE trust domain`, 1},
	} {
		got := Check([]byte(tc.file))
		if len(got) != 1 || got[0].Warning || !strings.Contains(got[0].Message, tc.want) || tc.line != 0 && got[0].Line != tc.line {
			t.Errorf("%s: %+v, want an error containing %q at line %d", tc.name, got, tc.want, tc.line)
		}
	}
	if got := Check([]byte(base + "routing: [\n")); got[0].Line == 0 {
		t.Errorf("a YAML syntax error has no line: %+v", got)
	}
}

// Warnings: hosts two clusters both claim, routing rules that select nothing, identities
// that are not the trust domain's SPIFFE IDs; each at its field's line.
func TestCheckWarnings(t *testing.T) {
	file := `devCA: true
http: 127.0.0.1:9990
collections: [vs, dr]
clusters:
- name: east
  namespaces: [shop]
  hosts: ["*.example.com"]
- name: west
  namespaces: [pay]
  hosts: ["api.example.com", "*.pay.other.com"]
routing:
  rules:
  - name: gateways
    identities: ["spiffe://meshfed.local/sink/*"]
    collections: ["istio/networking/v1alpha3/gateways"]
  - name: north
    identities: ["spiffe://meshfed.local/sink/*"]
    clusters: [north]
  - name: elsewhere
    identities: ["spiffe://mesh.example.com/sink/*", "spiffe://meshfed.local/operator/*"]
`
	got := Check([]byte(file))
	want := []struct {
		line int
		msg  string
	}{
		{7, `clusters[0] ("east").hosts[0]: "*.example.com" overlaps clusters[1] ("west").hosts[0] "api.example.com": both may publish objects for api.example.com`},
		{15, `routing.rules[0] ("gateways").collections[0]: "istio/networking/v1alpha3/gateways" matches none of the hub's collections`},
		{18, `routing.rules[1] ("north").clusters[0]: "north" matches none of the configured clusters (east, west)`},
		{20, `routing.rules[2] ("elsewhere").identities[0]: "spiffe://mesh.example.com/sink/*" is of trust domain "mesh.example.com", not "meshfed.local"`},
		{20, `routing.rules[2] ("elsewhere").identities[1]: "spiffe://meshfed.local/operator/*" names kind "operator"`},
	}
	if len(got) != len(want) {
		t.Fatalf("%d findings, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if !got[i].Warning || got[i].Line != w.line || !strings.HasPrefix(got[i].Message, w.msg) {
			t.Errorf("finding %d: %+v, want line %d: %s", i, got[i], w.line, w.msg)
		}
	}
}

// Field paths as the hub's errors write them, and as encoding/json's type errors do.
func TestLine(t *testing.T) {
	file := `tenants:
- name: acme
  sinks: ["acme-*"]
  clusters:
  - name: east
    hosts:
    - a.example.com
    - b.example.com
staleness:
  collections:
    istio/networking/v1alpha3/virtualservices: 10m
`
	for path, want := range map[string]int{
		`tenants[0] ("acme").clusters[0] ("east").hosts[1]: bad`:                        8,
		`tenants[0].clusters[0].hosts: x`:                                               6,
		`tenants[0].clusters[0].identities: missing, so its cluster's line`:             5,
		`tenants.clusters.name: want a string`:                                          5,
		`staleness.collections[istio/networking/v1alpha3/virtualservices]: not a value`: 11,
		`tenants[3].name: no such tenant`:                                               1,
		`not valid YAML`:                                                                0,
		`[0]: not a path`:                                                               0,
	} {
		if got := Line([]byte(file), path); got != want {
			t.Errorf("Line(%q) = %d, want %d", path, got, want)
		}
	}
}

// Line takes any file and any message: it never panics, and a line it returns is one of
// the file's.
func FuzzLine(f *testing.F) {
	f.Add([]byte(base), `clusters[1] ("west").hosts[0]: bad`)
	f.Add([]byte("a: &x {b: [1, *x]}\n"), "a.b[1].b")
	f.Add([]byte("a:\n  - b\n"), `a[0] ("").b[`)
	f.Fuzz(func(t *testing.T, data []byte, path string) {
		line := Line(data, path)
		if line < 0 || line > strings.Count(string(data), "\n")+1 {
			t.Errorf("Line = %d for a file of %d lines", line, strings.Count(string(data), "\n")+1)
		}
		if l := UnknownKeyLine(data, reflect.TypeFor[hub.Config](), path); l < 0 || l > strings.Count(string(data), "\n")+1 {
			t.Errorf("UnknownKeyLine = %d for a file of %d lines", l, strings.Count(string(data), "\n")+1)
		}
	})
}
