package tls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDevCACreatedOnceAndReused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	ca, created, err := EnsureDevCA(dir, "mesh.test")
	if err != nil || !created {
		t.Fatalf("first start: %v created=%v", err, created)
	}
	for name, want := range map[string]os.FileMode{"ca.key": 0o600, "ca.crt": 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, %v; want %v", name, fi.Mode().Perm(), err, want)
		}
	}
	again, created, err := EnsureDevCA(dir, "mesh.test")
	if err != nil || created || !again.cert.Equal(ca.cert) {
		t.Fatalf("second start: %v created=%v same=%v", err, created, again.cert.Equal(ca.cert))
	}

	// Issued leaves chain to it and carry the SPIFFE ID; a handshake between two works.
	out := t.TempDir()
	srv, err := ca.Issue("spiffe://mesh.test/hub/h1", []string{"127.0.0.1", "localhost"}, out, "hub")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Issue("spiffe://mesh.test/cluster/east", nil, out, "east")
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(cli.Key); fi.Mode().Perm() != 0o600 {
		t.Errorf("issued key mode %v", fi.Mode().Perm())
	}
	s, err := NewSource(srv, quiet())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewSource(cli, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if c.cur.cert.Leaf.URIs[0].String() != "spiffe://mesh.test/cluster/east" || c.cur.cert.Leaf.NotAfter.Before(time.Now().Add(80*24*time.Hour)) {
		t.Errorf("leaf = %v, %v", c.cur.cert.Leaf.URIs, c.cur.cert.Leaf.NotAfter)
	}
	if _, _, err := handshake(t, s.ServerConfig(), c.ClientConfig("")); err != nil {
		t.Fatalf("handshake with development certificates: %v", err)
	}

	if _, err := ca.Issue("east", nil, out, "bad"); err == nil || !strings.Contains(err.Error(), "not a SPIFFE ID") {
		t.Errorf("non-SPIFFE identity: %v", err)
	}
	if _, err := LoadDevCA(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no development CA") {
		t.Errorf("LoadDevCA of an empty directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsureDevCA(dir, "mesh.test"); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("a damaged CA: %v", err)
	}
}
