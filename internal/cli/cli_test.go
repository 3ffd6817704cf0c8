package cli

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// tree is a small command tree like the hub's: a root that runs, a command with a flag and
// an argument, and a group.
func tree(ran *[]string) *cobra.Command {
	var config, admin string
	root := &cobra.Command{Use: "prog", RunE: func(*cobra.Command, []string) error { *ran = append(*ran, "root "+config); return nil }}
	root.Flags().StringVar(&config, "config", "", "")
	why := &cobra.Command{Use: "why A B", Args: Args(cobra.ExactArgs(2)), RunE: func(_ *cobra.Command, args []string) error {
		*ran = append(*ran, "why "+strings.Join(args, " ")+" "+admin)
		return nil
	}}
	why.Flags().StringVar(&admin, "admin", "", "")
	group := Group(&cobra.Command{Use: "certs"})
	group.AddCommand(&cobra.Command{Use: "issue", RunE: func(*cobra.Command, []string) error { *ran = append(*ran, "issue"); return nil }})
	fail := &cobra.Command{Use: "fail", RunE: func(*cobra.Command, []string) error { return &ExitError{Code: 3, Err: errors.New("boom")} }}
	missing := &cobra.Command{Use: "missing", RunE: func(*cobra.Command, []string) error {
		return errors.New(`Error from server (NotFound): vs "shop/a" not found`)
	}}
	root.AddCommand(why, group, fail, missing, VersionCommand())
	return root
}

// Long flags with one dash are taken as with two (manifests say -config); shorthands,
// values and what follows "--" are left alone.
func TestNormalize(t *testing.T) {
	var ran []string
	got := Normalize(tree(&ran), []string{"-config", "f", "why", "-admin=x", "-o", "-h", "-x", "--", "-config"})
	want := []string{"--config", "f", "why", "--admin=x", "-o", "-h", "-x", "--", "-config"}
	if !slices.Equal(got, want) {
		t.Errorf("Normalize = %q, want %q", got, want)
	}
}

// kubectl's conventions: flags anywhere, an unknown word is an error with a suggestion
// (for the root and for a group alike) and runs nothing, a usage error says where the
// usage is, an ExitError chooses the status.
func TestExecute(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		ran    string
		stderr string
	}{
		{nil, 0, "root ", ""},
		{[]string{"-config", "hub.yaml"}, 0, "root hub.yaml", ""},
		{[]string{"why", "vs", "shop/a", "--admin", "h:1"}, 0, "why vs shop/a h:1", ""},
		{[]string{"why", "-admin", "h:1", "vs", "shop/a"}, 0, "why vs shop/a h:1", ""},
		{[]string{"wyh"}, 1, "", "Error: unknown command \"wyh\" for \"prog\"\n\nDid you mean this?\n\twhy\n\nRun 'prog --help' for usage.\n"},
		{[]string{"certs", "isue"}, 1, "", "Error: unknown command \"isue\" for \"prog certs\"\n\nDid you mean this?\n\tissue\n\nRun 'prog certs --help' for usage.\n"},
		{[]string{"certs", "issue"}, 0, "issue", ""},
		{[]string{"why", "vs"}, 1, "", "Error: accepts 2 arg(s), received 1 (usage: prog why A B [flags])\nRun 'prog why --help' for usage.\n"},
		{[]string{"why", "--nope", "a", "b"}, 1, "", "Error: unknown flag: --nope\nRun 'prog why --help' for usage.\n"},
		{[]string{"fail"}, 3, "", "Error: boom\n"},
		{[]string{"missing"}, 1, "", "Error from server (NotFound): vs \"shop/a\" not found\n"},
		{[]string{"version", "-o", "xml"}, 1, "", "Error: -o \"xml\": want one of text, json, yaml\nRun 'prog version --help' for usage.\n"},
	} {
		var ran []string
		var stdout, stderr bytes.Buffer
		code := Execute(context.Background(), tree(&ran), tc.args, &stdout, &stderr)
		if code != tc.code || strings.Join(ran, ";") != tc.ran || stderr.String() != tc.stderr {
			t.Errorf("%q: exit %d, ran %q, stderr %q; want %d, %q, %q", tc.args, code, ran, stderr.String(), tc.code, tc.ran, tc.stderr)
		}
	}
}

// version prints the build; -o json|yaml the same fields as a document.
func TestVersion(t *testing.T) {
	for format, want := range map[string]string{"text": "prog ", "json": `"goVersion": "go`, "yaml": "goVersion: go"} {
		var ran []string
		var stdout bytes.Buffer
		if code := Execute(context.Background(), tree(&ran), []string{"version", "-o", format}, &stdout, &stdout); code != 0 || !strings.Contains(stdout.String(), want) {
			t.Errorf("version -o %s: %d\n%s", format, code, stdout.String())
		}
	}
}

// Normalize takes any command line: it never panics, changes only one-dash long flags
// (to two dashes, one more character) before any "--", and is idempotent.
func FuzzNormalize(f *testing.F) {
	f.Add("-config f why -admin=x -o json -- -config")
	f.Add("--admin -admin= - -- --")
	f.Fuzz(func(t *testing.T, line string) {
		var ran []string
		root := tree(&ran)
		args := strings.Fields(line)
		got := Normalize(root, args)
		if len(got) != len(args) {
			t.Fatalf("Normalize(%q) = %q", args, got)
		}
		seenDashes := false
		for i, a := range args {
			seenDashes = seenDashes || a == "--"
			if got[i] != a && (seenDashes || got[i] != "-"+a) {
				t.Errorf("Normalize changed %q to %q", a, got[i])
			}
		}
		if again := Normalize(root, got); !slices.Equal(again, got) {
			t.Errorf("Normalize is not idempotent: %q, then %q", got, again)
		}
	})
}
