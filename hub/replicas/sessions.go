package replicas

import (
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/replicas/membership"
	"github.com/meshfed/meshfed/mcp"
)

// The session rules. A replica's copy of a cluster has one writer at a time:
//   - while one of the cluster's minion sessions here has not delivered everything, that
//     session (the minion is here: it is the freshest source); the follow stops;
//   - once it has, this replica holds the cluster at a new epoch, and its peers follow the
//     cluster from here;
//   - a minion session whose epoch a newer session elsewhere has superseded (the minion
//     reconnected to another replica before this stream was noticed dead, or a second
//     minion with the cluster's identity writes there) writes nothing and is ended, so that
//     its minion reconnects and resends what the hub does not hold; this replica follows the
//     newer session. Its minion's return is judged like any stream competing with the
//     cluster's writer (GroupWriter: refused while the writer is live and the cluster
//     changed hands less than the core's takeover window ago);
//   - a follow writes until it is retired (a minion session here opened or synced) or
//     stopped (the authority moved).

// rep returns cluster's state here, creating it. The caller holds l.mu.
func (l *Layer) repLocked(cluster string) *clusterRep {
	c := l.clusters[cluster]
	if c == nil {
		c = &clusterRep{minion: map[*hub.Session]uint64{}}
		l.clusters[cluster] = c
	}
	return c
}

// SessionOpened: a minion session makes what this replica follows of the cluster stop
// writing at once (the follow is stopped on the next reconciliation, which nothing starts
// again while the session resyncs).
func (l *Layer) SessionOpened(s *hub.Session) {
	l.mu.Lock()
	if l.follows[s] != nil {
		l.mu.Unlock()
		return
	}
	c := l.repLocked(s.Cluster())
	c.minion[s] = 0
	if c.follow != nil {
		c.follow.retired.Store(true)
	}
	l.mu.Unlock()
	if m := l.members(); m != nil {
		m.Poke()
	}
}

// SessionDelivered: a minion session that has delivered every collection holds the
// cluster (the newest epoch: peers follow this replica for it, and it stops applying what
// it follows). A follow that has delivered every collection has made this replica's copy
// the state of the session it follows.
func (l *Layer) SessionDelivered(s *hub.Session) {
	l.mu.Lock()
	if f := l.follows[s]; f != nil {
		if !f.retired.Load() {
			f.delivered.Store(true)
			l.setEpochLocked(s.Cluster(), l.repLocked(s.Cluster()), f.epoch)
		}
		l.mu.Unlock()
		return
	}
	c := l.clusters[s.Cluster()]
	_, minion := c.minionOf(s)
	if minion && c.follow != nil {
		c.follow.retired.Store(true)
	}
	l.mu.Unlock()
	if minion && l.members() != nil {
		l.hold(s)
	}
}

// minionOf returns the epoch a minion session holds and whether it is one of this
// cluster's open minion sessions (c may be nil).
func (c *clusterRep) minionOf(s *hub.Session) (uint64, bool) {
	if c == nil {
		return 0, false
	}
	epoch, ok := c.minion[s]
	return epoch, ok
}

// SessionClosed: a minion session's end releases what it held; a copy taken from a peer
// is not taken again from another once it has arrived.
func (l *Layer) SessionClosed(s *hub.Session) {
	cluster := s.Cluster()
	l.mu.Lock()
	if f := l.follows[s]; f != nil {
		l.mu.Unlock()
		if f.copy && f.delivered.Load() {
			// A copy is taken once, from one peer: redialling another could declare
			// versions that peer never had and receive deletions of them.
			f.stop()
		}
		return
	}
	c := l.clusters[cluster]
	epoch, open := c.minionOf(s)
	// Another minion session of the cluster still open here: one that took over this one
	// (the core closes the older stream), or, synced, a minion that reconnected before its
	// old stream was noticed dead.
	var other *hub.Session
	otherSynced := false
	if open {
		delete(c.minion, s)
		for o, e := range c.minion {
			if other == nil || e > 0 {
				other, otherSynced = o, e > 0
			}
		}
	}
	l.mu.Unlock()
	if !open {
		return
	}
	m := l.members()
	if m == nil {
		return
	}
	switch {
	case epoch > 0:
		l.release(cluster, epoch, other, otherSynced)
	case other == nil && !m.Holds(cluster):
		// A session that took over ended before it synced: nothing here holds the
		// cluster, so the peers following it from here (kept for that session) stop.
		if n := l.peers.closeAll(cluster); n > 0 {
			l.log.Info("the cluster's minion left before it synced; closed the peers' streams following it", "cluster", cluster, "streams", n)
		}
	}
	m.Poke()
}

// MayWrite: a retired follow writes nothing, nor does a minion session a newer one
// elsewhere has superseded (the core NACKs its pushes; the next reconciliation ends it).
func (l *Layer) MayWrite(s *hub.Session) bool {
	l.mu.Lock()
	f := l.follows[s]
	epoch, _ := l.clusters[s.Cluster()].minionOf(s)
	l.mu.Unlock()
	if f != nil {
		return !f.retired.Load()
	}
	m := l.members()
	if m == nil {
		return true
	}
	replica, newest, ok := m.Authority(s.Cluster())
	return !ok || !l.superseded(epoch, membership.Authority{Replica: replica, Epoch: newest})
}

// superseded reports whether a minion session here holding epoch (0: it has not delivered
// everything yet, so it is newer than any session) has been replaced by the session of
// the cluster's authority a: another replica's, newer, or of the same epoch, where the
// authority won the tie (the lower replica name). Equal epochs come from two replicas
// taking the cluster at once, each before it heard of the other (two minions of one
// identity, or one failing over), or from both sides of a split; left to write both, the
// replica that follows the authority's session would mix its state with its own
// session's, and its own minion, ACKed, would never resend what the authority's state
// replaced there. During a split each side sees only its own, and writes it until the heal.
func (l *Layer) superseded(epoch uint64, a membership.Authority) bool {
	return epoch > 0 && a.Replica != l.cfg.Name && a.Epoch >= epoch
}

// endSupersededLocked ends the cluster's minion sessions here that the session of its
// authority a has superseded. Such a stream writes nothing (MayWrite) while this replica's
// copy follows the newer session; left open, it would be the cluster's writer again once
// that session ends, over a copy that is not its minion's state, and its minion, never told
// otherwise, would not resend it (test/invariant's replicas-second-minion-superseded: an
// object the writer publishes missing on every replica). Ended with a retryable refusal, its
// minion reconnects: refused as competing while the newer session is live and the cluster
// changed hands recently (GroupWriter), otherwise taking over like any returning minion and
// sending what the hub does not hold. The caller holds l.mu.
func (l *Layer) endSupersededLocked(cluster string, c *clusterRep, a membership.Authority) {
	for s, epoch := range c.minion {
		if !l.superseded(epoch, a) {
			continue
		}
		l.noteTakeover(cluster)
		why := fmt.Sprintf("cluster %q is written through replica %s by a session that supersedes this stream's (epoch %d, this one's %d; a tie goes to the lower replica name): two minions with one identity, or this one reconnected there; this stream writes nothing more",
			cluster, a.Replica, a.Epoch, epoch)
		l.log.Warn("a newer session of the cluster through another replica superseded a minion stream here: ending it", "cluster", cluster,
			"replica", a.Replica, "epoch", a.Epoch, "superseded_epoch", epoch)
		l.h.Note(api.Event{Kind: api.EventTakeover, Cluster: cluster, Reason: api.ReasonTakeover, Message: why})
		s.End(mcp.WithRetry(status.New(codes.FailedPrecondition, why), hub.CompetingRetry))
	}
}

// noteTakeover records that the cluster changed hands from one live session to another,
// now, for GroupWriter.
func (l *Layer) noteTakeover(cluster string) {
	now := l.h.Now()
	l.tmu.Lock()
	defer l.tmu.Unlock()
	if l.tookOver == nil {
		l.tookOver = map[string]time.Time{}
	}
	l.tookOver[cluster] = now
}

// GroupWriter: the cluster's writer is elsewhere when another replica holds it (its holding
// lasts as long as the minion's stream there); the cluster changed hands when this replica
// saw its authority move to a newer session while the previous one's was still held
// (noteChangesLocked), or ended a session here that a newer one replaced. Called under the
// core's cluster lock: it takes only tmu and the membership's own lock, never l.mu (whose
// holders call the core).
func (l *Layer) GroupWriter(cluster string) (string, time.Time) {
	l.tmu.Lock()
	at := l.tookOver[cluster]
	l.tmu.Unlock()
	m := l.members()
	if m == nil {
		return "", at
	}
	replica, epoch, ok := m.Authority(cluster)
	if !ok || replica == l.cfg.Name {
		return "", at
	}
	return fmt.Sprintf("its session of epoch %d, through replica %s", epoch, replica), at
}

// hold holds the cluster's session for the minion session s, unless it has ended, and
// reports whether it did.
func (l *Layer) hold(s *hub.Session) bool {
	cluster := s.Cluster()
	m := l.members()
	epoch := m.Hold(cluster)
	l.mu.Lock()
	c := l.clusters[cluster]
	_, open := c.minionOf(s)
	if open {
		c.minion[s] = epoch
		l.setEpochLocked(cluster, c, epoch) // the store holds this session's whole state
	}
	l.mu.Unlock()
	if !open { // the stream ended meanwhile
		m.Release(cluster, epoch)
		return false
	}
	l.log.Info("holding the cluster's session", "cluster", cluster, "epoch", epoch)
	return true
}

// release releases the session of epoch after its stream ended. Another minion session of
// the cluster still open here holds it anew if it has synced, or will once it has (it is the
// cluster's minion writing: the peers following from here keep their streams); otherwise
// the peers following the cluster from here are disconnected: what this replica has of it
// may change now (staleness, a reload) without being the cluster's.
func (l *Layer) release(cluster string, epoch uint64, other *hub.Session, otherSynced bool) {
	m := l.members()
	m.Release(cluster, epoch)
	if m.Holds(cluster) {
		return // a newer session of this replica's holds it
	}
	if other != nil && (!otherSynced || l.hold(other)) {
		return
	}
	if n := l.peers.closeAll(cluster); n > 0 {
		l.log.Info("released the cluster's session; closed the peers' streams following it", "cluster", cluster, "streams", n)
	}
}
