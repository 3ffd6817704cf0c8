package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
)

// getObject asks the admin API's /api/object as v would (the context viaAdminTLS gives a
// tenant's operator; nil: the vendor).
func getObject(t *testing.T, h *Hub, v *viewer, coll, name string) (int, string) {
	t.Helper()
	q := url.Values{"collection": {coll}}
	if name != "" {
		q.Set("name", name)
	}
	r := httptest.NewRequest(http.MethodGet, "/api/object?"+q.Encode(), nil)
	if v != nil {
		r = r.WithContext(context.WithValue(r.Context(), viewerKey{}, *v))
	}
	w := httptest.NewRecorder()
	h.httpHandler().ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b)
}

func compact(t *testing.T, b []byte) string {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// publish applies one VirtualService per name (claiming host) as cluster's push.
func publish(t *testing.T, h *Hub, cluster, host string, names ...string) {
	t.Helper()
	c := &mcp.Change{Collection: vsColl}
	for _, n := range names {
		r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: n, Version: "7", Labels: map[string]string{"app": "cart"}, CreateTime: timestamppb.Now()},
			Body: goldenBody(t, vsColl, []string{host})}
		e, err := mcp.NewEntry(r)
		if err != nil {
			t.Fatal(err)
		}
		c.Entries, c.Resources = append(c.Entries, e), append(c.Resources, r)
	}
	if err := h.Apply(cluster, c); err != nil {
		t.Fatal(err)
	}
}

// /api/object lists a collection's served objects and shows one's served content (its
// body decoded through the kind's message) with every cluster's copy; a tenant's operator
// sees its tenant's only, and another tenant's object is answered exactly as a missing one.
func TestObjectEndpoint(t *testing.T) {
	h := testHub(t, twoTenants)
	publish(t, h, "east", "a.shop.example.com", "shop/a")
	publish(t, h, "north", "b.bank.example.com", "bank/b")

	code, body := getObject(t, h, nil, "vs", "")
	var list api.ObjectList
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil {
		t.Fatalf("list: %d %v\n%s", code, err, body)
	}
	if list.Kind != "VirtualService" || list.APIVersion != "networking.istio.io/v1alpha3" || len(list.Items) != 2 ||
		list.Items[0].Name != "bank/b" || list.Items[0].Cluster != "north" || list.Items[1].Version != "east/7" || list.Items[1].Created == nil {
		t.Errorf("vendor's list: %+v", list)
	}

	code, body = getObject(t, h, nil, "VirtualService", "shop/a")
	var o api.Object
	if err := json.Unmarshal([]byte(body), &o); code != http.StatusOK || err != nil {
		t.Fatalf("object: %d %v\n%s", code, err, body)
	}
	if o.Served == nil || o.Served.Kind != "VirtualService" || o.Served.Metadata.Namespace != "shop" || o.Served.Metadata.Name != "a" ||
		o.Served.Metadata.ResourceVersion != "east/7" || o.Served.Metadata.Annotations[api.OriginAnnotation] != "east" ||
		o.Served.Metadata.Labels["app"] != "cart" || compact(t, o.Served.Spec) != `{"hosts":["a.shop.example.com"]}` {
		t.Errorf("served: %+v (spec %s)", o.Served, o.Served.Spec)
	}
	if len(o.Candidates) != 1 || !o.Candidates[0].Served || o.Candidates[0].Cluster != "east" {
		t.Errorf("candidates: %+v", o.Candidates)
	}

	acme := viewer{tenant: "acme", comp: h.current().comp}
	code, body = getObject(t, h, &acme, "vs", "")
	if code != http.StatusOK || !strings.Contains(body, `"shop/a"`) || strings.Contains(body, "bank") || strings.Contains(body, "north") {
		t.Errorf("acme's list: %d\n%s", code, body)
	}
	if code, _ := getObject(t, h, &acme, "vs", "shop/a"); code != http.StatusOK {
		t.Errorf("acme's own object: %d", code)
	}
	code, theirs := getObject(t, h, &acme, "vs", "bank/b")
	missingCode, missing := getObject(t, h, &acme, "vs", "bank/zz")
	if code != http.StatusNotFound || missingCode != http.StatusNotFound || strings.ReplaceAll(missing, "bank/zz", "bank/b") != theirs {
		t.Errorf("another tenant's object: %d %q; a missing one: %d %q", code, theirs, missingCode, missing)
	}
	if code, body := getObject(t, h, nil, "vs", "bank/zz"); code != http.StatusNotFound || body != "istio/networking/v1alpha3/virtualservices \"bank/zz\" not found\n" {
		t.Errorf("missing: %d %q", code, body)
	}
	if code, body := getObject(t, h, nil, "dr", ""); code != http.StatusBadRequest || !strings.HasPrefix(body, "collection: istio/networking/v1alpha3/destinationrules is not one of this hub's collections") {
		t.Errorf("a collection not served: %d %q", code, body)
	}
	if code, body := getObject(t, h, nil, "vss", "shop/a"); code != http.StatusBadRequest || !strings.HasPrefix(body, `collection: unknown collection "vss"`) {
		t.Errorf("an unknown collection: %d %q", code, body)
	}
}
