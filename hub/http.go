package hub

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/ops"
)

// The admin API: what the hub holds, serves and refused, and to whom, as package hub/api
// defines it.

// Why explains collection/name, for the vendor.
func (h *Hub) Why(collection, name string) api.Why {
	return h.why(vendor(h.current().comp), collection, name)
}

// whyServed is why without its sinks: the candidates, the one served, and the refusals (what
// /api/object shows, which lists no sinks).
func (h *Hub) whyServed(v viewer, collection, name string) api.Why {
	cands, why := h.store.candidates(v, collection, name)
	w := api.Why{Collection: collection, Name: name, Candidates: cands, Conflict: why, Rejected: []api.Refused{}, Sinks: []api.WhySink{}}
	if w.Candidates == nil {
		w.Candidates = []api.Candidate{}
	}
	if len(w.Candidates) > 0 && w.Candidates[0].Served {
		w.Served = &w.Candidates[0]
	}
	for _, cs := range h.clusterList() {
		if !v.ownsCluster(cs.name) {
			continue
		}
		cs.mu.Lock()
		if reason, ok := cs.rejections[collection][name]; ok {
			w.Rejected = append(w.Rejected, api.Refused{Cluster: cs.name, Reason: reason})
		}
		cs.mu.Unlock()
	}
	return w
}

// why explains collection/name as v may see it: only candidates v sees, refusals of v's
// clusters and v's sinks; of another tenant's object, v learns nothing (it is not served,
// as far as v can tell).
func (h *Hub) why(v viewer, collection, name string) api.Why {
	w := h.whyServed(v, collection, name)
	for _, s := range h.sinks.list(v.comp) {
		if !v.seesRoute(s.route) {
			continue
		}
		// What its tenant is served of the name (each tenant's own copy, should two
		// tenants' ever both be stored), if its rules include it.
		r := h.store.pick(s.route.tenant, collection, name)
		if r == nil || !s.route.sub.Includes(collection, r.cluster, r.namespace, r.labels) {
			continue
		}
		ws := api.WhySink{Stream: s.Stream, Protocol: s.Protocol, Identity: s.Identity, NodeID: s.NodeID, Rules: s.Rules}
		if c := s.Collections[collection]; c != nil && !c.Pending {
			ws.UpToDate = c.AckedVersion == c.PushedVersion && c.AckedVersion > 0
			if c.State == api.SinkNACKed { // as the sink list judged it
				ws.NACK = c.LastNACK
			}
		}
		w.Sinks = append(w.Sinks, ws)
		for _, d := range s.Downstream {
			rs := api.WhySink{Protocol: d.Protocol, NodeID: d.NodeID, BehindRelay: s.Stream}
			if c := d.Collections[collection]; c != nil {
				rs.UpToDate = ws.UpToDate && c.Acked == c.Pushed && c.Acked > 0 && c.NACK == ""
				rs.NACK = c.NACK
			}
			w.Sinks = append(w.Sinks, rs)
		}
	}
	return w
}

// Clusters returns every configured cluster's state.
func (h *Hub) Clusters() []api.ClusterStatus { return h.clusterStatuses(vendor(h.current().comp)) }

// clusterStatuses returns the state of every configured cluster v owns.
func (h *Hub) clusterStatuses(v viewer) []api.ClusterStatus {
	return h.clusterStatusesWith(v, h.store.conflicts(v))
}

// clusterStatusesWith is clusterStatuses for the conflicts v sees (a caller that needs
// them too walks the store once).
func (h *Hub) clusterStatusesWith(v viewer, conflicts []api.Conflict) []api.ClusterStatus {
	lost := map[string]map[string]map[string]string{} // cluster -> collection -> name -> winner
	for _, c := range conflicts {
		for _, l := range c.Losers {
			if lost[l] == nil {
				lost[l] = map[string]map[string]string{}
			}
			if lost[l][c.Collection] == nil {
				lost[l][c.Collection] = map[string]string{}
			}
			lost[l][c.Collection][c.Name] = c.Winner
		}
	}
	cl := h.clusterList()
	out := make([]api.ClusterStatus, 0, len(cl))
	for _, cs := range cl {
		if !v.ownsCluster(cs.name) {
			continue
		}
		st := cs.status()
		st.Tenant = v.comp.tenants.OfCluster(cs.name)
		st.Resources = h.store.counts(cs.name)
		st.Conflicts = lost[cs.name]
		st.Breaker = h.store.breaker(cs.data)
		if st.Unknown != "" {
			st.Breaker = unknownBreaker(st.Unknown, h.store.count(cs.data))
		}
		h.layer.DescribeCluster(&st)
		out = append(out, st)
	}
	return out
}

// Sinks returns the connected sinks (MCP dialed in or dialed out, MCP over xDS) with their
// rules and per-collection (over xDS, per-type) push and ACK state.
func (h *Hub) Sinks() []api.SinkStatus { return h.sinkList(vendor(h.current().comp)) }

// sinkList returns the connected sinks of v's tenant.
func (h *Hub) sinkList(v viewer) []api.SinkStatus {
	out := []api.SinkStatus{}
	for _, s := range h.sinks.list(v.comp) {
		if v.seesRoute(s.route) {
			out = append(out, s.SinkStatus)
		}
	}
	return out
}

// Conflicts returns every collection/name several clusters publish, with the winner.
func (h *Hub) Conflicts() []api.Conflict { return h.store.conflicts(vendor(h.current().comp)) }

// owners answers who owns a host or a namespace, for v: the vendor learns the clusters and
// their tenant; a tenant's operator learns its own clusters that own it, or, when none does,
// only that it is not theirs (whether another tenant owns it is not theirs to know).
func (h *Hub) owners(v viewer, q api.Owners) api.Owners {
	ask := func(t *tenantComp) []string {
		if q.Host != "" {
			return t.policy.OwnersOfHost(q.Host)
		}
		return t.policy.OwnersOfNamespace(q.Namespace)
	}
	if !v.isVendor() {
		q.Clusters = orEmpty(ask(v.comp.tenant[v.tenant]))
		q.NotYours = len(q.Clusters) == 0
		return q
	}
	q.Clusters = []string{}
	for _, name := range v.comp.tenants.Names() {
		if owners := ask(v.comp.tenant[name]); len(owners) > 0 {
			q.Clusters = append(q.Clusters, owners...)
			q.Tenant = name // claims of two tenants never overlap
		}
	}
	return q
}

// tenants lists the tenants v sees, with the exports that concern each.
func (h *Hub) tenants(v viewer) []api.Tenant {
	counts := map[string]int{}
	for _, s := range h.sinks.list(v.comp) {
		counts[s.route.tenant]++
	}
	out := []api.Tenant{}
	for _, name := range v.comp.tenants.Names() {
		if !v.isVendor() && name != v.tenant {
			continue
		}
		t := api.Tenant{Name: name, Clusters: orEmpty(v.comp.tenants.Clusters(name)), Sinks: orEmpty(v.comp.tenants.Sinks(name)), ConnectedSinks: counts[name], Exports: []api.Export{}}
		// The vendor sees each export once, under its exporter, with every target; a
		// tenant's operator those from and to the tenant.
		for _, x := range v.comp.tenants.Exports(v.tenant) {
			if v.isVendor() && x.From != name {
				continue
			}
			t.Exports = append(t.Exports, api.Export{Name: x.Name, From: x.From, To: x.To, Clusters: x.Clusters, Collections: x.Collections, Namespaces: x.Namespaces, Labels: x.Labels})
		}
		out = append(out, t)
	}
	return out
}

// httpHandler is the admin API, /metrics, the probes and pprof; a layer may add routes.
// The http and adminTLS listeners serve it alike; only its actions ask who is calling.
func (h *Hub) httpHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !h.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "warming up: waiting for clusters %v\n", h.pendingClusters())
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/api/clusters", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, h.clusterStatuses(h.viewerOf(r))) })
	mux.HandleFunc("/api/sinks", h.serveSinks)
	h.dashboardRoutes(mux) // the page at /, and its summaries (http_dashboard.go)
	mux.HandleFunc("/api/tenants", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, h.tenants(h.viewerOf(r))) })
	mux.HandleFunc("/api/why", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("collection") == "" || q.Get("name") == "" {
			http.Error(w, "give ?collection=COLLECTION&name=NAMESPACE/NAME", http.StatusBadRequest)
			return
		}
		coll, err := h.servedCollection(q.Get("collection"))
		if err != nil {
			http.Error(w, "collection: "+err.Error(), http.StatusBadRequest)
			return
		}
		WriteJSON(w, h.why(h.viewerOf(r), coll, q.Get("name")))
	})
	mux.HandleFunc("/api/object", h.serveObject)
	mux.HandleFunc("/api/events", h.serveEvents)
	mux.HandleFunc("/api/state", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, h.StateStatus()) })
	mux.HandleFunc("/api/kinds", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, h.servedKinds()) })
	mux.HandleFunc("/api/conflicts", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, orNone(h.store.conflicts(h.viewerOf(r))))
	})
	mux.HandleFunc("/api/owners", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("host") != "":
			WriteJSON(w, h.owners(h.viewerOf(r), api.Owners{Host: q.Get("host")}))
		case q.Get("namespace") != "":
			WriteJSON(w, h.owners(h.viewerOf(r), api.Owners{Namespace: q.Get("namespace")}))
		default:
			http.Error(w, "give ?host=NAME or ?namespace=NAME", http.StatusBadRequest)
		}
	})
	mux.HandleFunc("GET /api/dryrun", h.serveDryRun) // a dry run of the running configuration: a read (dryrun.go)
	// Actions, the only requests that change the hub or take its CPU at a caller's say: each
	// through h.action, which decides who the operator is (operator.go).
	h.action(mux, "POST /api/clusters/{name}/breaker/release", h.releaseBreaker)
	h.action(mux, "POST /api/dryrun", h.dryRunCandidate) // a candidate compiled: dryrun.go
	mux.Handle("/metrics", promhttp.HandlerFor(h.reg, promhttp.HandlerOpts{}))
	ops.AddPprof(mux)
	return mux
}

// orNone is s, or an empty list (JSON [] rather than null).
func orNone[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// WriteJSON writes v as the admin API's indented JSON.
func WriteJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
