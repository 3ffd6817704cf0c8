package tls

import (
	"net/url"
	"strings"
	"testing"
)

func TestIDs(t *testing.T) {
	id := ID("mesh.test", KindCluster, "east")
	if id != "spiffe://mesh.test/cluster/east" {
		t.Fatalf("ID = %s", id)
	}
	for _, tc := range []struct {
		id, kind, name string
		ok             bool
	}{
		{id, KindCluster, "east", true},
		{"spiffe://mesh.test/sink/istiod-1", KindSink, "istiod-1", true},
		{"spiffe://mesh.test/sink/istiod_1.v2", KindSink, "istiod_1.v2", true},
		{"spiffe://other.test/cluster/east", "", "", false},
		{"spiffe://mesh.test/cluster/", "", "", false},
		{"spiffe://mesh.test/cluster", "", "", false},
		{"east", "", "", false},
	} {
		kind, name, ok := ParseID("mesh.test", tc.id)
		if kind != tc.kind || name != tc.name || ok != tc.ok {
			t.Errorf("ParseID(%q) = %q %q %v", tc.id, kind, name, ok)
		}
	}
}

// An operator is an identity kind like the others.
func TestOperatorIdentity(t *testing.T) {
	id := ID("mesh.test", KindOperator, "alice")
	if kind, name, ok := ParseID("mesh.test", id); id != "spiffe://mesh.test/operator/alice" || kind != KindOperator || name != "alice" || !ok {
		t.Errorf("ID = %s, ParseID = %q %q %v", id, kind, name, ok)
	}
}

// Only the canonical spelling of an ID is one: whatever a URI parser would read as the same
// ID, or as another kind's, is refused, saying what is wrong (issue 25, finding 9).
func TestParseIDRefusesNonCanonical(t *testing.T) {
	for _, tc := range []struct{ id, says string }{
		{"spiffe://mesh.test/operator/alice/../../cluster/west", "is not /KIND/NAME"},
		{"spiffe://mesh.test/operator/..", `".." is not a name`},
		{"spiffe://mesh.test/operator/.", `"." is not a name`},
		{"spiffe://mesh.test/./operator", `"." is not a name`},
		{"spiffe://mesh.test/operator/alice/", "is not /KIND/NAME"},
		{"spiffe://mesh.test/operator//alice", "is not /KIND/NAME"},
		{"spiffe://mesh.test//operator/alice", "is not /KIND/NAME"},
		{"spiffe://mesh.test/operator/%61lice", `has "%"`},
		{"spiffe://mesh.test/operator%2Falice", "is not /KIND/NAME"},
		{"spiffe://mesh.test/operator/a%2Fb", `has "%"`},
		{"spiffe://mesh.test/operator/alice?x=1", `has "?"`},
		{"spiffe://mesh.test/operator/alice?", `has "?"`},
		{"spiffe://mesh.test/operator/alice#", `has "#"`},
		{"spiffe://mesh.test/operator/alice#frag", `has "#"`},
		{"spiffe://mesh.test/operator/al ice", `has " "`},
		{"spiffe://mesh.test/operator/alicé", `has "\xc3"`},
		{"spiffe://mesh.test/operator/alice\x00", `has "\x00"`},
		{"spiffe://user@mesh.test/operator/alice", `not the trust domain "mesh.test"`},
		{"spiffe://mesh.test:443/operator/alice", `not the trust domain "mesh.test"`},
		{"spiffe://MESH.test/operator/alice", `not the trust domain "mesh.test"`},
		{"SPIFFE://mesh.test/operator/alice", "does not begin with spiffe://"},
		{"spiffe:/mesh.test/operator/alice", "does not begin with spiffe://"},
		{" spiffe://mesh.test/operator/alice", "does not begin with spiffe://"},
		{"spiffe://mesh.test", "has no path"},
		{"spiffe://mesh.test/", "is not /KIND/NAME"},
		{"spiffe://mesh.test/operator", "is not /KIND/NAME"},
	} {
		kind, name, err := CheckID("mesh.test", tc.id)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("CheckID(%q) = %q %q %v, want an error saying %q", tc.id, kind, name, err, tc.says)
		}
		if _, _, ok := ParseID("mesh.test", tc.id); ok {
			t.Errorf("ParseID(%q) accepted it", tc.id)
		}
	}
	// A trust domain that is not one parses nothing, whatever the ID.
	for _, td := range []string{"", "Mesh.test", "user@mesh.test", "mesh.test:443", "mesh.test/x"} {
		if _, _, err := CheckID(td, ID(td, KindOperator, "alice")); err == nil {
			t.Errorf("trust domain %q: accepted %q", td, ID(td, KindOperator, "alice"))
		}
	}
}

// Whatever the input, a parsed ID re-formats to exactly the input (so no two spellings
// parse to one identity), and is, read as a URI, the scheme spiffe, the trust domain as
// its host and the path /KIND/NAME, with nothing else; or it is refused.
func FuzzParseID(f *testing.F) {
	for _, id := range []string{
		"spiffe://mesh.test/operator/alice", "spiffe://mesh.test/cluster/east", "spiffe://mesh.test/sink/istiod-1.a_b",
		"spiffe://mesh.test/operator/alice/../../cluster/west", "spiffe://mesh.test/operator/%61lice",
		"spiffe://mesh.test/operator/alice/", "spiffe://mesh.test/operator/alice#", "spiffe://u@mesh.test:1/operator/alice?q",
		"SPIFFE://mesh.test/operator/alice", "spiffe://mesh.test/operator/..", "spiffe://mesh.test//alice",
	} {
		f.Add("mesh.test", id)
	}
	f.Add("", "spiffe:///operator/alice")
	f.Add("a@b", "spiffe://a@b/operator/alice")
	f.Fuzz(func(t *testing.T, td, id string) {
		kind, name, ok := ParseID(td, id)
		if !ok {
			if kind != "" || name != "" {
				t.Fatalf("ParseID(%q, %q) refused it but returned %q %q", td, id, kind, name)
			}
			return
		}
		if again := ID(td, kind, name); again != id {
			t.Fatalf("ParseID(%q, %q) = %q %q, which formats as %q", td, id, kind, name, again)
		}
		u, err := url.Parse(id)
		if err != nil {
			t.Fatalf("ParseID(%q, %q) accepted what is not a URI: %v", td, id, err)
		}
		if u.Scheme != "spiffe" || u.Opaque != "" || u.User != nil || u.Host != td || u.Port() != "" || u.RawPath != "" ||
			u.Path != "/"+kind+"/"+name || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.String() != id {
			t.Fatalf("ParseID(%q, %q) accepted %#v", td, id, u)
		}
		if kind == "." || kind == ".." || name == "." || name == ".." || strings.ContainsAny(kind+name, "/%") {
			t.Fatalf("ParseID(%q, %q) = %q %q", td, id, kind, name)
		}
	})
}
