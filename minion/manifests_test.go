package minion

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/mcp"
)

// readDocs parses a multi-document YAML file of the repository.
func readDocs(t *testing.T, rel string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, doc := range strings.Split(string(data), "\n---") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if len(m) > 0 {
			out = append(out, m)
		}
	}
	return out
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestTestCRDsCoverBuiltinKinds keeps test/kube/crds.yaml in step with the built-in table:
// every kind is there with its group, plural, scope, and the table's version served.
func TestTestCRDsCoverBuiltinKinds(t *testing.T) {
	type crd struct {
		kind, scope string
		versions    []string
	}
	crds := map[string]crd{} // group/plural -> crd
	for _, d := range readDocs(t, "test/kube/crds.yaml") {
		spec := d["spec"].(map[string]any)
		names := spec["names"].(map[string]any)
		c := crd{kind: names["kind"].(string), scope: spec["scope"].(string)}
		for _, v := range spec["versions"].([]any) {
			c.versions = append(c.versions, v.(map[string]any)["name"].(string))
		}
		crds[spec["group"].(string)+"/"+names["plural"].(string)] = c
	}
	for _, k := range BuiltinKinds() {
		c, ok := crds[k.Group+"/"+k.Resource]
		if !ok {
			t.Errorf("%s: no CRD for %s.%s", k.Collection, k.Resource, k.Group)
			continue
		}
		if c.kind != k.Kind || c.scope != "Namespaced" || !slices.Contains(c.versions, k.Version) {
			t.Errorf("%s: CRD %+v does not match %+v", k.Collection, c, k)
		}
	}
}

// TestDeployedRBACIsLeastPrivilege: the minion's ClusterRole grants get/list/watch on exactly
// the built-in kinds' resources and create/patch on events, nothing more.
func TestDeployedRBACIsLeastPrivilege(t *testing.T) {
	want := map[string]bool{}
	for _, k := range BuiltinKinds() {
		want[k.Group+"/"+k.Resource] = true
	}
	var role map[string]any
	for _, d := range readDocs(t, "deploy/minion/rbac.yaml") {
		if d["kind"] == "ClusterRole" {
			role = d
		}
	}
	if role == nil {
		t.Fatal("no ClusterRole in deploy/minion/rbac.yaml")
	}
	granted := map[string]bool{}
	for _, r := range role["rules"].([]any) {
		rule := r.(map[string]any)
		verbs := strings.Join(strs(rule["verbs"]), ",")
		for _, g := range strs(rule["apiGroups"]) {
			for _, res := range strs(rule["resources"]) {
				switch {
				case g == "" && res == "events":
					if verbs != "create,patch" {
						t.Errorf("events: verbs %s, want create,patch", verbs)
					}
				case want[g+"/"+res]:
					if verbs != "get,list,watch" {
						t.Errorf("%s/%s: verbs %s, want get,list,watch", g, res, verbs)
					}
					granted[g+"/"+res] = true
				default:
					t.Errorf("grants %s on %s/%s, which the minion does not need", verbs, g, res)
				}
			}
		}
	}
	for gr := range want {
		if !granted[gr] {
			t.Errorf("no read access to %s", gr)
		}
	}
}

// TestExamplesParse: the example directory that the default configuration publishes has no
// problems and covers several kinds.
func TestExamplesParse(t *testing.T) {
	root := filepath.Join(repoRoot(t), "examples/clusters/east")
	cfg := DefaultConfig()
	if cfg.Sources[0].URL != "fs://examples/clusters/east" {
		t.Fatalf("default source %s is not the example directory", cfg.Sources[0].URL)
	}
	kinds := BuiltinKinds()
	var colls []string
	for _, k := range kinds {
		colls = append(colls, k.Collection)
	}
	cache := mcp.NewCache(colls...)
	src := NewFileSource("fs", root, kinds, NewStore(cache, []string{"fs"}, testLog(t)), testLog(t), nil)
	if err := src.scan(nil); err != nil {
		t.Fatal(err)
	}
	if p := src.Problems(); len(p) != 0 {
		t.Fatalf("problems: %v", p)
	}
	total := 0
	for _, c := range colls {
		total += cache.Len(c)
	}
	if total != 6 || cache.Len(vsColl) != 1 {
		t.Fatalf("examples publish %d objects, want 6", total)
	}
	for _, f := range []string{"examples/minion.yaml"} {
		if _, err := LoadConfig(filepath.Join(repoRoot(t), f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
