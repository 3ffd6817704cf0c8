package hub

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/ops"
)

// The admin API: what the hub holds, serves and refused, and to whom, as package hub/api
// defines it.

// Why explains collection/name.
func (h *Hub) Why(collection, name string) api.Why {
	cands, why := h.store.candidates(collection, name)
	w := api.Why{Collection: collection, Name: name, Candidates: cands, Conflict: why, Rejected: []api.Refused{}, Sinks: []api.WhySink{}}
	if w.Candidates == nil {
		w.Candidates = []api.Candidate{}
	}
	if len(w.Candidates) > 0 {
		w.Served = &w.Candidates[0]
	}
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		if reason, ok := cs.rejections[collection][name]; ok {
			w.Rejected = append(w.Rejected, api.Refused{Cluster: cs.name, Reason: reason})
		}
		cs.mu.Unlock()
	}
	if r, ok := h.store.winner(collection, name); ok {
		for _, s := range h.sinks.list(h.current().comp) {
			if !s.subset.Includes(collection, r.cluster, r.namespace, r.labels) {
				continue
			}
			ws := api.WhySink{Stream: s.Stream, Protocol: s.Protocol, Identity: s.Identity, NodeID: s.NodeID, Rules: s.Rules}
			if c := s.Collections[collection]; c != nil && !c.Pending {
				ws.UpToDate = c.AckedVersion == c.PushedVersion && c.AckedVersion > 0
				if c.LastNACK != "" && c.NACKedVersion == c.PushedVersion {
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
	}
	return w
}

// Clusters returns every configured cluster's state.
func (h *Hub) Clusters() []api.ClusterStatus {
	lost := map[string]map[string]map[string]string{} // cluster -> collection -> name -> winner
	for _, c := range h.store.conflicts() {
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
		st := cs.status()
		st.Resources = h.store.counts(cs.name)
		st.Conflicts = lost[cs.name]
		st.Breaker = h.store.breaker(cs.data)
		h.layer.DescribeCluster(&st)
		out = append(out, st)
	}
	return out
}

// Sinks returns the connected sinks (MCP dialed in or dialed out, MCP over xDS) with their
// rules and per-collection (over xDS, per-type) push and ACK state.
func (h *Hub) Sinks() []api.SinkStatus {
	listed := h.sinks.list(h.current().comp)
	out := make([]api.SinkStatus, len(listed))
	for i, s := range listed {
		out[i] = s.SinkStatus
	}
	return out
}

// Conflicts returns every collection/name several clusters publish, with the winner.
func (h *Hub) Conflicts() []api.Conflict { return h.store.conflicts() }

// DryRun returns what a sink with this identity and SinkNode receives now, or, given a
// candidate configuration, what it would receive under it (its routing and ownership; the
// stored resources and the running conflict order) and how that differs from now. A
// candidate that does not validate is an error naming the field.
func (h *Hub) DryRun(identity, nodeID string, annotations map[string]string, candidate *Config) (api.DryRun, error) {
	now := h.current().comp.subset(identity, nodeID, annotations)
	d := api.DryRun{Identity: identity, NodeID: nodeID, Annotations: annotations, Rules: now.Rules(), Resources: h.store.served(now)}
	if candidate == nil {
		return d, nil
	}
	comp, err := candidate.compile()
	if err != nil {
		return d, err
	}
	sub := comp.subset(identity, nodeID, annotations)
	would := h.store.servedWith(sub, func(r *resource) bool {
		return comp.configured(r.cluster) && comp.policy.Check(r.cluster, acl.Object{Collection: r.collection, Name: r.name, Hosts: r.hosts}) == nil
	})
	d.Candidate, d.Rules = true, sub.Rules()
	d.Added, d.Removed, d.Changed = map[string][]string{}, map[string][]string{}, map[string][]string{}
	for coll, names := range would {
		for n, v := range names {
			switch was, ok := d.Resources[coll][n]; {
			case !ok:
				d.Added[coll] = append(d.Added[coll], n)
			case was != v:
				d.Changed[coll] = append(d.Changed[coll], n)
			}
		}
		for n := range d.Resources[coll] {
			if _, ok := names[n]; !ok {
				d.Removed[coll] = append(d.Removed[coll], n)
			}
		}
	}
	for _, m := range []map[string][]string{d.Added, d.Removed, d.Changed} {
		for coll := range m {
			sort.Strings(m[coll])
		}
	}
	d.Resources = would
	return d, nil
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
	mux.HandleFunc("/api/clusters", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, h.Clusters()) })
	mux.HandleFunc("/api/sinks", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, h.Sinks()) })
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
		WriteJSON(w, h.Why(coll, q.Get("name")))
	})
	mux.HandleFunc("/api/state", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, h.stateStatus()) })
	mux.HandleFunc("/api/kinds", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, h.servedKinds()) })
	mux.HandleFunc("/api/conflicts", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, h.Conflicts()) })
	mux.HandleFunc("/api/owners", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		policy := h.current().comp.policy
		switch {
		case q.Get("host") != "":
			WriteJSON(w, api.Owners{Host: q.Get("host"), Clusters: orEmpty(policy.OwnersOfHost(q.Get("host")))})
		case q.Get("namespace") != "":
			WriteJSON(w, api.Owners{Namespace: q.Get("namespace"), Clusters: orEmpty(policy.OwnersOfNamespace(q.Get("namespace")))})
		default:
			http.Error(w, "give ?host=NAME or ?namespace=NAME", http.StatusBadRequest)
		}
	})
	mux.HandleFunc("/api/dryrun", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		ann := map[string]string{}
		for _, a := range q["annotation"] {
			k, v, ok := strings.Cut(a, "=")
			if !ok {
				http.Error(w, fmt.Sprintf("annotation %q: want key=value", a), http.StatusBadRequest)
				return
			}
			ann[k] = v
		}
		var candidate *Config
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if candidate, err = ParseConfig(body); err != nil {
				http.Error(w, "candidate configuration: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		d, err := h.DryRun(q.Get("identity"), q.Get("node"), ann, candidate)
		if err != nil {
			http.Error(w, "candidate configuration: "+err.Error(), http.StatusBadRequest)
			return
		}
		WriteJSON(w, d)
	})
	// Actions, the only requests that change the hub: each through h.action, which decides
	// who the operator is (operator.go).
	h.action(mux, "POST /api/clusters/{name}/breaker/release", h.releaseBreaker)
	mux.Handle("/metrics", promhttp.HandlerFor(h.reg, promhttp.HandlerOpts{}))
	ops.AddPprof(mux)
	return mux
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
