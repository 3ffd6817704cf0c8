package replicas

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/replicas/membership"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// follow is one replica-to-replica stream of one cluster: from the replica holding it, or,
// when none does, a copy from a peer that has one.
type follow struct {
	replica, addr string
	epoch         uint64   // the epoch of the session whose state it carries (a copy: at least)
	copy          bool     // the copy of a cluster no replica holds (ForwardCopyAnnotation)
	peers         []string // copy: the peers asked, in order
	cancel        context.CancelFunc
	retired       atomic.Bool // superseded: its pushes are no longer applied
	delivered     atomic.Bool // a stream of it has delivered every collection
}

func (f *follow) stop() {
	f.retired.Store(true)
	f.cancel()
}

// followPeers keeps, for every cluster another replica holds, one stream from that replica
// (its authority), until ctx ends. When the authority changes, the old stream stops at once
// (it carries an older session) and a stream to the new authority declares the versions
// this replica has: the cluster's copy stays in the store meanwhile and the new stream's
// first push is only the difference, so nothing that still exists vanishes. When no replica
// holds the cluster any more, the stream stops and the copy stays, served under the
// staleness policy. A cluster this replica holds itself is followed from nowhere.
func (l *Layer) followPeers(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		l.reconcile(ctx, &wg)
		select {
		case <-ctx.Done():
			l.mu.Lock()
			for _, c := range l.clusters {
				if c.follow != nil {
					c.follow.stop()
				}
			}
			l.mu.Unlock()
			return
		case <-l.members().Changed():
		case <-tick.C:
		}
	}
}

// reconcile brings what this replica follows in line with the membership.
func (l *Layer) reconcile(ctx context.Context, wg *sync.WaitGroup) {
	m := l.members()
	l.learnDeparted(m) // before l.mu: the core's configuration lock orders before it
	if l.GroupKnown() {
		l.h.RecheckReady()
	}
	auth := m.Authorities()
	held, followed := map[string]bool{}, map[string]bool{}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Departed clusters too (their copies are exchanged like any other's). Under l.mu: a
	// cluster added meanwhile is not taken for a removed one.
	names := l.h.KeptClusters()
	for name, c := range l.clusters {
		if slices.Contains(names, name) {
			continue
		}
		// No longer configured: nothing to follow. Its state goes with its last minion
		// session, whose end (SessionClosed, after the core closed it) releases its hold.
		l.stopLocked(name, c, "")
		// A delivery racing the removal may have advertised a copy again: peers must not
		// try to take it.
		m.SetCopy(name, "", 0, false)
		if len(c.minion) == 0 {
			delete(l.clusters, name)
			l.metrics.forget(name)
		}
	}
	for _, name := range names {
		held[name] = m.Holds(name)
		if l.reconcileLocked(ctx, name, auth, wg) {
			followed[name] = true
		}
	}
	l.metrics.view(len(m.Replicas()), held, followed, names)
	l.noteChangesLocked(m.Replicas(), auth)
	l.following = map[string]string{}
	for name, c := range l.clusters {
		switch f := c.follow; {
		case f == nil:
		case f.copy:
			l.following[name] = fmt.Sprintf("copy from %s (epoch %d)", strings.Join(f.peers, " or "), f.epoch)
		default:
			l.following[name] = f.replica
		}
	}
}

// reconcileLocked decides how this replica follows one cluster, and reports whether it
// does. The caller holds l.mu.
func (l *Layer) reconcileLocked(ctx context.Context, name string, auth map[string]membership.Authority, wg *sync.WaitGroup) bool {
	c := l.repLocked(name)
	if a, ok := auth[name]; ok {
		l.endSupersededLocked(name, c, a)
	}
	if c.resyncing() {
		// The minion is here: its stream is the freshest source and the only writer of the
		// cluster's store until it syncs (and holds it) or ends.
		l.stopLocked(name, c, "")
		return false
	}
	f := c.follow
	if f != nil && f.retired.Load() {
		f = nil // retired by a session of this replica's own that has ended since
	}
	a, ok := auth[name]
	if !ok || l.h.ClusterDeparted(name) {
		// No replica holds it (a departed cluster's minion is refused everywhere: a holding
		// still gossiped is its last session's, ending).
		return l.copyLocked(ctx, name, c, f, wg) // copies.go
	}
	if a.Replica == l.cfg.Name {
		l.stopLocked(name, c, "this replica holds it")
		return false
	}
	// A held cluster is followed from its holder whatever this replica's copy: the live
	// session is the cluster's state. A new session of the same holder is followed anew, so
	// that its delivery says when this copy is that session's state (the stream declares
	// the versions this replica has: only differences come).
	if f == nil || f.copy || f.replica != a.Replica || f.addr != a.MCPAddr || f.epoch != a.Epoch {
		l.stopLocked(name, c, "")
		c.follow = l.startFollow(ctx, name, a, wg)
	}
	return true
}

// stopLocked stops c's follow, if any, logging why when given.
func (l *Layer) stopLocked(cluster string, c *clusterRep, why string) {
	if c.follow == nil {
		return
	}
	c.follow.stop()
	c.follow = nil
	if why != "" {
		l.log.Info("no longer following the cluster from a peer", "cluster", cluster, "why", why)
	}
}

func (l *Layer) startFollow(ctx context.Context, cluster string, a membership.Authority, wg *sync.WaitGroup) *follow {
	f := &follow{replica: a.Replica, addr: a.MCPAddr, epoch: a.Epoch}
	log := l.log.With("cluster", cluster, "from_replica", a.Replica, "addr", a.MCPAddr)
	log.Info("following the cluster from the replica holding it", "epoch", a.Epoch)
	l.runFollow(ctx, cluster, f, []string{a.MCPAddr}, log, wg)
	return f
}

// startCopy takes the copy of a cluster no replica holds, of epoch, from the first of peers
// that has it, and keeps mirroring it.
func (l *Layer) startCopy(ctx context.Context, cluster string, epoch uint64, peers []membership.Copy, wg *sync.WaitGroup) *follow {
	f := &follow{copy: true, epoch: epoch}
	var addrs []string
	for _, p := range peers {
		f.peers = append(f.peers, p.Replica)
		addrs = append(addrs, p.MCPAddr)
	}
	log := l.log.With("cluster", cluster, "from_replicas", f.peers, "epoch", epoch)
	log.Info("no replica holds the cluster: taking a peer's copy")
	l.runFollow(ctx, cluster, f, addrs, log, wg)
	return f
}

// samePeers reports whether a copy follow asks the peers it would ask now.
func samePeers(asked []string, now []membership.Copy) bool {
	if len(asked) != len(now) {
		return false
	}
	for i, r := range now {
		if asked[i] != r.Replica {
			return false
		}
	}
	return true
}

// runFollow runs f's stream, trying addrs in turn, until f is stopped. Each attempt is a
// session of the cluster in the core.
func (l *Layer) runFollow(ctx context.Context, cluster string, f *follow, addrs []string, log *slog.Logger, wg *sync.WaitGroup) {
	ctx, f.cancel = context.WithCancel(ctx)
	l.metrics.follows.Inc()
	ctx = metadata.AppendToOutgoingContext(ctx, hub.DevIdentityHeader, l.id)
	node := &mcppb.SinkNode{Id: l.cfg.Name, Annotations: map[string]string{ForwardClusterAnnotation: cluster}}
	if f.copy {
		node.Annotations[ForwardCopyAnnotation] = "true"
		node.Annotations[ForwardEpochAnnotation] = strconv.FormatUint(f.epoch, 10)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.h.Redial(ctx, addrs, log, func(ctx context.Context, conn *grpc.ClientConn) error {
			s, err := l.h.OpenSession(cluster, hub.SessionOptions{Node: node, Away: f.copy, Peer: true})
			if err != nil {
				return err
			}
			l.mu.Lock()
			l.follows[s] = f
			l.mu.Unlock()
			defer func() {
				l.mu.Lock()
				delete(l.follows, s)
				l.mu.Unlock()
			}()
			return s.Sink().PullFrom(ctx, conn)
		})
	}()
}

// rendezvous is replica's score for key: the replica with the highest score takes it
// (every replica computes the same from the same membership; a departure moves only its
// keys).
func rendezvous(replica, key string) uint64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte(replica + "\x00" + key))
	return f.Sum64()
}

// noteChangesLocked records, as the hub's events, the replicas that joined or left and the
// clusters whose authority moved since the last reconcile; an authority that moved to a
// newer session while the previous one's holding is still there took over a live session
// (a second minion with the cluster's identity, or one that reconnected before its old
// stream was noticed dead), which GroupWriter tells the core.
func (l *Layer) noteChangesLocked(rs []membership.Replica, auth map[string]membership.Authority) {
	now := map[string]bool{}
	for _, r := range rs {
		now[r.Name] = true
		if l.seen.replicas != nil && !l.seen.replicas[r.Name] {
			l.h.Note(api.Event{Kind: api.EventReplica, Reason: api.ReasonJoined, Message: fmt.Sprintf("replica %s joined (MCP %s)", r.Name, r.MCPAddr)})
		}
	}
	for name := range l.seen.replicas {
		if !now[name] {
			l.h.Note(api.Event{Kind: api.EventReplica, Reason: api.ReasonLeft, Message: fmt.Sprintf("replica %s left or died", name)})
		}
	}
	for cluster, a := range auth {
		was, ok := l.seen.auth[cluster]
		if !ok || was == a {
			continue
		}
		if was.Replica != a.Replica {
			// No Cluster: which replica holds a cluster is the vendor's, not its tenant's.
			l.h.Note(api.Event{Kind: api.EventReplica, Reason: api.ReasonAuthority,
				Message: fmt.Sprintf("cluster %s is now held by replica %s (epoch %d), was %s", cluster, a.Replica, a.Epoch, was.Replica)})
		}
		if a.Epoch > was.Epoch && stillHolds(rs, was.Replica, cluster, was.Epoch) {
			l.noteTakeover(cluster)
		}
	}
	l.seen.replicas, l.seen.auth = now, auth
}

// stillHolds reports whether replica holds cluster at epoch in the membership rs.
func stillHolds(rs []membership.Replica, replica, cluster string, epoch uint64) bool {
	for _, r := range rs {
		if r.Name == replica {
			return r.Holding[cluster] == epoch
		}
	}
	return false
}
