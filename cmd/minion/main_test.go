package main

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/cli"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
)

// runMinion runs the minion binary with args in dir until it ends (within a minute) and
// returns its exit status and output (stdout and stderr together).
func runMinion(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	code, stdout, stderr := testproc.Exit(t, testbin.Own(t, "minion"), dir, time.Minute, args...)
	return code, stdout + stderr
}

// Words run their command and end; none starts a minion. A word that is no command is an
// error with a suggestion. With no command the minion runs: in a directory without the
// development hub's CA, its default configuration fails for that reason (the run was
// tried), logged as asked (--log-format text).
func TestWordsStartNothing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"version"}, 0, "minion "},
		{[]string{"help"}, 0, "  version     Print the build's version"},
		{[]string{"-h"}, 0, "--log-format string"},
		{[]string{"versoin"}, 1, "Error: unknown command \"versoin\" for \"minion\"\n\nDid you mean this?\n\tversion\n"},
		{[]string{"completion", "fish"}, 0, "complete -c minion"},
		{[]string{"-log-format", "xml"}, 1, `log format "xml": want json or text`},
		{[]string{"--log-format", "text"}, 1, "no development CA in .meshfed/hub/ca"},
		{[]string{"-config", "nope.yaml"}, 1, "nope.yaml"},
	} {
		dir := t.TempDir()
		code, out := runMinion(t, dir, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.out) {
			t.Errorf("minion %q: exit %d, want %d with %q:\n%s", tc.args, code, tc.code, tc.out, out)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("minion %q created %s in its working directory", tc.args, entries[0].Name())
		}
	}
}

// Every minion command the README shows is one the minion takes.
func TestREADMECommandsParse(t *testing.T) {
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := regexp.MustCompile(`^(?:go run \./cmd/minion|\S*bin/minion|minion)(?:\s|$)`)
	found, in := 0, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "```") {
			in = !in && l == "```sh"
			continue
		}
		if !in || !line.MatchString(l) {
			continue
		}
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		args := strings.Fields(strings.TrimSuffix(strings.TrimSpace(l), "&"))
		if args[0] == "go" {
			args = args[3:]
		} else {
			args = args[1:]
		}
		found++
		root := newRoot()
		cmd, rest, err := root.Find(cli.Normalize(root, args))
		if err == nil {
			err = cmd.ParseFlags(rest)
		}
		if err == nil {
			err = cmd.ValidateArgs(cmd.Flags().Args())
		}
		if err != nil {
			t.Errorf("README.md:%d: minion %s: %v", n, strings.Join(args, " "), err)
		}
	}
	if found < 2 {
		t.Errorf("found %d minion commands in README.md", found)
	}
}
