package minion

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	vsColl = "istio/networking/v1alpha3/virtualservices"
	drColl = "istio/networking/v1alpha3/destinationrules"
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

func startFileSource(t *testing.T, root string) (*FileSource, *mcp.Cache) {
	t.Helper()
	cache := mcp.NewCache(vsColl, drColl)
	kinds := []Kind{mustKind(t, vsColl), mustKind(t, drColl)}
	store := NewStore(cache, []string{"fs"}, testLog(t))
	src := NewFileSource("fs", root, kinds, store, testLog(t), nil)
	src.debounce = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
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

// FuzzParseDocuments: arbitrary file content never panics, and every problem names a line.
func FuzzParseDocuments(f *testing.F) {
	f.Add([]byte(vsDoc("a", "  namespace: n", "h")))
	f.Add([]byte("---\n---\nkind: [\n"))
	f.Add([]byte("apiVersion: a/b/c\nkind: K\nmetadata: {name: x, creationTimestamp: nope}\n"))
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
		for _, o := range objs {
			if o.obj.Name == "" || o.gvk.Kind == "" {
				t.Fatalf("object without name or kind: %+v", o)
			}
		}
	})
}
