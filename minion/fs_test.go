package minion

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	vsColl = "istio/networking/v1alpha3/virtualservices"
	drColl = "istio/networking/v1alpha3/destinationrules"
	efColl = "istio/networking/v1alpha3/envoyfilters"
)

func testLog(t testing.TB) *slog.Logger { return testlog.New(t) }

func write(t testing.TB, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	// Write to a temp file and rename, as editors and ConfigMap mounts do.
	tmp := p + ".tmp~"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

// names returns collection's published names -> versions.
func published(c *mcp.Cache, collection string) map[string]string {
	out := map[string]string{}
	for _, e := range c.Entries(collection) {
		out[e.Name] = e.Version
	}
	return out
}

// eventually polls cond for up to 10 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, 10*time.Second, what, cond)
}

func keys(m map[string]string) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sortStrings(ks)
	return strings.Join(ks, ",")
}

// startFileSource runs a source reading root into a cache of colls (VirtualServices and
// DestinationRules when none are given) until the test ends.
func startFileSource(t *testing.T, root string, colls ...string) (*FileSource, *mcp.Cache) {
	t.Helper()
	if len(colls) == 0 {
		colls = []string{vsColl, drColl}
	}
	cache := mcp.NewCache(colls...)
	var kinds []Kind
	for _, c := range colls {
		kinds = append(kinds, mustKind(t, c))
	}
	store := NewStore(cache, []string{"fs"}, testLog(t))
	src := NewFileSource("fs", root, kinds, store, testLog(t), nil)
	src.debounce = 10 * time.Millisecond
	testrun.Start(t, "Run", src.Run)
	eventually(t, "first scan", src.Synced)
	return src, cache
}

const vsYAML = `apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata:
  name: %s
%s
spec:
  hosts: [%s]
`

func vsDoc(name, nsLine, host string) string {
	return strings.NewReplacer("%s\n%s", "").Replace(sprintf(vsYAML, name, nsLine, host))
}

func TestFileSourceLifecycle(t *testing.T) {
	root := t.TempDir()
	write(t, root, "root.yaml", vsDoc("top", "  namespace: explicit", "a.example.com"))
	write(t, root, "shop/cart.yaml", vsDoc("cart", "", "cart.example.com")+"---\n# a comment-only document\n---\n"+
		"apiVersion: networking.istio.io/v1beta1\nkind: DestinationRule\nmetadata: {name: cart}\nspec: {host: cart}\n"+
		"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: ignored}\n")
	write(t, root, "shop/deep/er/pay.json", `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"pay"},"spec":{"hosts":["pay"]}}`)
	write(t, root, "nons.yaml", vsDoc("plain", "", "p"))
	write(t, root, "notes.txt", "not config")
	src, cache := startFileSource(t, root)

	if got := keys(published(cache, vsColl)); got != "default/plain,explicit/top,shop/cart,shop/pay" {
		t.Fatalf("virtualservices = %s", got)
	}
	if got := keys(published(cache, drColl)); got != "shop/cart" {
		t.Fatalf("destinationrules = %s", got)
	}
	if p := src.Problems(); len(p) != 0 {
		t.Fatalf("problems = %v", p)
	}
	v0 := published(cache, vsColl)["shop/cart"]

	t.Run("edit", func(t *testing.T) {
		write(t, root, "shop/cart.yaml", vsDoc("cart", "", "cart2.example.com"))
		eventually(t, "edited version", func() bool { v := published(cache, vsColl)["shop/cart"]; return v != "" && v != v0 })
		eventually(t, "dr removed with its document", func() bool { return len(published(cache, drColl)) == 0 })
	})
	v1 := published(cache, vsColl)["shop/cart"]

	t.Run("break keeps the file's objects", func(t *testing.T) {
		write(t, root, "shop/cart.yaml", "apiVersion: networking.istio.io/v1alpha3\nkind: VirtualService\nmetadata:\n  name: cart\nspec:\n  hosts: [a\n  b: c\n")
		eventually(t, "syntax problem reported", func() bool {
			p := src.Problems()
			return len(p) == 1 && strings.HasPrefix(p[0].Where, filepath.Join("shop", "cart.yaml")+":") && strings.Contains(p[0].Reason, "previous objects stay")
		})
		if v := published(cache, vsColl)["shop/cart"]; v != v1 {
			t.Fatalf("broken file changed the published object: %s -> %s", v1, v)
		}
	})

	t.Run("fix", func(t *testing.T) {
		write(t, root, "shop/cart.yaml", vsDoc("cart", "", "cart3.example.com"))
		eventually(t, "fixed", func() bool { v := published(cache, vsColl)["shop/cart"]; return v != v1 && len(src.Problems()) == 0 })
	})
	v3 := published(cache, vsColl)["shop/cart"]

	t.Run("invalid spec keeps the last good version and names the field", func(t *testing.T) {
		write(t, root, "shop/cart.yaml", "apiVersion: networking.istio.io/v1alpha3\nkind: VirtualService\nmetadata: {name: cart}\nspec:\n  hosts: [x]\n  http:\n  - timeout: soon\n---\n"+vsDoc("other", "", "o"))
		eventually(t, "invalid spec reported", func() bool {
			p := src.Problems()
			return len(p) == 1 && p[0].Where == filepath.Join("shop", "cart.yaml")+":1" && strings.Contains(p[0].Reason, "spec.http[0].timeout")
		})
		eventually(t, "other published", func() bool { return published(cache, vsColl)["shop/other"] != "" })
		if v := published(cache, vsColl)["shop/cart"]; v != v3 {
			t.Fatalf("invalid update replaced the last good version")
		}
	})

	t.Run("rename", func(t *testing.T) {
		if err := os.Rename(filepath.Join(root, "nons.yaml"), filepath.Join(root, "renamed.yaml")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "rescan after rename", func() bool {
			src.mu.Lock()
			defer src.mu.Unlock()
			_, ok := src.files[filepath.Join(root, "renamed.yaml")]
			return ok
		})
		if published(cache, vsColl)["default/plain"] == "" {
			t.Fatal("renamed file's object vanished")
		}
	})

	t.Run("new namespace directory", func(t *testing.T) {
		write(t, root, "billing/sub/inv.yaml", vsDoc("inv", "", "inv"))
		eventually(t, "new directory's file", func() bool { return published(cache, vsColl)["billing/inv"] != "" })
	})

	t.Run("duplicate across files", func(t *testing.T) {
		write(t, root, "zz-dup.yaml", vsDoc("top", "  namespace: explicit", "dup.example.com"))
		eventually(t, "duplicate reported", func() bool {
			for _, p := range src.Problems() {
				if p.Resource == "explicit/top" && strings.Contains(p.Reason, "also defined in root.yaml") {
					return true
				}
			}
			return false
		})
	})

	t.Run("delete", func(t *testing.T) {
		if err := os.RemoveAll(filepath.Join(root, "shop")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "objects removed", func() bool {
			p := published(cache, vsColl)
			return p["shop/cart"] == "" && p["shop/pay"] == "" && p["shop/other"] == "" && p["explicit/top"] != ""
		})
	})
}

func TestParseDocumentsReportsLines(t *testing.T) {
	_, _, err := parseDocuments("f.yaml", []byte("a: 1\n---\nb: 2\nc: [\n"), "")
	if err == nil || !strings.HasPrefix(err.Error(), "f.yaml:") {
		t.Fatalf("err = %v", err)
	}
	_, _, err = parseDocuments("f.yaml", []byte("apiVersion: v1\nkind: X\nkind: Y\n"), "")
	if err == nil || !strings.Contains(err.Error(), "f.yaml:3") || !strings.Contains(err.Error(), "kind") {
		t.Fatalf("duplicate key: err = %v", err)
	}
	objs, problems, err := parseDocuments("f.yaml", []byte("kind: X\n---\n- a\n---\napiVersion: v1\nkind: X\nmetadata: {name: nm, labels: {a: 1}}\n"), "ns")
	if err != nil || len(objs) != 0 || len(problems) != 3 {
		t.Fatalf("objs=%v problems=%v err=%v", objs, problems, err)
	}
	if problems[2].Where != "f.yaml:5" || !strings.Contains(problems[2].Reason, "labels") {
		t.Errorf("problem = %v", problems[2])
	}
}

// TestFileSourceDirectoryRemovedAndRecreated: while the directory is gone the minion keeps
// its objects and reports the gap in its status; when it is back its files are read and
// watched again.
func TestFileSourceDirectoryRemovedAndRecreated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove func(dir string) error
	}{
		{"removed", os.RemoveAll},
		{"moved away", func(dir string) error { return os.Rename(dir, dir+".old") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "conf")
			write(t, root, "a.yaml", vsDoc("a", "", "a"))
			write(t, root, "shop/b.yaml", vsDoc("b", "", "b"))
			m := runMinion(t, fsConfig(root, "push://"+deadAddr(t)))
			eventually(t, "the first scan", m.Ready)
			before := published(m.Cache(), vsColl)
			if keys(before) != "default/a,shop/b" {
				t.Fatalf("virtualservices = %v", before)
			}
			problems := func() []Problem { return m.Status().Sources[0].Problems }

			if err := tc.remove(root); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the missing directory in the status", func() bool {
				p := problems()
				return len(p) == 1 && p[0].Where == root && strings.Contains(p[0].Reason, "cannot read the directory")
			})
			if got := published(m.Cache(), vsColl); !maps.Equal(got, before) {
				t.Fatalf("published %v while the directory is missing, want %v", got, before)
			}
			if st := m.Status(); !st.Ready || !st.Sources[0].Synced {
				t.Errorf("status = %+v, want still synced: the objects read stay served", st)
			}

			// Back with one of its two files changed, the other gone, and a new one.
			write(t, root, "a.yaml", vsDoc("a", "", "a2"))
			write(t, root, "c.yaml", vsDoc("c", "", "c"))
			eventually(t, "the re-created directory's files", func() bool {
				p := published(m.Cache(), vsColl)
				return keys(p) == "default/a,default/c" && p["default/a"] != before["default/a"] && len(problems()) == 0
			})
			// With the problem gone nothing polls: this change arrives through the new watch.
			write(t, root, "billing/d.yaml", vsDoc("d", "", "d"))
			eventually(t, "a file written after the directory came back", func() bool {
				return published(m.Cache(), vsColl)["billing/d"] != ""
			})
		})
	}
}

// luaEnvoyFilter carries Lua whose first line, a Lua comment, starts with "---".
const luaEnvoyFilter = `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata:
  name: lua-header
  namespace: shop
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.lua
        typedConfig:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          inlineCode: |
            --- adds a header
            function envoy_on_response(handle)
              handle:headers():add("x-lua", "1")
            end
`

const luaCode = "--- adds a header\nfunction envoy_on_response(handle)\n  handle:headers():add(\"x-lua\", \"1\")\nend\n"

// TestFileSourceServesLuaEnvoyFilterWhole: the Lua reaches the cache whole, with the object
// that follows it in the file.
func TestFileSourceServesLuaEnvoyFilterWhole(t *testing.T) {
	root := t.TempDir()
	write(t, root, "shop/lua.yaml", luaEnvoyFilter+"---\n"+vsDoc("after", "", "after"))
	src, cache := startFileSource(t, root, efColl, vsColl)
	if p := src.Problems(); len(p) != 0 {
		t.Fatalf("problems = %v", p)
	}
	if got := keys(published(cache, vsColl)); got != "shop/after" {
		t.Errorf("virtualservices = %s", got)
	}
	entries := cache.Entries(efColl)
	if len(entries) != 1 {
		t.Fatalf("%d envoyfilters published", len(entries))
	}
	r, err := entries[0].Decode()
	if err != nil {
		t.Fatal(err)
	}
	var ef networking.EnvoyFilter
	if err := r.Body.UnmarshalTo(&ef); err != nil {
		t.Fatal(err)
	}
	code := ef.GetConfigPatches()[0].GetPatch().GetValue().GetFields()["typedConfig"].GetStructValue().GetFields()["inlineCode"].GetStringValue()
	if code != luaCode {
		t.Errorf("inlineCode = %q, want %q", code, luaCode)
	}
}

// TestFileSourceRefusesAFileThatDoesNotParseWhole: none of such a file is published, and
// what it published before stays.
func TestFileSourceRefusesAFileThatDoesNotParseWhole(t *testing.T) {
	root := t.TempDir()
	write(t, root, "shop/two.yaml", vsDoc("a", "", "a")+"---\n"+vsDoc("b", "", "b"))
	src, cache := startFileSource(t, root)
	before := published(cache, vsColl)
	if keys(before) != "shop/a,shop/b" {
		t.Fatalf("virtualservices = %v", before)
	}
	for _, tc := range []struct{ name, content, where, reason string }{
		// A parser reads the first document and stops at "..."; b (and the change to a) must
		// not go out without the rest.
		{"content after the document end marker", vsDoc("a", "", "a2") + "...\n" + vsDoc("b", "", "b2") + "---\n" + vsDoc("c", "", "c"), "shop/two.yaml:8", "did not find expected <document start>"},
		{"--- at column 0 with content", vsDoc("a", "", "a2") + "--- adds a header\n" + vsDoc("c", "", "c"), "shop/two.yaml:8", "invalid Yaml document separator: adds a header"},
		{"a second document after a lone CR", strings.ReplaceAll(vsDoc("a", "", "a2")+"---\n"+vsDoc("c", "", "c"), "\n", "\r"), "shop/two.yaml:1", "a second document starts inside this one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write(t, root, "shop/two.yaml", tc.content)
			eventually(t, "the file refused at "+tc.where, func() bool {
				p := src.Problems()
				return len(p) == 1 && p[0].Where == filepath.FromSlash(tc.where) && strings.HasPrefix(p[0].Reason, tc.reason) &&
					strings.Contains(p[0].Reason, "previous objects stay")
			})
			if got := published(cache, vsColl); !maps.Equal(got, before) {
				t.Fatalf("published %v, want the file's previous objects %v", got, before)
			}
		})
	}
}

// TestParseDocumentsYAMLStream: documents split where YAML splits them, never inside a
// scalar, and a stream that cannot be split by lines is refused whole.
func TestParseDocumentsYAMLStream(t *testing.T) {
	obj := func(name, data string) string {
		return "apiVersion: v1\nkind: K\nmetadata: {name: " + name + "}\ndata: " + data
	}
	for _, tc := range []struct {
		name, in string
		want     []string // line name data, per object
		err      string   // prefix of the error
	}{
		{name: "--- and ... inside a literal block scalar",
			in:   obj("a", "|\n  --- adds a header\n  x\n  ---\n  ...\n") + "---\n" + obj("b", "b\n"),
			want: []string{`1 a "--- adds a header\nx\n---\n...\n"`, `10 b "b"`}},
		{name: "--- inside a folded block scalar",
			in:   obj("a", ">\n  one\n  --- two\n\n  three\n"),
			want: []string{`1 a "one --- two\nthree\n"`}},
		{name: "comments, a leading ---, empty documents",
			in:   "# head\n---\n" + obj("a", "a # c\n") + "--- # next\n# only a comment\n---\n---\n" + obj("b", "'#b'\n"),
			want: []string{`3 a "a"`, `11 b "#b"`}},
		{name: "... ends a document",
			in:   obj("a", "a\n") + "... # end\n---\n" + obj("b", "b\n") + "...\n",
			want: []string{`1 a "a"`, `7 b "b"`}},
		{name: "CRLF",
			in:   strings.ReplaceAll(obj("a", "|\n  --- x\n  y\n")+"---\n"+obj("b", ">\n  b\n  c\n"), "\n", "\r\n"),
			want: []string{`1 a "--- x\ny\n"`, `8 b "b c\n"`}},
		{name: "JSON",
			in:   `{"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"}, "data": "---"}`,
			want: []string{`1 a "---"`}},
		{name: "a document after ... without ---", in: obj("a", "a\n") + "...\n" + obj("b", "b\n"), err: "f.yaml:5: "},
		{name: "--- followed by content", in: obj("a", "a\n") + "--- |\n  text\n", err: "f.yaml:5: invalid Yaml document separator: |"},
		{name: "----", in: obj("a", "a\n") + "---\n" + obj("b", "b\n") + "----\n", err: "f.yaml:10: invalid Yaml document separator: -"},
		{name: "--- after a CR", in: obj("a", "a\r---\r") + obj("b", "b\n"), err: "f.yaml:1: a second document"},
		{name: "--- after a LS", in: obj("a", "a\u2028---\u2028") + obj("b", "b\n"), err: "f.yaml:1: a second document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, problems, err := parseDocuments("f.yaml", []byte(tc.in), "ns")
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) || len(objs) != 0 {
					t.Fatalf("objects %d, err = %v, want %q", len(objs), err, tc.err)
				}
				return
			}
			if err != nil || len(problems) != 0 {
				t.Fatalf("err = %v, problems = %v", err, problems)
			}
			var got []string
			for _, o := range objs {
				got = append(got, fmt.Sprintf("%d %s %q", o.line, o.obj.Name, o.obj.Content["data"]))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// FuzzParseDocuments: arbitrary file content never panics, every problem names a line, and
// CRLF line breaks read as LF.
func FuzzParseDocuments(f *testing.F) {
	f.Add([]byte(vsDoc("a", "  namespace: n", "h")))
	f.Add([]byte("---\n---\nkind: [\n"))
	f.Add([]byte("apiVersion: a/b/c\nkind: K\nmetadata: {name: x, creationTimestamp: nope}\n"))
	f.Add([]byte(luaEnvoyFilter + "---\n" + vsDoc("b", "", "b")))
	f.Add([]byte("# c\n--- # c\napiVersion: v1\nkind: K\nmetadata: {name: a}\ndata: |\n  ---\n  ...\nfold: >-\n  --- a\n  b\n...\n---\n"))
	f.Add([]byte("apiVersion: v1\nkind: K\nmetadata: {name: a}\n...\napiVersion: v1\n"))
	f.Add([]byte("apiVersion: v1\r\nkind: K\r\nmetadata: {name: a}\r\ndata: |\r\n  --- x\r\n---\r\n"))
	f.Add([]byte("apiVersion: v1\rkind: K\rmetadata: {name: a}\r---\rkind: L\r"))
	f.Add([]byte("--- |\n  text\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, problems, err := parseDocuments("f.yaml", data, "dir")
		if err != nil && !strings.HasPrefix(err.Error(), "f.yaml:") {
			t.Fatalf("error without a line: %v", err)
		}
		for _, p := range problems {
			if !strings.HasPrefix(p.Where, "f.yaml:") {
				t.Fatalf("problem without a line: %v", p)
			}
		}
		lines := bytes.Count(data, []byte("\n")) + 1
		for _, o := range objs {
			if o.obj.Name == "" || o.gvk.Kind == "" {
				t.Fatalf("object without name or kind: %+v", o)
			}
			if o.line < 1 || o.line > lines {
				t.Fatalf("object at line %d of %d", o.line, lines)
			}
		}
		if bytes.ContainsRune(data, '\r') {
			return
		}
		crlf := bytes.ReplaceAll(data, []byte("\n"), []byte("\r\n"))
		objs2, problems2, err2 := parseDocuments("f.yaml", crlf, "dir")
		if fmt.Sprint(err) != fmt.Sprint(err2) || !reflect.DeepEqual(objs, objs2) || !reflect.DeepEqual(problems, problems2) {
			t.Fatalf("CRLF reads differently:\nLF:   %v %v %v\nCRLF: %v %v %v", objs, problems, err, objs2, problems2, err2)
		}
	})
}

// A Kubernetes ConfigMap mount: every file is a symlink through ..data to a timestamped
// directory, and an update swaps ..data atomically. The swap is seen and the new content
// published; the timestamped directories themselves are not read.
func TestFileSourceFollowsConfigMapSwap(t *testing.T) {
	root := t.TempDir()
	write(t, root, "..2026_11_23_a/shop.yaml", vsDoc("cart", "  namespace: shop", "cart.example.com"))
	if err := os.Symlink("..2026_11_23_a", filepath.Join(root, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/shop.yaml", filepath.Join(root, "shop.yaml")); err != nil {
		t.Fatal(err)
	}
	_, cache := startFileSource(t, root)
	eventually(t, "shop/cart published", func() bool { return keys(published(cache, vsColl)) == "shop/cart" })
	first := published(cache, vsColl)["shop/cart"]

	// The kubelet's update: a new timestamped directory, a new link renamed over ..data.
	write(t, root, "..2026_11_23_b/shop.yaml", vsDoc("cart", "  namespace: shop", "cart2.example.com"))
	if err := os.Symlink("..2026_11_23_b", filepath.Join(root, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "..data_tmp"), filepath.Join(root, "..data")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the swapped content published", func() bool {
		v, ok := published(cache, vsColl)["shop/cart"]
		return ok && v != first && len(published(cache, vsColl)) == 1
	})
}

// A file under a subdirectory that could not be listed keeps its objects (scan); only
// the directory itself and what is inside it count, not a sibling sharing its prefix.
func TestUnder(t *testing.T) {
	dirs := []string{filepath.Join("r", "team")}
	for path, want := range map[string]bool{
		filepath.Join("r", "team"):            true,
		filepath.Join("r", "team", "a.yaml"):  true,
		filepath.Join("r", "team", "x", "b"):  true,
		filepath.Join("r", "teams", "a.yaml"): false,
		filepath.Join("r", "top.yaml"):        false,
	} {
		if got := under(path, dirs); got != want {
			t.Errorf("under(%q) = %v, want %v", path, got, want)
		}
	}
}
