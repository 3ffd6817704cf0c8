package hub

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/procmetrics"
)

// ReloadResult says what a reload changed.
type ReloadResult struct {
	// Refused are stored resources the new ownership no longer allows: no longer served.
	Refused int
	// Held are resources the new ownership no longer allows that stay served because
	// withdrawing them would exceed their cluster's breaker (it is open).
	Held int
	// ClosedIngest and ClosedSinks are the streams closed so they reconnect under the new
	// configuration (clusters whose ownership or identity changed; sinks routed elsewhere).
	ClosedIngest, ClosedSinks int
	// Views are the open views recomputed: those of the tenants whose sight changed.
	Views int
}

// restartOnly refuses a change of a field a reload cannot apply (see restartFields).
func restartOnly(old, next *Config) error {
	switch f := restartFields(old, next); len(f) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%s: changing it needs a restart of the hub; the running configuration stays", f[0])
	default:
		return fmt.Errorf("%s: changing them needs a restart of the hub; the running configuration stays", strings.Join(f, ", "))
	}
}

// restartFields are the fields next changes that a reload cannot: they shape listeners and
// streams. Reload refuses such a change whole; a dry run of a candidate names them.
func restartFields(old, next *Config) []string {
	var changed []string
	for _, f := range []struct {
		name string
		a, b any
	}{
		{"ingest", old.Ingest, next.Ingest}, {"serve", old.Serve, next.Serve}, {"serveUnauthenticated", old.ServeUnauthenticated, next.ServeUnauthenticated}, {"http", old.HTTP, next.HTTP}, {"adminTLS", old.AdminTLS, next.AdminTLS},
		{"tls", old.TLS, next.TLS}, {"devCA", old.DevCA, next.DevCA}, {"stateDir", old.StateDir, next.StateDir}, {"persist", old.Persist, next.Persist}, {"insecure", old.Insecure, next.Insecure}, {"collections", old.Collections, next.Collections},
		{"kinds", old.Kinds, next.Kinds},
		{"maxMessageSize", old.MaxMessageSize, next.MaxMessageSize}, {"dialSinks", old.DialSinks, next.DialSinks},
		{"poll", old.Poll, next.Poll}, {"backoff", old.Backoff, next.Backoff}, {"limits", old.Limits, next.Limits},
		{"replicas", old.Replicas, next.Replicas},
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			changed = append(changed, f.name)
		}
	}
	return changed
}

// Reload applies a new configuration without a restart: clusters, ownership, shared
// namespaces, conflict policy, staleness and routing. A cluster added starts empty; a
// cluster removed leaves every part of the hub (removeCluster). Stored resources are
// re-checked against the new ownership (those now refused stop being served); clusters whose
// ownership or identities changed are asked to reconnect, so what was refused before is
// resent; winners are re-chosen under the new policy; open views are recomputed under the
// new rules and push only what changed; sinks whose rules changed are asked to reconnect. A
// field that shapes listeners or streams (see restartOnly) refuses the whole change.
func (h *Hub) Reload(next *Config) (ReloadResult, error) {
	var res ReloadResult
	nextComp, err := next.compile() // the file's own errors, without the departed clusters the hub adds
	if err != nil {
		return res, err
	}
	if err := restartOnly(h.cfg, next); err != nil {
		return res, err
	}
	h.configMu.Lock()
	defer h.configMu.Unlock()
	old := h.current()
	// A cluster that leaves the configuration and holds something departs (departure.go):
	// kept, held, until an operator confirms; one that comes back is configured again.
	inNext := map[string]bool{}
	for _, c := range next.allClusters() {
		inNext[c.Name] = true
	}
	keep := map[string]string{}
	var departing []string
	renames := map[string]string{} // old name → new: the cluster's identity is the new one's
	for name := range old.comp.clusters {
		switch {
		case inNext[name]:
		case old.comp.departed[name]:
			keep[name] = old.comp.tenants.OfCluster(name)
		case h.cluster(name) == nil || h.store.count(h.cluster(name).data) == 0 && !h.cluster(name).isUnknown():
			// It leaves with nothing, and nothing unknown: what a cluster whose last state
			// is unknown had is kept unknown (departing), until an operator confirms.
		case renamedTo(old.comp, nextComp, name) != "":
			renames[name] = renamedTo(old.comp, nextComp, name)
		default:
			keep[name] = old.comp.tenants.OfCluster(name)
			departing = append(departing, name)
		}
	}
	comp, err := withDeparted(next, keep).compile()
	if err != nil {
		return res, err
	}
	// Clusters join before the configuration naming them is live, and leave after it is:
	// an identity the live configuration maps always finds its cluster.
	h.clustersMu.Lock()
	var added []*clusterState
	for _, c := range next.allClusters() {
		if h.clusters[c.Name] == nil {
			added = append(added, h.addClusterLocked(c.Name))
			h.log.Info("cluster added to the configuration", "cluster", c.Name)
		}
	}
	h.clustersMu.Unlock()
	if why := h.lostState.Load(); why != nil {
		for _, cs := range added {
			// The file this run could not read may have held it (a cluster that had left,
			// whose objects sinks still have): unknown until its minion delivers. A rename
			// below gives it its old name's state instead.
			h.markUnknown(cs, *why+"; it may have held this cluster, added since by a reload")
		}
	}
	h.live.Store(&live{cfg: next, comp: comp})
	for from, to := range renames {
		if err := h.rename(h.cluster(from), h.cluster(to)); err != nil {
			h.log.Error("a renamed cluster's state could not move to its new name; the new name starts empty", "from", from, "to", to, "err", err)
		}
	}
	for name := range old.comp.clusters {
		if !comp.known(name) {
			res.ClosedIngest += h.removeCluster(name) // it left with nothing, or renamed
		}
	}
	now := h.now()
	for _, name := range departing {
		if cs := h.cluster(name); cs != nil {
			res.ClosedIngest += h.depart(cs, departure{since: now, tenant: keep[name], cause: "a configuration reload"})
		}
	}
	for name := range old.comp.departed {
		if cs := h.cluster(name); cs != nil && comp.configured(name) {
			h.returned(cs)
		}
	}
	h.store.retenant(comp)
	h.events.forget(comp.tenants.Has) // a removed tenant's operators can no longer ask

	refused, held := h.recheckOwnership(comp, "a configuration reload")
	res.Held = held
	for _, rs := range refused {
		res.Refused += len(rs)
	}
	// A cluster whose configuration changed reconnects under the new one; after a change of
	// ownership, so does one with standing refusals, which its minion does not resend
	// unchanged (see mcp.RejectionError): on the new stream it resends what the hub lacks,
	// and the new ownership decides.
	owning := !reflect.DeepEqual(old.comp.ownership, comp.ownership)
	for name, prev := range old.comp.clusters {
		c, ok := comp.clusters[name]
		cs := h.cluster(name)
		if !ok || cs == nil || comp.departed[name] {
			continue
		}
		changed := !reflect.DeepEqual(prev, c) || old.comp.tenants.OfCluster(name) != comp.tenants.OfCluster(name)
		if changed {
			cs.renegotiate(h.mcpMetrics)
		}
		if changed || owning && cs.hasRejections() {
			res.ClosedIngest += cs.closeSessions()
		}
	}
	// Merge, then views, then the sinks routed elsewhere.
	h.store.setPolicy(ConflictPolicy{Priority: next.Conflicts.Priority, Departed: comp.departed})
	res.Views = h.store.reroute(comp, func(tenant string) bool { return !reflect.DeepEqual(old.comp.sight(tenant), comp.sight(tenant)) })
	res.ClosedSinks = h.watchers.rerouted(comp)
	h.log.Info("configuration reloaded", "refused", res.Refused, "held_by_breaker", res.Held, "closed_ingest_streams", res.ClosedIngest,
		"recomputed_views", res.Views, "closed_sink_streams", res.ClosedSinks, "departed", len(comp.departed))
	h.checkReady() // a removed cluster is no longer waited for
	h.resolicit()  // new bounds, or withdrawn objects, may let refused ones in
	// What the reload moved (a rename's state, a departure, withdrawals) is on disk before
	// it is done: a kill within the next commit interval must not restart on the old
	// names, where a renamed cluster would be a departed one an operator may confirm away
	// while its writer, under the new name, still publishes its objects.
	_ = h.flushState()
	return res, nil
}

// recheckOwnership re-checks every stored resource against comp's ownership (a reload, or
// the restored state against the configuration at start, which cause names): those it no
// longer allows are withdrawn and recorded as the cluster's rejections, unless withdrawing
// them would exceed the cluster's breaker, which then holds them (served). It returns the
// withdrawn ones by cluster and how many were held.
func (h *Hub) recheckOwnership(comp *compiled, cause string) (map[string][]refusal, int) {
	now := h.now()
	refused, verdicts := h.store.recheck(func(r *resource) error {
		return comp.check(r.cluster, acl.Object{Collection: r.collection, Name: r.name, Hosts: r.hosts})
	}, func(cluster string) *breakerGuard {
		return &breakerGuard{cfg: comp.breakerFor(cluster), now: now, departed: comp.departed[cluster]}
	}, cause)
	held := 0
	for cluster, v := range verdicts {
		if cs := h.cluster(cluster); cs != nil {
			h.breakerChanged(cs, "", v)
			held += v.reload
		}
	}
	for cluster, rs := range refused {
		cs := h.cluster(cluster)
		if cs == nil {
			continue
		}
		cs.mu.Lock()
		if cs.rejections == nil {
			cs.rejections = map[string]map[string]string{}
		}
		for _, r := range rs {
			if cs.rejections[r.collection] == nil {
				cs.rejections[r.collection] = map[string]string{}
			}
			cs.rejections[r.collection][r.name] = r.reason
		}
		cs.mu.Unlock()
		for _, r := range rs {
			h.note(api.Event{Kind: api.EventRefusal, Cluster: cluster, Collection: r.collection, Name: r.name, Reason: api.ReasonNotOwned, Message: cause + ": " + r.reason})
		}
		cs.log.Warn(cause+": stored resources no longer allowed; not served any more", "count", len(rs))
	}
	return refused, held
}

// RunWithReload runs the hub and follows its configuration file, path: a valid change is
// applied with Reload; an invalid one, or one that needs a restart, is logged and counted,
// and the running configuration stays.
func (h *Hub) RunWithReload(ctx context.Context, path string) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return h.Run(ctx) })
	g.Go(func() error { return h.watchConfig(ctx, path, 100*time.Millisecond) })
	return g.Wait()
}

// watchConfig applies each new content of the file. Each content is judged once: a refused
// one is logged and counted once, however often the file or its directory is touched after.
func (h *Hub) watchConfig(ctx context.Context, path string, debounce time.Duration) error {
	return ops.WatchFile(ctx, path, debounce, h.log, func(data []byte) {
		next, err := ParseConfig(data)
		if err == nil && reflect.DeepEqual(next, h.current().cfg) {
			h.metrics.reloaded().Current() // put back after a refused change: nothing is amiss
			return
		}
		if err == nil {
			_, err = h.Reload(next)
		}
		if err != nil {
			h.log.Error("configuration refused; keeping the running one", "path", path, "err", err)
			h.metrics.reloaded().Record(procmetrics.ReloadRefused)
			h.note(api.Event{Kind: api.EventReload, Reason: api.ReasonRefused, Message: fmt.Sprintf("%s refused; the running configuration stays: %v", path, err)})
			return
		}
		h.metrics.reloaded().Record(procmetrics.ReloadApplied)
		h.note(api.Event{Kind: api.EventReload, Reason: api.ReasonApplied, Message: path + " applied"})
	})
}
