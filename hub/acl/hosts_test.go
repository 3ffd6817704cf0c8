package acl

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hostMessages are real Istio messages of every host-claiming kind, with what Hosts returns.
func hostMessages(t testing.TB) []struct {
	collection string
	body       []byte
	want       []string
} {
	return []struct {
		collection string
		body       []byte
		want       []string
	}{
		{vsColl, marshal(t, &networking.VirtualService{
			Hosts:    []string{"reviews", "api.example.com", "*.east.example.com"},
			Gateways: []string{"istio-system/gw"},
			Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{
				Destination: &networking.Destination{Host: "not-a-claim.example.com"},
			}}}},
		}), []string{"reviews", "api.example.com", "*.east.example.com"}},
		{"istio/networking/v1beta1/virtualservices", marshal(t, &networking.VirtualService{Hosts: []string{"a.com"}}), []string{"a.com"}},
		{"networking.istio.io/v1/VirtualService", marshal(t, &networking.VirtualService{Hosts: []string{"b.com"}}), []string{"b.com"}},
		{vsColl, marshal(t, &networking.VirtualService{}), nil}, // a delegate VirtualService claims nothing
		{seColl, marshal(t, &networking.ServiceEntry{
			Hosts:     []string{"db.example.net", "*.example.org"},
			Addresses: []string{"10.0.0.1"},
			Endpoints: []*networking.WorkloadEntry{{Address: "not-a-claim.example.com"}},
		}), []string{"db.example.net", "*.example.org"}},
		{drColl, marshal(t, &networking.DestinationRule{
			Host:          "reviews.shop.svc.cluster.local",
			TrafficPolicy: &networking.TrafficPolicy{},
		}), []string{"reviews.shop.svc.cluster.local"}},
		{drColl, marshal(t, &networking.DestinationRule{}), []string{""}}, // checked (and refused) as an empty host
		{gwColl, marshal(t, &networking.Gateway{
			Selector: map[string]string{"istio": "ingressgateway"},
			Servers: []*networking.Server{
				{Port: &networking.Port{Number: 80, Name: "http", Protocol: "HTTP"}, Hosts: []string{"./*", "shop/api.example.com"}},
				{Port: &networking.Port{Number: 443, Name: "https", Protocol: "HTTPS"}, Hosts: []string{"*/x.example.com"}},
				{Port: &networking.Port{Number: 8080, Name: "none"}},
			},
		}), []string{"./*", "shop/api.example.com", "*/x.example.com"}},
		{"networking.istio.io/v1beta1/Gateway", marshal(t, &networking.Gateway{
			Servers: []*networking.Server{{Hosts: []string{"a.com"}}},
		}), []string{"a.com"}},
		{scColl, marshal(t, &networking.Sidecar{
			Egress: []*networking.IstioEgressListener{
				{Hosts: []string{"./*", "istio-system/*"}},
				{Port: &networking.SidecarPort{Number: 9080}, Hosts: []string{"~/*"}},
			},
			Ingress: []*networking.IstioIngressListener{{Port: &networking.SidecarPort{Number: 80}, DefaultEndpoint: "127.0.0.1:8080"}},
		}), []string{"./*", "istio-system/*", "~/*"}},
		{scColl, marshal(t, &networking.Sidecar{}), nil},
	}
}

func TestHosts(t *testing.T) {
	for _, tc := range hostMessages(t) {
		got, err := Hosts(tc.collection, tc.body)
		if err != nil {
			t.Errorf("Hosts(%s): %v", tc.collection, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Hosts(%s) = %q, want %q", tc.collection, got, tc.want)
		}
	}
}

// HostsOf reads a body already decoded exactly as Hosts reads its bytes, and says when the
// message is not the one Hosts decodes the collection's bodies as.
func TestHostsOfDecodedBodies(t *testing.T) {
	for _, tc := range hostMessages(t) {
		m := messageOf(kindOf(tc.collection))
		if err := proto.Unmarshal(tc.body, m); err != nil {
			t.Fatal(err)
		}
		got, ok := HostsOf(tc.collection, m)
		if !ok || !slices.Equal(got, tc.want) {
			t.Errorf("HostsOf(%s) = %q, %v, want %q", tc.collection, got, ok, tc.want)
		}
	}
	if _, ok := HostsOf(vsColl, &networking.DestinationRule{Host: "a.com"}); ok {
		t.Error("HostsOf took a DestinationRule for a VirtualService")
	}
	if got, ok := HostsOf(apColl, &networking.VirtualService{Hosts: []string{"a.com"}}); got != nil || ok {
		t.Errorf("HostsOf of a collection that claims no hosts, with a host-claiming message: %q, %v", got, ok)
	}
	if got, ok := HostsOf(apColl, nil); got != nil || !ok {
		t.Errorf("HostsOf of a collection that claims no hosts: %q, %v", got, ok)
	}
}

func TestHostsOtherCollections(t *testing.T) {
	garbage := []byte{0xff, 0xff, 0xff}
	vs := marshal(t, &networking.VirtualService{Hosts: []string{"a.com"}})
	for _, c := range []string{
		"istio/networking/v1alpha3/envoyfilters",
		"istio/security/v1beta1/authorizationpolicies",
		"k8s/gateway_api/v1/gateways",
		"gateway.networking.k8s.io/v1/Gateway",
		"virtualservices",
		"",
	} {
		for _, body := range [][]byte{nil, garbage, vs} {
			if got, err := Hosts(c, body); got != nil || err != nil {
				t.Errorf("Hosts(%q, %x) = %q, %v; want nil, nil", c, body, got, err)
			}
		}
	}
}

func TestHostsGarbage(t *testing.T) {
	garbage := []byte{0xff, 0xff, 0xff, 0xff}
	for c, kind := range map[string]string{
		vsColl:                                 "VirtualService",
		seColl:                                 "ServiceEntry",
		drColl:                                 "DestinationRule",
		gwColl:                                 "Gateway",
		scColl:                                 "Sidecar",
		"networking.istio.io/v1/Gateway":       "Gateway",
		"istio/networking/v1/destinationrules": "DestinationRule",
	} {
		got, err := Hosts(c, garbage)
		if err == nil {
			t.Errorf("Hosts(%s, garbage) = %q, nil; want an error", c, got)
			continue
		}
		if !strings.Contains(err.Error(), kind) || !strings.Contains(err.Error(), "does not decode") {
			t.Errorf("Hosts(%s, garbage) error %q does not name %s", c, err, kind)
		}
	}
	// Invalid UTF-8 in a string field is refused too.
	bad := []byte{0x0a, 0x02, 0xff, 0xfe} // field 1 (hosts), length 2
	if _, err := Hosts(vsColl, bad); err == nil || !strings.Contains(err.Error(), "VirtualService") {
		t.Errorf("Hosts(invalid UTF-8) = %v, want an error naming VirtualService", err)
	}
}

// TestHostsThenCheck is the way the hub uses the package: decode, then check.
func TestHostsThenCheck(t *testing.T) {
	p := mustNew(t, testClusters[:3], Options{})
	body := marshal(t, &networking.VirtualService{Hosts: []string{"reviews", "api.pay.example.com"}})
	hosts, err := Hosts(vsColl, body)
	if err != nil {
		t.Fatal(err)
	}
	want := `host "api.pay.example.com" is not owned by cluster "east" (owned by "west", "wide")`
	if err := p.Check("east", Object{Collection: vsColl, Name: "shop/r", Hosts: hosts}); err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}
