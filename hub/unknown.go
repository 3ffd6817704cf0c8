package hub

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/meshfed/meshfed/hub/api"
)

// Clusters whose last state the hub does not know. A hub that knows less than it did (a
// state file it could not read whole, writes that were failing when it stopped) must treat
// what it does not know as unknown and kept, never as empty: serving a cluster's partial or
// missing state makes every full-state sink (istiod) delete what it lacks. So such a
// cluster is marked unknown at the start (persist.go), with why; until its own session (or,
// with replicas, a peer's copy of it, which a peer gives only if it knows it whole: taken,
// an unknown copy would delete what it lacks) has delivered its whole state, or an operator
// decides to serve what was read (a release of its breaker, whose status says so), no sink
// of a tenant that sees it is served (readyToServe): they keep what they were last served,
// and retry. The warm-up's timeout does not end this, as it would for a cluster the hub
// never knew. Removing the cluster from the configuration does (it departs, holding what
// was read). Sinks of other tenants are served as usual.

// unknownSeen returns a cluster tenant's sinks see whose last state is unknown, and the
// refusal's words ("" if none). A cluster of another tenant (one exporting to this one) is
// not named.
func (h *Hub) unknownSeen(tenant string) (cluster, why string) {
	if h.unknown.Load() == 0 {
		return "", ""
	}
	comp := h.current().comp
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		u := cs.unknown
		cs.mu.Unlock()
		if u == "" {
			continue
		}
		own := comp.tenants.OfCluster(cs.name)
		switch {
		case comp.tenants.Single() || own == tenant:
			return cs.name, fmt.Sprintf("cluster %q's last state is unknown (%s): serving without it would withdraw its objects from the sinks that have them; it is served once its minion has resynced, or an operator releases it (hub breaker release %s)", cs.name, u, cs.name)
		case comp.tenants.Exports(own) != nil && sees(comp, tenant, own):
			return cs.name, "a cluster whose objects this tenant receives has an unknown last state: it is served once that cluster's minion has resynced"
		}
	}
	return "", ""
}

// sees reports whether tenant receives objects of tenant from's clusters (an export).
func sees(comp *compiled, tenant, from string) bool {
	for _, t := range comp.tenants.Receivers(from) {
		if t == tenant {
			return true
		}
	}
	return false
}

// unknownAtWarmUpEnd marks unknown each cluster whose restored state may lack its last
// changes (a kill while it was connected, a read-only file) and whose minion has not
// resynced it within the warm-up: serving the file's state then would withdraw, or revert,
// what its writer published in the moments the file did not keep.
func (h *Hub) unknownAtWarmUpEnd() {
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		why := cs.mayLack
		lacking := why != "" && !cs.synced && cs.unknown == "" && cs.departed == nil && !cs.removed
		cs.mu.Unlock()
		if lacking {
			h.markUnknown(cs, why+"; its minion has not resynced within the warm-up")
		}
	}
}

// resyncedLocked clears what a restore said the file may lack, once the cluster's whole
// state is known again (its session delivered it, or the layer found nothing newer): the
// file's mark goes with it. The caller holds cs.mu.
func (h *Hub) resyncedLocked(cs *clusterState) {
	if cs.mayLack == "" {
		return
	}
	cs.mayLack = ""
	if st := h.state.Load(); st != nil && cs.unknown == "" && !cs.removed {
		st.Repaired(cs.name) // an unknown one is repaired by knownLocked
	}
}

// markUnknown records that cs's last state is unknown, and why (at the start, or at the
// warm-up's end).
func (h *Hub) markUnknown(cs *clusterState, why string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.unknown == "" {
		h.unknown.Add(1)
	}
	cs.unknown = why
	h.metrics.stateUnknown(cs.name, true)
	cs.log.Error("cluster's last state unknown: sinks that see it are not served until its minion resyncs or an operator releases it", "why", why)
	h.note(api.Event{Kind: api.EventCluster, Cluster: cs.name, Reason: api.ReasonUnknown,
		Message: fmt.Sprintf("last state unknown (%s): its tenant's sinks are not served until its minion resyncs, or an operator releases it (hub breaker release %s)", why, cs.name)})
}

// knownLocked records that cs's state is known again (a session delivered it whole, an
// operator accepted what was read, or it left). The caller holds cs.mu.
func (h *Hub) knownLocked(cs *clusterState, how string) {
	if cs.unknown == "" {
		return
	}
	cs.unknown = ""
	h.unknown.Add(-1)
	if !cs.removed {
		h.metrics.stateUnknown(cs.name, false)
		if st := h.state.Load(); st != nil {
			st.Repaired(cs.name) // the file holds what the hub now knows of it
		}
	}
	cs.log.Info("cluster's state known again: its tenant's sinks are served", "how", how)
}

// unknownDigest names an unknown state for its release (api.Breaker.Digest).
func unknownDigest(why string) string {
	sum := sha256.Sum256([]byte("unknown\x00" + why))
	return "unknown-" + hex.EncodeToString(sum[:6])
}

// unknownBreaker is how the admin API shows a cluster whose last state is unknown: as an
// open breaker holding its withdrawal, which an operator may release (serving what was
// read of it, n objects).
func unknownBreaker(why string, n int) *api.Breaker {
	return &api.Breaker{Open: true, Held: 0, Pending: map[string][]string{}, Digest: unknownDigest(why),
		Reason: fmt.Sprintf("its last state is unknown (%s): the sinks that see it are not served until its minion resyncs; releasing serves what was read of it (%d objects)", why, n)}
}

// releaseUnknown is an operator's release of a cluster whose last state is unknown (ok:
// it is): what was read of it is served from now on, its tenant's sinks admitted. digest
// must be the one its status showed (unknownBreaker).
func (h *Hub) releaseUnknown(cs *clusterState, operator, digest string) (api.BreakerRelease, bool, error) {
	cs.mu.Lock()
	defer func() {
		cs.mu.Unlock()
		h.forgetDeparted(cs.name) // a departed one that held nothing known leaves for good
	}()
	if cs.unknown == "" {
		return api.BreakerRelease{}, false, nil
	}
	if now := unknownDigest(cs.unknown); digest != now {
		return api.BreakerRelease{}, true, &HeldChangedError{Reviewed: digest, Now: now}
	}
	h.knownLocked(cs, "an operator released it")
	h.decidedLocked(cs, fmt.Sprintf("operator %s released its unknown state", operator))
	cs.log.Warn("a cluster whose last state was unknown released by an operator: what was read of it is served", "operator", operator)
	h.note(api.Event{Kind: api.EventBreaker, Cluster: cs.name, Reason: api.ReasonReleased,
		Message: fmt.Sprintf("released by operator %s: what was read of its unknown last state is served", operator)})
	return api.BreakerRelease{Cluster: cs.name, Operator: operator, Deleted: map[string]int{}}, true, nil
}

func (cs *clusterState) isUnknown() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.unknown != ""
}
