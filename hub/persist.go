package hub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/durable"
	"github.com/meshfed/meshfed/mcp"
)

// Durable last-known state. The hub keeps nothing of a cluster but what its sessions
// wrote; restarted while a minion is down, it would serve without that cluster once the
// warm-up ended, and istiod would delete the cluster's objects. So each cluster's accepted
// state (its resources as received, when it was last in contact, whether it had synced) is
// written to <stateDir>/clusters.db (package durable: asynchronously, off the push path),
// and a restarted hub serves it, under the staleness policy counted from the last contact,
// until the cluster's own session replaces it. A restored cluster that had synced counts as
// present for the warm-up. Restored resources go through the ownership ACL again: the
// configuration may have changed while the hub was down.
//
// With replicas, the state file also keeps, per cluster, the epoch of the session whose
// state the copy is (the layer sets it: SetClusterEpoch), and a restored copy counts only
// once the layer says so (Layer.ClusterRestored, ConfirmRestored): a peer may hold a newer
// session's state, which must replace the restored one before any sink is served it.

// StateFile is the file, under stateDir, holding the clusters' last-known state.
const StateFile = "clusters.db"

// openState opens the state file and restores what it holds into the store. What it cannot
// vouch for is unknown, never empty (unknown.go): a file that could not be read or opened
// leaves every configured cluster unknown; a cluster whose records are damaged is; and so is
// every cluster the file holds when the hub stopped while its writes were failing, or when
// the file lost its last commit. After an unclean stop otherwise (a kill), a cluster that
// was connected may lack its last changes (at most a commit interval's), and with a
// read-only file any cluster may lack what the last run could not write: the warm-up waits
// for their minions before they count. A file another hub holds is an error (two hubs on
// one state directory would overwrite each other's state).
func (h *Hub) openState() error {
	if !h.cfg.Persist {
		return nil
	}
	path := filepath.Join(h.cfg.StateDir, StateFile)
	st, state, err := durable.OpenState(path, h.log.With("state", path), h.stateFaults)
	if errors.Is(err, durable.ErrLocked) {
		return fmt.Errorf("stateDir: %w (another hub uses %s)", err, path)
	}
	if err != nil {
		h.log.Error("cannot keep the clusters' state: running without it; what it held is unknown until each cluster's minion resyncs", "path", path, "err", err)
		h.stateErr.Store(&err)
		why := "the state file could not be opened: " + err.Error()
		h.lostState.Store(&why)
		for _, cs := range h.clusterList() {
			h.markUnknown(cs, "the state file could not be opened: "+err.Error())
		}
		return nil
	}
	if state.ReadOnly {
		h.log.Error("the state file is read-only: what it held is served, and nothing is kept until it is writable", "path", path)
	}
	unknown := h.unknownAtStart(state)
	names := slices.Sorted(maps.Keys(state.Clusters))
	h.keepDeparted(state, st)
	for _, name := range names {
		c := state.Clusters[name]
		if h.cluster(name) == nil {
			// A cluster of a tenant no longer configured (it left with its tenant), or a
			// name damage made up.
			st.DropCluster(name)
			h.log.Warn("state file: a cluster the configuration does not have is forgotten", "cluster", name, "tenant", c.Tenant, "damaged", state.Damaged[name])
			continue
		}
		// It may lack its last changes (a kill while it was connected: at most a commit
		// interval's; a read-only file: whatever the last run could not write): the warm-up
		// waits for its minion before it counts.
		mayLack := ""
		switch {
		case state.ReadOnly:
			mayLack = "the state file is read-only: the last run may not have written its last changes"
		case state.Unclean && c.Connected:
			mayLack = "the hub stopped without closing the state file (killed) while the cluster was connected: the file may lack its changes of the last commit interval"
		}
		if mayLack != "" && !state.ReadOnly {
			// Kept until its session resyncs it: a restart before that, clean or not, must
			// not take the file's state as whole either.
			st.MarkDamaged(name, mayLack)
		}
		n, refused, present := h.restoreCluster(name, c, st, mayLack)
		h.log.Info("cluster restored from the state file: served until its own session replaces it",
			"cluster", name, "resources", n, "refused", refused, "last_contact", c.LastContact, "synced", c.Synced, "epoch", c.Epoch,
			"counts_as_synced", present)
	}
	for _, name := range slices.Sorted(maps.Keys(unknown)) {
		if cs := h.cluster(name); cs != nil {
			h.markUnknown(cs, unknown[name])
			st.MarkDamaged(name, unknown[name]) // a second restart remembers: the file cannot vouch for it
		}
	}
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		why, lacking := cs.mayLack, cs.mayLack != "" && cs.departed != nil && cs.unknown == ""
		cs.mu.Unlock()
		if lacking { // no minion will resync it: what it may lack stays unknown
			h.markUnknown(cs, why+"; it is not in the configuration, so no minion resyncs it")
		}
	}
	// Ownership as a reload re-checks it: what the configuration no longer allows is
	// withdrawn, and forgotten by the file too, unless that would exceed a cluster's
	// breaker (an ownership typo arriving with a restart, as a ConfigMap change usually
	// does, is held like one arriving by a reload).
	refused, _ := h.recheckOwnership(h.current().comp, "the configuration the hub started with")
	for cluster, rs := range refused {
		for _, r := range rs {
			st.Remove(cluster, r.collection, r.name)
		}
	}
	h.state.Store(st) // written from here on: restoring wrote nothing back
	// What the start marked (clusters unknown, or whose state may lack its last changes) is
	// on disk before anything is served: a kill right after must find the marks again, not
	// a file that looks whole (a file set aside is new and empty).
	h.flushState()
	h.expireStale() // what was already past its TTL is never served
	h.checkReady()
	return nil
}

// unknownAtStart says which clusters' last state the state file cannot vouch for, and why:
// every configured cluster when the file could not be read; a cluster whose records are
// damaged; every cluster it holds, and every configured one, when the hub stopped while its
// writes were failing, or when it lost its last commit.
func (h *Hub) unknownAtStart(state *durable.State) map[string]string {
	out := map[string]string{}
	if r := state.Reset; r != nil {
		why := fmt.Sprintf("the state file could not be read (%v)", r.Err)
		if r.MovedTo != "" {
			why += "; it was moved to " + r.MovedTo
		}
		for _, name := range h.ClusterNames() {
			out[name] = why
		}
		h.lostState.Store(&why)
	}
	stale := ""
	switch {
	case state.LastCommitLost != "":
		stale = "the state file lost its last commit: " + state.LastCommitLost
	case state.Failing:
		stale = "the hub stopped while its state file's writes were failing: it may hold an older state than was served"
	}
	if stale != "" {
		// The file may lack anything since its writes began failing, a cluster's whole
		// state included (one renamed or added then): every cluster is unknown.
		h.lostState.Store(&stale)
		for name := range state.Clusters {
			out[name] = stale
		}
		for _, name := range h.ClusterNames() {
			out[name] = stale
		}
	}
	for name, why := range state.Damaged {
		out[name] = "its state in the state file is damaged: " + why
	}
	return out
}

// keepDeparted keeps the clusters of the state file that the configuration the hub starts
// with does not have (departure.go): a typo arriving with a restart must not withdraw what
// the cluster published. Each is kept under the tenant it belonged to; one whose tenant is
// not configured either has no place, and is not kept.
func (h *Hub) keepDeparted(state *durable.State, st *durable.Store) {
	added := map[string]string{}
	for name, c := range state.Clusters {
		if h.current().comp.known(name) || len(c.Collections) == 0 && state.Damaged[name] == "" {
			continue
		}
		// A damaged one is kept too, unknown (openState): what the file cannot vouch for may
		// be a cluster renamed in a run whose writes were lost. A name damage made up is
		// then an unknown departed cluster, which an operator confirms away.
		added[name] = c.Tenant // "" without tenants: at the top level
	}
	h.addDeparted(added, "the configuration the hub started with does not have it", false)
}

// addDeparted adds the clusters of added (name → the tenant it belonged to), which the hub
// does not keep, as departed (departure.go), with cause; awaited ones are waited for by the
// warm-up until a session (a replica's copy) has delivered their state. It returns those it
// added: one whose tenant is not configured has no place. The caller orders it with the
// configuration's other changes (configMu, or the start).
func (h *Hub) addDeparted(added map[string]string, cause string, awaited bool) []string {
	if len(added) == 0 {
		return nil
	}
	cur := h.current()
	keep := departedTenants(cur.comp)
	for name, tenant := range added {
		keep[name] = tenant
	}
	comp, err := withDeparted(cur.cfg, keep).compile()
	if err != nil { // the file compiled alone: entries that own nothing cannot make it fail
		h.log.Error("keeping the clusters that left the configuration", "err", err)
		return nil
	}
	h.live.Store(&live{cfg: cur.cfg, comp: comp})
	h.store.retenant(comp)
	h.store.setPolicy(ConflictPolicy{Priority: cur.cfg.Conflicts.Priority, Departed: comp.departed})
	var out []string
	h.clustersMu.Lock()
	defer h.clustersMu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(added)) {
		if !comp.known(name) || h.clusters[name] != nil {
			continue // its tenant is not configured
		}
		cs := h.addClusterLocked(name)
		cs.departed = &departure{since: h.now(), tenant: keep[name], cause: cause}
		cs.unconfirmed = awaited
		out = append(out, name)
		h.note(api.Event{Kind: api.EventCluster, Tenant: keep[name], Cluster: name, Reason: api.ReasonDeparted,
			Message: fmt.Sprintf("%s: its last-known objects stay served until an operator confirms (hub breaker release %s) or the configuration has it again", cause, name)})
	}
	return out
}

// KeepDeparted keeps, as departed, a cluster the hub does not know that a replica's peers
// keep a copy of (tenant: the one it belongs to there): removed from the configuration
// while this replica was down, or before its state directory was emptied, it is what the
// hub does not know, which is kept, never empty. The warm-up waits for its copy (the layer
// takes it from a peer) as it waits for a restored one held back. It reports whether it
// added it.
func (h *Hub) KeepDeparted(cluster, tenant, peer string) bool {
	h.configMu.Lock()
	defer h.configMu.Unlock()
	if h.current().comp.known(cluster) {
		return false
	}
	added := h.addDeparted(map[string]string{cluster: tenant}, fmt.Sprintf("not in this replica's configuration, and kept by replica %s", peer), true)
	return len(added) == 1
}

// restoreCluster puts c's resources into the store as cluster's, and its last contact,
// sync state and epoch into the cluster's state, as if its last session had just ended at
// its last contact. Records that no longer pass ingest's checks (the kinds, the size a sink
// can receive), and collections the hub no longer asks the cluster for, are refused and
// removed from st; ownership is re-checked after (openState). A whole state counts as
// synced if the layer says so (present).
func (h *Hub) restoreCluster(name string, c *durable.Cluster, st *durable.Store, mayLack string) (restored, refused int, present bool) {
	cs := h.cluster(name)
	comp := h.current().comp
	rejections := map[string]map[string]string{}
	colls := make([]string, 0, len(c.Collections))
	for coll := range c.Collections {
		colls = append(colls, coll)
	}
	sort.Strings(colls)
	asked := comp.collections(name)
	for _, coll := range colls {
		if !slices.Contains(asked, coll) {
			// Never updated nor deleted by the cluster's source again.
			for n := range c.Collections[coll] {
				st.Remove(name, coll, n)
			}
			continue
		}
		var put []*resource
		for _, e := range c.Collections[coll] {
			res, err := restoredResource(comp, name, coll, e)
			if err != nil {
				if rejections[coll] == nil {
					rejections[coll] = map[string]string{}
				}
				rejections[coll][e.Name] = err.Error()
				refused++
				st.Remove(name, coll, e.Name)
				continue
			}
			put = append(put, res)
		}
		if _, err := h.store.apply(cs.data, write{collection: coll, put: put, full: true}); err != nil {
			return restored, refused, false
		}
		restored += len(put)
		h.metrics.resources(name, coll, len(put))
	}
	last := c.LastContact
	if last.IsZero() {
		last = h.now()
	}
	// The layer is told of every whole copy, one that may lack its last changes included:
	// its epoch is what the replica's copy is of, which the group must count (a session it
	// holds next is newer, and a peer's older copy must not replace it). Such a copy does
	// not count here whatever the layer says (ConfirmRestored does not take it whole): its
	// minion makes up for what the file may lack, or a peer's whole copy of at least its
	// epoch replaces it, else the warm-up's end makes it unknown. A departed cluster's
	// minion never comes: the layer decides (a replica's peers may have a newer copy; a
	// single hub's counts, and a departed copy that may lack its last changes is unknown:
	// openState).
	present = c.Synced && h.layer.ClusterRestored(name, c.Epoch) && (mayLack == "" || comp.departed[name])
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.lastContact, cs.disconnectedAt, cs.synced, cs.restored, cs.mayLack = last, last, present, true, mayLack
	cs.unconfirmed, cs.epoch = c.Synced && !present, c.Epoch
	if len(rejections) > 0 {
		cs.rejections = rejections
	}
	return restored, refused, present
}

// ConfirmRestored makes a cluster's restored state, which the layer held back
// (ClusterRestored returned false), count as synced: the layer found nothing newer of the
// cluster. It reports whether it did: not once a session has delivered the cluster's state
// (which replaced the restored one), nor for a cluster not restored whole, nor for a copy
// that may lack its session's last changes (a kill while its minion was connected here, a
// read-only state file): nothing newer is known, but it is not that session's whole state,
// so it stays uncounted until its minion resyncs it or a peer's whole copy of at least its
// epoch replaces it (the warm-up's end makes it unknown meanwhile: unknown.go). A departed
// one is confirmed (no minion comes; openState made it unknown).
func (h *Hub) ConfirmRestored(cluster string) bool {
	cs := h.cluster(cluster)
	if cs == nil {
		return false
	}
	cs.mu.Lock()
	ok := cs.unconfirmed && !cs.removed && (cs.mayLack == "" || cs.departed != nil)
	if ok {
		cs.unconfirmed, cs.synced = false, true
		h.resyncedLocked(cs)
		cs.log.Info("restored state confirmed: nothing newer of the cluster is known; it counts as synced", "epoch", cs.epoch)
	}
	cs.mu.Unlock()
	if ok {
		h.checkReady()
	}
	return ok
}

// SetClusterEpoch records the epoch of the session whose state the hub's copy of cluster
// now is, and writes it to the state file with the cluster's metadata, so that a restart
// knows how new its restored copy is. The layer calls it once the store holds that
// session's whole state: the file then holds the epoch only with that state (package
// durable writes a prefix of the calls). A single hub never calls it: its epochs are 0.
func (h *Hub) SetClusterEpoch(cluster string, epoch uint64) {
	cs := h.cluster(cluster)
	if cs == nil {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.removed || cs.epoch == epoch {
		return
	}
	cs.epoch = epoch
	h.saveMetaLocked(cs)
}

// restoredResource rebuilds a stored resource from its entry as received, through the
// checks ingest makes of a resource but ownership (the kinds and maxMessageSize may have
// changed with the restart).
func restoredResource(comp *compiled, cluster, collection string, e *mcp.Entry) (*resource, error) {
	r := &mcpapi.Resource{}
	if err := proto.Unmarshal(e.Encoded, r); err != nil {
		return nil, err
	}
	body, err := comp.kindTable.Decode(collection, r)
	if err != nil {
		return nil, err
	}
	hosts, ok := acl.HostsOf(collection, body)
	if !ok {
		if hosts, err = acl.Hosts(collection, r.GetBody().GetValue()); err != nil {
			return nil, err
		}
	}
	res, err := newResource(cluster, collection, e, r, hosts)
	if err == nil && len(res.served.Encoded) > comp.quotaFor(cluster).q.MaxObjectBytes {
		err = fmt.Errorf("%s is %d bytes as served, more than maxObjectBytes", e.Name, len(res.served.Encoded))
	}
	return res, err
}

// stateChanged is the store's report of each change of a cluster's resources: written to
// the state file, and told to the layer.
func (h *Hub) stateChanged(cluster, collection string, put []*mcp.Entry, removed []string) {
	if st := h.state.Load(); st != nil {
		st.Apply(cluster, collection, put, removed)
	}
	if h.layerChanged != nil {
		h.layerChanged(cluster, collection, put, removed)
	}
}

// stateMovedAway is the store's report of the resources a rename moved from a cluster's
// old name to its new one: the state file forgets them under the old name. The layer is not
// told: they were not deleted (store.transfer).
func (h *Hub) stateMovedAway(cluster, collection string, removed []string) {
	if st := h.state.Load(); st != nil {
		st.Apply(cluster, collection, nil, removed)
	}
}

// saveMeta writes what the state file keeps of cs beyond its resources; the caller holds
// cs.mu.
func (h *Hub) saveMetaLocked(cs *clusterState) {
	st := h.state.Load()
	if st == nil || cs.removed {
		return
	}
	last := cs.lastContact
	if cs.connected > 0 {
		last = h.now() // in contact now: a crash counts the staleness from about here
	}
	// A restored state the layer has not confirmed yet is still whole: a crash meanwhile
	// must restore it as such.
	tenant := ""
	if cs.departed != nil {
		tenant = cs.departed.tenant
	} else if comp := h.current().comp; !comp.tenants.Single() {
		tenant = comp.tenants.OfCluster(cs.name)
	}
	st.SetMeta(cs.name, durable.Meta{LastContact: last, Synced: cs.synced || cs.unconfirmed, Epoch: cs.epoch, Tenant: tenant, Connected: cs.connected > 0})
}

// saveContacts refreshes the last contact of the connected clusters in the state file
// (housekeeping, every 10 s: a crash counts staleness from at most that much earlier).
func (h *Hub) saveContacts() {
	if h.state.Load() == nil {
		return
	}
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		if cs.connected > 0 {
			h.saveMetaLocked(cs)
		}
		cs.mu.Unlock()
	}
}

// flushState waits until what is queued is in the state file (at most a few seconds): when a
// cluster's minion goes away, its last state must not wait for the next commit interval,
// since a restart will serve it from the file alone. It returns why what is queued is not on
// disk (nil: it is, or the hub keeps no state file).
func (h *Hub) flushState() error {
	st := h.state.Load()
	if st == nil {
		if err := h.stateErr.Load(); err != nil {
			return fmt.Errorf("the state file could not be opened: %w", *err)
		}
		return nil
	}
	if s := st.Stats(); s.Failing {
		// Waiting would hold the caller (a stream's end, an operator's request) for the
		// timeout and gain nothing: while writes fail, a kill makes every cluster unknown
		// at the restart (the run marker says so).
		return fmt.Errorf("writes to the state file fail: %s", s.LastError)
	}
	// In short waits, so that writes that start failing meanwhile (a full disk's next
	// commit) end it too, not only the bound.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := st.Flush(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if s := st.Stats(); s.Failing {
			err = fmt.Errorf("writes to the state file fail: %s", s.LastError)
		}
		if !errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline) { // closed, or failing
			h.log.Warn("state file: a cluster's last state is not on disk yet", "err", err)
			return err
		}
	}
}

// keepableNow says why a decision about cs taken now would not reach the state file (nil: it
// would, or the hub keeps none). It writes cs's metadata again and waits for it, so that a
// disk that filled or turned read-only since the last commit is found before the decision,
// not after it.
func (h *Hub) keepableNow(cs *clusterState) error {
	if !h.cfg.Persist {
		return nil
	}
	cs.mu.Lock()
	h.saveMetaLocked(cs) // nothing without a state file open: flushState says why
	cs.mu.Unlock()
	return h.flushState()
}

// flushConnected waits until the state file has a cluster's Connected mark, before its
// session's first push is applied: a kill from then on restarts with the mark, so the
// warm-up waits for the cluster's minion instead of serving the file's state, which may lack
// what the session changed within the last commit interval. While writes fail it does not
// wait: a kill then makes every cluster unknown at the restart (the run marker says so).
func (h *Hub) flushConnected() {
	_ = h.flushState()
}

// closeState writes what is queued and closes the state file.
func (h *Hub) closeState() error {
	st := h.state.Swap(nil)
	if st == nil {
		return nil
	}
	if err := st.Close(); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// StateStatus is the state file's health, as /api/state shows it.
func (h *Hub) StateStatus() api.State {
	out := api.State{Persist: h.cfg.Persist, Path: filepath.Join(h.cfg.StateDir, StateFile)}
	if p := h.stateErr.Load(); p != nil {
		out.Error = (*p).Error()
	}
	if st := h.state.Load(); st != nil {
		s := st.Stats()
		out.Open, out.Queued, out.Failing, out.LastError, out.FileSize = true, s.Queued, s.Failing, s.LastError, s.FileSize
		if !s.LastCommit.IsZero() {
			t := s.LastCommit
			out.LastCommit = &t
		}
	}
	return out
}

// stateFileHealth is what the state file's metrics say: whether it fails to keep what the
// hub serves (writes failing, or not open at all), its failed commits, and what is queued.
func (h *Hub) stateFileHealth() (failing bool, failures uint64, queued int) {
	st := h.state.Load()
	if st == nil {
		return h.stateErr.Load() != nil, 0, 0 // could not be opened: nothing is kept
	}
	s := st.Stats()
	return s.Failing, s.Failures, s.Queued
}
