package hub

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub/api"
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
	if status.Code(err) != codes.InvalidArgument { // nothing here is a matter of ownership
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

// A NACK's code says what kind of refusal it carries (issue 25, finding 9.2): invalid
// bodies, resource names and hosts were NACKed PermissionDenied, as if a matter of
// ownership. One code per NACK, by this precedence when a push mixes them: not owned
// (PermissionDenied), then invalid (InvalidArgument), over a quota (ResourceExhausted),
// deletions held by the breaker (FailedPrecondition), and conflicts alone
// (AlreadyExists). Every refused resource keeps its own reason in the BadRequest detail.
func TestNACKCodeNamesTheRefusal(t *testing.T) {
	h := testHub(t, `
insecure: true
collections: [istio/networking/v1alpha3/virtualservices]
warmUp: 1h
sharedNamespaces: [shared]
clusters:
- {name: east, identities: [east], namespaces: [shop, shared], hosts: ["*"], quotas: {maxObjects: 2}}
- {name: west, identities: [west], namespaces: [pay, shared], hosts: ["*"]}
routing: {default: {name: all}}
`)
	good := goldenBody(t, vsColl, []string{"reviews"})
	garbage := &anypb.Any{TypeUrl: good.TypeUrl, Value: []byte{0xff, 0xff, 0xff}}
	badHost := goldenBody(t, vsColl, []string{"*foo.com"})
	change := func(objs ...any) *mcp.Change { // name, body pairs
		c := &mcp.Change{Collection: vsColl}
		for i := 0; i < len(objs); i += 2 {
			r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: objs[i].(string), Version: "1"}, Body: objs[i+1].(*anypb.Any)}
			e, err := mcp.NewEntry(r)
			if err != nil {
				t.Fatal(err)
			}
			c.Entries, c.Resources = append(c.Entries, e), append(c.Resources, r)
		}
		return c
	}
	mustApply(t, h, "east", change("shared/x", good)) // west's shared/x then loses: a conflict
	for _, tc := range []struct {
		name, cluster string
		push          *mcp.Change
		code          codes.Code
		why           map[string]string // each refused resource, and a part of its reason
	}{
		{"a conflict", "west", change("shared/x", good), codes.AlreadyExists, map[string]string{"shared/x": `conflicts with cluster "east"'s`}},
		{"an invalid body", "east", change("shop/garbage", garbage, "shop/ok", good), codes.InvalidArgument,
			map[string]string{"shop/garbage": "does not decode"}},
		{"an invalid name", "east", change("shop/..", good), codes.InvalidArgument, map[string]string{"shop/..": "DNS-1123"}},
		{"an invalid host", "east", change("shop/h", badHost), codes.InvalidArgument, map[string]string{"shop/h": `host "*foo.com" is not a valid host name`}},
		{"not owned, and invalid", "east", change("pay/x", good, "shop/garbage", garbage), codes.PermissionDenied,
			map[string]string{"pay/x": `namespace "pay" is not owned by cluster "east"`, "shop/garbage": "does not decode"}},
		{"over the quota, and invalid", "east", change("shop/a", good, "shop/b", good, "shop/c", good, "shop/garbage", garbage), codes.InvalidArgument,
			map[string]string{"shop/c": "maxObjects", "shop/garbage": "does not decode"}},
		{"over the quota", "east", change("shop/a", good, "shop/b", good, "shop/c", good), codes.ResourceExhausted, map[string]string{"shop/c": "maxObjects"}},
	} {
		err := h.Apply(tc.cluster, tc.push)
		got := map[string]string{}
		for _, r := range rejectionsOf(t, err) {
			got[r.Resource] = r.Reason
		}
		if status.Code(err) != tc.code || len(got) != len(tc.why) {
			t.Errorf("%s: %v, want %v refusing %d", tc.name, err, tc.code, len(tc.why))
			continue
		}
		for name, why := range tc.why {
			if !strings.Contains(got[name], why) {
				t.Errorf("%s: %s refused with %q, want a reason with %q", tc.name, name, got[name], why)
			}
		}
	}
	// An invalid host is an invalid body, not a matter of ownership, in the events (and
	// meshfed_hub_refusals_total) as in the code.
	for _, e := range h.Events(0).Events {
		if e.Kind == api.EventRefusal && e.Name == "shop/h" && e.Reason != api.ReasonInvalid {
			t.Errorf("shop/h refused as %q, want %q", e.Reason, api.ReasonInvalid)
		}
	}
}

// nackCode's precedence, breaker included: one code per NACK, the most lasting refusal's.
func TestNACKCodePrecedence(t *testing.T) {
	for _, tc := range []struct {
		reasons []string
		held    bool
		want    codes.Code
	}{
		{[]string{api.ReasonConflict, api.ReasonOverQuota, api.ReasonInvalid, api.ReasonNotOwned}, true, codes.PermissionDenied},
		{[]string{api.ReasonConflict, api.ReasonOverQuota, api.ReasonInvalid}, true, codes.InvalidArgument},
		{[]string{api.ReasonConflict, api.ReasonOverQuota}, true, codes.ResourceExhausted},
		{[]string{api.ReasonConflict}, true, codes.FailedPrecondition},
		{nil, true, codes.FailedPrecondition},
		{[]string{api.ReasonConflict}, false, codes.AlreadyExists},
	} {
		if got := nackCode(tc.reasons, tc.held); got != tc.want {
			t.Errorf("nackCode(%v, held %v) = %v, want %v", tc.reasons, tc.held, got, tc.want)
		}
	}
}
