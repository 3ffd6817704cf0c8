package main

import (
	"bufio"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/internal/cli"
)

// hubLine is a command line of the hub in a README code block, however it is invoked.
var hubLine = regexp.MustCompile(`^(?:go run \./cmd/hub|\S*bin/hub|hub)(?:\s|$)`)

// readmeCommands returns the hub command lines of README.md's code blocks (sh), each as
// its arguments, with the line number.
func readmeCommands(t *testing.T, invoked *regexp.Regexp) map[int][]string {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[int][]string{}
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "```") {
			in = !in && line == "```sh"
			continue
		}
		if !in || !invoked.MatchString(line) {
			continue
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		args := strings.Fields(strings.TrimSuffix(strings.TrimSpace(line), "&"))
		prog := 1
		if args[0] == "go" {
			prog = 3
		}
		out[n] = args[prog:]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// parseOnly parses args as root would run them, without running anything: the command
// found, its flags, its arguments and its -o.
func parseOnly(root *cobra.Command, args []string) error {
	cmd, rest, err := root.Find(cli.Normalize(root, args))
	if err != nil {
		return err
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	pos := cmd.Flags().Args()
	if cmd.HasSubCommands() && len(pos) > 0 {
		return errors.New("unknown command " + pos[0] + " for " + cmd.CommandPath())
	}
	if err := cmd.ValidateArgs(pos); err != nil {
		return err
	}
	if cmd.PreRunE != nil {
		return cmd.PreRunE(cmd, pos)
	}
	return nil
}

// Every hub command the README shows is one the hub takes: its command, flags and
// arguments parse (nothing runs).
func TestREADMECommandsParse(t *testing.T) {
	cmds := readmeCommands(t, hubLine)
	if len(cmds) < 10 {
		t.Fatalf("found %d hub commands in README.md: is the extraction broken?", len(cmds))
	}
	for n, args := range cmds {
		if err := parseOnly(newRoot(), args); err != nil {
			t.Errorf("README.md:%d: hub %s: %v", n, strings.Join(args, " "), err)
		}
	}
	// The check itself refuses what the hub refuses.
	for _, bad := range [][]string{{"stauts"}, {"why", "vs"}, {"status", "--nope"}, {"status", "-o", "xml"}, {"certs", "isue"}} {
		if parseOnly(newRoot(), bad) == nil {
			t.Errorf("hub %q parses", bad)
		}
	}
}
