package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
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
// it makes its development CA, and runs until it is told to stop.
func TestNoArgumentsRunsTheHub(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(testbin.Own(t, "hub"), "--log-format", "text")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ca := filepath.Join(dir, ".meshfed", "hub", "ca", "ca.crt")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(ca); err == nil {
			break
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("hub with no arguments ended (%v) without making its development CA:\n%s", err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub with no arguments made no development CA in 30s:\n%s", out.String())
		}
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

// A hub that cannot start says why on the terminal and in its log, and exits 2.
func TestNotStarted(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hub.yaml"), []byte("clusters: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runHub(t, dir, "-config", "hub.yaml")
	if code != 2 || !strings.Contains(errOut, `"msg":"hub not started"`) || !strings.Contains(errOut, "Error: hub not started: ") {
		t.Errorf("exit %d:\n%s", code, errOut)
	}
}
