package hub

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/meshfed/meshfed/hub/api"
)

// Departed clusters. A cluster that leaves the configuration (a reload without it, its
// entry renamed, a restart with a configuration that lacks it) is, to the hub, a cluster
// it no longer recognises, and what the hub does not know is kept, never withdrawn: a typo
// in a cluster's name must not delete its objects from every sink. So the hub keeps a
// departed cluster: its objects stay served and in the state file, held by its breaker
// (open, every object pending; whatever the breaker's limits, unless it is turned off), no
// identity is it (its minion is refused), and nothing waits for it. It leaves for good when
// an operator confirms the removal (hub breaker release NAME applies the held deletions),
// or once it holds nothing (its collections' staleness TTL passed); and it is back, with
// nothing ever withdrawn, when the configuration has it again.
//
// The hub keeps a departed cluster as an entry of its own in the compiled configuration
// (ClusterConfig.departed, under the tenant it belonged to), so ownership, tenancy,
// routing and the views treat it as any cluster that owns nothing: every object of it is
// a held refusal, seen by the sinks that saw it.

// departure is how a cluster left the configuration.
type departure struct {
	since  time.Time
	tenant string // the tenant it belonged to: its sinks keep seeing its objects
	cause  string // what removed it (a reload, the configuration at start)
}

// withDeparted returns cfg with an entry for each cluster in departed (name → tenant), under
// its tenant (at the top level without tenants). A departed cluster whose tenant left the
// configuration too has no place: it leaves with its tenant (whose sinks are no longer
// served either).
func withDeparted(cfg *Config, departed map[string]string) *Config {
	if len(departed) == 0 {
		return cfg
	}
	c := *cfg
	if len(c.Tenants) == 0 {
		c.Clusters = slices.Clone(c.Clusters)
	} else {
		c.Tenants = slices.Clone(c.Tenants)
	}
	for _, name := range slices.Sorted(maps.Keys(departed)) {
		entry := ClusterConfig{Name: name, departed: true}
		if len(c.Tenants) == 0 {
			c.Clusters = append(c.Clusters, entry)
			continue
		}
		for i := range c.Tenants {
			if c.Tenants[i].Name == departed[name] {
				c.Tenants[i].Clusters = append(slices.Clone(c.Tenants[i].Clusters), entry)
			}
		}
	}
	return &c
}

// renamedTo returns the cluster that cluster's minion is in next: a cluster of next that
// old did not have, or had only as departed, which one of cluster's identities is now (its
// entry renamed, or renamed back). "" if none.
func renamedTo(old, next *compiled, cluster string) string {
	for id, c := range old.identity {
		if c != cluster {
			continue
		}
		if to := next.identity[id]; to != "" && (!old.known(to) || old.departed[to]) {
			return to
		}
	}
	return ""
}

// rename moves from's state to to, a cluster the same reload added or brought back
// (renamedTo): the cluster's objects are to's from now on, none withdrawn, and its minion
// resumes as to. What to kept as a departed cluster is an older state of the same minion's:
// from's, the live one, replaces it.
func (h *Hub) rename(from, to *clusterState) error {
	from.mu.Lock()
	blank := !from.synced && !from.restored && from.unknown == "" && from.connected == 0
	from.mu.Unlock()
	if blank && to.isDeparted() && h.store.count(from.data) == 0 {
		// The old name has nothing at all (it was added since the start, say by a rename
		// the state file lost, and its minion has not delivered): the departed copy is the
		// newer, and stays, with what the hub does or does not know of it.
		to.log.Info("cluster renamed back by the configuration: its old name had nothing, so what it kept stays", "was", from.name)
		return nil
	}
	if err := h.store.transfer(from.data, to.data); err != nil {
		return err
	}
	h.layer.ClusterRenamed(from.name, to.name)
	from.mu.Lock()
	synced, unconfirmed, epoch, last, away := from.synced, from.unconfirmed, from.epoch, from.lastContact, from.disconnectedAt
	unknown, mayLack, restored, decided := from.unknown, from.mayLack, from.restored, from.decided
	if from.connected > 0 {
		away = h.now() // its streams are closed as it leaves
	}
	from.mu.Unlock()
	to.mu.Lock()
	// The same session's state, at its epoch (a replica's peers take it by that epoch), held
	// back by the layer if it was, with what the hub does not know of it.
	to.synced, to.unconfirmed, to.epoch, to.lastContact, to.disconnectedAt = synced, unconfirmed, epoch, last, away
	to.mayLack, to.restored, to.decided = mayLack, restored, decided
	if unknown == "" {
		h.knownLocked(to, "its old name's known state replaced what it kept") // a departed copy whose state was unknown
	}
	h.saveMetaLocked(to)
	to.mu.Unlock()
	// What the hub did not know of the cluster under its old name it does not know under
	// the new one: the file's mark moves with it (the old name's goes with its records).
	if why := cmp.Or(unknown, mayLack); why != "" {
		if unknown != "" {
			h.markUnknown(to, unknown)
		}
		if st := h.state.Load(); st != nil {
			st.MarkDamaged(to.name, why)
		}
	}
	to.log.Info("cluster renamed by the configuration: it has what its old name held", "was", from.name)
	h.note(api.Event{Kind: api.EventCluster, Cluster: to.name, Reason: api.ReasonRenamed,
		Message: fmt.Sprintf("renamed from %q by the configuration (its identity is this cluster's now): it has what %q held", from.name, from.name)})
	return nil
}

// recheckCopy judges what a peer's copy put that the configuration does not allow (Hub.apply
// stores a copy's objects without refusing them: a departed cluster owns nothing, and an
// object a configured cluster no longer owns is one its holder's breaker holds) as the
// holder did, by the one judgement of what the configuration no longer allows: a reload's
// re-check, under the configuration live now (configMu: a reload meanwhile judges it with
// the ownership it has then), which holds it or withdraws it by the breaker's rules. It
// walks the whole store, which only such copies pay, rarely.
func (h *Hub) recheckCopy() {
	h.configMu.Lock()
	defer h.configMu.Unlock()
	h.recheckOwnership(h.current().comp, "a replica's copy of what the configuration does not allow")
}

// departedTenants are the departed clusters of comp (name → tenant).
func departedTenants(comp *compiled) map[string]string {
	out := map[string]string{}
	for name := range comp.departed {
		out[name] = comp.tenants.OfCluster(name)
	}
	return out
}

// depart records that cs left the configuration: its streams are closed (no identity is
// it any more; it returns how many), the layer stops following it, and the event says what
// an operator may do.
func (h *Hub) depart(cs *clusterState, d departure) int {
	cs.mu.Lock()
	cs.departed = &d // if its last state is unknown, it stays so: what it had is still not known
	lacking := cs.mayLack != "" && !cs.synced && cs.unknown == ""
	why := cs.mayLack
	cs.mu.Unlock()
	if lacking {
		// Its restored state may lack its last changes and no minion will resync it now:
		// what it departs with is unknown, as the warm-up's end would have found.
		h.markUnknown(cs, why+"; it left the configuration before its minion resynced")
	}
	closed := cs.closeSessions()
	h.layer.ClusterRemoved(cs.name)
	n := h.store.count(cs.data)
	cs.log.Warn("cluster left the configuration: its objects stay served, held by its breaker, until an operator confirms the removal (hub breaker release) or the configuration has it again",
		"cause", d.cause, "objects", n, "streams_closed", closed)
	h.note(api.Event{Kind: api.EventCluster, Tenant: d.tenant, Cluster: cs.name, Reason: api.ReasonDeparted,
		Message: fmt.Sprintf("left the configuration (%s): its %d objects stay served until an operator confirms (hub breaker release %s) or the configuration has it again", d.cause, n, cs.name)})
	return closed
}

// returned records that a departed cluster is in the configuration again.
func (h *Hub) returned(cs *clusterState) {
	cs.mu.Lock()
	cs.departed = nil
	cs.mu.Unlock()
	cs.log.Info("cluster back in the configuration: what it held was kept")
}

// forgetDeparted takes a departed cluster that holds nothing any more out of the hub (its
// removal was confirmed, or staleness dropped what it had), as removeCluster does for a
// cluster that leaves with nothing. It reports whether it did.
func (h *Hub) forgetDeparted(name string) bool {
	h.configMu.Lock()
	cur := h.current()
	cs := h.cluster(name)
	if !cur.comp.departed[name] || cs == nil || h.store.count(cs.data) > 0 || cs.isUnknown() {
		h.configMu.Unlock()
		return false
	}
	keep := departedTenants(cur.comp)
	delete(keep, name)
	comp, err := withDeparted(cur.cfg, keep).compile()
	if err != nil { // the running file compiled with the others: it cannot fail without this one
		h.configMu.Unlock()
		h.log.Error("forgetting a departed cluster", "cluster", name, "err", err)
		return false
	}
	h.live.Store(&live{cfg: cur.cfg, comp: comp})
	h.configMu.Unlock()
	h.removeCluster(name)
	return true
}
