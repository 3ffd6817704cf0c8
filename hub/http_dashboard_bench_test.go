package hub

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/meshfed/meshfed/hub/api"
)

// scaleHub is a development hub of 100 clusters (c00..c99, each owning namespace nsNN)
// whose 10,000 sinks are registered through the sink registry's hooks, as the engine
// registers real streams: node ids nRR-I routed to 20 rules (fleets) rRR; nine in ten have
// ACKed, one in twenty has a push unanswered (stale), one in twenty NACKed. Each cluster
// holds 10 objects and had one refused.
func scaleHub(b testing.TB) *Hub {
	var y strings.Builder
	y.WriteString("insecure: true\nsinkStaleAfter: 1ns\ncollections: [istio/networking/v1alpha3/virtualservices]\nclusters:\n")
	for c := range 100 {
		fmt.Fprintf(&y, "- {name: c%02d, identities: [c%02d], namespaces: [ns%02d], hosts: [\"*\"]}\n", c, c, c)
	}
	y.WriteString("routing:\n  rules:\n")
	for r := range 20 {
		fmt.Fprintf(&y, "  - {name: r%02d, nodeIds: [\"n%02d-*\"], identities: [\"*\"]}\n", r, r)
	}
	h := testHub(b, y.String())
	for c := range 100 {
		cluster := fmt.Sprintf("c%02d", c)
		_ = h.Apply(cluster, edit(b, fmt.Sprintf("elsewhere/refused-%02d", c), 1)) // refused: its error is the NACK's
		for i := range 10 {
			if err := h.Apply(cluster, edit(b, fmt.Sprintf("ns%02d/vs-%d", c, i), 1)); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := range 10_000 {
		state := api.SinkSynced
		switch i % 20 {
		case 7:
			state = api.SinkStale
		case 13:
			state = api.SinkNACKed
		}
		answer(h, openSink(b, h, fmt.Sprintf("sink-%d", i), fmt.Sprintf("n%02d-%d", i%20, i)), state)
	}
	return h
}

// BenchmarkDashboard measures what the page's requests cost the hub with 100 clusters and
// 10,000 sinks, JSON encoding included: an overview as computed (the endpoint answers every
// request of a scope with one for a second: overviewCache), a page of a fleet's stale
// sinks, a search, the refusals of a namespace, and, for comparison, the full sink list
// (/api/sinks without parameters) that the page never asks for.
func BenchmarkDashboard(b *testing.B) {
	h := scaleHub(b)
	mux := h.httpHandler()
	vendorView := vendor(h.current().comp)
	ask := func(path string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) { mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil)) }
	}
	for _, bc := range []struct {
		name  string
		serve func(w http.ResponseWriter)
	}{
		{"overview", func(w http.ResponseWriter) { WriteJSON(w, h.overview(vendorView)) }},
		{"sinks_page", ask("/api/sinks?fleet=default/r07&state=Stale&limit=50")},
		{"sinks_search", ask("/api/sinks?q=n14-1234")},
		{"refusals_namespace", ask("/api/refusals?namespace=elsewhere&limit=50")},
		{"sinks_full_list", ask("/api/sinks")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var n int
			for b.Loop() {
				rec := httptest.NewRecorder()
				bc.serve(rec)
				if rec.Code != http.StatusOK {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
				n = rec.Body.Len()
			}
			b.ReportMetric(float64(n), "bytes/answer")
		})
	}
}
