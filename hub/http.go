package hub

import (
	"encoding/json"
	"fmt"
	"github.com/meshfed/meshfed/hub/replicas"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/routing"
)

// DryRun is what a sink with a given identity and SinkNode would receive — under the
// running configuration, or under a candidate one, with the difference from what such a
// sink receives now.
type DryRun struct {
	Identity    string            `json:"identity"`
	NodeID      string            `json:"nodeId"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Rules that select it (under the candidate configuration, if one was given).
	Rules []string `json:"rules"`
	// Resources it would receive: collection -> name -> served version.
	Resources map[string]map[string]string `json:"resources"`
	// Candidate is true when a candidate configuration was evaluated; then Added, Removed
	// and Changed compare with what the running configuration gives it now.
	Candidate bool                `json:"candidate"`
	Added     map[string][]string `json:"added,omitempty"`
	Removed   map[string][]string `json:"removed,omitempty"`
	Changed   map[string][]string `json:"changed,omitempty"`
}

// Owners answers "who owns host X" and "what does namespace N belong to".
type Owners struct {
	Host      string   `json:"host,omitempty"`
	Namespace string   `json:"namespace,omitempty"`
	Clusters  []string `json:"clusters"`
}

// Why explains one resource: who publishes it, which one is served and why, who was
// refused and why, and which connected sinks receive it.
type Why struct {
	Collection string      `json:"collection"`
	Name       string      `json:"name"`
	Served     *Candidate  `json:"served"`
	Candidates []Candidate `json:"candidates"`
	Conflict   string      `json:"conflict,omitempty"` // why the served one wins, when several publish it
	Rejected   []Refused   `json:"rejected"`
	Sinks      []WhySink   `json:"sinks"`
}

// Refused is one cluster's refused version of a resource.
type Refused struct {
	Cluster string `json:"cluster"`
	Reason  string `json:"reason"`
}

// WhySink is a connected sink whose rules give it the resource.
type WhySink struct {
	Stream   uint64   `json:"stream"`
	Identity string   `json:"identity"`
	NodeID   string   `json:"nodeId"`
	Rules    []string `json:"rules"`
	// UpToDate: the sink has ACKed the latest push of the collection (so it holds the
	// served version).
	UpToDate bool `json:"upToDate"`
}

// Why explains collection/name.
func (h *Hub) Why(collection, name string) Why {
	cands, why := h.store.candidates(collection, name)
	w := Why{Collection: collection, Name: name, Candidates: cands, Conflict: why, Rejected: []Refused{}, Sinks: []WhySink{}}
	if w.Candidates == nil {
		w.Candidates = []Candidate{}
	}
	if len(w.Candidates) > 0 {
		w.Served = &w.Candidates[0]
	}
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		if reason, ok := cs.rejections[collection][name]; ok {
			w.Rejected = append(w.Rejected, Refused{Cluster: cs.name, Reason: reason})
		}
		cs.mu.Unlock()
	}
	if r, ok := h.store.winner(collection, name); ok {
		routes := h.current().comp.routes
		for _, s := range h.Sinks() {
			sub := routes.Select(routing.Sink{Identity: s.Identity, NodeID: s.NodeID, Annotations: s.Annotations})
			if !sub.Includes(collection, r.cluster, r.namespace, r.labels) {
				continue
			}
			c := s.Collections[collection]
			w.Sinks = append(w.Sinks, WhySink{Stream: s.Stream, Identity: s.Identity, NodeID: s.NodeID, Rules: sub.Rules(),
				UpToDate: c != nil && !c.Pending && c.AckedVersion == c.PushedVersion && c.AckedVersion > 0})
		}
	}
	return w
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
	var auth map[string]replicas.Authority
	if h.mem() != nil {
		auth = h.mem().Authorities()
	}
	cl := h.clusterList()
	out := make([]ClusterStatus, 0, len(cl))
	for _, cs := range cl {
		st := cs.status(h.store.counts(cs.name))
		st.Conflicts = lost[cs.name]
		if a, ok := auth[cs.name]; ok {
			st.HeldBy = &a
		}
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

// DryRun returns what a sink with this identity and SinkNode receives now, or, given a
// candidate configuration, what it would receive under it (its routing and ownership; the
// stored resources and the running conflict order) and how that differs from now. A
// candidate that does not validate is an error naming the field.
func (h *Hub) DryRun(identity, nodeID string, annotations map[string]string, candidate *Config) (DryRun, error) {
	sink := routing.Sink{Identity: identity, NodeID: nodeID, Annotations: annotations}
	cur := h.current()
	now := cur.comp.routes.Select(sink)
	d := DryRun{Identity: identity, NodeID: nodeID, Annotations: annotations, Rules: now.Rules(), Resources: h.store.served(now)}
	if candidate == nil {
		return d, nil
	}
	comp, err := candidate.compile()
	if err != nil {
		return d, err
	}
	sub := comp.routes.Select(sink)
	would := h.store.servedWith(sub, func(r *resource) bool {
		return !comp.removed(r.cluster) && comp.policy.Check(r.cluster, acl.Object{Collection: r.collection, Name: r.name, Hosts: r.hosts}) == nil
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
	mux.HandleFunc("/api/replicas", func(w http.ResponseWriter, _ *http.Request) {
		st := h.Replicas()
		if st == nil {
			http.Error(w, "this hub is not configured with replicas", http.StatusNotFound)
			return
		}
		writeJSON(w, st)
	})
	mux.HandleFunc("/api/why", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("collection") == "" || q.Get("name") == "" {
			http.Error(w, "give ?collection=COLLECTION&name=NAMESPACE/NAME", http.StatusBadRequest)
			return
		}
		writeJSON(w, h.Why(q.Get("collection"), q.Get("name")))
	})
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
		writeJSON(w, d)
	})
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

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
