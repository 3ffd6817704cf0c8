package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/replicas"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// clusterState is the hub's knowledge of one configured cluster beyond its resources.
type clusterState struct {
	name string
	log  *slog.Logger

	mu             sync.Mutex // guards the following fields
	streams        int
	lastContact    time.Time
	disconnectedAt time.Time       // zero while connected (or never connected)
	everSynced     bool            // a stream has delivered every collection since the hub started
	dropped        map[string]bool // collections dropped for staleness since the disconnect
	rejections     map[string]map[string]string
	received       map[*mcp.Sink]map[string]bool // per open stream: collections pushed so far
	open           map[*mcp.StreamInfo]bool      // open ingest streams, to close on a reload
	sessions       map[*mcp.Sink]uint64          // minion streams that synced: the epoch held for each
	follows        map[*mcp.Sink]*follow         // open streams from the replica holding the cluster
	local          int                           // open minion streams (pushed or polled) here
}

// closeStreams ends the cluster's ingest streams: its minion reconnects and resumes,
// resending what the hub does not hold (after a reload that widened what it owns).
func (cs *clusterState) closeStreams() int {
	cs.mu.Lock()
	infos := make([]*mcp.StreamInfo, 0, len(cs.open))
	for i := range cs.open {
		infos = append(infos, i)
	}
	cs.mu.Unlock()
	for _, i := range infos {
		i.Close()
	}
	return len(infos)
}

// ClusterStatus is one cluster as the admin API shows it.
type ClusterStatus struct {
	Name        string         `json:"name"`
	Connected   bool           `json:"connected"`
	Streams     int            `json:"streams"`
	Synced      bool           `json:"synced"`
	LastContact *time.Time     `json:"lastContact,omitempty"`
	Resources   map[string]int `json:"resources"`
	// Rejections are resources refused by the ACL (or malformed), by collection and name,
	// with the reason. They are not stored and never served.
	Rejections map[string]map[string]string `json:"rejections,omitempty"`
	// Conflicts are resources held but not served because another cluster's resource of
	// the same collection/name wins: collection -> name -> the winning cluster.
	Conflicts map[string]map[string]string `json:"conflicts,omitempty"`
	// HeldBy is, with replicas, the replica holding the cluster's newest minion session
	// (every other replica follows the cluster from it); absent when none holds it.
	HeldBy *replicas.Authority `json:"heldBy,omitempty"`
}

func (cs *clusterState) status(counts map[string]int) ClusterStatus {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := ClusterStatus{Name: cs.name, Connected: cs.streams > 0, Streams: cs.streams, Synced: cs.everSynced, Resources: counts}
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
		cp := make(map[string]string, len(m))
		for k, v := range m {
			cp[k] = v
		}
		st.Rejections[coll] = cp
	}
	return st
}

// peerIdentity returns the authenticated identity of a stream's peer: the URI SAN (a SPIFFE
// ID) of its verified client certificate, else its subject common name; in development
// mode, the x-meshfed-dev-identity header.
func peerIdentity(ctx context.Context, insecure bool) (string, error) {
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
	leaf := ti.State.PeerCertificates[0]
	if len(leaf.URIs) > 0 {
		return leaf.URIs[0].String(), nil
	}
	if leaf.Subject.CommonName != "" {
		return leaf.Subject.CommonName, nil
	}
	return "", status.Error(codes.Unauthenticated, "client certificate has neither a URI SAN nor a common name")
}

// authenticateCluster admits a minion's stream only if its identity is a configured
// cluster's.
func (h *Hub) authenticateCluster(ctx context.Context) (string, error) {
	id, err := peerIdentity(ctx, h.cfg.Insecure)
	if err != nil {
		return "", err
	}
	cur := h.current()
	if err := h.requireKind(id, meshtls.KindCluster, "minions may push"); err != nil {
		return "", err
	}
	if _, ok := cur.comp.identity[id]; !ok {
		return "", status.Errorf(codes.PermissionDenied, "identity %q is not a configured cluster", id)
	}
	if h.cfg.Insecure {
		h.log.Warn("development mode: admitting a cluster by the identity it claims", "identity", id)
	}
	return id, nil
}

// newClusterSink returns the Sink for one minion stream: it requests every served
// collection, declares what the hub already holds for that cluster (so the minion resumes),
// and applies pushes through the ACL into the store.
func (h *Hub) newClusterSink(_ context.Context, info *mcp.StreamInfo) (*mcp.Sink, error) {
	name, ok := h.current().comp.identity[info.Identity]
	cs := h.cluster(name)
	if !ok || cs == nil {
		return nil, status.Errorf(codes.PermissionDenied, "identity %q is not a configured cluster", info.Identity)
	}
	return h.clusterSink(cs)
}

// clusterSink returns a Sink for one stream of cs, dialed in or polled.
func (h *Hub) clusterSink(cs *clusterState) (*mcp.Sink, error) {
	return h.newSink(cs, nil, &mcppb.SinkNode{Id: "meshfed-hub"})
}

// forwardSink returns a Sink for one stream of f, from the replica holding cs.
func (h *Hub) forwardSink(cs *clusterState, f *follow) (*mcp.Sink, error) {
	return h.newSink(cs, f, h.forwardNode(cs.name, f.copy))
}

// newSink builds the sink of one stream of cs: from its minion (f nil) or from the replica
// holding it. It requests every served collection, declares what the hub holds for cs (so
// the other side resumes) and applies pushes through the ACL into the store.
func (h *Hub) newSink(cs *clusterState, f *follow, node *mcppb.SinkNode) (*mcp.Sink, error) {
	name := cs.name
	var sink *mcp.Sink
	var err error
	sink, err = mcp.NewSink(mcp.SinkOptions{
		Collections: h.cfg.Collections,
		Node:        node,
		Applier: mcp.ApplierFunc(func(ctx context.Context, c *mcp.Change) error {
			if f != nil && f.retired.Load() {
				return nil // superseded by a newer session's stream
			}
			if f == nil && h.superseded(cs, sink) {
				return nil // a minion stream here that a newer session elsewhere has replaced
			}
			return h.applyCluster(cs, sink, c)
		}),
		InitialVersions: func(coll string) map[string]string { return h.store.versions(name, coll) },
		MaxMessageSize:  h.maxRecv,
		Logger:          cs.log,
		Metrics:         h.mcpMetrics,
		Hooks: mcp.Hooks{
			StreamOpened: func(i *mcp.StreamInfo) {
				cs.mu.Lock()
				if cs.open == nil {
					cs.open = map[*mcp.StreamInfo]bool{}
				}
				cs.open[i] = true
				if f != nil {
					if cs.follows == nil {
						cs.follows = map[*mcp.Sink]*follow{}
					}
					cs.follows[sink] = f
				} else {
					// The cluster's minion is here: it is the freshest source, so what this
					// replica follows stops writing the store at once (reconcileFollows
					// starts nothing new while the stream is open, and again after it).
					cs.local++
					for _, other := range cs.follows {
						other.retired.Store(true)
					}
				}
				cs.mu.Unlock()
				if f == nil && h.mem() != nil {
					h.mem().Poke()
				}
				if f == nil || !f.copy { // a copy is not the cluster being connected
					h.clusterConnected(cs, true)
				}
			},
			StreamClosed: func(i *mcp.StreamInfo, _ error) {
				cs.mu.Lock()
				delete(cs.received, sink)
				delete(cs.open, i)
				delete(cs.follows, sink)
				if f == nil {
					cs.local--
				}
				epoch, held := cs.sessions[sink]
				delete(cs.sessions, sink)
				var other *mcp.Sink // another synced minion stream of the cluster, still open here
				for s := range cs.sessions {
					other = s
				}
				cs.mu.Unlock()
				if held {
					h.releaseSession(cs, epoch, other)
				}
				if f == nil || !f.copy {
					h.clusterConnected(cs, false)
				}
				if f != nil && f.copy && h.hasCopy(cs) {
					// A copy is taken once, from one peer: redialling another could declare
					// versions that peer never had and receive deletions of them.
					f.stop()
				}
				if f == nil && h.mem() != nil {
					h.mem().Poke()
				}
			},
		},
	})
	return sink, err
}

func (h *Hub) clusterConnected(cs *clusterState, up bool) {
	cs.mu.Lock()
	now := h.now()
	cs.lastContact = now
	if up {
		cs.streams++
		cs.disconnectedAt = time.Time{}
		cs.dropped = nil
	} else if cs.streams--; cs.streams == 0 {
		cs.disconnectedAt = now
	}
	streams := cs.streams
	cs.mu.Unlock()
	h.metrics.connected(cs.name, streams > 0)
	if up {
		cs.log.Info("cluster stream opened", "streams", streams)
	} else {
		cs.log.Info("cluster stream closed", "streams", streams)
	}
}

// applyCluster checks one push of a cluster against the ownership ACL, stores the accepted
// part (whatever is rejected is never served), and NACKs with every rejected resource and
// why, including those that lost a conflict.
func (h *Hub) applyCluster(cs *clusterState, sink *mcp.Sink, c *mcp.Change) error {
	cur := h.current()
	if cur.comp.removed(cs.name) {
		return status.Errorf(codes.PermissionDenied, "cluster %q is no longer in the hub's configuration", cs.name)
	}
	var put []*resource
	var rejected []mcp.Rejection
	keep := map[string]bool{}
	aclRejected := false
	for i, e := range c.Entries {
		r := c.Resources[i]
		hosts, err := acl.Hosts(c.Collection, r.GetBody().GetValue())
		if err == nil {
			err = cur.comp.policy.Check(cs.name, acl.Object{Collection: c.Collection, Name: e.Name, Hosts: hosts})
		}
		if err != nil {
			rejected = append(rejected, mcp.Rejection{Resource: e.Name, Reason: err.Error()})
			keep[e.Name] = true
			aclRejected = true
			continue
		}
		res, err := newResource(cs.name, c.Collection, e, r, hosts)
		if err != nil {
			rejected = append(rejected, mcp.Rejection{Resource: e.Name, Reason: err.Error()})
			keep[e.Name] = true
			continue
		}
		put = append(put, res)
	}
	lost := h.store.apply(cs.name, c.Collection, put, c.Removed, !c.Incremental, keep)
	refused := len(rejected) // the ones not stored; conflicts are stored and may be served later
	for _, cf := range lost {
		rejected = append(rejected, mcp.Rejection{Resource: cf.Name,
			Reason: fmt.Sprintf("conflicts with cluster %q's %s, which is served (%s); this one is held and served if that one goes away",
				cf.Winner, cf.Name, cf.Why)})
	}

	cs.mu.Lock()
	cs.lastContact = h.now()
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
	cs.mu.Unlock()
	for _, r := range rejected {
		h.metrics.rejected(cs.name, c.Collection)
		cs.log.Warn("resource rejected", "collection", c.Collection, "resource", r.Resource, "reason", r.Reason)
	}
	h.metrics.resources(cs.name, c.Collection, h.store.counts(cs.name)[c.Collection])
	if !c.More { // a split push has delivered the collection at its last chunk
		h.noteSynced(cs, sink, c.Collection)
	}
	if len(rejected) == 0 {
		return nil
	}
	code := codes.AlreadyExists // only conflicts
	if aclRejected {
		code = codes.PermissionDenied
	}
	return mcp.RejectionError(code, c.Collection, rejected)
}

// noteSynced marks the cluster synced once one stream has delivered every collection
// (accepted or not: a permanently rejected resource must not hold the hub's warm-up). A
// replica's minion stream that has delivered everything holds the cluster's session (the
// newest epoch: peers now follow this replica for it, and this replica stops applying
// what it follows from theirs).
func (h *Hub) noteSynced(cs *clusterState, sink *mcp.Sink, collection string) {
	cs.mu.Lock()
	if cs.received == nil {
		cs.received = map[*mcp.Sink]map[string]bool{}
	}
	got := cs.received[sink]
	if got == nil {
		got = map[string]bool{}
		cs.received[sink] = got
	}
	before := len(got)
	got[collection] = true
	complete := before < len(h.cfg.Collections) && len(got) == len(h.cfg.Collections)
	newly := !cs.everSynced && complete
	if newly {
		cs.everSynced = true
	}
	if f := cs.follows[sink]; complete && f != nil && f.copy && cs.streams == 0 && cs.disconnectedAt.IsZero() {
		cs.disconnectedAt = h.now() // a copy of a cluster away: its staleness TTL runs here too
	}
	local := complete && cs.follows[sink] == nil && h.mem() != nil && sink != nil
	if local {
		for _, f := range cs.follows {
			f.retired.Store(true) // this session is newer than what they carry
		}
	}
	cs.mu.Unlock()
	if local {
		_ = h.holdSession(cs, sink) // false: the stream has just ended
	}
	if newly {
		cs.log.Info("cluster synced")
		h.checkReady()
	}
}

// holdSession holds cs's session for the minion stream of sink, unless it has ended, and
// reports whether it did.
func (h *Hub) holdSession(cs *clusterState, sink *mcp.Sink) bool {
	epoch := h.mem().Hold(cs.name)
	cs.mu.Lock()
	if cs.received[sink] == nil { // the stream ended meanwhile
		cs.mu.Unlock()
		h.mem().Release(cs.name, epoch)
		return false
	}
	if cs.sessions == nil {
		cs.sessions = map[*mcp.Sink]uint64{}
	}
	cs.sessions[sink] = epoch
	cs.mu.Unlock()
	cs.log.Info("holding the cluster's session", "epoch", epoch)
	return true
}

// superseded reports whether the minion stream of sink holds a session that a newer one
// elsewhere has replaced (the minion reconnected to another replica before this stream was
// noticed dead): its pushes are not applied; this replica follows the newer session.
func (h *Hub) superseded(cs *clusterState, sink *mcp.Sink) bool {
	if h.mem() == nil {
		return false
	}
	cs.mu.Lock()
	epoch, held := cs.sessions[sink]
	cs.mu.Unlock()
	if !held {
		return false // resyncing: newer than any session
	}
	replica, newest, ok := h.mem().Authority(cs.name)
	return ok && replica != h.cfg.Replicas.Name && newest > epoch
}

// releaseSession releases the session of epoch after its stream ended. Another synced
// minion stream of the cluster still open here (a minion that reconnected before its old
// stream was noticed dead) holds it anew; otherwise the peers following the cluster from
// here are disconnected: what this replica has of it may change now (staleness, a reload)
// without being the cluster's.
func (h *Hub) releaseSession(cs *clusterState, epoch uint64, other *mcp.Sink) {
	h.mem().Release(cs.name, epoch)
	if h.mem().Holds(cs.name) {
		return // a newer session of this replica's holds it
	}
	if other != nil && h.holdSession(cs, other) {
		return
	}
	if n := h.peerStreams.closeAll(cs.name); n > 0 {
		cs.log.Info("released the cluster's session; closed the peers' streams following it", "streams", n)
	}
}

var errNotReady = errors.New("the hub is warming up")
