package hub

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/dashboard"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// The dashboard's endpoints: summaries and pages of what the admin API lists, for the
// request's viewer.

// fleetHub is a development hub of one cluster whose sinks are routed by node id: "a-*"
// to rule a, "b-*" to rule b. A push unanswered for a nanosecond is stale, so a test sees
// Stale without waiting.
const fleetHub = `
insecure: true
sinkStaleAfter: 1ns
collections: [istio/networking/v1alpha3/virtualservices]
clusters: [{name: east, identities: [east], namespaces: [shop], hosts: ["*"]}]
routing: {rules: [{name: a, nodeIds: ["a-*"], identities: ["*"]}, {name: b, nodeIds: ["b-*"], identities: ["*"]}]}
`

// openSink registers a sink stream as the engine's hooks would, with node id node, and
// returns it; it is closed when the test ends.
func openSink(t testing.TB, h *Hub, identity, node string) *mcp.StreamInfo {
	info := mcp.NewStreamInfo(identity, &mcppb.SinkNode{Id: node}, func() {})
	h.sinks.hooks().StreamOpened(info)
	t.Cleanup(func() { h.sinks.hooks().StreamClosed(info, nil) })
	return info
}

// answer drives state for a sink's collection: "Synced" (pushed and ACKed), "Syncing" is
// not reachable with sinkStaleAfter 1ns, "Stale" (pushed, unanswered), "NACKed".
func answer(h *Hub, info *mcp.StreamInfo, state string) {
	hooks := h.sinks.hooks()
	hooks.Pushed(info, mcp.PushEvent{Collection: vsColl, Version: 1})
	switch state {
	case api.SinkSynced:
		hooks.Acked(info, mcp.AckEvent{Collection: vsColl, Version: 1, Code: codes.OK})
	case api.SinkNACKed:
		hooks.Acked(info, mcp.AckEvent{Collection: vsColl, Version: 1, Code: codes.InvalidArgument, Message: "bad object"})
	}
}

// get serves path with the hub's admin handler, as the http listener (the vendor).
func get(t *testing.T, h *Hub, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.httpHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func decode[T any](t *testing.T, body string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return v
}

// Fleets count their sinks by state; /api/sinks with parameters pages, filters and
// searches, and without them still lists every sink.
func TestDashboardFleetsAndSinkPages(t *testing.T) {
	h := testHub(t, fleetHub)
	states := []string{api.SinkSynced, api.SinkStale, api.SinkNACKed}
	for i := range 120 {
		answer(h, openSink(t, h, fmt.Sprintf("sink-%d", i), fmt.Sprintf("a-%03d", i)), states[i%3])
	}
	for i := range 5 {
		answer(h, openSink(t, h, fmt.Sprintf("other-%d", i), fmt.Sprintf("b-%d", i)), api.SinkSynced)
	}
	openSink(t, h, "lost", "c-1") // no rule selects it

	_, body := get(t, h, "/api/overview")
	o := decode[api.Overview](t, body)
	want := map[string]api.StateCounts{
		"default/":  {Total: 1, Synced: 1},
		"default/a": {Total: 120, Synced: 40, Stale: 40, NACKed: 40},
		"default/b": {Total: 5, Synced: 5},
	}
	if len(o.Fleets) != len(want) {
		t.Fatalf("fleets %+v, want %v", o.Fleets, want)
	}
	for _, f := range o.Fleets {
		if f.StateCounts != want[f.Key] {
			t.Errorf("fleet %s: %+v, want %+v", f.Key, f.StateCounts, want[f.Key])
		}
		if (f.OldestBehind != nil) != (f.Key == "default/a") {
			t.Errorf("fleet %s: oldest unanswered push %v; only fleet a has unanswered pushes", f.Key, f.OldestBehind)
		}
	}
	if o.Sinks != (api.StateCounts{Total: 126, Synced: 46, Stale: 40, NACKed: 40}) || len(o.Clusters) != 1 || o.Clusters[0].Name != "east" {
		t.Errorf("overview: sinks %+v, clusters %+v", o.Sinks, o.Clusters)
	}

	// Pages of fleet a's stale sinks: 40 in all, by stream.
	seen := map[uint64]bool{}
	for offset := 0; offset < 40; offset += 15 {
		_, body := get(t, h, fmt.Sprintf("/api/sinks?fleet=default/a&state=stale&offset=%d&limit=15", offset))
		p := decode[api.SinkPage](t, body)
		if p.Total != 40 || len(p.Sinks) != min(15, 40-offset) {
			t.Fatalf("offset %d: total %d, %d sinks", offset, p.Total, len(p.Sinks))
		}
		for i, s := range p.Sinks {
			if s.State != api.SinkStale || s.Rules[0] != "a" || seen[s.Stream] || i > 0 && s.Stream < p.Sinks[i-1].Stream {
				t.Errorf("page at %d: %+v (a stale sink of fleet a, once, in stream order)", offset, s)
			}
			seen[s.Stream] = true
		}
	}
	// Search: by node id, any case; past the end, an empty page.
	for q, total := range map[string]int{"q=A-00": 10, "q=other": 5, "q=nothing": 0, "fleet=default/b&q=sink": 0, "offset=1000": 126} {
		_, body := get(t, h, "/api/sinks?"+q)
		if p := decode[api.SinkPage](t, body); p.Total != total || p.Sinks == nil {
			t.Errorf("%s: total %d (sinks %v), want %d", q, p.Total, p.Sinks, total)
		}
	}
	// Without parameters: every sink, as before.
	_, body = get(t, h, "/api/sinks")
	if all := decode[[]api.SinkStatus](t, body); len(all) != 126 {
		t.Errorf("/api/sinks lists %d sinks, want 126", len(all))
	}
}

// Bad parameters are refused with 400, naming the parameter and what it takes.
func TestDashboardQueriesRefuseBadInput(t *testing.T) {
	h := testHub(t, fleetHub)
	for path, says := range map[string]string{
		"/api/sinks?offset=-1":             "offset: -1 is not between 0 and",
		"/api/sinks?limit=0":               "limit: 0 is not between 1 and 500",
		"/api/sinks?limit=501":             "limit: 501 is not between 1 and 500",
		"/api/sinks?limit=ten":             `limit: "ten" is not a whole number`,
		"/api/sinks?state=broken":          `state: "broken" is not one of Synced, Syncing, Stale, NACKed`,
		"/api/sinks?flet=default/a":        `parameter "flet": unknown; this endpoint takes fleet, q, state, offset, limit`,
		"/api/refusals?offset=x":           `offset: "x" is not a whole number`,
		"/api/refusals?hosts=a.example":    `parameter "hosts": unknown`,
		"/api/refusals?limit=100000000000": "limit:",
	} {
		if code, body := get(t, h, path); code != http.StatusBadRequest || !strings.Contains(body, says) {
			t.Errorf("%s: %d %q, want 400 saying %q", path, code, body, says)
		}
	}
}

// The refusals list is searchable by host (a reason quotes it), namespace and cluster.
func TestDashboardRefusals(t *testing.T) {
	h := testHub(t, twoClusters)
	_ = h.Apply("east", vsPush(t, "shop/a", "pay/stolen", "pay/other"))
	_, body := get(t, h, "/api/refusals")
	all := decode[api.RefusalPage](t, body)
	if all.Total != 2 || all.Refusals[0].Name != "pay/other" || all.Refusals[0].Cluster != "east" || !strings.Contains(all.Refusals[0].Reason, `namespace "pay"`) {
		t.Fatalf("refusals: %+v", all)
	}
	for q, total := range map[string]int{"namespace=pay": 2, "namespace=shop": 0, "cluster=east&q=STOLEN": 1, "cluster=west": 0, "host=api.pay.example.com": 0} {
		_, body := get(t, h, "/api/refusals?"+q)
		if p := decode[api.RefusalPage](t, body); p.Total != total {
			t.Errorf("%s: %d refusals, want %d: %+v", q, p.Total, total, p.Refusals)
		}
	}
	_, body = get(t, h, "/api/overview")
	if o := decode[api.Overview](t, body); o.Refusals != 2 || o.Clusters[0].Refusals != 2 || o.Clusters[0].Objects != 1 {
		t.Errorf("overview: %d refusals, east %+v", o.Refusals, o.Clusters[0])
	}
}

// Over adminTLS with tenants, the page and every dashboard endpoint answer a tenant's
// operator for its tenant alone, and whoami says who it is and that it may act; the http
// listener is the vendor's, read-only; a sink's certificate reads nothing.
func TestDashboardScopedByTenant(t *testing.T) {
	p := newPKI(t)
	files, bundle := p.files, p.bundle
	hubFiles := meshtls.Files{Cert: p.hubCert, Key: p.hubKy}
	h, _ := runHub(t, `
tls: {certFile: `+hubFiles.Cert+`, keyFile: `+hubFiles.Key+`, caFile: `+bundle+`}
trustDomain: mesh.test
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
adminTLS: 127.0.0.1:0
collections: [istio/networking/v1alpha3/virtualservices]
operators: [vera]
tenants:
- name: acme
  operators: [ann]
  sinks: ["spiffe://mesh.test/sink/acme-*"]
  clusters: [{name: east, namespaces: [shop], hosts: ["*.shop.example.com"]}]
  routing: {rules: [{name: fleet, identities: ["*"]}]}
- name: globex
  operators: [gus]
  sinks: ["spiffe://mesh.test/sink/globex-*"]
  clusters: [{name: north, namespaces: [bank], hosts: ["*.bank.example.com"]}]
  routing: {rules: [{name: fleet, identities: ["*"]}]}
`)
	_ = h.Apply("east", vsPush(t, "shop/cart", "bank/steal"))
	_ = h.Apply("north", vsPush(t, "bank/vault", "shop/steal"))
	openSink(t, h, "spiffe://mesh.test/sink/acme-1", "")
	openSink(t, h, "spiffe://mesh.test/sink/globex-1", "")
	openSink(t, h, "spiffe://mesh.test/sink/globex-2", "")
	_, _, httpAddr := h.Addrs()
	admin := "https://" + h.AdminTLSAddr()
	ann := tlsClient(t, files("ann", "spiffe://mesh.test/operator/ann"))
	vera := tlsClient(t, files("vera", "spiffe://mesh.test/operator/vera"))

	read := func(c *http.Client, url string, v any) {
		t.Helper()
		code, body := call(t, c, http.MethodGet, url, nil)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", url, code, body)
		}
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Fatalf("GET %s: %v: %s", url, err, body)
		}
	}
	for _, tc := range []struct {
		who            string
		c              *http.Client
		base           string
		clusters       string
		sinks          int
		refused        string
		whoami         api.WhoAmI
		tenantOfFleets string
	}{
		{"ann, acme's operator", ann, admin, "east", 1, "east bank/steal", api.WhoAmI{Operator: "spiffe://mesh.test/operator/ann", Tenant: "acme", CanAct: true}, "acme"},
		{"vera, the vendor's operator", vera, admin, "east,north", 3, "east bank/steal,north shop/steal", api.WhoAmI{Operator: "spiffe://mesh.test/operator/vera", CanAct: true}, ""},
		{"plain http", &http.Client{}, "http://" + httpAddr, "east,north", 3, "east bank/steal,north shop/steal",
			api.WhoAmI{Operator: "none (the http listener carries no certificate)", Why: "actions need an authenticated operator: a client certificate for spiffe://mesh.test/operator/NAME, over adminTLS (" + h.AdminTLSAddr() + "), not the http listener"}, ""},
	} {
		var o api.Overview
		read(tc.c, tc.base+"/api/overview", &o)
		var names []string
		for _, c := range o.Clusters {
			names = append(names, c.Name)
		}
		if strings.Join(names, ",") != tc.clusters || o.Sinks.Total != tc.sinks || o.Refusals != len(strings.Split(tc.refused, ",")) {
			t.Errorf("%s: overview clusters %v, %d sinks, %d refusals; want %s, %d, %s", tc.who, names, o.Sinks.Total, o.Refusals, tc.clusters, tc.sinks, tc.refused)
		}
		for _, f := range o.Fleets {
			if tc.tenantOfFleets != "" && f.Tenant != tc.tenantOfFleets {
				t.Errorf("%s: sees fleet %s", tc.who, f.Key)
			}
		}
		var p api.SinkPage
		read(tc.c, tc.base+"/api/sinks?limit=10", &p)
		if p.Total != tc.sinks {
			t.Errorf("%s: a page of sinks says %d in all, want %d", tc.who, p.Total, tc.sinks)
		}
		var r api.RefusalPage
		read(tc.c, tc.base+"/api/refusals", &r)
		var refused []string
		for _, x := range r.Refusals {
			refused = append(refused, x.Cluster+" "+x.Name)
		}
		if strings.Join(refused, ",") != tc.refused {
			t.Errorf("%s: refusals %v, want %s", tc.who, refused, tc.refused)
		}
		var w api.WhoAmI
		read(tc.c, tc.base+"/api/whoami", &w)
		if w != tc.whoami {
			t.Errorf("%s: whoami %+v, want %+v", tc.who, w, tc.whoami)
		}
		for _, path := range []string{"/", dashboard.Prefix + "app.js", dashboard.Prefix + "app.css"} {
			code, body := call(t, tc.c, http.MethodGet, tc.base+path, nil)
			if code != http.StatusOK || len(body) == 0 {
				t.Errorf("%s: GET %s: %d", tc.who, path, code)
			}
		}
	}
	// A sink's certificate is no operator's: with tenants, it reads nothing, the page
	// included.
	sink := tlsClient(t, files("sink", "spiffe://mesh.test/sink/acme-1"))
	for _, path := range []string{"/", "/api/overview", "/api/whoami"} {
		if code, _ := call(t, sink, http.MethodGet, admin+path, nil); code != http.StatusForbidden {
			t.Errorf("a sink's certificate: GET %s: %d, want 403", path, code)
		}
	}
	// The vendor's paths stay the vendor's.
	if code, _ := call(t, ann, http.MethodGet, admin+"/api/state", nil); code != http.StatusForbidden {
		t.Errorf("ann: GET /api/state: %d, want 403", code)
	}
}

// In development mode, a loopback page may act; the same request addressed to another
// name may not, and whoami says why.
func TestWhoAmIInDevelopmentMode(t *testing.T) {
	h := testHub(t, fleetHub)
	for host, want := range map[string]api.WhoAmI{
		"127.0.0.1:8080":    {Operator: DevOperator, CanAct: true},
		"rebound.example:1": {Operator: "none (development mode)", Why: `development mode (insecure) takes actions addressed to a loopback address only (127.0.0.1, ::1, localhost), not "rebound.example:1"`},
	} {
		req := httptest.NewRequest(http.MethodGet, "/api/whoami", nil)
		req.Host, req.RemoteAddr = host, "127.0.0.1:5555"
		rec := httptest.NewRecorder()
		h.httpHandler().ServeHTTP(rec, req)
		if got := decode[api.WhoAmI](t, rec.Body.String()); got != want {
			t.Errorf("addressed to %s: %+v, want %+v", host, got, want)
		}
	}
}

// The page is mounted at "/" exactly: other paths keep their answers (a GET of an action
// stays 405, an unknown path 404).
func TestDashboardMountedAtRootOnly(t *testing.T) {
	h := testHub(t, fleetHub)
	for path, want := range map[string]int{"/": 200, dashboard.Prefix + "app.js": 200, "/nothing": 404, dashboard.Prefix + "nothing.js": 404, "/api/clusters/east/breaker/release": 405} {
		if code, _ := get(t, h, path); code != want {
			t.Errorf("GET %s: %d, want %d", path, code, want)
		}
	}
}

// FuzzDashboardQueries: any query string is accepted within bounds or refused with an
// error naming a parameter; never a panic.
func FuzzDashboardQueries(f *testing.F) {
	for _, s := range []string{"", "fleet=default/a&state=Stale&offset=10&limit=5", "q=%zz", "limit=-1", "state=nacked", "offset=99999999999999999999", "host=a.b&namespace=shop&cluster=east"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if q, err := parseSinkQuery(v); err == nil {
			if q.offset < 0 || q.limit < 1 || q.limit > paging.max {
				t.Fatalf("%q: accepted %+v", raw, q)
			}
			if from, to := q.window(10); from > to || to > 10 {
				t.Fatalf("%q: window %d..%d of 10", raw, from, to)
			}
		} else if !strings.Contains(err.Error(), ":") {
			t.Fatalf("%q: %v names no parameter", raw, err)
		}
		if q, err := parseRefusalQuery(v); err == nil && (q.offset < 0 || q.limit < 1 || q.limit > paging.max) {
			t.Fatalf("%q: accepted %+v", raw, q)
		}
	})
}

// One overview answers every request of its scope for overviewEvery, however many pages
// poll; then, or after a reload, the next request computes a new one.
func TestDashboardOverviewComputedOncePerSecond(t *testing.T) {
	h := testHub(t, fleetHub)
	clock := withClock(h)
	mux := h.httpHandler()
	sinks := func() int {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/overview", nil))
		return decode[api.Overview](t, rec.Body.String()).Sinks.Total
	}
	if n := sinks(); n != 0 {
		t.Fatalf("%d sinks, want none yet", n)
	}
	openSink(t, h, "s-1", "a-1")
	if n := sinks(); n != 0 {
		t.Errorf("within a second: %d sinks, want the overview already computed (0)", n)
	}
	clock.advance(overviewEvery)
	if n := sinks(); n != 1 {
		t.Errorf("a second later: %d sinks, want 1", n)
	}
	openSink(t, h, "s-2", "a-2")
	reload(t, h, strings.Replace(fleetHub, "1ns", "2ns", 1))
	if n := sinks(); n != 2 {
		t.Errorf("after a reload: %d sinks, want 2 (a new configuration, a new overview)", n)
	}
}
