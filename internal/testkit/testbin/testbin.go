// Package testbin builds the real third-party programs the integration tiers run —
// kube-apiserver, etcd, Istio's own MCP peer and istiod — from their pinned, separate Go modules
// under test/, and caches the binaries in .cache/bin at the repository root.
//
// A binary is rebuilt only when its stamp (a hash of the module's go.mod, go.sum and the
// local package sources) changes. Builds of the same binary by concurrent test processes are
// serialized with a file lock, so `go test ./...` may ask for it from several packages at
// once. `make testbins` (run by `make test`) builds them all up front. Own builds meshfed's
// own commands (cmd/hub, cmd/minion) for tests that run them as processes, to kill them.
//
// It is test infrastructure, not product code: nothing in the product imports it.
package testbin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// Own builds meshfed's own command ./cmd/<name> into .cache/bin/meshfed-<name>, once per
// test process (go's build cache makes it quick), for tests that run the product as a
// process (to kill it with SIGKILL), and returns its path.
func Own(t TB, name string) string {
	t.Helper()
	ownMu.Lock()
	defer ownMu.Unlock()
	if p, ok := ownBuilt[name]; ok {
		return p
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, ".cache", "bin", "meshfed-"+name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatal(fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, b))
	}
	ownBuilt[name] = out
	return out
}

var (
	ownMu    sync.Mutex
	ownBuilt = map[string]string{}
)

// Binary is one program the tests need.
type Binary struct {
	// Name is the binary's file name under .cache/bin.
	Name string
	// Module is the directory of its Go module, relative to the repository root.
	Module string
	// Package is the package to build, as `go build` takes it from inside Module.
	Package string
	// Local is the package's directory inside Module when it is the module's own code
	// (its sources are part of the stamp); empty for a dependency's package.
	Local string
}

// Binaries are the programs the integration tiers run.
var Binaries = map[string]Binary{
	"kube-apiserver":  {Name: "kube-apiserver", Module: "test/kube", Package: "k8s.io/kubernetes/cmd/kube-apiserver"},
	"etcd":            {Name: "etcd", Module: "test/kube", Package: "./etcd", Local: "etcd"},
	"istio-mcp-peer":  {Name: "istio-mcp-peer", Module: "test/istio", Package: "./cmd/istio-mcp-peer", Local: "cmd/istio-mcp-peer"},
	"pilot-discovery": {Name: "pilot-discovery", Module: "test/istiod/pilot", Package: "istio.io/istio/pilot/cmd/pilot-discovery"},
}

// RepoRoot returns the repository root: the nearest directory above the working directory
// whose go.mod declares module github.com/meshfed/meshfed.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/meshfed/meshfed\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testbin: not inside the meshfed repository")
		}
		dir = parent
	}
}

// Path returns the path of the named binary, building it first if it is missing or stale.
func Path(name string) (string, error) {
	b, ok := Binaries[name]
	if !ok {
		return "", fmt.Errorf("testbin: unknown binary %q", name)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	binDir := filepath.Join(root, ".cache", "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(binDir, b.Name)
	stamp, err := b.stamp(root)
	if err != nil {
		return "", err
	}
	if b.fresh(out, stamp) {
		return out, nil
	}
	unlock, err := lock(out + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if b.fresh(out, stamp) { // another process built it while we waited
		return out, nil
	}
	tmp := out + ".building"
	cmd := exec.Command("go", "build", "-o", tmp, b.Package)
	cmd.Dir = filepath.Join(root, b.Module)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("testbin: building %s in %s: %v\n%s", b.Package, b.Module, err, stderr.String())
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	if err := os.WriteFile(out+".stamp", []byte(stamp), 0o644); err != nil {
		return "", err
	}
	return out, nil
}

// TB is the part of testing.TB that Require uses; the benchmark command provides its own.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Require returns the named binary's path or fails the test.
func Require(t TB, name string) string {
	t.Helper()
	p, err := Path(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (b Binary) fresh(out, stamp string) bool {
	if _, err := os.Stat(out); err != nil {
		return false
	}
	got, err := os.ReadFile(out + ".stamp")
	return err == nil && string(got) == stamp
}

// stamp hashes what the binary is built from: the package path, the module's go.mod and
// go.sum, the local package's sources, and the Go version.
func (b Binary) stamp(root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", b.Package, goVersion())
	files := []string{"go.mod", "go.sum"}
	if b.Local != "" {
		err := filepath.WalkDir(filepath.Join(root, b.Module, b.Local), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".go") {
				rel, _ := filepath.Rel(filepath.Join(root, b.Module), p)
				files = append(files, rel)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	sort.Strings(files[2:])
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, b.Module, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func goVersion() string {
	out, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// lock takes an exclusive advisory lock on path, waiting for it.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("testbin: lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
