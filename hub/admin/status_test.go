package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub/api"
)

// fakeAPI serves fixed documents at the admin API's paths (the rendering under test is the
// command's; the documents are the hub's, as package hub/api defines them).
func fakeAPI(t *testing.T, docs map[string]any) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc, ok := docs[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(doc)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

var allColls = []string{
	"istio/networking/v1alpha3/virtualservices", "istio/networking/v1alpha3/destinationrules", "istio/networking/v1alpha3/gateways",
	"istio/networking/v1alpha3/serviceentries", "istio/networking/v1alpha3/sidecars", "istio/networking/v1alpha3/workloadentries",
	"istio/networking/v1alpha3/workloadgroups", "istio/networking/v1alpha3/envoyfilters", "istio/security/v1beta1/authorizationpolicies",
	"istio/security/v1beta1/peerauthentications", "istio/security/v1beta1/requestauthentications", "istio/telemetry/v1alpha1/telemetries",
	"istio/extensions/v1alpha1/wasmplugins",
}

// hub status: clusters with whether they are connected and in sync now (a cluster that
// synced and then left is not), LAST CONTACT "now" while connected and the time since its
// disconnect otherwise; sinks named by identity (node id, marked, without one) with their
// state, the collections counted, not inlined: a row fits 120 columns for a sink of every
// collection. -o wide adds each sink's state per collection.
func TestStatusTables(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	colls := map[string]*api.SinkCollection{}
	for i, c := range allColls {
		colls[c] = &api.SinkCollection{PushedVersion: uint64(i + 2), AckedVersion: uint64(i + 2), State: api.SinkSynced, Resources: 3, LastPush: now.Add(-time.Minute)}
	}
	colls[allColls[1]] = &api.SinkCollection{PushedVersion: 4, AckedVersion: 3, LastNACK: "InvalidArgument: bad subset", NACKedVersion: 4, State: api.SinkNACKed}
	addr := fakeAPI(t, map[string]any{
		"/api/clusters": []api.ClusterStatus{
			{Name: "east", Tenant: "default", Connected: true, Streams: 1, Synced: true, LastContact: ago(40 * time.Minute), Resources: map[string]int{"vs": 4, "dr": 2},
				Rejections: map[string]map[string]string{"vs": {"shop/x": "not owned"}}, Conflicts: map[string]map[string]string{"vs": {"shop/y": "west"}}},
			{Name: "west", Tenant: "default", Connected: false, Synced: true, LastContact: ago(2 * time.Second), Resources: map[string]int{}},
			{Name: "north", Tenant: "default", Restored: true, Synced: false},
		},
		"/api/sinks": []api.SinkStatus{
			{Stream: 3, Protocol: "mcp", Transport: "server", Identity: "spiffe://meshfed.local/sink/istiod-1", Tenant: "default", NodeID: "istiod-1",
				Rules: []string{"all"}, Since: now.Add(-5 * time.Minute), State: api.SinkNACKed, Collections: colls},
			{Stream: 9, Protocol: "xds", Transport: "server", Unauthenticated: true, NodeID: "sidecar~10.0.0.7~istiod-2", Tenant: "default", Rules: []string{"istiod"},
				Since: now.Add(-3 * time.Hour), State: api.SinkSyncing, Collections: map[string]*api.SinkCollection{allColls[0]: {Pending: true, PushedVersion: 1, State: api.SinkSyncing}}},
		},
	})
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := Run(context.Background(), append([]string{"status", "--admin", addr}, args...), &out); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := run()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^NAME +TENANT +CONNECTED +SYNCED +LAST CONTACT +OBJECTS +REFUSED +CONFLICTS +BREAKER$`),
		regexp.MustCompile(`(?m)^east +default +yes +yes +now +6 +1 +1 +-$`),
		regexp.MustCompile(`(?m)^west +default +no +no +2s ago +0 +0 +0 +-$`),
		regexp.MustCompile(`(?m)^north +default +no \(restored\) +no +never +0 +0 +0 +-$`),
		regexp.MustCompile(`(?m)^SINK +TENANT +RULES +STATE +COLLECTIONS +AGE$`),
		regexp.MustCompile(`(?m)^spiffe://meshfed.local/sink/istiod-1 +default +all +NACKED +13 +5m$`),
		regexp.MustCompile(`(?m)^sidecar~10.0.0.7~istiod-2 \(unauthenticated\) +default +istiod +SYNCING +1 +3h$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("hub status does not match %s:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 120 {
			t.Errorf("a line of %d columns (over 120):\n%s", len(line), line)
		}
	}

	wide := run("-o", "wide")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^SINK +COLLECTION +STATE +ACKED +PUSHED +OBJECTS +LAST PUSH +LAST NACK$`),
		regexp.MustCompile(`(?m)^spiffe://meshfed.local/sink/istiod-1 +destinationrules +NACKed +3 +4 +0 +- +InvalidArgument: bad subset$`),
		regexp.MustCompile(`(?m)^spiffe://meshfed.local/sink/istiod-1 +virtualservices +Synced +2 +2 +3 +60s ago +-$`),
		regexp.MustCompile(`(?m)^sidecar~10.0.0.7~istiod-2 \(unauthenticated\) +virtualservices +Syncing +0 +1 +0 +- +-$`),
		regexp.MustCompile(`(?m)^SINK +TENANT +RULES +STATE +COLLECTIONS +AGE +PROTOCOL +NODE +PEER$`),
	} {
		if !want.MatchString(wide) {
			t.Errorf("hub status -o wide does not match %s:\n%s", want, wide)
		}
	}

	var doc struct {
		Clusters []api.ClusterStatus `json:"clusters"`
		Sinks    []api.SinkStatus    `json:"sinks"`
	}
	if err := json.Unmarshal([]byte(run("-o", "json")), &doc); err != nil || len(doc.Clusters) != 3 || len(doc.Sinks) != 2 {
		t.Errorf("-o json: %v %+v", err, doc)
	}
	if y := run("-o", "yaml"); !strings.Contains(y, "clusters:\n- ") || !strings.Contains(y, "name: east") {
		t.Errorf("-o yaml:\n%s", y)
	}
	if err := Run(context.Background(), []string{"status", "--admin", addr, "-o", "xml"}, &bytes.Buffer{}); err == nil || err.Error() != `-o "xml": want one of table, wide, json, yaml` {
		t.Errorf("-o xml: %v", err)
	}
}

// kubectl's AGE: seconds up to 3 minutes, minutes up to 3 hours, hours up to 2 days.
func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{-time.Second: "0s", 59 * time.Second: "59s", 179 * time.Second: "179s", 3 * time.Minute: "3m",
		3 * time.Hour: "3h", 47 * time.Hour: "47h", 50 * time.Hour: "2d"} {
		if got := age(d); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
}

// checkName takes any name a user types: NAMESPACE/NAME or NAME as Kubernetes names
// objects, refused otherwise with the rule; it never panics, and what it accepts has at most
// one "/" and no empty part.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"shop/cart", "cart", "a/b/c", "/x", "Shop/cart", "", "a.b/c-d"} {
		f.Add(s)
	}
	cmd := whyCommand()
	f.Fuzz(func(t *testing.T, name string) {
		err := checkName(cmd, name)
		if err == nil && (strings.Count(name, "/") > 1 || name == "" || strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/")) {
			t.Errorf("checkName(%q) accepted it", name)
		}
		if err != nil && !strings.Contains(err.Error(), "want NAMESPACE/NAME") {
			t.Errorf("checkName(%q): %v", name, err)
		}
	})
}
