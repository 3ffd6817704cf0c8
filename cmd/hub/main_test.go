package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// runHub runs the hub binary with args in dir until it ends (within a minute) and returns
// its exit status and output.
func runHub(t *testing.T, dir string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return testproc.Exit(t, testbin.Own(t, "hub"), dir, time.Minute, args...)
}

// Words run their command and end; none starts a hub (which would create its development
// CA in the working directory). A word that is no command is an error with a suggestion; a
// command's -h shows its own flags (not the hub's), and exits 0.
func TestWordsStartNothing(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		out, notIn string // in stdout+stderr; not in it
	}{
		{[]string{"help"}, 0, "Available Commands:", ""},
		{[]string{"-h"}, 0, "  get         Show what the hub serves", ""},
		{[]string{"--help"}, 0, "  validate    Check a configuration file offline", ""},
		{[]string{"version"}, 0, "hub ", ""},
		{[]string{"version", "-o", "json"}, 0, `"goVersion"`, ""},
		{[]string{"versoin"}, 1, "Error: unknown command \"versoin\" for \"hub\"\n\nDid you mean this?\n\tversion\n", ""},
		{[]string{"stauts", "--admin", "127.0.0.1:1"}, 1, "Did you mean this?\n\tstatus", ""},
		{[]string{"why", "-h"}, 0, "hub why COLLECTION NAMESPACE/NAME [flags]", "--log-format"},
		{[]string{"certs", "issue", "-h"}, 0, "--trust-domain", "--config"},
		{[]string{"certs", "isue"}, 1, "Did you mean this?\n\tissue", ""},
		{[]string{"completion", "bash"}, 0, "bash completion V2 for hub", ""},
		{[]string{"completion", "zsh"}, 0, "#compdef hub", ""},
		{[]string{"why", "vs"}, 1, "accepts 2 arg(s), received 1", ""},
		{[]string{"why", "vs", "shop/a/b"}, 1, `name "shop/a/b": want NAMESPACE/NAME`, ""},
		{[]string{"status", "--admin", "127.0.0.1:1"}, 1, "the hub's admin API at http://127.0.0.1:1", ""},
		{[]string{"--log-format", "xml"}, 1, `log format "xml": want json or text`, ""},
		{[]string{"-log-level", "loud"}, 1, `log level "loud"`, ""},
	} {
		dir := t.TempDir()
		code, stdout, stderr := runHub(t, dir, tc.args...)
		all := stdout + stderr
		if code != tc.code || !strings.Contains(all, tc.out) || tc.notIn != "" && strings.Contains(all, tc.notIn) {
			t.Errorf("hub %q: exit %d, want %d with %q (and not %q):\n%s", tc.args, code, tc.code, tc.out, tc.notIn, all)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("hub %q created %s in its working directory", tc.args, entries[0].Name())
		}
	}
}

// With no command the hub runs on its development configuration (the README's first step):
// it makes its development CA and listens on the development addresses, until it is told to
// stop. Those addresses are fixed, so it runs in a network namespace of its own (its own
// loopback): it cannot clash with a hub on this machine, nor one of another test run.
func TestNoArgumentsRunsTheHub(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the development hub's fixed addresses are tested in a network namespace of its own, which needs root")
	}
	for _, tool := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (util-linux, iproute2): the development hub runs in a network namespace of its own", tool)
		}
	}
	dir := t.TempDir()
	want := map[string]bool{}
	cfg := hub.DefaultConfig()
	for name, addr := range map[string]string{"ingest": cfg.Ingest, "serve": cfg.Serve, "http": cfg.HTTP, "adminTLS": cfg.AdminTLS} {
		want["msg=listening listener="+name+" addr="+addr] = true
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	p := testproc.Start(t, testproc.Options{Path: "unshare", Dir: dir, Name: "hub",
		Args: []string{"--net", "sh", "-c", `ip link set lo up && exec "$0" --log-format text`, testbin.Own(t, "hub")},
		OnLine: func(line string) {
			for w := range want {
				if strings.Contains(line, w) {
					mu.Lock()
					seen[w] = true
					mu.Unlock()
				}
			}
		}})
	testwait.For(t, 30*time.Second, "the development hub listening on every development address", func() bool {
		if p.Exited() {
			t.Fatalf("hub with no arguments ended:\n%s", p.Tail(50))
		}
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(want)
	})
	if _, err := os.Stat(filepath.Join(dir, ".meshfed", "hub", "ca", "ca.crt")); err != nil {
		t.Errorf("no development CA: %v", err)
	}
}

// hub validate FILE needs no hub: 0 for a file the hub takes (its warnings printed with
// their lines), 1 for one it refuses, with the error at its line.
func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := "devCA: true\nclusters:\n- {name: east, namespaces: [shop], hosts: [\"*.example.com\"]}\n- {name: west, namespaces: [pay], hosts: [api.example.com]}\nrouting: {default: {name: all}}\n"
	bad := strings.Replace(good, "namespaces: [pay]", "namespace: [pay]", 1)
	for name, content := range map[string]string{"good.yaml": good, "bad.yaml": bad} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, out, _ := runHub(t, dir, "validate", "good.yaml")
	if code != 0 || !strings.Contains(out, "good.yaml: warning: http: not set") ||
		!strings.Contains(out, `good.yaml:3: warning: clusters[0] ("east").hosts[0]: "*.example.com" overlaps clusters[1] ("west").hosts[0] "api.example.com"`) ||
		!strings.HasSuffix(out, "good.yaml: valid (2 warning(s))\n") {
		t.Errorf("validate good.yaml: exit %d\n%s", code, out)
	}
	code, out, errOut := runHub(t, dir, "validate", "bad.yaml")
	if code != 1 || !strings.Contains(out, `bad.yaml:4: error: unknown field "namespace"`) || !strings.Contains(errOut, "Error: bad.yaml: invalid") {
		t.Errorf("validate bad.yaml: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := runHub(t, dir, "validate", "bad.yaml", "-o", "json"); code != 1 || !strings.Contains(out, `"valid": false`) || !strings.Contains(out, `"line": 4`) {
		t.Errorf("validate -o json: exit %d\n%s", code, out)
	}
	if code, _, errOut := runHub(t, dir, "validate", "missing.yaml"); code != 1 || !strings.Contains(errOut, "missing.yaml") {
		t.Errorf("validate missing.yaml: exit %d\n%s", code, errOut)
	}
}

// A hub that cannot start says why on the terminal and in its log, and exits 2: a
// configuration it refuses, and an address another process has.
func TestNotStarted(t *testing.T) {
	dir := t.TempDir()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for file, content := range map[string]string{
		"refused.yaml": "clusters: []\n",
		"taken.yaml":   "insecure: true\ningest: 127.0.0.1:0\nserve: " + taken.Addr().String() + "\nclusters: [{name: dev, identities: [dev], namespaces: ['*']}]\nstateDir: state\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := runHub(t, dir, "-config", file)
		if code != 2 || !strings.Contains(errOut, `"msg":"hub not started"`) || !strings.Contains(errOut, "Error: hub not started: ") {
			t.Errorf("%s: exit %d:\n%s", file, code, errOut)
		}
		if file == "taken.yaml" && !strings.Contains(errOut, "serve: listen tcp "+taken.Addr().String()) {
			t.Errorf("%s: the error does not name the listener and its address:\n%s", file, errOut)
		}
	}
}
