package admin_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

const vsColl = "istio/networking/v1alpha3/virtualservices"

// vsState is a full state of VirtualServices with the given names.
func vsState(t *testing.T, names ...string) *mcp.Change {
	t.Helper()
	body, err := anypb.New(&networking.VirtualService{Hosts: []string{"cart"}})
	if err != nil {
		t.Fatal(err)
	}
	c := &mcp.Change{Collection: vsColl}
	for _, n := range names {
		r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: n, Version: "1"}, Body: body}
		e, err := mcp.NewEntry(r)
		if err != nil {
			t.Fatal(err)
		}
		c.Entries, c.Resources = append(c.Entries, e), append(c.Resources, r)
	}
	return c
}

// hubCmd runs one of the hub's commands and returns what it printed.
func hubCmd(args ...string) (string, error) {
	var out bytes.Buffer
	err := admin.Run(context.Background(), args, &out)
	return out.String(), err
}

// runHub runs a hub on the configuration text yaml until the test ends, once its http
// listener and, when the text configures it, its adminTLS listener are bound.
func runHub(t *testing.T, yaml string) *hub.Hub {
	t.Helper()
	cfg, err := hub.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(cfg, testlog.New(t), hub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub", h.Run)
	testwait.For(t, 10*time.Second, "the hub's listeners", func() bool {
		_, _, a := h.Addrs()
		return a != "" && (cfg.AdminTLS == "" || h.AdminTLSAddr() != "")
	})
	return h
}

// The whole path of a release, as an operator takes it: a hub with its development CA and
// adminTLS; `hub certs issue -operator` from that CA; `hub status` showing the open
// breaker; `hub breaker release` over https refused with a sink's certificate and over
// plain http (saying what is needed), and done with the operator's, printing what it
// applied.
func TestBreakerReleaseAsAnOperator(t *testing.T) {
	state, certs := t.TempDir(), t.TempDir()
	h := runHub(t, `
devCA: true
stateDir: `+state+`
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
adminTLS: 127.0.0.1:0
collections: [vs]
clusters: [{name: east, namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`)
	_, _, httpAddr := h.Addrs()
	adminTLS := h.AdminTLSAddr()

	for _, who := range []string{"-operator", "-sink"} {
		out, err := hubCmd("certs", "issue", who, "alice", "-out", filepath.Join(certs, who[1:]), "-state-dir", state)
		if err != nil || !strings.Contains(out, "issued spiffe://meshfed.local/"+who[1:]+"/alice") {
			t.Fatalf("certs issue %s: %v\n%s", who, err, out)
		}
	}
	tls := func(kind string) []string {
		dir := filepath.Join(certs, kind)
		return []string{"-admin", adminTLS, "-cert", filepath.Join(dir, "alice.crt"), "-key", filepath.Join(dir, "alice.key"), "-ca", filepath.Join(dir, "ca.crt")}
	}

	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprintf("shop/vs-%d", i))
	}
	if err := h.Apply("east", vsState(t, names...)); err != nil {
		t.Fatal(err)
	}
	_ = h.Apply("east", vsState(t)) // every one deleted: the breaker holds them (the error is the NACK saying so)

	out, err := hubCmd("status", "-admin", httpAddr)
	if err != nil || !regexp.MustCompile(`NAME .* BREAKER\n(?s:.*)east .* open, 12 held\n`).MatchString(out) {
		t.Errorf("hub status: %v\n%s", err, out)
	}
	// Reading over adminTLS takes any certificate of the bundle.
	if out, err := hubCmd(append([]string{"status"}, tls("sink")...)...); err != nil || !strings.Contains(out, "open, 12 held") {
		t.Errorf("hub status over adminTLS with a sink's certificate: %v\n%s", err, out)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a sink's certificate", tls("sink"), `403 Forbidden: identity "spiffe://meshfed.local/sink/alice" is not an operator: actions need a client certificate for spiffe://meshfed.local/operator/NAME`},
		{"plain http", []string{"-admin", httpAddr}, "401 Unauthorized: actions need an authenticated operator: a client certificate for spiffe://meshfed.local/operator/NAME, over adminTLS (" + adminTLS + ")"},
		{"a key without a certificate", []string{"-key", "k"}, "--key, --ca and --server-name go with --cert"},
		{"no cluster", tls("operator"), "usage: hub breaker release"},
	} {
		args := append(append([]string{"breaker", "release"}, tc.args...), "east")
		if tc.name == "no cluster" {
			args = args[:len(args)-1]
		}
		if _, err := hubCmd(args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}

	// A digest other than the breaker's: refused, nothing deleted.
	if _, err := hubCmd(append(append([]string{"breaker", "release", "--digest", "0011223344556677"}, tls("operator")...), "east")...); err == nil ||
		!strings.Contains(err.Error(), "409 Conflict: cluster \"east\": the held deletions changed since they were reviewed (digest 0011223344556677 then") {
		t.Errorf("a release of another set: %v, want 409", err)
	}
	digest := h.Clusters()[0].Breaker.Digest
	out, err = hubCmd(append(append([]string{"breaker", "release"}, tls("operator")...), "east")...)
	if want := "cluster east's breaker holds 12 deletion(s) (digest " + digest + "):\n  " + vsColl + ": shop/vs-0, shop/vs-1, shop/vs-10, shop/vs-11, shop/vs-2, shop/vs-3, shop/vs-4, shop/vs-5, shop/vs-6, shop/vs-7, shop/vs-8, shop/vs-9\n" +
		"released cluster east's breaker as spiffe://meshfed.local/operator/alice: 12 held deletion(s) applied\n  " + vsColl + ": 12\n"; err != nil || out != want {
		t.Errorf("release by the operator: %v\n%s\nwant\n%s", err, out, want)
	}
	if _, err := hubCmd(append(append([]string{"breaker", "release"}, tls("operator")...), "east")...); err == nil || !strings.Contains(err.Error(), "cluster east's breaker holds no deletions") {
		t.Errorf("a second release: %v, want nothing held", err)
	}
	if _, err := hubCmd(append(append([]string{"breaker", "release", "--digest", digest}, tls("operator")...), "east")...); err == nil || !strings.Contains(err.Error(), "409 Conflict") {
		t.Errorf("a second release naming the digest: %v, want 409 (nothing held)", err)
	}
	if out, err := hubCmd(append(append([]string{"breaker", "release", "-o", "json"}, tls("operator")...), "west")...); err == nil || !strings.HasPrefix(err.Error(), "Error from server (NotFound): ") {
		t.Errorf("release of an unknown cluster: %v %s, want NotFound", err, out)
	}
}

// `hub whatif --config` is an operator's action: over plain http (a hub that is not in
// development mode) and with a sink's certificate the hub's refusal is printed, saying what
// is needed; with an operator's certificate the candidate is evaluated. A file larger than
// a hub takes is refused before the hub is asked.
func TestWhatifCandidateAsAnOperator(t *testing.T) {
	state, certs := t.TempDir(), t.TempDir()
	running := `
devCA: true
stateDir: ` + state + `
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
adminTLS: 127.0.0.1:0
collections: [vs]
clusters: [{name: east, namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`
	h := runHub(t, running)
	_, _, httpAddr := h.Addrs()
	adminTLS := h.AdminTLSAddr()
	if err := h.Apply("east", vsState(t, "shop/cart")); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"-operator", "-sink"} {
		if out, err := hubCmd("certs", "issue", who, "alice", "-out", filepath.Join(certs, who[1:]), "-state-dir", state); err != nil {
			t.Fatalf("certs issue %s: %v\n%s", who, err, out)
		}
	}
	tls := func(kind string) []string {
		dir := filepath.Join(certs, kind)
		return []string{"-admin", adminTLS, "-cert", filepath.Join(dir, "alice.crt"), "-key", filepath.Join(dir, "alice.key"), "-ca", filepath.Join(dir, "ca.crt")}
	}
	candidate := filepath.Join(certs, "candidate.yaml")
	if err := os.WriteFile(candidate, []byte(strings.Replace(running, "namespaces: [shop]", "namespaces: [pay]", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(certs, "huge.yaml")
	hugeText := running + "#" + strings.Repeat("x", 1<<20) + "\n"
	if err := os.WriteFile(huge, []byte(hugeText), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"plain http", []string{"-admin", httpAddr, "-config", candidate}, "401 Unauthorized: actions need an authenticated operator: a client certificate for spiffe://meshfed.local/operator/NAME, over adminTLS (" + adminTLS + ")"},
		{"a sink's certificate", append(tls("sink"), "-config", candidate), `403 Forbidden: identity "spiffe://meshfed.local/sink/alice" is not an operator`},
		{"a file over 1 MiB", append(tls("operator"), "-config", huge), "--config: " + huge + " is " + fmt.Sprint(len(hugeText)) + " bytes: a hub dry-runs a file of at most 1048576 bytes (1 MiB)"},
	} {
		if out, err := hubCmd(append([]string{"whatif", "-node", "istiod-1"}, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\n%s\nwant %q", tc.name, err, out, tc.want)
		}
	}
	// What a sink receives now is a read: anyone on http.
	if out, err := hubCmd("whatif", "-node", "istiod-1", "-admin", httpAddr); err != nil || !strings.Contains(out, vsColl+"  1") {
		t.Errorf("whatif without a candidate on http: %v\n%s", err, out)
	}
	out, err := hubCmd(append([]string{"whatif", "-node", "istiod-1", "-config", candidate}, tls("operator")...)...)
	if err != nil || !regexp.MustCompile(regexp.QuoteMeta(vsColl)+` +0 +- +shop/cart +-\n`).MatchString(out) {
		t.Errorf("whatif by the operator: %v\n%s", err, out)
	}
}
