package hub

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/mcp"
)

// Every body is checked against its collection's type and every name against Kubernetes'
// rules: garbage bytes, a wrong or unknown type URL, a missing body and bad names were
// accepted and served to every sink. Each is refused by name, and the good resources of
// the same push are served.
func TestIngestChecksBodiesAndNames(t *testing.T) {
	h := testHub(t, breakerHub)
	sink := watchAs(t, h, "", "istiod")
	good := goldenBody(t, vsColl, []string{"reviews"})
	cases := []struct {
		name string
		body *anypb.Any
		why  string
	}{
		{"shop/garbage", &anypb.Any{TypeUrl: good.TypeUrl, Value: []byte{0xff, 0xff, 0xff}}, "does not decode"},
		{"shop/wrong-type", goldenBody(t, drColl, []string{"reviews"}), "is not istio.networking.v1alpha3.VirtualService"},
		{"shop/unknown-type", &anypb.Any{TypeUrl: "type.googleapis.com/example.Nope", Value: nil}, "type URL"},
		{"shop/no-body", nil, "body: missing"},
		{"shop/..", good, "DNS-1123"},
		{"shop/", good, "name is empty"},
		{"shop/a\x01b", good, "DNS-1123"},
		{"shop/" + strings.Repeat("a", 300), good, "253"},
		{"shop/ok", good, ""},
	}
	c := &mcp.Change{Collection: vsColl}
	for _, tc := range cases {
		r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: tc.name, Version: "1"}, Body: tc.body}
		e, err := mcp.NewEntry(r)
		if err != nil {
			t.Fatalf("%q: %v", tc.name, err)
		}
		c.Entries, c.Resources = append(c.Entries, e), append(c.Resources, r)
	}
	err := h.Apply("east", c)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("push: %v", err)
	}
	got := map[string]string{}
	for _, r := range rejectionsOf(t, err) {
		got[r.Resource] = r.Reason
	}
	for _, tc := range cases {
		why, refused := got[tc.name]
		switch {
		case tc.why == "" && refused:
			t.Errorf("%q refused: %s", tc.name, why)
		case tc.why != "" && !strings.Contains(why, tc.why):
			t.Errorf("%q: refused %v with %q, want a reason with %q", tc.name, refused, why, tc.why)
		}
	}
	if s := sink.names(vsColl); s != "shop/ok" {
		t.Errorf("served %q, want only shop/ok", s)
	}
}
