package tls

import "testing"

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
