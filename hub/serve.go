package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/tenancy"
	"github.com/meshfed/meshfed/internal/lograte"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Serving: each sink's stream (MCP ResourceSource, MCP over xDS, or a dial-out to a sink
// that only listens) watches the view of the subset its routing rules give it.

// sink is who a serving stream's peer is, as routing sees it: its authenticated identity,
// its SinkNode's annotations, and its node id, which, when the hub has a trust domain (and
// TLS) and the identity is one of its SPIFFE IDs, is the name in the peer's certificate: a
// SinkNode id that says otherwise is not believed, and a sink that sends none is still
// routed by its name. That is what lets routing rules select by node ids alone under a trust
// domain (nodeIDsProven); annotations stay claims, which rules may only narrow by. Every
// caller that asks who a sink is uses it: the serving router, a reload's re-route, the sink
// list, why and the dry run.
func (c *compiled) sink(identity, nodeID string, annotations map[string]string) routing.Sink {
	if c.nodeIDsProven() {
		if _, name, _ := meshtls.ParseID(c.trustDomain, identity); name != "" {
			nodeID = name
		}
	}
	return routing.Sink{Identity: identity, NodeID: nodeID, Annotations: annotations}
}

// nodeIDsProven reports whether sink gives every sink of the serve listener the name in its
// certificate as its node id: under a trust domain over TLS, where that listener admits only
// spiffe://<td>/sink/NAME identities (requireKind), each with a name. (A dialed sink's node id
// and identity are the configuration's, and a dry run's the operator's question.)
func (c *compiled) nodeIDsProven() bool { return c.trustDomain != "" && !c.insecure }

// streamSink is sink for a serving stream: one admitted without authentication
// (serveUnauthenticated) is routed as such, whatever it claims.
func (c *compiled) streamSink(info *mcp.StreamInfo) routing.Sink {
	node := info.Node()
	s := c.sink(info.Identity, node.GetId(), node.GetAnnotations())
	s.Unauthenticated = info.Unauthenticated
	s.Relay = info.Listener == relayListener
	return s
}

// route is what a sink receives: what its tenant sees (its clusters' objects and what is
// exported to it), narrowed by the routing subset its tenant's rules give it. Sinks with
// the same route share one view.
type route struct {
	tenant  string // "": the sink is no tenant's, and receives nothing
	sub     *routing.Subset
	tenants *tenancy.Set
}

// key identifies the route's view: the tenant and its subset's rules (a tenant's name has
// no "/").
func (r route) key() string { return r.tenant + "/" + r.sub.Key() }

func (r route) wantsCollection(collection string) bool { return r.sub.WantsCollection(collection) }

// noRoutes selects nothing: the routing of a sink that is no tenant's.
var noRoutes, _ = routing.New(routing.Config{}, routing.Options{})

// route is the route of sink s: its tenant's (sinkTenant), by its tenant's rules.
func (c *compiled) route(s routing.Sink) route {
	name := c.sinkTenant(s)
	if t := c.tenant[name]; t != nil {
		return route{tenant: name, sub: t.routes.Select(s), tenants: c.tenants}
	}
	return route{sub: noRoutes.Select(s), tenants: c.tenants}
}

// routeByKey is the route a view's key names under c (a reload keeps each open view with
// the new definitions of its rules), if its tenant and every one of its rules still exist.
func (c *compiled) routeByKey(key string) (route, bool) {
	name, subKey, _ := strings.Cut(key, "/")
	table := noRoutes
	if name != "" {
		t := c.tenant[name]
		if t == nil {
			return route{}, false
		}
		table = t.routes
	}
	sub, ok := table.SubsetByKey(subKey)
	return route{tenant: name, sub: sub, tenants: c.tenants}, ok
}

// sinkTenant is the tenant a sink belongs to: a relay's is its cluster's; a sink's is the
// one whose sink identities match its own; a sink without an identity is the implicit
// tenant's in a configuration without tenants, and no tenant's otherwise.
func (c *compiled) sinkTenant(s routing.Sink) string {
	switch {
	case s.Relay:
		return c.tenants.OfCluster(c.identity[s.Identity])
	case s.Unauthenticated && !c.tenants.Single():
		return ""
	case s.Unauthenticated:
		return DefaultTenant
	}
	return c.tenants.OfSink(s.Identity)
}

// routeOf is the route of a sink with this identity and SinkNode.
func (c *compiled) routeOf(identity, nodeID string, annotations map[string]string) route {
	return c.route(c.sink(identity, nodeID, annotations))
}

var errNotReady = errors.New("the hub is warming up")

// warmUpRetry is the longest a stream refused during the warm-up is told to wait: the
// clusters may sync well before the warm-up times out.
const warmUpRetry = 5 * time.Second

// readyToServe is the serving listeners' mcp.ServerConfig.Ready: until the hub is ready,
// a sink's or a relay's stream is refused with Unavailable, so that it retries instead of
// receiving a partial state, and told to retry within warmUpRetry. The engine asks it
// after authentication and the per-peer rate limit: a warm-up refusal is not an
// authentication failure, and a sink redialing in a tight loop is rate limited. After the
// warm-up, a stream whose tenant sees a cluster whose last state the hub does not know is
// refused too (unknownSeen): serving it without that cluster would withdraw the cluster's
// objects from the sinks that have them.
func (h *Hub) readyToServe(info *mcp.StreamInfo) (wait time.Duration, why string, ok bool) {
	if h.Ready() {
		tenant, _ := h.streamTenant(info)
		if c, why := h.unknownSeen(tenant); c != "" {
			return warmUpRetry, why, false
		}
		return 0, "", true
	}
	pending := h.pendingClusters()
	left := h.cfg.WarmUp.Duration - h.now().Sub(h.started)
	waiting := fmt.Sprintf("clusters %v", pending)
	if !h.current().comp.tenants.Single() {
		// Every peer is told: with tenants, the clusters of the others are not its to know.
		waiting = fmt.Sprintf("%d clusters", len(pending))
	}
	return min(max(left, time.Second), warmUpRetry),
		fmt.Sprintf("%v: waiting for %s to sync (at most %v more)", errNotReady, waiting, left.Round(time.Second)), false
}

// insecureSinks keeps the warning that a sink was taken at its word to a line per identity
// per interval: a sink redialing in a tight loop would otherwise write one per attempt.
var insecureSinks = lograte.New(lograte.DefaultInterval, nil)

// authenticateSink admits a sink's identity: a sink kind's (under a trust domain). Until
// the hub is ready its stream is then refused (readyToServe).
func (h *Hub) authenticateSink(ctx context.Context) (string, error) {
	id, err := PeerIdentity(ctx, h.cfg.Insecure)
	if err != nil {
		return "", err
	}
	if h.cfg.Insecure {
		if ok, suppressed := insecureSinks.Allow(id); ok {
			h.log.Warn("insecure: admitting a sink without TLS, by the identity it claims", "identity", id, "suppressed", suppressed)
		}
	}
	if err := h.requireKind(id, meshtls.KindSink, "sinks may subscribe"); err != nil {
		return "", err
	}
	return id, nil
}

// authenticateUnauthenticatedSink admits a sink on the serveUnauthenticated listener, which
// asks for no certificate: anyone, without an identity (only unauthenticated routing rules
// select it, by what it claims), once the hub is ready (readyToServe).
func (h *Hub) authenticateUnauthenticatedSink(ctx context.Context) (string, error) {
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	h.log.Debug("admitting a sink without a client certificate: its node id and annotations are only what it claims", "peer", addr)
	return "", nil
}

// resolveTypeURL maps istiod's MCP-over-xDS type URLs (group/version/Kind) to the served
// collection of that kind, built in or configured (the same table the configuration's
// collections resolve through). Kinds and collections need a restart, so the table and
// h.cfg agree.
func (h *Hub) resolveTypeURL(typeURL string) (string, bool) {
	k, ok := h.current().comp.kindTable.ForTypeURL(typeURL)
	if !ok || !slices.Contains(h.cfg.Collections, k.Collection) {
		return "", false
	}
	return k.Collection, true
}

// servedCollection resolves a collection a user typed (the admin API's why) to one the hub
// serves: an unknown name is an error listing the known ones, and a known kind the hub does
// not serve says so, rather than answering that nothing of it is served.
func (h *Hub) servedCollection(name string) (string, error) {
	k, err := h.current().comp.kindTable.Resolve(name)
	if err != nil {
		return "", err
	}
	if !slices.Contains(h.cfg.Collections, k.Collection) {
		return "", fmt.Errorf("%s is not one of this hub's collections (%s)", k.Collection, strings.Join(h.cfg.Collections, ", "))
	}
	return k.Collection, nil
}

// servedKinds returns the kinds of the hub's collections, in their order.
func (h *Hub) servedKinds() []kinds.Kind {
	table := h.current().comp.kindTable
	out := make([]kinds.Kind, 0, len(h.cfg.Collections))
	for _, c := range h.cfg.Collections {
		if k, ok := table.Lookup(c); ok {
			out = append(out, k)
		}
	}
	return out
}

// router is the Watcher sinks are served from: it routes each stream to the view of its
// subset.
type router struct{ h *Hub }

// Watch implements mcp.Watcher.
func (r router) Watch(info *mcp.StreamInfo, collection string, notify func()) (mcp.Collection, func(), bool) {
	node := info.Node()
	cur := r.h.current()
	sink := cur.comp.streamSink(info)
	if id := node.GetId(); id != "" && id != sink.NodeID {
		// Once per identity per interval: every istiod of a deployment that shares one
		// certificate says so, on each collection of each stream (their ids, in /api/sinks).
		if ok, suppressed := r.h.nodeIDLogs.Allow(info.Identity); ok {
			r.h.log.Warn("SinkNode id disagrees with the sink's certificate; routing by the certificate",
				"identity", info.Identity, "node_id", id, "routed_as", sink.NodeID, "suppressed", suppressed)
		}
	}
	rt := cur.comp.route(sink)
	cache, release := r.h.store.watch(rt)
	coll, cancel, ok := cache.Watch(info, collection, notify)
	untrack, tracked := r.h.watchers.track(info, rt.key())
	// A reload between reading the configuration and tracking the stream has not seen it
	// (rerouted closes what is tracked), and a stream's later collection may be routed
	// under a newer configuration than its first: either way the stream would hold a view
	// its sink is no longer given, perhaps another tenant's. It reconnects instead.
	if now := r.h.current(); tracked != rt.key() || now != cur && now.comp.route(now.comp.streamSink(info)).key() != rt.key() {
		info.Close()
	}
	return coll, func() { cancel(); release(); untrack() }, ok
}

// watchRegistry knows which subset every serving stream (MCP or xDS) watches, so a reload
// can close the streams whose routing changed.
type watchRegistry struct {
	mu      sync.Mutex // guards streams
	streams map[*mcp.StreamInfo]*watched
}

type watched struct {
	key  string
	refs int
}

func newWatchRegistry() *watchRegistry {
	return &watchRegistry{streams: map[*mcp.StreamInfo]*watched{}}
}

// track records that info watches key's view, and returns how to forget it and the key the
// stream is tracked under (its first watch's).
func (r *watchRegistry) track(info *mcp.StreamInfo, key string) (func(), string) {
	r.mu.Lock()
	w := r.streams[info]
	if w == nil {
		w = &watched{key: key}
		r.streams[info] = w
	}
	w.refs++
	tracked := w.key
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if w.refs--; w.refs == 0 && r.streams[info] == w {
				delete(r.streams, info)
			}
		})
	}, tracked
}

// rerouted closes every stream whose subset under comp differs from the one it watches,
// and returns how many it closed. Such a sink reconnects and gets its new view (resuming
// by versions if it declares them).
func (r *watchRegistry) rerouted(comp *compiled) int {
	r.mu.Lock()
	var stale []*mcp.StreamInfo
	for info, w := range r.streams {
		if comp.route(comp.streamSink(info)).key() != w.key {
			stale = append(stale, info)
		}
	}
	r.mu.Unlock()
	for _, i := range stale {
		i.Close()
	}
	return len(stale)
}

// sinkRegistry follows the hub's sink streams, MCP and MCP over xDS (the source, the dial-out
// and the xDS server share its hooks), through the engine's hooks. The hooks run
// on every push and ACK of every stream: a lock-free map from stream to its entry, and a
// lock per entry, keep them from contending with each other.
type sinkRegistry struct {
	now   func() time.Time
	sinks sync.Map // *mcp.StreamInfo -> *sinkEntry
}

type sinkEntry struct {
	info *mcp.StreamInfo
	mu   sync.Mutex // guards st and routed
	st   api.SinkStatus
	// routed is the stream's route under comp, for its first SinkNode (which routes it,
	// and is set once): listing 10,000 sinks every few seconds (the dashboard) then routes
	// each once per configuration, not once per listing.
	routed struct {
		comp *compiled
		node *mcppb.SinkNode
		rt   route
	}
}

// route is the entry's route under comp, as the serving router asks (streamSink).
func (e *sinkEntry) route(comp *compiled) route {
	n := e.info.Node()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.routed.comp != comp || e.routed.node != n {
		e.routed.comp, e.routed.node, e.routed.rt = comp, n, comp.route(comp.streamSink(e.info))
	}
	return e.routed.rt
}

func (r *sinkRegistry) hooks() mcp.Hooks {
	return mcp.Hooks{
		StreamOpened: func(i *mcp.StreamInfo) {
			r.sinks.Store(i, &sinkEntry{info: i, st: api.SinkStatus{Stream: i.ID, Peer: i.Peer, Transport: i.Transport, Protocol: i.Protocol, Identity: i.Identity, Unauthenticated: i.Unauthenticated,
				Since: r.now(), Collections: map[string]*api.SinkCollection{}}})
		},
		StreamClosed: func(i *mcp.StreamInfo, _ error) { r.sinks.Delete(i) },
		Pushed: func(i *mcp.StreamInfo, e mcp.PushEvent) {
			r.update(i, e.Collection, func(c *api.SinkCollection) {
				c.PushedVersion, c.Pending, c.LastPush = e.Version, true, r.now()
				if e.TypeURL != "" {
					c.TypeURL = e.TypeURL
				}
				if !e.Incremental {
					c.Resources = e.Resources
				}
			})
		},
		Acked: func(i *mcp.StreamInfo, e mcp.AckEvent) {
			r.update(i, e.Collection, func(c *api.SinkCollection) {
				c.Pending = false
				if e.Code == codes.OK {
					c.AckedVersion = e.Version
				} else {
					c.LastNACK, c.NACKedVersion = e.Code.String()+": "+e.Message, e.Version
				}
			})
		},
	}
}

func (r *sinkRegistry) update(i *mcp.StreamInfo, coll string, f func(*api.SinkCollection)) {
	v, ok := r.sinks.Load(i)
	if !ok {
		return
	}
	e := v.(*sinkEntry)
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.st.Collections[coll]
	if c == nil {
		c = &api.SinkCollection{}
		e.st.Collections[coll] = c
	}
	f(c)
}

// judge sets the state of s and of each of its collections at now: a push unanswered
// for staleAfter or longer is stale, and one NACKed is NACKed until a later push is
// ACKed (a new push awaiting its answer is syncing again).
func judge(s *api.SinkStatus, now time.Time, staleAfter time.Duration) {
	worst := 0
	s.BehindSince = nil
	for _, c := range s.Collections {
		st := 0 // api.SinkStates' index
		switch {
		case c.Pending && now.Sub(c.LastPush) >= staleAfter:
			st = 2
		case c.Pending:
			st = 1
		case c.LastNACK != "" && c.NACKedVersion == c.PushedVersion && c.NACKedVersion != c.AckedVersion:
			st = 3
		}
		if c.Pending && (s.BehindSince == nil || c.LastPush.Before(*s.BehindSince)) {
			t := c.LastPush
			s.BehindSince = &t
		}
		c.State = api.SinkStates[st]
		worst = max(worst, st)
	}
	s.State = api.SinkStates[worst]
}

// listedSink is a connected sink with its route under the running configuration.
type listedSink struct {
	api.SinkStatus
	route route
}

// list returns the connected sinks, by stream, with their subsets under comp: who each is
// is asked as the serving router asks (streamSink), so an unauthenticated stream is routed
// here as it is served.
func (r *sinkRegistry) list(comp *compiled) []listedSink {
	var out []listedSink
	r.each(comp, func(s listedSink) { out = append(out, s) })
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}

// each calls f with every connected sink as list lists it, in no order: a caller that
// keeps few of them (the dashboard's counts and pages) holds no list of them all, though
// each sink is still copied as it is judged.
func (r *sinkRegistry) each(comp *compiled, f func(listedSink)) {
	now := r.now()
	r.sinks.Range(func(_, v any) bool {
		e := v.(*sinkEntry)
		f(e.listed(comp, now))
		return true
	})
}

// listed is the sink as list lists it, under comp, judged at now.
func (e *sinkEntry) listed(comp *compiled, now time.Time) listedSink {
	e.mu.Lock()
	cp := e.st
	cp.Collections = make(map[string]*api.SinkCollection, len(e.st.Collections))
	for k, c := range e.st.Collections {
		c := *c
		cp.Collections[k] = &c
	}
	e.mu.Unlock()
	n := e.info.Node()
	cp.NodeID, cp.Annotations = n.GetId(), n.GetAnnotations()
	if e.info.Listener == relayListener {
		cp.Downstream = relayed(e.info)
	}
	judge(&cp, now, comp.staleAfter)
	rt := e.route(comp)
	cp.Rules, cp.Tenant = rt.sub.Rules(), rt.tenant
	return listedSink{cp, rt}
}
