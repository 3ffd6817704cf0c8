package replicas

import (
	"slices"

	"context"
	"sort"
	"sync"

	"github.com/meshfed/meshfed/hub/replicas/membership"
)

// Copies and their epochs. Every replica's copy of a cluster is the state of one session of
// it, named by that session's epoch: the epoch it held the cluster at, or the epoch of the
// holder it followed, or of the peer's copy it took. The epoch goes to the state file with
// the copy (Hub.SetClusterEpoch) and to the peers (Members.SetCopy), once the store holds
// that session's whole state.
//
// When a replica holds the cluster, everyone follows it, whatever their copies: the live
// session is the cluster's state. When none does (the minion is away), the copy of the
// highest epoch among the live replicas is the newest state of the cluster, and the others
// take it (their streams declare their versions: only differences come, deletions
// included). At a tie, a copy restored from a state file yields to a live replica's: the
// live one was there for whatever that session did after the restarted replica went down.
//
// A restored copy (Layer.ClusterRestored) is held back — it counts neither for the warm-up
// nor as a copy a peer may take — until the membership has heard the full state of every
// peer it knows (Members.Synced): only then is it known whether a peer has a newer session's
// state, which must replace it before a sink is served. A replica that knows no peer waits
// for one, or for its warm-up to end: it cannot tell a group of one from peers it cannot
// reach yet, and serving an older copy would resurrect what a newer session deleted. It is
// confirmed when nothing newer exists (ConfirmRestored), or replaced by a follow or a copy.
// A replica without a copy waits for the same before it takes one, for the same reason. A
// held cluster does not wait: its holder is followed as soon as it is known.
//
// A copy that is not the state of the session its epoch names (Hub.ClusterIsSessionState)
// is not given to peers: one the core does not know whole (its state file's records of it
// were damaged, or may lack what its session did last), where a peer taking it would apply
// whatever it lacks as deletions; and one an operator's decision at this replica changed or
// vouched for (a release of the configuration's withdrawals, or of an unknown state), where
// a peer taking it would take that decision too, which replicas do not share. It is
// confirmed like any restored copy when nothing newer exists (an unknown one stays unknown:
// its tenant's sinks are not served; one that may lack its session's last changes, from a
// kill while its minion was connected or a read-only state file, is not confirmed at all:
// it stays restored, its epoch counted, until its minion resyncs it or a peer's whole copy
// of at least its epoch replaces it, and the warm-up's end makes it unknown), but
// advertised held back, as a restored copy is, and
// not given (offeredLocked) until a session delivers the cluster's whole state again (or,
// unknown, an operator releases it); its epoch still counts, so sessions order after it.
// Confirmed, it is kept like any confirmed copy until a newer one exists: its epoch may be
// older than what it holds (a file that lost its last changes may have lost a newer epoch
// with them), so a peer's copy of the same epoch is no better.
//
// A departed cluster (removed from the configuration while it held objects, kept by the core
// until an operator confirms) is a cluster no replica holds: its copy keeps its epoch and is
// decided by the same rules, taken once (not mirrored), and a replica that does not know it
// keeps it when its peers do (learnDeparted).

// ClusterRestored records a copy restored from the state file at epoch: held back until
// the group is known (see above), so it does not count as synced yet.
func (l *Layer) ClusterRestored(cluster string, epoch uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.repLocked(cluster)
	c.epoch, c.restored = epoch, true
	return false
}

// restoredCopies are the epochs of the copies restored from the state file, which the
// membership carries from its first message (the join's full state included): a peer then
// never counts itself synced with this replica without knowing them, and this replica's
// next session of such a cluster is newer than its copy.
func (l *Layer) restoredCopies() map[string]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]uint64{}
	for name, c := range l.clusters {
		if c.restored && c.epoch > 0 {
			out[name] = c.epoch
		}
	}
	return out
}

// setEpochLocked records that this replica's copy of cluster is now the state of the
// session of epoch: in the state file and for the peers. The caller holds l.mu, so that
// both see the changes in the order they were made.
func (l *Layer) setEpochLocked(cluster string, c *clusterRep, epoch uint64) {
	if !slices.Contains(l.h.KeptClusters(), cluster) {
		return // removed meanwhile (a delivery racing the removal): no copy to advertise
	}
	c.epoch, c.restored = epoch, false
	l.h.SetClusterEpoch(cluster, epoch)
	if m := l.members(); m != nil {
		l.advertiseLocked(m, cluster, c)
	}
	if f := c.follow; f != nil && f.copy && l.h.ClusterDeparted(cluster) {
		// A departed cluster's copy is taken once, and stops as soon as it has arrived (not
		// at the next reconciliation): no session changes it any more, and what changes it
		// on the peer afterwards (its operator confirming the removal there, its staleness)
		// is that replica's decision, not the cluster's.
		l.stopLocked(cluster, c, "")
	}
}

// offeredLocked reports whether peers may take this replica's copy of cluster: confirmed,
// and known whole to the core. The caller holds l.mu.
func (l *Layer) offeredLocked(cluster string, c *clusterRep) bool {
	return !c.restored && l.h.ClusterIsSessionState(cluster)
}

// advertiseLocked tells the peers the epoch of this replica's copy of cluster, held back
// unless it is offered. The caller holds l.mu.
func (l *Layer) advertiseLocked(m members, cluster string, c *clusterRep) {
	m.SetCopy(cluster, l.h.ClusterTenant(cluster), c.epoch, !l.offeredLocked(cluster, c))
}

// copyEpoch is the epoch of this replica's copy of cluster that peers may take (0: none
// known, or not offered).
func (l *Layer) copyEpoch(cluster string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.clusters[cluster]; c != nil && l.offeredLocked(cluster, c) {
		return c.epoch
	}
	return 0
}

// copyLocked decides how this replica keeps a cluster no replica holds, and reports whether
// it follows a peer's copy of it. f is the cluster's follow unless retired. The caller
// holds l.mu.
func (l *Layer) copyLocked(ctx context.Context, name string, c *clusterRep, f *follow, wg *sync.WaitGroup) bool {
	m := l.members()
	best, from := newestCopies(name, m.Copies(name))
	mine := c.epoch
	have := !c.restored && l.h.ClusterSynced(name) // a copy of its own, confirmed
	if !c.restored {
		// Whether the core knows it may have changed since it was advertised (an operator
		// released it; a rename brought what the hub did not know of the old name).
		l.advertiseLocked(m, name, c)
	}
	switch {
	case !have && !m.Synced():
		// What the group has is not known yet: a restored copy waits, and so does a
		// replica without a copy (the first peer heard from may have an older one than a
		// peer not heard from yet).
		l.stopLocked(name, c, "")
		return false
	case c.restored && (mine > best || (mine == best && len(from) == 0)):
		// Nothing newer anywhere (at a tie, only other restored copies: the same session's).
		l.stopLocked(name, c, "")
		confirmed := l.h.ConfirmRestored(name)
		if !confirmed && !l.h.ClusterSynced(name) && !l.h.ClusterIsSessionState(name) {
			// The core does not take it whole: it may lack its session's last changes (a
			// kill while its minion was connected here, a read-only state file). It stays
			// held back, its epoch counted (a newer copy or session replaces it, an older
			// one does not), until its minion resyncs it or a peer's whole copy of at least
			// its epoch replaces it; the warm-up's end makes it unknown meanwhile.
			return false
		}
		c.restored = false
		if confirmed {
			l.log.Info("the copy restored from the state file is the newest the replicas have", "cluster", name, "epoch", mine)
		}
		l.advertiseLocked(m, name, c)
		return false
	case have && mine >= best:
		// This replica's copy is the newest there is (or as new).
		if f != nil && f.copy && f.epoch == mine {
			// Keeps mirroring the copy it took: a staleness drop there reaches it (not a
			// departed cluster's, stopped once taken: setEpochLocked).
			return true
		}
		l.stopLocked(name, c, "no replica holds it")
		return false
	case len(from) > 0:
		// A newer copy than this replica's (or the only one), confirmed on a peer: take it.
		if f == nil || !f.copy || f.epoch != best || !samePeers(f.peers, from) {
			l.stopLocked(name, c, "")
			c.follow = l.startCopy(ctx, name, best, from, wg)
		}
		return true
	default:
		// The newest copy is restored on a peer that has not confirmed it yet, or nobody
		// has one (a fresh group waits for the minions): keep what this replica has.
		l.stopLocked(name, c, "no replica holds it")
		return false
	}
}

// learnDeparted keeps, as departed, the clusters the peers have a copy of that this replica
// does not know, once, when the group is first known (Members.Synced): a cluster removed
// from the configuration while this replica was down (or before its state directory was
// emptied) is, to it, what the hub does not know, which is kept, never empty, until an
// operator confirms its removal here. The core waits for its copy in the warm-up
// (Hub.KeepDeparted), which reconcile takes like any departed copy. Once only: a cluster
// whose removal this replica's operator confirms afterwards is not taken back from a peer
// that still keeps it (after a restart it is, as its operator's decision is not kept: a
// known limit until replicas share operators' decisions).
func (l *Layer) learnDeparted(m members) {
	if l.learned.Load() || !m.Synced() {
		return
	}
	l.learned.Store(true)
	kept := l.h.KeptClusters()
	for _, name := range m.CopiedClusters() {
		if slices.Contains(kept, name) {
			continue
		}
		copies := m.Copies(name)
		if len(copies) == 0 {
			continue // its peer left meanwhile
		}
		tenant := "" // a copy restored on its peer is gossiped without it (not confirmed yet)
		for _, cp := range copies {
			if cp.Tenant != "" {
				tenant = cp.Tenant
			}
		}
		if l.h.KeepDeparted(name, tenant, copies[0].Replica) {
			l.log.Warn("a cluster this replica does not know is kept by its peers: kept here as departed, its copy taken from them, until an operator confirms its removal (hub breaker release)",
				"cluster", name, "tenant", tenant)
		}
	}
}

// GroupKnown implements hub.Layer: the group's departed clusters are learned
// (learnDeparted), or this replica knows no peer at all once it has tried to join (alone,
// nothing can be learned; a peer that joins later is learned from then).
func (l *Layer) GroupKnown() bool {
	m := l.members()
	if m == nil {
		return false // not started: nothing of the group is known yet
	}
	return l.learned.Load() || len(m.Replicas()) == 1
}

// newestCopies returns the highest epoch among the peers' copies of cluster, and the peers
// that may give a copy of that epoch (confirmed), in rendezvous order so that replicas
// starting together ask the same one first.
func newestCopies(cluster string, copies []membership.Copy) (uint64, []membership.Copy) {
	var best uint64
	for _, cp := range copies {
		best = max(best, cp.Epoch)
	}
	var from []membership.Copy
	for _, cp := range copies {
		if cp.Epoch == best && !cp.Restored && cp.MCPAddr != "" {
			from = append(from, cp)
		}
	}
	sort.Slice(from, func(i, j int) bool {
		return rendezvous(from[i].Replica, "copy/"+cluster) > rendezvous(from[j].Replica, "copy/"+cluster)
	})
	return best, from
}
