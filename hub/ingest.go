package hub

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Ingest: a minion's stream (it dials in, or the hub polls it) is a session of its
// cluster; each push goes through the ownership ACL into the store, whose merge and views
// bring every sink up to date.

// PeerIdentity returns the authenticated identity of a stream's peer: what its verified
// client certificate names (meshtls.PeerIdentity: its only URI SAN, a SPIFFE ID, else its
// subject common name; a certificate with several URI SANs is refused); in development
// mode (insecure), the x-meshfed-dev-identity header.
func PeerIdentity(ctx context.Context, insecure bool) (string, error) {
	if insecure {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(DevIdentityHeader); len(v) > 0 {
			return v[0], nil
		}
		return "", nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no peer information")
	}
	// The listener's TLS configuration (meshtls) refuses any handshake whose client
	// certificate does not verify against the bundle, so a certificate here is verified.
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return "", status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	id, err := meshtls.PeerIdentity(ti.State.PeerCertificates[0])
	if err != nil {
		return "", status.Error(codes.Unauthenticated, err.Error())
	}
	return id, nil
}

// requireKind refuses id, with PermissionDenied, unless it is an identity of kind in the
// configured trust domain (when there is one and TLS is on). what says who may.
func (h *Hub) requireKind(id, kind, what string) error {
	td := h.current().comp.trustDomain
	if td == "" || h.cfg.Insecure {
		return nil
	}
	if k, _, _ := meshtls.ParseID(td, id); k != kind {
		return status.Errorf(codes.PermissionDenied, "identity %q is not a %s identity (%s): only %s", id, kind, meshtls.ID(td, kind, "NAME"), what)
	}
	return nil
}

// authenticateCluster admits a minion's stream only if its identity is a configured
// cluster's.
func (h *Hub) authenticateCluster(ctx context.Context) (string, error) {
	id, err := PeerIdentity(ctx, h.cfg.Insecure)
	if err != nil {
		return "", err
	}
	if err := h.requireKind(id, meshtls.KindCluster, "minions may push"); err != nil {
		return "", err
	}
	if _, ok := h.current().comp.identity[id]; !ok {
		return "", status.Errorf(codes.PermissionDenied, "identity %q is not a configured cluster", id)
	}
	if h.cfg.Insecure {
		h.log.Warn("development mode: admitting a cluster by the identity it claims", "identity", id)
	}
	return id, nil
}

// minionNode is what the hub's side of a minion's stream sends.
var minionNode = &mcppb.SinkNode{Id: "meshfed-hub"}

// newMinionSink returns the Sink of a minion's stream that dialed in: a session of the
// cluster its identity is.
func (h *Hub) newMinionSink(_ context.Context, info *mcp.StreamInfo) (*mcp.Sink, error) {
	comp := h.current().comp
	name := comp.identity[info.Identity]
	cs := h.cluster(name)
	if cs == nil {
		return nil, status.Errorf(codes.PermissionDenied, "identity %q is not a configured cluster", info.Identity)
	}
	cs.mu.Lock()
	if why := h.competingLocked(cs, nil, info.Peer); why != "" {
		err := h.refuseCompetingLocked(cs, info.Peer, info.Identity, why)
		cs.mu.Unlock()
		return nil, err
	}
	cs.mu.Unlock()
	s, err := h.newSession(cs, SessionOptions{Node: minionNode}, &peerSource{fullState: comp.clusters[name].FullState})
	if err != nil {
		return nil, err
	}
	return s.sink, nil
}

// OpenSession returns a session of cluster for a stream a Layer runs (it calls
// Session.Sink().PullFrom): its pushes go through the same ACL, store, merge and views as a
// minion's.
func (h *Hub) OpenSession(cluster string, opts SessionOptions) (*Session, error) {
	cs := h.cluster(cluster)
	if cs == nil {
		return nil, fmt.Errorf("cluster %q is not configured", cluster)
	}
	return h.newSession(cs, opts, nil)
}

// peerSource says a session's stream comes from the cluster's own source (its minion, or
// a stock MCP source such as Galley): what that peer refused is remembered across its
// streams, and fullState asks it for full-state pushes.
type peerSource struct{ fullState bool }

// newSession builds a session of cs: its Sink requests the cluster's collections, declares
// what the hub holds of cs (so a peer that resumes does not resend) and applies pushes.
func (h *Hub) newSession(cs *clusterState, opts SessionOptions, peer *peerSource) (*Session, error) {
	s := &Session{cs: cs, away: opts.Away, peer: opts.Peer || opts.Away, delivered: map[string]bool{}, own: peer != nil}
	so := mcp.SinkOptions{
		Collections:     h.current().comp.collections(cs.name),
		Node:            opts.Node,
		Applier:         mcp.ApplierFunc(func(ctx context.Context, c *mcp.Change) error { return h.applyPaced(ctx, s, c) }),
		InitialVersions: func(coll string) map[string]string { return h.store.versions(cs.name, coll) },
		MaxMessageSize:  MaxIngestMessageSize,
		Logger:          cs.log,
		Metrics:         h.mcpMetrics,
		Hooks: mcp.Hooks{
			StreamOpened: func(i *mcp.StreamInfo) { h.sessionOpened(s, i) },
			StreamClosed: func(*mcp.StreamInfo, error) { h.sessionClosed(s) },
		},
	}
	if peer != nil {
		so.Negotiation = cs.currentNegotiation()
		so.FullStateOnly = peer.fullState
	}
	var err error
	s.sink, err = mcp.NewSink(so)
	return s, err
}

// applyPaced applies a push of a session once the cluster's push rate allows it, then its
// tenant's (all of the tenant's clusters together): a cluster pushing faster, or of a
// tenant pushing faster, waits on its own stream (its source coalesces meanwhile), and no
// other tenant's cluster waits with it.
func (h *Hub) applyPaced(ctx context.Context, s *Session, c *mcp.Change) error {
	if s.own {
		q := h.current().comp.quotaFor(s.cs.name).q
		if err := s.cs.pacer(q).wait(ctx); err != nil {
			return err
		}
		if err := h.paceTenant(ctx, s.cs.name); err != nil {
			return err
		}
	}
	return h.apply(s, c)
}

// apply checks one push of a session against the ownership ACL, stores the accepted part
// (whatever is rejected is never served), and NACKs with every rejected resource and why,
// including those that lost a conflict.
func (h *Hub) apply(s *Session, c *mcp.Change) error {
	cs := s.cs
	if !h.layer.MayWrite(s) {
		// Refused, not dropped: an ACK would tell the source the push is stored, and it would
		// never send it again.
		return status.Errorf(codes.Aborted, "cluster %q: this stream no longer writes the cluster (a newer session of it is the writer); reconnect to resend", cs.name)
	}
	// Its objects are kept as they were when it left (departure.go); a session that outlived
	// its leaving writes nothing. A copy of them kept elsewhere (a replica's peer's, Away)
	// still may: it is what the cluster last published too, perhaps newer than what this
	// hub kept (hub/replicas exchanges departed clusters' copies like any other's).
	departedCopy, copyRefused := false, false
	if cs.isDeparted() {
		if !s.away {
			return status.Errorf(codes.PermissionDenied, "cluster %q left the hub's configuration; what it last published is kept until an operator confirms its removal", cs.name)
		}
		departedCopy = true
	}
	if s.own && s.sink != nil {
		cs.writeMu.Lock()
		defer cs.writeMu.Unlock()
		cs.mu.Lock()
		superseded := s.superseded
		closeOld := func() {}
		if !superseded && cs.writer != s && s.info != nil {
			if why := h.competingLocked(cs, s, s.info.Peer); why != "" {
				err := h.refuseCompetingLocked(cs, s.info.Peer, s.info.Identity, why)
				cs.mu.Unlock()
				return err
			}
			closeOld = h.takeOverLocked(s) // a peer that does not resume, at its first push
		}
		cs.mu.Unlock()
		closeOld()
		if superseded {
			return status.Errorf(codes.Aborted, "a newer stream of cluster %q took over; this one writes nothing more", cs.name)
		}
	}
	cur := h.current()
	var put []*resource
	var rejected []mcp.Rejection
	var reasons []string // rejected's api.Reason* classes
	refuse := func(name, reason string, err error) {
		rejected = append(rejected, mcp.Rejection{Resource: name, Reason: err.Error()})
		reasons = append(reasons, reason)
	}
	keep := map[string]bool{}
	var quota *quotaGuard // copies were bounded where they were written
	if s.own {
		quota = cur.comp.quotaFor(cs.name)
	}
	for i, e := range c.Entries {
		r := c.Resources[i]
		var err error
		var hosts []string
		decoded := false
		reason := api.ReasonInvalid
		if s.own { // copies were checked where they were written
			var body proto.Message
			if body, err = cur.comp.kindTable.Decode(c.Collection, r); err == nil {
				hosts, decoded = acl.HostsOf(c.Collection, body) // the body is decoded once
			}
		}
		if err == nil && !decoded {
			hosts, err = acl.Hosts(c.Collection, r.GetBody().GetValue())
		}
		if err == nil && !departedCopy { // a departed cluster owns nothing: its objects are held, below
			err = cur.comp.check(cs.name, acl.Object{Collection: c.Collection, Name: e.Name, Hosts: hosts})
			reason = checkReason(err)
			if err != nil && s.peer {
				// A peer's session (following the holder, or a copy) holds what its holder
				// serves: an object this configuration does not allow is one the holder's
				// breaker holds (or a configuration not yet the same on every replica). Stored,
				// then judged as a reload judges it, below: refused here, a sink on this
				// replica would lose what the holder serves, and a peer following this replica
				// later would take its absence as deletions.
				err, copyRefused = nil, true
			}
		}
		if err != nil {
			refuse(e.Name, reason, err)
			keep[e.Name] = true
			continue
		}
		res, err := newResource(cs.name, c.Collection, e, r, hosts)
		reason = api.ReasonInvalid
		if err == nil && quota != nil && len(res.served.Encoded) > quota.q.MaxObjectBytes {
			err = fmt.Errorf("%s is %d bytes as served, more than maxObjectBytes %d (what a sink can receive in one push is %d)",
				e.Name, len(res.served.Encoded), quota.q.MaxObjectBytes, maxServedObject(cur.comp.maxMessage))
			reason = api.ReasonOverQuota
		}
		if err != nil {
			refuse(e.Name, reason, err)
			keep[e.Name] = true
			continue
		}
		put = append(put, res)
	}
	w := write{collection: c.Collection, put: put, remove: c.Removed, full: !c.Incremental, keep: keep, quota: quota}
	if s.own {
		w.guard = &breakerGuard{cfg: cur.comp.breakerFor(cs.name), now: h.now()}
	}
	res, err := h.store.apply(cs.data, w)
	if errors.Is(err, errRemoved) {
		return status.Errorf(codes.PermissionDenied, "cluster %q is no longer in the hub's configuration", cs.name)
	}
	h.breakerChanged(cs, c.Collection, res.breaker)
	if departedCopy || copyRefused {
		h.recheckCopy()
	}
	for _, r := range res.refused {
		rejected, reasons = append(rejected, r), append(reasons, api.ReasonOverQuota)
	}
	refused := len(rejected) // the ones not stored; conflicts are stored and may be served later
	for _, cf := range res.lost {
		refuse(cf.Name, api.ReasonConflict, fmt.Errorf("conflicts with cluster %q's %s, which is served (%s); this one is held and served if that one goes away",
			cf.Winner, cf.Name, cf.Why))
	}

	cs.mu.Lock()
	if cs.removed { // removed since the store took the push: nothing more is recorded of it
		cs.mu.Unlock()
		return status.Errorf(codes.PermissionDenied, "cluster %q is no longer in the hub's configuration", cs.name)
	}
	cs.lastContact = h.now()
	if cs.connected == 0 {
		// A write without an open stream of the cluster (Hub.Apply, a copy): its time is
		// its last contact. A connected cluster's is saved as it connects, disconnects and
		// every 10 s (saveContacts), not with every push.
		h.saveMetaLocked(cs)
	}
	if cs.rejections == nil {
		cs.rejections = map[string]map[string]string{}
	}
	rj := cs.rejections[c.Collection]
	if rj == nil || !c.Incremental {
		rj = map[string]string{}
		cs.rejections[c.Collection] = rj
	}
	for _, e := range c.Entries {
		delete(rj, e.Name)
	}
	for _, n := range c.Removed {
		delete(rj, n)
	}
	for _, r := range rejected[:refused] {
		rj[r.Resource] = r.Reason
	}
	h.overQuota.Add(cs.noteOverQuotaLocked(c, put, res.refused))
	tenant := ""
	if len(rejected) > 0 {
		tenant = cur.comp.tenants.OfCluster(cs.name) // the push's configuration's, once
	}
	for i, r := range rejected {
		h.metrics.rejected(cs.name, c.Collection)
		cs.log.Warn("resource rejected", "collection", c.Collection, "resource", r.Resource, "reason", r.Reason)
		h.note(api.Event{Kind: api.EventRefusal, Tenant: tenant, Cluster: cs.name, Collection: c.Collection, Name: r.Resource, Reason: reasons[i], Message: r.Reason})
	}
	h.metrics.resources(cs.name, c.Collection, res.held) // under cs.mu: a removal forgets the series after
	cs.mu.Unlock()
	if !c.More { // a split push has delivered the collection at its last chunk
		h.delivered(s, c.Collection)
	}
	h.resolicit() // what this write freed may let in what another write was refused
	if res.breaker.open {
		// Held deletions are reported like refusals (the source's NACK detail, which a
		// minion turns into Warning Events), but they are neither logged per name nor
		// recorded as rejections: the breaker's status lists them.
		rejected = append(rejected, heldRejections(cs.name, c.Collection, res.breaker.withheld)...)
	}
	if len(rejected) == 0 {
		return nil
	}
	if c.Stream != nil && !c.Stream.PeerResumes() {
		// A source that does not resume (Istio's) reads any NACK as "nothing applied" and
		// sends its next push against what it last had ACKed: a resource it sent since and
		// then deleted would never be removed here. The push is applied but for the refused
		// resources, which stay in status, logs and metrics: it is ACKed.
		return nil
	}
	return mcp.RejectionError(nackCode(reasons, res.breaker.open && len(res.breaker.withheld) > 0), c.Collection, rejected)
}

// Apply applies a change to the store as if cluster had pushed it on a stream: the ACL, the
// merge and the views, exactly as for a pushed change. For embedding and benchmarks; the
// error is the NACK a stream would have sent.
func (h *Hub) Apply(cluster string, c *mcp.Change) error {
	cs := h.cluster(cluster)
	if cs == nil || cs.isDeparted() {
		return fmt.Errorf("cluster %q is not configured", cluster)
	}
	cs.mu.Lock()
	if cs.direct == nil {
		cs.direct = &Session{cs: cs, delivered: map[string]bool{}, own: true, direct: h.current().comp.collections(cs.name)} // a session without a stream
	}
	s := cs.direct
	cs.mu.Unlock()
	return h.apply(s, c)
}
