package hub

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/dashboard"
)

// The dashboard's endpoints (package hub/dashboard serves the page): summaries computed
// here, so that a page watching 100 clusters and 10,000 sinks refreshes a few kilobytes,
// and pages of the long lists it searches. Every answer is for the request's viewer
// (h.viewerOf), like the rest of the admin API: a tenant's operator is shown its tenant.

// dashboardRoutes mounts the page and its endpoints on mux.
func (h *Hub) dashboardRoutes(mux *http.ServeMux) {
	dashboard.Mount(mux)
	overviews := &overviewCache{byScope: map[string]cachedOverview{}}
	mux.HandleFunc("GET /api/overview", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, overviews.get(h, h.viewerOf(r))) })
	mux.HandleFunc("GET /api/whoami", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, h.whoami(r)) })
	mux.HandleFunc("GET /api/refusals", func(w http.ResponseWriter, r *http.Request) {
		q, err := parseRefusalQuery(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		WriteJSON(w, h.refusalPage(h.viewerOf(r), q))
	})
}

// serveSinks is GET /api/sinks: every sink, or, given any of the paging parameters, a page
// of those they select.
func (h *Hub) serveSinks(w http.ResponseWriter, r *http.Request) {
	if r.URL.RawQuery == "" {
		WriteJSON(w, h.sinkList(h.viewerOf(r)))
		return
	}
	q, err := parseSinkQuery(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	WriteJSON(w, h.sinkPage(h.viewerOf(r), q))
}

// overview summarizes what v owns: its clusters, and its sinks counted by fleet and state.
func (h *Hub) overview(v viewer) api.Overview {
	o := api.Overview{Clusters: []api.ClusterSummary{}, Fleets: []api.Fleet{}, Ready: h.Ready(), Time: h.now()}
	conflicts := h.store.conflicts(v)
	for _, st := range h.clusterStatusesWith(v, conflicts) {
		c := h.summarize(v, st)
		o.Clusters = append(o.Clusters, c)
		o.Refusals += c.Refusals
	}
	o.Conflicts = len(conflicts)
	for _, f := range h.fleets(v) {
		o.Fleets = append(o.Fleets, f.Fleet)
		c := &o.Sinks
		c.Total, c.Synced, c.Syncing, c.Stale, c.NACKed = c.Total+f.Total, c.Synced+f.Synced, c.Syncing+f.Syncing, c.Stale+f.Stale, c.NACKed+f.NACKed
	}
	return o
}

// fleet is one fleet as counted: its route, which names it, and its sinks' counts.
type fleet struct {
	rt route
	api.Fleet
}

// fleets counts the connected sinks v sees by fleet (their route) and state, each fleet
// with its oldest unanswered push, in the order of their keys: the overview and the fleet
// gauges (stateCollector) both read it.
func (h *Hub) fleets(v viewer) []fleet {
	byKey := map[string]*fleet{}
	h.sinks.each(v.comp, func(s listedSink) {
		if !v.seesRoute(s.route) {
			return
		}
		key := s.route.key()
		f := byKey[key]
		if f == nil {
			f = &fleet{rt: s.route, Fleet: api.Fleet{Key: key, Tenant: s.Tenant, Rules: orEmpty(s.Rules)}}
			byKey[key] = f
		}
		count(&f.StateCounts, s.State)
		if s.BehindSince != nil && (f.OldestBehind == nil || s.BehindSince.Before(*f.OldestBehind)) {
			f.OldestBehind = s.BehindSince
		}
	})
	out := make([]fleet, 0, len(byKey))
	for _, f := range byKey {
		out = append(out, *f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// overviewEvery is how long one overview answers every request of the same scope (the
// vendor's, or one tenant's): the page polls every 2 seconds, so each open page still sees
// a new one each time, and however many pages are open the hub computes at most one a
// second per scope (with 10,000 sinks one costs tens of milliseconds: BenchmarkDashboard).
const overviewEvery = time.Second

// overviewCache keeps the last overview of each scope.
type overviewCache struct {
	// mu guards byScope, and is held while an overview is computed, so that requests
	// arriving meanwhile wait for that one rather than computing their own.
	mu      sync.Mutex
	byScope map[string]cachedOverview // by viewer.tenant
}

type cachedOverview struct {
	comp *compiled // the configuration it was computed under: a reload makes it stale
	at   time.Time
	o    api.Overview
}

// get returns v's overview, computed at most overviewEvery ago under v's configuration.
func (c *overviewCache) get(h *Hub, v viewer) api.Overview {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := h.now()
	if e, ok := c.byScope[v.tenant]; ok && e.comp == v.comp && !now.Before(e.at) && now.Sub(e.at) < overviewEvery {
		return e.o
	}
	for scope, e := range c.byScope {
		if e.comp != v.comp {
			delete(c.byScope, scope) // of an older configuration (perhaps of a tenant since removed)
		}
	}
	o := h.overview(v)
	c.byScope[v.tenant] = cachedOverview{comp: v.comp, at: now, o: o}
	return o
}

// count adds a sink in state to c.
// countOf is c's count of sinks in state.
func countOf(c api.StateCounts, state string) int {
	switch state {
	case api.SinkSynced:
		return c.Synced
	case api.SinkSyncing:
		return c.Syncing
	case api.SinkStale:
		return c.Stale
	case api.SinkNACKed:
		return c.NACKed
	}
	return 0
}

func count(c *api.StateCounts, state string) {
	c.Total++
	switch state {
	case api.SinkSynced:
		c.Synced++
	case api.SinkSyncing:
		c.Syncing++
	case api.SinkStale:
		c.Stale++
	case api.SinkNACKed:
		c.NACKed++
	}
}

// summarize counts the maps of st, and adds the cluster's quota bound on its objects.
func (h *Hub) summarize(v viewer, st api.ClusterStatus) api.ClusterSummary {
	s := api.ClusterSummary{Name: st.Name, Tenant: st.Tenant, Connected: st.Connected, Streams: st.Streams, Synced: st.Synced, Restored: st.Restored,
		Departed: st.Departed, Unknown: st.Unknown, LastContact: st.LastContact, RefusedCollections: len(st.RefusedCollections), HeldBy: st.HeldBy, MaxObjects: v.comp.quotaFor(st.Name).q.MaxObjects}
	for _, n := range st.Resources {
		s.Objects += n
	}
	for _, m := range st.Rejections {
		s.Refusals += len(m)
	}
	for _, m := range st.Conflicts {
		s.Conflicts += len(m)
	}
	if b := st.Breaker; b != nil {
		s.Breaker = &api.BreakerSummary{Open: b.Open, Since: b.Since, Reason: b.Reason, Held: b.Held, Digest: b.Digest}
	}
	return s
}

// whoami is who r is answered for, and whether an action sent the same way would be
// taken: the decision operator makes for every action, asked, not taken.
func (h *Hub) whoami(r *http.Request) api.WhoAmI {
	op, who, refused := h.operator(r)
	w := api.WhoAmI{Operator: who, Tenant: h.viewerOf(r).tenant, CanAct: refused == nil}
	if op != "" {
		w.Operator = op
	}
	if refused != nil {
		w.Why = refused.msg
	}
	return w
}

// sinkQuery selects a page of sinks: those of one fleet (its key; "" for every fleet), in
// one state ("" for any), whose identity, node id, peer, tenant, rules or stream number
// contain q (any case).
type sinkQuery struct {
	fleet, state, q string
	page
}

// page is a window of a list: limit items from offset.
type page struct{ offset, limit int }

// paging is the admin API's page sizes: the default, and the most one page may hold.
var paging = struct{ limit, max int }{limit: 50, max: 500}

// parseSinkQuery reads /api/sinks's parameters. Errors name the parameter.
func parseSinkQuery(v url.Values) (sinkQuery, error) {
	if err := onlyParams(v, "fleet", "q", "state", "offset", "limit"); err != nil {
		return sinkQuery{}, err
	}
	p, err := parsePage(v)
	if err != nil {
		return sinkQuery{}, err
	}
	q := sinkQuery{fleet: v.Get("fleet"), q: strings.ToLower(v.Get("q")), page: p}
	if s := v.Get("state"); s != "" {
		for _, known := range api.SinkStates {
			if strings.EqualFold(s, known) {
				q.state = known
			}
		}
		if q.state == "" {
			return sinkQuery{}, fmt.Errorf("state: %q is not one of %s", s, strings.Join(api.SinkStates, ", "))
		}
	}
	return q, nil
}

// onlyParams refuses a parameter other than known: a misspelt filter would otherwise
// quietly select everything.
func onlyParams(v url.Values, known ...string) error {
	for k := range v {
		ok := false
		for _, n := range known {
			ok = ok || k == n
		}
		if !ok {
			return fmt.Errorf("parameter %q: unknown; this endpoint takes %s", k, strings.Join(known, ", "))
		}
	}
	return nil
}

// parsePage reads offset (default 0) and limit (default paging.limit, at most paging.max).
func parsePage(v url.Values) (page, error) {
	p := page{limit: paging.limit}
	for _, f := range []struct {
		name     string
		into     *int
		min, max int
	}{{"offset", &p.offset, 0, 1 << 30}, {"limit", &p.limit, 1, paging.max}} {
		s := v.Get(f.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return page{}, fmt.Errorf("%s: %q is not a whole number", f.name, s)
		}
		if n < f.min || n > f.max {
			return page{}, fmt.Errorf("%s: %d is not between %d and %d", f.name, n, f.min, f.max)
		}
		*f.into = n
	}
	return p, nil
}

// window returns the items of p out of n, as indexes [from, to).
func (p page) window(n int) (from, to int) {
	from = min(p.offset, n)
	return from, min(from+p.limit, n)
}

// matches reports whether s is selected by q.
func (q sinkQuery) matches(s listedSink) bool {
	if q.fleet != "" && s.route.key() != q.fleet || q.state != "" && s.State != q.state {
		return false
	}
	if q.q == "" {
		return true
	}
	has := func(f string) bool { return strings.Contains(strings.ToLower(f), q.q) }
	return has(s.Identity) || has(s.NodeID) || has(s.Peer) || has(s.Tenant) || has(strconv.FormatUint(s.Stream, 10)) || slices.ContainsFunc(s.Rules, has)
}

// sinkPage is the page of v's sinks that q selects, each as it was judged when selected
// (one listing: a sink selected as Stale is shown Stale).
func (h *Hub) sinkPage(v viewer, q sinkQuery) api.SinkPage {
	var sel []api.SinkStatus
	h.sinks.each(v.comp, func(s listedSink) {
		if v.seesRoute(s.route) && q.matches(s) {
			sel = append(sel, s.SinkStatus)
		}
	})
	sort.Slice(sel, func(i, j int) bool { return sel[i].Stream < sel[j].Stream })
	from, to := q.window(len(sel))
	return api.SinkPage{Total: len(sel), Offset: q.offset, Limit: q.limit, Sinks: append([]api.SinkStatus{}, sel[from:to]...)}
}

// refusalQuery selects refusals: those of cluster ("" for every one), whose cluster,
// collection, name or reason contain q (any case), naming host (the reason quotes it), in
// namespace (the object's, or one the reason quotes).
type refusalQuery struct {
	cluster, q, host, namespace string
	page
}

// parseRefusalQuery reads /api/refusals's parameters. Errors name the parameter.
func parseRefusalQuery(v url.Values) (refusalQuery, error) {
	if err := onlyParams(v, "cluster", "q", "host", "namespace", "offset", "limit"); err != nil {
		return refusalQuery{}, err
	}
	p, err := parsePage(v)
	if err != nil {
		return refusalQuery{}, err
	}
	return refusalQuery{cluster: v.Get("cluster"), q: strings.ToLower(v.Get("q")), host: v.Get("host"), namespace: v.Get("namespace"), page: p}, nil
}

func (q refusalQuery) matches(r api.Refusal) bool {
	if q.cluster != "" && r.Cluster != q.cluster {
		return false
	}
	if q.host != "" && !strings.Contains(r.Reason, strconv.Quote(q.host)) {
		return false
	}
	if q.namespace != "" && !strings.HasPrefix(r.Name, q.namespace+"/") && !strings.Contains(r.Reason, "namespace "+strconv.Quote(q.namespace)) {
		return false
	}
	if q.q == "" {
		return true
	}
	for _, f := range []string{r.Cluster, r.Collection, r.Name, r.Reason} {
		if strings.Contains(strings.ToLower(f), q.q) {
			return true
		}
	}
	return false
}

// refusalPage is the page of v's clusters' refused objects that q selects: who tried to
// publish what, and why it is not served.
func (h *Hub) refusalPage(v viewer, q refusalQuery) api.RefusalPage {
	var sel []api.Refusal
	for _, cs := range h.clusterList() {
		if !v.ownsCluster(cs.name) {
			continue
		}
		tenant := v.comp.tenants.OfCluster(cs.name)
		cs.mu.Lock()
		for coll, names := range cs.rejections {
			for name, reason := range names {
				if r := (api.Refusal{Cluster: cs.name, Tenant: tenant, Collection: coll, Name: name, Reason: reason}); q.matches(r) {
					sel = append(sel, r)
				}
			}
		}
		cs.mu.Unlock()
	}
	sort.Slice(sel, func(i, j int) bool {
		a, b := sel[i], sel[j]
		if a.Cluster != b.Cluster {
			return a.Cluster < b.Cluster
		}
		if a.Collection != b.Collection {
			return a.Collection < b.Collection
		}
		return a.Name < b.Name
	})
	from, to := q.window(len(sel))
	return api.RefusalPage{Total: len(sel), Offset: q.offset, Limit: q.limit, Refusals: orNone(sel[from:to])}
}
