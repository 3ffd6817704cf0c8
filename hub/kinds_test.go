package hub

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	extensions "istio.io/api/extensions/v1alpha1"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/internal/testkit/adstest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

const (
	teColl     = "istio/extensions/v1alpha1/trafficextensions"
	widgetColl = "example/widgets"
)

// kindsHub serves TrafficExtension (built in), Widget (configured) and VirtualService to
// every sink; cluster east has published one resource of each of the first two.
const kindsHub = `
insecure: true
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
warmUp: 1h
kinds: [{collection: example/widgets, group: example.com, version: v1, resource: widgets, kind: Widget, shortNames: [wd]}]
collections: [TrafficExtension, wd, vs]
clusters: [{name: east, identities: [east], namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`

func kindsTestHub(t *testing.T) *Hub {
	t.Helper()
	h := testHub(t, kindsHub)
	if got := strings.Join(h.cfg.Collections, ","); got != teColl+","+widgetColl+","+vsColl {
		t.Fatalf("collections %s", got)
	}
	widget, _ := structpb.NewStruct(map[string]any{"size": 3.0})
	for coll, body := range map[string]proto.Message{teColl: &extensions.TrafficExtension{}, widgetColl: widget, vsColl: nil} {
		c := &mcp.Change{Collection: coll}
		if body != nil {
			b, err := anypb.New(body)
			if err != nil {
				t.Fatal(err)
			}
			r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "shop/a", Version: "1"}, Body: b}
			e, err := mcp.NewEntry(r)
			if err != nil {
				t.Fatal(err)
			}
			c.Entries, c.Resources = []*mcp.Entry{e}, []*mcpapi.Resource{r}
		}
		if err := h.Apply("east", c); err != nil {
			t.Fatal(err)
		}
	}
	if !h.Ready() {
		t.Fatal("not ready")
	}
	return h
}

// istiod (1.30 and later) asks for TrafficExtension by its type URL, and a newer istiod for
// kinds meshfed does not know yet: a configured kind is served by its group/version/Kind
// (any version), a kind the hub does not serve and MeshConfig are answered empty.
func TestXDSServesTrafficExtensionAndConfiguredKinds(t *testing.T) {
	h := kindsTestHub(t)
	testrun.Start(t, "Run", h.Run)
	var serve string
	testwait.For(t, 10*time.Second, "the serve listener", func() bool { _, serve, _ = h.Addrs(); return serve != "" })
	c := adstest.Dial(t, serve, nil, &corepb.Node{Id: "istiod-1"})
	want := map[string]string{
		"extensions.istio.io/v1alpha1/TrafficExtension": "shop/a",
		"example.com/v1/Widget":                         "shop/a",
		"example.com/v2/Widget":                         "shop/a",
		"networking.istio.io/v1/VirtualService":         "",
		"networking.istio.io/v1/DestinationRule":        "", // built in, not one of the hub's collections
		"example.com/v1/Gadget":                         "",
		"core/v1alpha1/MeshConfig":                      "",
	}
	urls := make([]string, 0, len(want))
	for url := range want {
		urls = append(urls, url)
	}
	sort.Strings(urls)
	for _, url := range urls {
		c.Subscribe(url)
	}
	got := map[string]string{}
	for range want {
		r := c.Recv()
		var names []string
		for _, res := range adstest.Resources(t, r) {
			names = append(names, res.GetMetadata().GetName())
		}
		got[r.GetTypeUrl()] = strings.Join(names, ",")
	}
	for url, w := range want {
		if g, ok := got[url]; !ok || g != w {
			t.Errorf("%s: served %q (answered: %v), want %q", url, g, ok, w)
		}
	}
}

// The admin API's why and the CLI take a collection as users type it; an unknown one is an
// error listing the known names, a known one the hub does not serve says so.
func TestWhyResolvesTypedCollections(t *testing.T) {
	h := kindsTestHub(t)
	srv := httptest.NewServer(h.httpHandler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	why := func(coll string) (string, error) {
		var out bytes.Buffer
		err := admin.Run(context.Background(), []string{"why", "-admin", addr, coll, "shop/a"}, &out)
		return out.String(), err
	}
	for _, typed := range []string{"TrafficExtension", "trafficextensions", "extensions.istio.io/v1/TrafficExtension", teColl} {
		out, err := why(typed)
		if err != nil || !strings.HasPrefix(out, teColl+" shop/a\n  served from cluster east") {
			t.Errorf("why %s: %v\n%s", typed, err, out)
		}
	}
	if out, err := why("wd"); err != nil || !strings.HasPrefix(out, widgetColl+" shop/a\n  served from cluster east") {
		t.Errorf("why wd: %v\n%s", err, out)
	}
	_, err := why("vss")
	if err == nil || !strings.HasPrefix(err.Error(), `collection: unknown collection "vss": known: `) ||
		!strings.Contains(err.Error(), "istio/networking/v1alpha3/virtualservices (VirtualService, vs)") || !strings.Contains(err.Error(), "example/widgets (Widget, wd)") {
		t.Errorf("why vss: %v", err)
	}
	if _, err := why("dr"); err == nil || err.Error() != "collection: istio/networking/v1alpha3/destinationrules is not one of this hub's collections ("+teColl+", "+widgetColl+", "+vsColl+")" {
		t.Errorf("why dr: %v", err)
	}
	// subscribe resolves its -collections against the kinds the hub serves (/api/kinds).
	if err := admin.Run(context.Background(), []string{"subscribe", "-admin", addr, "-collections", "vs,vss"}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), `--collections[1]: unknown collection "vss": known: `) || !strings.Contains(err.Error(), "example/widgets (Widget, wd)") {
		t.Errorf("subscribe vss: %v", err)
	}
	if err := admin.Run(context.Background(), []string{"subscribe", "-admin", addr, "-collections", "wd,dr"}, io.Discard); err == nil ||
		err.Error() != "--collections[1]: istio/networking/v1alpha3/destinationrules is not one of the hub's collections" {
		t.Errorf("subscribe dr: %v", err)
	}
}
