package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/replicatest"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// The README's second step: examples/minion.yaml, run as a minion process next to a hub on
// its default configuration (what `hub` with no arguments runs), publishes to it: the
// cluster it names is the default hub's, and it takes its certificate from that hub's
// development CA where the hub keeps it. Only the addresses are moved off the default ports
// (the hub's to the kernel's choice, and the example's push address and its own http
// listener with them).
func TestExampleMinionAgainstTheDefaultHub(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the minion binary")
	}
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // the working directory both share, as on a laptop
	if err := os.Symlink(filepath.Join(root, "examples"), filepath.Join(dir, "examples")); err != nil {
		t.Fatal(err)
	}
	cfg := hub.DefaultConfig()
	cfg.StateDir = filepath.Join(dir, hub.Defaults().StateDir)
	cfg.AdminTLS = "127.0.0.1:0"
	h := runHub(t, cfg)
	ingest, _, _ := h.Addrs()

	example, err := os.ReadFile(filepath.Join(root, "examples", "minion.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	moved := strings.NewReplacer("push://127.0.0.1:9901", "push://"+ingest, "http: 127.0.0.1:9902", "http: "+replicatest.FreeAddr(t, false)).Replace(string(example))
	if moved == string(example) {
		t.Fatal("examples/minion.yaml no longer pushes to 127.0.0.1:9901 with http on 127.0.0.1:9902: update this test")
	}
	if err := os.WriteFile(filepath.Join(dir, "minion.yaml"), []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	testproc.Start(t, testproc.Options{Path: testbin.Own(t, "minion"), Args: []string{"-config", "minion.yaml", "--log-format", "text"},
		Dir: dir, Name: "minion", Log: testlog.Writer(t, "minion: ")})
	testwait.For(t, 60*time.Second, "the example minion synced to the default hub, nothing refused", func() bool {
		cl := h.Clusters()
		return len(cl) == 1 && cl[0].Name == "dev" && cl[0].Connected && cl[0].Synced && len(cl[0].Rejections) == 0 && sumOf(cl[0].Resources) > 0
	})
}

func sumOf(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
