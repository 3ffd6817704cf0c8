package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp/kinds"
)

// The operator's commands link the admin API's contract, not the server: neither the hub's
// core nor its replica layer (memberlist).
func TestLinksOnlyTheContract(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "github.com/meshfed/meshfed/hub", strings.HasPrefix(dep, "github.com/meshfed/meshfed/hub/replicas"),
			strings.Contains(dep, "hashicorp/memberlist"), dep == "github.com/meshfed/meshfed/routing", dep == "github.com/meshfed/meshfed/hub/acl":
			t.Errorf("hub/admin links %s", dep)
		}
	}
}

// subscribe's -collections are typed as users type them; without -admin they resolve
// against the built-in kinds, and an unknown one is an error listing the known names.
func TestSubscribeCollections(t *testing.T) {
	ctx := context.Background()
	got, err := subscribeCollections(ctx, "", "vs, TrafficExtension,networking.istio.io/v1/DestinationRule")
	if err != nil || strings.Join(got, ",") != "istio/networking/v1alpha3/virtualservices,istio/extensions/v1alpha1/trafficextensions,istio/networking/v1alpha3/destinationrules" {
		t.Errorf("subscribeCollections = %v, %v", got, err)
	}
	if got, err := subscribeCollections(ctx, "", ""); err != nil || !slices.Equal(got, kinds.Collections()) {
		t.Errorf("default = %v, %v", got, err)
	}
	for typed, want := range map[string]string{
		"vs,vss":             `-collections[1]: unknown collection "vss": known: `,
		"vs,,dr":             "-collections[1]: empty collection name: known: ",
		"vs,Virtual":         `-collections[1]: unknown collection "Virtual"`,
		"dr,DestinationRule": `-collections[1]: "DestinationRule" is istio/networking/v1alpha3/destinationrules, already listed as -collections[0] ("dr")`,
	} {
		if _, err := subscribeCollections(ctx, "", typed); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", typed, err, want)
		}
	}
}

// hub status shows every sink with its protocol, and per collection (over xDS, per type URL
// that resolves to none) the ACKed/pushed versions, pending and NACK; hub why says which
// protocol each sink receiving the object speaks.
func TestStatusAndWhyShowSinksByProtocol(t *testing.T) {
	sinks := []api.SinkStatus{
		{Stream: 3, Transport: "server", Protocol: "mcp", NodeID: "global-a", Rules: []string{"all"}, Collections: map[string]*api.SinkCollection{
			"istio/networking/v1alpha3/virtualservices": {PushedVersion: 4, AckedVersion: 3, Pending: true},
		}},
		{Stream: 4, Transport: "client", Protocol: "mcp", NodeID: "listener", Rules: []string{"all"}, Collections: map[string]*api.SinkCollection{}},
		{Stream: 9, Transport: "server", Protocol: "xds", NodeID: "sidecar~10.0.0.7~istiod-1.istio-system~istio-system.svc.cluster.local", Rules: []string{"istiod"},
			Collections: map[string]*api.SinkCollection{
				"istio/networking/v1alpha3/virtualservices":  {TypeURL: "networking.istio.io/v1/VirtualService", PushedVersion: 4, AckedVersion: 4},
				"istio/networking/v1alpha3/destinationrules": {TypeURL: "networking.istio.io/v1/DestinationRule", PushedVersion: 2, LastNACK: "InvalidArgument: bad", NACKedVersion: 2},
				"core/v1alpha1/MeshConfig":                   {TypeURL: "core/v1alpha1/MeshConfig", Pending: true},
			}},
	}
	why := api.Why{Collection: "istio/networking/v1alpha3/virtualservices", Name: "shop/cart", Served: &api.Candidate{Cluster: "east", Version: "east/1"},
		Candidates: []api.Candidate{{Cluster: "east", Version: "east/1", Served: true}},
		Sinks:      []api.WhySink{{Stream: 9, Protocol: "xds", NodeID: "istiod-1", Rules: []string{"istiod"}, UpToDate: true}, {Stream: 3, NodeID: "old-hub"}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/clusters":
			_ = json.NewEncoder(w).Encode([]api.ClusterStatus{{Name: "east", Synced: true, Restored: true, Resources: map[string]int{"vs": 4}}})
		case "/api/sinks":
			_ = json.NewEncoder(w).Encode(sinks)
		case "/api/why":
			_ = json.NewEncoder(w).Encode(why)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	admin := strings.TrimPrefix(srv.URL, "http://")
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"status", "-admin", admin}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`\neast +false \(restored\) +true +4 +0 +0 +never\n`),
		regexp.MustCompile(`SINK +PROTOCOL +IDENTITY +NODE`),
		regexp.MustCompile(`\n3 +mcp +- +global-a +all +virtualservices 3/4 pending +0\n`),
		regexp.MustCompile(`\n4 +mcp dial-out +- +listener +all +0\n`),
		regexp.MustCompile(`\n9 +xds +- +sidecar~10\.0\.0\.7~istiod-1\S+ +istiod +MeshConfig 0/0 pending; destinationrules 0/2 NACK; virtualservices 4/4 +1\n`),
	} {
		if !want.MatchString(out.String()) {
			t.Errorf("hub status does not match %s:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := Run(context.Background(), []string{"why", "-admin", admin, "vs", "shop/cart"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"  sink 9 over xds (-, node istiod-1, rules istiod): up to date\n", "  sink 3 (-, node old-hub, rules ): not yet acknowledged\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("hub why lacks %q:\n%s", want, out.String())
		}
	}
}
