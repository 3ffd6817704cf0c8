package hub

import (
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/lograte"
	"github.com/meshfed/meshfed/mcp"
)

// clusterState is the hub's state of one configured cluster beyond its resources (which
// are in the store): its open sessions, whether it is connected and has synced, and what it
// was refused. It exists from the cluster's entering the configuration (at start or by a
// reload) until its leaving it (removeCluster), after which it is marked removed and
// records nothing more.
type clusterState struct {
	name string
	log  *slog.Logger
	data *clusterData // its resources in the store

	// writeMu orders the writes of the cluster's own sessions against a takeover: a push
	// of a superseded session is either applied before the newer session declares what the
	// hub holds, or refused.
	writeMu sync.Mutex

	mu             sync.Mutex // guards the following fields
	removed        bool
	writer         *Session          // the cluster's own session (its source's stream) that may write; nil: none
	sessions       map[*Session]bool // open sessions, to close on a reload
	connected      int               // open sessions that are not Away
	lastContact    time.Time
	disconnectedAt time.Time        // zero while connected (or never connected)
	synced         bool             // a session has delivered every collection since the cluster was added
	negotiation    *mcp.Negotiation // what its minion (or stock source) refused to serve; new with its configuration
	dropped        map[string]bool  // collections dropped for staleness since the disconnect
	rejections     map[string]map[string]string
	direct         *Session   // Hub.Apply's, which has no stream
	departed       *departure // it left the configuration; the hub keeps it (departure.go)
	unknown        string     // why its last state is unknown ("": known; unknown.go)
	decided        string     // why what it holds is an operator's decision at this hub, not what a session delivered ("": it is not; ClusterIsSessionState)
	restored       bool       // what is served of it was read from the state file; its own session has not delivered since
	mayLack        string     // why what was restored may lack its last changes ("": it cannot); the warm-up's end makes it unknown (unknown.go)
	unconfirmed    bool       // restored whole, but held back by the layer: not synced until it confirms (ConfirmRestored) or a session delivers
	epoch          uint64     // the epoch of the session whose state this copy is (SetClusterEpoch; 0 on a single hub), kept in the state file
	pushes         *pushLimiter
	pushesFor      QuotaConfig // the quotas pushes was made for
	lastTakeover   time.Time   // when a stream of its source last took over from another
	competing      time.Time   // when a stream was last refused for competing with its writer
	// overQuota are the objects it was refused for a bound of the store's (its share of a
	// collection, its or its tenant's objects or bytes): collection → name → size as
	// served. Room freed later lets them in, but its source does not send them again
	// unchanged: resolicit asks it to.
	overQuota     map[string]map[string]int64
	resolicitedAt time.Time
}

// resolicitEvery is the least time between two re-solicitations of one cluster: room that
// frees a little at a time (a cluster deleting one object after another) reconnects its
// minion once, not once per deletion.
const resolicitEvery = 5 * time.Second

// noteOverQuotaLocked keeps what write c of the cluster was refused for a store bound (of
// put, refused) and forgets what c put or removed otherwise; it returns how the number of
// clusters with such refusals changes (-1, 0, 1). The caller holds cs.mu.
func (cs *clusterState) noteOverQuotaLocked(c *mcp.Change, put []*resource, refused []mcp.Rejection) int64 {
	had := len(cs.overQuota) > 0
	m := cs.overQuota[c.Collection]
	if !c.Incremental {
		m = nil
	}
	for _, e := range c.Entries {
		delete(m, e.Name)
	}
	for _, n := range c.Removed {
		delete(m, n)
	}
	if len(refused) > 0 {
		size := make(map[string]int64, len(put))
		for _, r := range put {
			size[r.name] = servedSize(r)
		}
		if m == nil {
			m = map[string]int64{}
		}
		for _, r := range refused {
			m[r.Resource] = size[r.Resource]
		}
	}
	if len(m) == 0 {
		delete(cs.overQuota, c.Collection)
	} else {
		if cs.overQuota == nil {
			cs.overQuota = map[string]map[string]int64{}
		}
		cs.overQuota[c.Collection] = m
	}
	switch has := len(cs.overQuota) > 0; {
	case has && !had:
		return 1
	case had && !has:
		return -1
	}
	return 0
}

// resolicit asks the source of each cluster that was refused objects for a store bound, and
// that now has room for some of them, to send them again: its streams are closed, and on
// its minion's next stream the hub declares what it holds, which lacks them, so they come
// again and are judged anew (issue 25, finding 3: objects refused while another cluster
// filled a collection stayed refused after it shrank, and hub why kept the old byte count).
// Once per resolicitEvery per cluster; nothing to do, and no cluster visited, while no
// cluster has such refusals.
func (h *Hub) resolicit() {
	if h.overQuota.Load() == 0 {
		return
	}
	now := h.now()
	cur := h.current().comp
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		want := maps.Clone(cs.overQuota)
		due := len(want) > 0 && cs.departed == nil && now.Sub(cs.resolicitedAt) >= resolicitEvery && cs.connected > 0
		cs.mu.Unlock()
		if !due {
			continue
		}
		n := h.store.fits(cs.data, want, cur.quotaFor(cs.name))
		if n == 0 {
			continue
		}
		cs.mu.Lock()
		cs.resolicitedAt = now
		cs.mu.Unlock()
		cs.log.Info("room freed for objects the cluster was refused for a bound: asking its source to send them again", "objects", n)
		cs.closeSessions()
	}
}

// takeoverWindow is how long after a takeover a cluster's writer keeps the cluster while its
// stream is open: a stream of the cluster's source that comes meanwhile is refused, not let
// take over. A restarted minion (its old stream not yet seen dead) takes over at once, as
// long as the cluster has not just changed hands; two live minions with one certificate
// (a copied Secret) change hands once and then the newer one keeps it, with the other
// refused and the conflict alerted on, instead of each replacing the cluster's whole state
// at every sink in turn (issue 25, finding 2: 19 takeovers in 40 s). A restart within it
// waits for keepalive to close the dead stream (about 40 s).
const takeoverWindow = 10 * time.Minute

// competingLocked says why s (a stream from peer) may not take over its cluster now (""
// if it may): the cluster's writer is a live stream, on another connection here or through
// another replica (Layer.GroupWriter), and the cluster changed hands, here or anywhere in
// the group, less than takeoverWindow ago. Streams of one connection are one process's
// (Istio's source opens a stream per collection it probes on its one connection, each
// taking over at its first push). The caller holds cs.mu.
func (h *Hub) competingLocked(cs *clusterState, s *Session, peer string) string {
	elsewhere, tookOver := h.layer.GroupWriter(cs.name)
	last := cs.lastTakeover
	if tookOver.After(last) {
		last = tookOver
	}
	if last.IsZero() || h.now().Sub(last) >= takeoverWindow {
		return ""
	}
	ago := h.now().Sub(last).Round(time.Second)
	if elsewhere != "" {
		return fmt.Sprintf("cluster %q is written by another live stream (%s), and changed hands %s ago: two minions with one identity? The hubs keep one writer and refuse the other until that stream ends",
			cs.name, elsewhere, ago)
	}
	w := cs.writer
	if w == nil || w == s || w.info == nil || w.info.Peer == peer {
		return ""
	}
	return fmt.Sprintf("cluster %q is written by another live stream (from %s, identity %s), which took over %s ago: two minions with one identity? The hub keeps one writer and refuses the other until that stream ends",
		cs.name, w.info.Peer, w.info.Identity, ago)
}

// refuseCompetingLocked records a stream refused for competing with the cluster's writer
// (counted, the gauge raised until takeoverWindow passes without one, an event, a log line
// per peer per interval) and returns the refusal. The caller holds cs.mu.
func (h *Hub) refuseCompetingLocked(cs *clusterState, peer, identity, why string) error {
	cs.competing = h.now()
	h.metrics.competing(cs.name, true)
	if ok, suppressed := competingLogs.Allow(cs.name + "\x00" + peer); ok {
		cs.log.Warn("a stream competing with the cluster's writer refused (two minions with one identity?)", "peer", peer, "identity", identity, "suppressed", suppressed)
		h.note(api.Event{Kind: api.EventTakeover, Cluster: cs.name, Reason: api.ReasonCompeting, Message: why})
	}
	return mcp.WithRetry(status.New(codes.FailedPrecondition, why), CompetingRetry)
}

// CompetingRetry is how soon a refused competing stream is told to retry: it takes over
// once the writer's stream has ended. A replica ending a stream whose session a newer one
// through another replica replaced tells it the same.
const CompetingRetry = 10 * time.Second

// competingLogs keeps one log line and event per cluster and refused peer per interval.
var competingLogs = lograte.New(lograte.DefaultInterval, nil)

// clearCompeting lowers the competing-writers gauge of clusters that refused no stream
// for takeoverWindow.
func (h *Hub) clearCompeting() {
	now := h.now()
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		if !cs.competing.IsZero() && now.Sub(cs.competing) >= takeoverWindow && !cs.removed {
			cs.competing = time.Time{}
			h.metrics.competing(cs.name, false)
		}
		cs.mu.Unlock()
	}
}

// pacer returns the cluster's push limiter for its quotas q (a reload that changes them
// starts a new one).
func (cs *clusterState) pacer(q QuotaConfig) *pushLimiter {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.pushes == nil || cs.pushesFor.PushesPerSecond != q.PushesPerSecond || cs.pushesFor.PushBurst != q.PushBurst {
		cs.pushes, cs.pushesFor = newPushLimiter(q), q
	}
	return cs.pushes
}

// addClusterLocked brings a cluster into the hub's state. The caller holds clustersMu.
func (h *Hub) addClusterLocked(name string) *clusterState {
	log := h.log.With("cluster", name)
	cs := &clusterState{name: name, log: log, data: h.store.addCluster(name, h.current().comp.tenants.OfCluster(name)), sessions: map[*Session]bool{},
		negotiation: mcp.NewNegotiation(log, h.mcpMetrics)}
	h.clusters[name] = cs
	// A configured cluster is disconnected until its minion connects: a minion that never
	// comes is then alerted on like one that left.
	h.metrics.connected(name, false)
	return cs
}

// removeCluster takes a cluster that left the configuration out of every part of the hub:
// its sessions are closed, its resources withdrawn from the views, its status, metrics and
// place in the warm-up gone, and the layer told. It returns how many streams it closed.
func (h *Hub) removeCluster(name string) int {
	h.clustersMu.Lock()
	cs := h.clusters[name]
	delete(h.clusters, name)
	h.clustersMu.Unlock()
	if cs == nil {
		return 0
	}
	cs.mu.Lock()
	cs.removed = true // from here on, nothing records metrics of it: forgetting them is final
	h.knownLocked(cs, "it left the configuration")
	if len(cs.overQuota) > 0 {
		cs.overQuota = nil
		h.overQuota.Add(-1)
	}
	cs.mu.Unlock()
	h.store.removeCluster(cs.data)
	if st := h.state.Load(); st != nil {
		st.DropCluster(name)
	}
	closed := cs.closeSessions()
	h.metrics.forgetCluster(name)
	h.layer.ClusterRemoved(name)
	cs.log.Info("cluster removed from the configuration: its streams closed and its resources no longer served", "streams", closed)
	return closed
}

// cluster returns a configured cluster's state, or nil.
func (h *Hub) cluster(name string) *clusterState {
	h.clustersMu.RLock()
	defer h.clustersMu.RUnlock()
	return h.clusters[name]
}

// clusterList returns the configured clusters' states, by name.
func (h *Hub) clusterList() []*clusterState {
	h.clustersMu.RLock()
	out := make([]*clusterState, 0, len(h.clusters))
	for _, cs := range h.clusters {
		out = append(out, cs)
	}
	h.clustersMu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// ClusterNames returns the configured clusters' names, sorted (not those that left the
// configuration, which the hub keeps until an operator confirms: departure.go).
func (h *Hub) ClusterNames() []string {
	var out []string
	for _, cs := range h.clusterList() {
		if !cs.isDeparted() {
			out = append(out, cs.name)
		}
	}
	return out
}

// KeptClusters returns the names of the clusters the hub keeps a state of, sorted: the
// configured ones and those that left the configuration holding objects (departure.go),
// whose copies replicas exchange like any other cluster's.
func (h *Hub) KeptClusters() []string {
	var out []string
	for _, cs := range h.clusterList() {
		out = append(out, cs.name)
	}
	return out
}

// ClusterTenant returns the tenant a kept cluster belongs to ("" without tenants).
func (h *Hub) ClusterTenant(cluster string) string {
	return h.current().comp.tenants.OfCluster(cluster)
}

// ClusterDeparted reports whether cluster left the configuration holding objects, which the
// hub keeps (departure.go) until an operator confirms its removal or the configuration has
// it again.
func (h *Hub) ClusterDeparted(cluster string) bool {
	cs := h.cluster(cluster)
	return cs != nil && cs.isDeparted()
}

func (cs *clusterState) isDeparted() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.departed != nil
}

// ClusterIsSessionState reports whether what the hub holds of cluster is the state of the
// session its epoch names, as that session (or a peer's copy of it) delivered it, so that a
// peer may take it as that session's state. It is not when the hub does not know the
// cluster's last state (unknown.go: read from a state file that cannot vouch for it, and no
// session has delivered its whole state since), nor when what it restored may lack the
// session's last changes (a kill while the cluster was connected, a read-only state file:
// unknown once the warm-up ends), nor when an operator's decision at this hub
// changed or vouched for it since (a release of the configuration's withdrawals, or of an
// unknown state): replicas do not share operators' decisions, and a peer taking such a
// copy would take the decision with it (withdrawing, where nobody decided it, what the
// cluster's writer publishes).
func (h *Hub) ClusterIsSessionState(cluster string) bool {
	cs := h.cluster(cluster)
	if cs == nil {
		return false
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.unknown == "" && cs.mayLack == "" && cs.decided == ""
}

// decided records that what the hub holds of cs is an operator's decision at this hub, and
// why (ClusterIsSessionState), until a session delivers its whole state again ("": it is
// not).
func (h *Hub) decided(cs *clusterState, why string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	h.decidedLocked(cs, why)
}

func (h *Hub) decidedLocked(cs *clusterState, why string) {
	cs.decided = why
	if why == "" {
		return
	}
	cs.log.Info("what the hub holds of the cluster is an operator's decision here: peers do not take it as its session's state", "why", why)
}

// ClusterSynced reports whether cluster is configured and a session has delivered its
// every collection since the hub started (or since the cluster was added).
func (h *Hub) ClusterSynced(cluster string) bool {
	cs := h.cluster(cluster)
	if cs == nil {
		return false
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.synced
}

// closeSessions ends the cluster's open sessions: its minion reconnects and resumes,
// resending what the hub does not hold (after a reload that widened what it owns).
func (cs *clusterState) closeSessions() int {
	cs.mu.Lock()
	open := make([]*Session, 0, len(cs.sessions))
	for s := range cs.sessions {
		open = append(open, s) // a session is in the set once its stream has opened
	}
	cs.mu.Unlock()
	for _, s := range open {
		s.info.Close()
	}
	return len(open)
}

// currentNegotiation is what the cluster's source refused, under its current configuration.
func (cs *clusterState) currentNegotiation() *mcp.Negotiation {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.negotiation
}

// renegotiate forgets what the cluster's source refused: its configuration changed.
func (cs *clusterState) renegotiate(metrics *mcp.Metrics) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.negotiation = mcp.NewNegotiation(cs.log, metrics)
}

// hasRejections reports whether the cluster has resources standing refused.
func (cs *clusterState) hasRejections() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, rj := range cs.rejections {
		if len(rj) > 0 {
			return true
		}
	}
	return false
}

// sessionOpened records a session's stream as open. One writer per cluster: a stream of
// the cluster's own source takes over from any other, the newest winning (a restarted
// minion whose old stream is not yet seen dead must not wait for it; two peers with one
// cluster's certificate alternate, each taking the whole state, and say so in the log).
// A peer that resumes (a minion) takes over here, before its stream declares what the hub
// holds, and so does a stream the hub dials; a peer dialing in that does not resume
// (Istio's source) takes over at its first push, which is its full state (see
// takeOverLocked): it opens a stream without pushing to probe a collection it may not
// serve, and that must not end the stream that serves the rest.
func (h *Hub) sessionOpened(s *Session, info *mcp.StreamInfo) {
	cs := s.cs
	if s.own {
		cs.writeMu.Lock()
		defer cs.writeMu.Unlock()
	}
	cs.mu.Lock()
	if cs.removed || cs.departed != nil && !s.away {
		// No identity is it any more (a stream that opened late): only a copy kept
		// elsewhere of what it last published (a replica's peer's) may still write it.
		cs.mu.Unlock()
		info.Close()
		return
	}
	// A stream the hub dials (poll) declares the hub's versions with its first request,
	// before the peer's header says whether it resumes: it takes over here too.
	takesOver := s.own && (info.PeerResumes() || info.Transport == "client")
	if why := h.competingLocked(cs, s, info.Peer); takesOver && why != "" {
		_ = h.refuseCompetingLocked(cs, info.Peer, info.Identity, why) // admission refused most; this one raced it
		cs.mu.Unlock()
		info.Close()
		return
	}
	s.info = info
	if takesOver {
		defer h.takeOverLocked(s)()
	}
	cs.sessions[s] = true
	first := false // the cluster's first own stream: its Connected mark must be on disk
	if !s.away {
		cs.lastContact = h.now()
		cs.connected++
		first = cs.connected == 1
		cs.disconnectedAt = time.Time{}
		cs.dropped = nil
		h.metrics.connected(cs.name, true) // under cs.mu: a removal forgets the series after
		h.saveMetaLocked(cs)
		cs.log.Info("cluster stream opened", "streams", cs.connected)
		if cs.connected == 1 {
			h.note(api.Event{Kind: api.EventCluster, Cluster: cs.name, Reason: api.ReasonConnected, Message: "connected from " + info.Peer})
		}
	}
	cs.mu.Unlock()
	if first {
		h.flushConnected()
	}
	h.layer.SessionOpened(s)
}

// sessionClosed records a session's stream as ended.
func (h *Hub) sessionClosed(s *Session) {
	cs := s.cs
	cs.mu.Lock()
	open := cs.sessions[s]
	delete(cs.sessions, s)
	if cs.writer == s {
		cs.writer = nil
	}
	away := false // the cluster's last own stream ended
	if open && !s.away && !cs.removed {
		cs.lastContact = h.now()
		if cs.connected--; cs.connected == 0 {
			cs.disconnectedAt = cs.lastContact
			away = true
			h.note(api.Event{Kind: api.EventCluster, Cluster: cs.name, Reason: api.ReasonDisconnected, Message: "its last stream closed; its objects stay served as staleness says"})
		}
		h.metrics.connected(cs.name, cs.connected > 0)
		h.saveMetaLocked(cs)
		cs.log.Info("cluster stream closed", "streams", cs.connected)
	}
	cs.mu.Unlock()
	if away {
		h.flushState() // from now on the file is what a restart has of the cluster
	}
	if open {
		h.layer.SessionClosed(s)
	}
}

// takeOverLocked makes s the cluster's writer; the caller holds cs.writeMu and cs.mu, and
// calls what it returns once it has released cs.mu (it closes the previous writer's stream).
func (h *Hub) takeOverLocked(s *Session) func() {
	cs := s.cs
	old := cs.writer
	cs.writer = s
	if old == nil || old == s {
		return func() {}
	}
	old.superseded = true
	cs.lastTakeover = h.now()
	cs.log.Warn("a second stream of the cluster took over: the previous one is closed and its state replaced by the new stream's as a whole (two minions, or one restarted before its old stream was seen dead)",
		"new_peer", s.info.Peer, "new_identity", s.info.Identity, "previous_peer", old.info.Peer)
	h.metrics.takeover(cs.name)
	h.note(api.Event{Kind: api.EventTakeover, Cluster: cs.name, Reason: api.ReasonTakeover,
		Message: fmt.Sprintf("a second stream of the cluster (%s, %s) took over from %s; the previous one is closed", s.info.Peer, s.info.Identity, old.info.Peer)})
	return old.info.Close
}

// delivered records that a session delivered collection; once it has delivered every
// one (accepted or not: a permanently rejected resource must not hold the warm-up), the
// cluster has synced and the layer is told.
func (h *Hub) delivered(s *Session, collection string) {
	cs := s.cs
	cs.mu.Lock()
	s.delivered[collection] = true
	complete := !s.complete && s.deliveredAll()
	s.complete = s.complete || complete
	newly := complete && !cs.synced && !cs.removed
	if newly {
		cs.synced = true
	}
	if complete {
		// The session's state replaced the restored one: the cluster's own, or a copy taken
		// from a peer (not what this hub read from its file any more).
		cs.unconfirmed, cs.restored = false, false
		h.resyncedLocked(cs)
		h.knownLocked(cs, "a session delivered its whole state")
		cs.decided = ""
	}
	if complete && !s.away {
		h.saveMetaLocked(cs)
	}
	if complete && s.away && cs.connected == 0 && cs.disconnectedAt.IsZero() {
		cs.disconnectedAt = h.now() // the cluster is away: its staleness clock runs from this copy
	}
	cs.mu.Unlock()
	if complete {
		h.layer.SessionDelivered(s)
	}
	if newly {
		cs.log.Info("cluster synced")
		h.checkReady()
	}
}

// status is the cluster as the admin API shows it (without what the store and the layer
// add).
func (cs *clusterState) status() api.ClusterStatus {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := api.ClusterStatus{Name: cs.name, Connected: cs.connected > 0, Streams: cs.connected, Synced: cs.synced, Restored: cs.restored, Unknown: cs.unknown, Decided: cs.decided}
	if cs.departed != nil {
		t := cs.departed.since
		st.Departed = &t
	}
	if r := cs.negotiation.Refused(); len(r) > 0 {
		st.RefusedCollections = r
	}
	if !cs.lastContact.IsZero() {
		t := cs.lastContact
		st.LastContact = &t
	}
	for coll, m := range cs.rejections {
		if len(m) == 0 {
			continue
		}
		if st.Rejections == nil {
			st.Rejections = map[string]map[string]string{}
		}
		st.Rejections[coll] = maps.Clone(m)
	}
	return st
}

// Warm-up: nothing is served until every configured cluster has synced, or the warm-up
// passes.

// Ready reports whether the hub serves sinks: every configured cluster has synced since the
// start, or the warm-up has passed.
func (h *Hub) Ready() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ready
}

// pendingClusters are the configured clusters that have not synced, by name.
func (h *Hub) pendingClusters() []string {
	var out []string
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		// A departed cluster has no minion to wait for; but a copy of it the layer holds
		// back (a replica's peers may have a newer one) is waited for like any other.
		if !cs.synced && (cs.departed == nil || cs.unconfirmed) {
			out = append(out, cs.name)
		}
		cs.mu.Unlock()
	}
	return out
}

// checkReady turns the hub ready when no cluster is pending and the layer knows what the
// group keeps (Layer.GroupKnown). Once ready it costs nothing: the layer asks at every
// reconciliation.
func (h *Hub) checkReady() {
	if h.Ready() {
		return
	}
	if len(h.pendingClusters()) == 0 && h.layer.GroupKnown() {
		h.setReady("every configured cluster has synced")
	}
}

// RecheckReady is the layer's word that what the warm-up waits for of it changed
// (Layer.GroupKnown): the hub turns ready if nothing else is pending.
func (h *Hub) RecheckReady() { h.checkReady() }

func (h *Hub) setReady(why string) {
	h.mu.Lock()
	if h.ready {
		h.mu.Unlock()
		return
	}
	h.ready = true
	close(h.readyCh)
	h.mu.Unlock()
	h.metrics.ready.Set(1)
	h.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.log.Info("serving sinks", "why", why, "after", h.now().Sub(h.started).Round(time.Millisecond))
}

// Staleness: a disconnected cluster's resources stay served, except in collections with a
// TTL, which drop them once the cluster has been gone that long.

func (h *Hub) expireStale() {
	now := h.now()
	staleness := h.current().cfg.Staleness
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		since := cs.disconnectedAt
		var due []string
		if !since.IsZero() {
			for _, coll := range h.cfg.Collections {
				if ttl := staleness.ttl(coll); ttl > 0 && now.Sub(since) >= ttl && !cs.dropped[coll] {
					due = append(due, coll)
					if cs.dropped == nil {
						cs.dropped = map[string]bool{}
					}
					cs.dropped[coll] = true
				}
			}
		}
		cs.mu.Unlock()
		if len(due) == 0 {
			continue
		}
		n, err := h.store.dropCollections(cs.data, due)
		if err != nil {
			continue // removed meanwhile: nothing of it is served any more
		}
		h.breakerRefresh(cs) // the deletions it held may have gone with them
		cs.mu.Lock()
		if !cs.removed {
			cs.log.Warn("cluster disconnected for longer than its staleness TTL; its resources are no longer served",
				"collections", due, "resources", n, "disconnected_at", since)
			for _, coll := range due {
				h.metrics.resources(cs.name, coll, 0)
			}
		}
		cs.mu.Unlock()
		if cs.isDeparted() {
			h.forgetDeparted(cs.name) // if that was all it had
		}
	}
}
