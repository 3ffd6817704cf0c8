package hub

import (
	"context"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// Layer is the one seam between the single-hub core and what runs beside it: the replica
// layer (package hub/replicas) implements it. The core calls it at these points only, and a
// single hub's layer (noLayer) does nothing at any of them. Its hooks are called on stream
// goroutines and must be quick; StateChanged is called with the store's lock held.
type Layer interface {
	// Start is called by Run once the listeners are bound and before any stream is served:
	// the layer may serve its peers on the ingest listener and add routes to the admin API,
	// and runs its goroutines in g until ctx ends.
	Start(ctx context.Context, g *errgroup.Group, l Listeners) error

	// SessionOpened, SessionDelivered and SessionClosed follow every session (a stream
	// writing one cluster's state): opened, delivered every collection once (the cluster's
	// state here is then the session's), ended. MayWrite is asked before each push of a
	// session is applied: false refuses it (NACKed with Aborted, nothing changes). A push is
	// never ACKed unapplied: its source would take it as stored and never send it again.
	SessionOpened(*Session)
	SessionDelivered(*Session)
	SessionClosed(*Session)
	MayWrite(*Session) bool

	// GroupWriter tells the one-writer rule (competingLocked) about the cluster's writer
	// beyond this hub: a description of it if it is a live session elsewhere (""
	// otherwise), and when the cluster last changed hands from one live session to another
	// anywhere the layer knows of (zero: never seen). A new stream of the cluster's source
	// is judged by it as by a takeover here. It is called with the cluster's lock held and
	// must not call the core.
	GroupWriter(cluster string) (elsewhere string, tookOver time.Time)

	// StateChanged reports each change of what a cluster holds, as received (the entries
	// put, the names removed), in the order the store applied them. ClusterRemoved reports a
	// cluster leaving the configuration: its state is gone from the core and its open
	// sessions were told to close (each one's SessionClosed comes when its stream ends).
	StateChanged(cluster, collection string, put []*mcp.Entry, removed []string)
	ClusterRemoved(cluster string)
	// ClusterRenamed reports that a reload renamed a cluster: the store moved from's state
	// to to (store.transfer), so to's copy is from's, of the same session. from's
	// ClusterRemoved follows.
	ClusterRenamed(from, to string)

	// GroupKnown reports whether the layer knows what the group keeps: a replica's peers
	// may keep clusters this hub does not know (departed while it was down, or before its
	// state directory was emptied), whose copies it must take before it serves a sink. The
	// warm-up does not end by the clusters' syncing before it does (its timeout ends it
	// anyway); the layer calls Hub.RecheckReady once it does. A single hub's always does.
	GroupKnown() bool

	// ClusterDecided is told before an operator's decision at this hub changes what it
	// holds of cluster in a way its writer did not (a release of what a reload's ownership
	// withdrew). It returns whether the decision is the group's: its followers follow this
	// hub's state, as when it holds the cluster's live session. If not, what this hub holds
	// of cluster is no longer a session's state (Hub.ClusterIsSessionState), and the layer
	// ends the streams through which peers follow it before the change is made.
	ClusterDecided(cluster string) (shared bool)

	// ClusterRestored is told, at the start (before Start and before any stream), of each
	// cluster whose whole state was restored from the state file, with the epoch that state
	// was saved at (see Hub.SetClusterEpoch). It returns whether the restored state counts
	// as the cluster's synced state now, for the warm-up and as a copy peers may take; if
	// not, it counts once the layer calls Hub.ConfirmRestored, or once a session of the
	// cluster has delivered everything (which replaced it). A single hub's always counts.
	// A state that may lack its last changes (a kill while the cluster was connected, a
	// read-only state file) is told too, for its epoch, but never counts whatever the layer
	// says, and ConfirmRestored does not make it count (nor Hub.ClusterIsSessionState report
	// it as its session's state): only a session's delivery does.
	ClusterRestored(cluster string, epoch uint64) bool

	// RunTask runs run, one of the hub's dial-outs (key names it: dialSink/<name>,
	// poll/<cluster>), for as long as this hub should; a single hub always should.
	RunTask(ctx context.Context, key string, run func(context.Context))
	// DescribeCluster adds the layer's view of a cluster to its status.
	DescribeCluster(*api.ClusterStatus)
}

// Listeners are what Layer.Start may extend.
type Listeners struct {
	// Ingest is the ingest listener's server and IngestAddr its bound address. Its
	// ResourceSink and ResourceSource are the core's.
	Ingest     *grpc.Server
	IngestAddr string
	// PeerSource gives the ingest listener's ResourceSource streams of the peers accept
	// takes (by identity) to srv; every other stream there is a minion's relay.
	PeerSource func(srv *mcp.SourceServer, accept func(identity string) bool)
	// Admin is the admin API's mux (served only when the configuration has an http
	// address).
	Admin *http.ServeMux
}

// noLayer is a single hub's Layer.
type noLayer struct{}

func (noLayer) Start(context.Context, *errgroup.Group, Listeners) error { return nil }
func (noLayer) SessionOpened(*Session)                                  {}
func (noLayer) SessionDelivered(*Session)                               {}
func (noLayer) SessionClosed(*Session)                                  {}
func (noLayer) MayWrite(*Session) bool                                  { return true }
func (noLayer) GroupWriter(string) (string, time.Time)                  { return "", time.Time{} }
func (noLayer) StateChanged(string, string, []*mcp.Entry, []string)     {}
func (noLayer) ClusterRemoved(string)                                   {}
func (noLayer) ClusterRenamed(string, string)                           {}
func (noLayer) ClusterRestored(string, uint64) bool                     { return true }
func (noLayer) ClusterDecided(string) bool                              { return true }
func (noLayer) GroupKnown() bool                                        { return true }
func (noLayer) RunTask(ctx context.Context, _ string, run func(context.Context)) {
	run(ctx)
}
func (noLayer) DescribeCluster(*api.ClusterStatus) {}

// SessionOptions describe a session a Layer opens with OpenSession.
type SessionOptions struct {
	// Node is the SinkNode the session's stream sends.
	Node *mcppb.SinkNode
	// Away: the stream carries the last state of a cluster whose minion is away (a copy
	// kept elsewhere). It does not make the cluster connected, and the cluster's staleness
	// clock starts when it has delivered every collection.
	Away bool
	// Peer: the stream comes from a peer replica (following the replica that holds the
	// cluster, or a copy): what it carries is what that replica serves, so an object this
	// hub's configuration does not allow is stored and judged as a reload judges it (held by
	// the breaker, as on the holder), not refused. Away implies it.
	Peer bool
}

// Session is one stream writing a cluster's state into the hub: a minion's, pushed or
// polled, or one a Layer opened with OpenSession. Its Sink runs the stream; every push goes
// through the ACL, the store, the merge and the views.
type Session struct {
	cs   *clusterState
	away bool
	peer bool // from a peer replica (SessionOptions.Peer)
	own  bool // written by the cluster itself (its source, Hub.Apply), not a copy: the breaker judges it
	sink *mcp.Sink

	// Guarded by cs.mu:
	info       *mcp.StreamInfo // set while the stream is open
	superseded bool            // a newer stream of the cluster's source took over: it writes nothing more
	delivered  map[string]bool // collections delivered (a split push: at its last chunk)
	complete   bool            // every collection the sink asks for has been delivered

	direct []string // without a stream (Hub.Apply): the collections that make it complete
}

// deliveredAll reports whether every collection the session's sink asks for (those the
// peer has not refused) has been delivered. The caller holds cs.mu.
func (s *Session) deliveredAll() bool {
	want := s.direct
	if s.sink != nil {
		want = s.sink.Collections()
	}
	for _, c := range want {
		if !s.delivered[c] {
			return false
		}
	}
	return true
}

// Cluster is the name of the cluster whose state the session writes.
func (s *Session) Cluster() string { return s.cs.name }

// Sink runs the session's stream (Sink.PullFrom for a stream the caller dials).
func (s *Session) Sink() *mcp.Sink { return s.sink }

// End ends the session's stream with err, the status its peer is told (a minion
// reconnects, and its next stream resends what the hub does not hold). Nothing happens if
// the stream is not open.
func (s *Session) End(err error) {
	s.cs.mu.Lock()
	info := s.info
	s.cs.mu.Unlock()
	if info != nil {
		info.CloseWith(err)
	}
}
