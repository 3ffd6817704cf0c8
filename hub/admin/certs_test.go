package admin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	meshtls "github.com/meshfed/meshfed/tls"
)

// hub certs issue writes the key 0600 from the development CA of the state directory; it
// refuses a trust domain other than the CA's (naming both: a hub would refuse the
// certificate), a name that is not one, and a missing kind or --out, each saying what is
// wrong.
func TestCertsIssue(t *testing.T) {
	state, out := t.TempDir(), t.TempDir()
	if _, _, err := meshtls.EnsureDevCA(filepath.Join(state, "ca"), "mesh.example.com"); err != nil {
		t.Fatal(err)
	}
	issue := func(args ...string) (string, error) {
		var b bytes.Buffer
		err := Run(context.Background(), append([]string{"certs", "issue", "--state-dir", state, "--out", out}, args...), &b)
		return b.String(), err
	}
	got, err := issue("--cluster", "east", "--trust-domain", "mesh.example.com")
	if err != nil || !strings.HasPrefix(got, "issued spiffe://mesh.example.com/cluster/east\n") {
		t.Fatalf("issue: %v\n%s", err, got)
	}
	st, err := os.Stat(filepath.Join(out, "east.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("east.key: %v, mode %v, want 0600", err, st.Mode())
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster", "west"}, `--trust-domain "meshfed.local": the development CA in ` + filepath.Join(state, "ca") + ` is trust domain "mesh.example.com"'s`},
		{[]string{"--sink", "Bad Name", "--trust-domain", "mesh.example.com"}, `--sink "Bad Name": not a valid name`},
		{[]string{"--operator", "a/b", "--trust-domain", "mesh.example.com"}, `--operator "a/b": not a valid name`},
		{[]string{"--trust-domain", "mesh.example.com"}, "give exactly one of --cluster, --sink and --operator"},
		{[]string{"--cluster", "a", "--sink", "b"}, "give exactly one of --cluster, --sink and --operator"},
	} {
		if _, err := issue(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("certs issue %q: %v, want %q", tc.args, err, tc.want)
		}
	}
	var b bytes.Buffer
	if err := Run(context.Background(), []string{"certs", "issue", "--cluster", "east"}, &b); err == nil || !strings.Contains(err.Error(), "--out: required") {
		t.Errorf("without --out: %v", err)
	}
	if err := Run(context.Background(), []string{"certs", "issue", "--cluster", "east", "--out", out, "--state-dir", t.TempDir()}, &b); err == nil || !strings.Contains(err.Error(), "no development CA in ") {
		t.Errorf("without a CA: %v", err)
	}
}

// The README's `hub certs issue ... --out certs` at the repository's root writes keys
// there: the repository ignores them.
func TestCertsDirIgnored(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git")
	}
	root := filepath.Join("..", "..")
	if err := exec.Command(git, "-C", root, "rev-parse", "--is-inside-work-tree").Run(); err != nil {
		t.Skip("not a git work tree")
	}
	if out, err := exec.Command(git, "-C", root, "check-ignore", "certs/east.key", "certs/ca.crt").CombinedOutput(); err != nil {
		t.Errorf("certs/ is not ignored: %v %s", err, out)
	}
}
