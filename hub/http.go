package hub

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meshfed/meshfed/routing"
)

// DryRun is what a sink with a given identity and SinkNode would receive.
type DryRun struct {
	Identity    string                       `json:"identity"`
	NodeID      string                       `json:"nodeId"`
	Annotations map[string]string            `json:"annotations,omitempty"`
	Rules       []string                     `json:"rules"`
	Resources   map[string]map[string]string `json:"resources"` // collection -> name -> served version
}

// Owners answers "who owns host X" and "what does namespace N belong to".
type Owners struct {
	Host      string   `json:"host,omitempty"`
	Namespace string   `json:"namespace,omitempty"`
	Clusters  []string `json:"clusters"`
}

// Clusters returns every configured cluster's state.
func (h *Hub) Clusters() []ClusterStatus {
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
	out := make([]ClusterStatus, 0, len(cl))
	for _, cs := range cl {
		st := cs.status(h.store.counts(cs.name))
		st.Conflicts = lost[cs.name]
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Sinks returns the connected MCP sinks (dialed in or dialed out) with their subset and
// per-collection push and ACK state.
func (h *Hub) Sinks() []SinkStatus { return h.sinks.list() }

// Conflicts returns every collection/name several clusters publish, with the winner.
func (h *Hub) Conflicts() []Conflict { return h.store.conflicts() }

// DryRun returns what a sink with this identity and SinkNode would receive now.
func (h *Hub) DryRun(identity, nodeID string, annotations map[string]string) DryRun {
	sub := h.current().comp.routes.Select(routing.Sink{Identity: identity, NodeID: nodeID, Annotations: annotations})
	return DryRun{Identity: identity, NodeID: nodeID, Annotations: annotations, Rules: sub.Rules(), Resources: h.store.served(sub)}
}

func (h *Hub) httpHandler() http.Handler {
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
	mux.HandleFunc("/api/clusters", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, h.Clusters()) })
	mux.HandleFunc("/api/sinks", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, h.Sinks()) })
	mux.HandleFunc("/api/conflicts", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, h.Conflicts()) })
	mux.HandleFunc("/api/owners", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("host") != "":
			writeJSON(w, Owners{Host: q.Get("host"), Clusters: orEmpty(h.current().comp.policy.OwnersOfHost(q.Get("host")))})
		case q.Get("namespace") != "":
			writeJSON(w, Owners{Namespace: q.Get("namespace"), Clusters: orEmpty(h.current().comp.policy.OwnersOfNamespace(q.Get("namespace")))})
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
		writeJSON(w, h.DryRun(q.Get("identity"), q.Get("node"), ann))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(h.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
