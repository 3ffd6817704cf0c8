package hub

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

// Isolation of what is felt: one tenant flooding changes, opening thousands of streams or
// holding a fleet of stalled sinks must not slow another tenant. Each tenant's peers, all
// together, are bounded by its TenantLimits:
//
//   - streams: every listener shares one mcp.PeerGroups keyed by tenant (streamTenant), so
//     a tenant's minions, relays and sinks, on whichever listener, count against its
//     maxStreams and streamsPerSecond; a refusal is ResourceExhausted, counted as
//     tenant_too_many_streams or tenant_rate_limited;
//   - pushes: its clusters' pushes, all together, wait for its pushesPerSecond after their
//     cluster's own quota, on their own streams (paceTenant): the sources coalesce what
//     changes meanwhile, nothing is dropped, and no other tenant's cluster waits;
//   - objects: its clusters' objects and bytes, all together, and what each collection of
//     them adds up to (quotas.maxCollectionBytes: what its sinks can receive in one push)
//     are bounded in the store (overQuotaLocked), which refuses an object over a bound
//     naming that bound only, never another tenant or its clusters;
//   - the store's write path, which every cluster shares, admits writers of different
//     tenants by turns (fairGate).
//
// A configuration without tenants has no other tenant to be isolated from: its implicit
// tenant is bounded by the clusters' quotas and the per-peer limits alone, as before
// tenants, and tenantLimits does not apply (a hub-wide push rate would make one cluster's
// flood every cluster's). With tenants, a peer that is no tenant's (a sink whose identity
// no tenant lists, one on serveUnauthenticated) receives nothing, and all of them together
// are one more tenant, noTenant, with the hub's tenantLimits: a storm of strangers takes
// at most one tenant's share.

// noTenant labels the peers that are no tenant's, together (no tenant's name has
// parentheses).
const noTenant = "(none)"

// tenantLimits returns what bounds tenant's peers under the live configuration: its
// limits, the hub's tenantLimits for noTenant, nothing without tenants.
func (l *live) tenantLimits(tenant string) TenantLimits {
	if l.comp.tenants.Single() {
		return TenantLimits{}
	}
	if t := l.comp.tenant[tenant]; t != nil {
		return t.limits
	}
	return l.cfg.TenantLimits
}

// streamTenant is the mcp.PeerGroupsConfig.Of of every listener: a stream's tenant under
// the live configuration (noTenant for none) and its stream limits. A minion's push stream
// (the ingest listener's ResourceSink, where the hub is the sink) and a relay are their
// cluster's tenant's; a sink's tenant is the one routing gives it (sinkTenant).
func (h *Hub) streamTenant(info *mcp.StreamInfo) (string, mcp.GroupLimits) {
	cur := h.current()
	var t string
	if info.Role == "sink" {
		t = cur.comp.tenants.OfCluster(cur.comp.identity[info.Identity])
	} else {
		t = cur.comp.sinkTenant(routing.Sink{Identity: info.Identity, Unauthenticated: info.Unauthenticated, Relay: info.Listener == relayListener})
	}
	l := cur.tenantLimits(t)
	if t == "" {
		t = noTenant
	}
	return t, mcp.GroupLimits{MaxStreams: l.MaxStreams, StreamsPerSecond: l.StreamsPerSecond, StreamBurst: l.StreamBurst}
}

// tenantLoad is what each tenant's peers take from the hub beyond what the store holds:
// their streams (shared by every listener) and their clusters' push rate.
type tenantLoad struct {
	streamsOnce sync.Once
	streams     atomic.Pointer[mcp.PeerGroups] // nil until the hub's listeners are built

	mu     sync.Mutex // guards pushes
	pushes map[string]*tenantPacer
}

// tenantPacer paces one tenant's pushes at the rate and burst it was made for.
type tenantPacer struct {
	l     *rate.Limiter
	rate  float64
	burst int
}

func newTenantLoad() *tenantLoad { return &tenantLoad{pushes: map[string]*tenantPacer{}} }

// streamGroups returns the PeerGroups every listener of h shares.
func (h *Hub) streamGroups() *mcp.PeerGroups {
	load := h.store.load
	load.streamsOnce.Do(func() {
		load.streams.Store(mcp.NewPeerGroups(mcp.PeerGroupsConfig{Kind: "tenant", Of: h.streamTenant, Logger: h.log,
			Opened: func(tenant string, open int) {
				// A tenant a reload removed is forgotten (retenant) once its last stream ends.
				if open == 0 && tenant != noTenant && !h.current().comp.tenants.Has(tenant) {
					h.metrics.tenantStreamsGone(tenant)
					return
				}
				h.metrics.tenantStreams(tenant, open)
			},
			Refused: h.metrics.tenantStreamRefused}))
	})
	return load.streams.Load()
}

// paceTenant waits until the tenant of cluster may push again under its pushesPerSecond,
// or ctx ends; a push that waited is counted.
func (h *Hub) paceTenant(ctx context.Context, cluster string) error {
	cur := h.current()
	tenant := cur.comp.tenants.OfCluster(cluster)
	l := cur.tenantLimits(tenant)
	if l.PushesPerSecond <= 0 {
		return nil
	}
	r := h.store.load.pacer(tenant, l).Reserve()
	wait := r.Delay()
	if wait <= 0 {
		return nil
	}
	h.metrics.tenantPushDelayed(tenant, wait)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.Cancel() // the push is not made: its place goes to the next one
		return ctx.Err()
	}
}

// pacer returns tenant's push limiter for limits l (a change of them starts a new one).
func (t *tenantLoad) pacer(tenant string, l TenantLimits) *rate.Limiter {
	burst := max(l.PushBurst, 1)
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pushes[tenant]
	if p == nil || p.rate != l.PushesPerSecond || p.burst != burst {
		p = &tenantPacer{l: rate.NewLimiter(rate.Limit(l.PushesPerSecond), burst), rate: l.PushesPerSecond, burst: burst}
		t.pushes[tenant] = p
	}
	return p.l
}

// retain forgets the push pacing of the tenants keep does not keep.
func (t *tenantLoad) retain(keep func(tenant string) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name := range t.pushes {
		if !keep(name) {
			delete(t.pushes, name)
		}
	}
}

// open returns how many streams tenant's peers have open.
func (t *tenantLoad) open(tenant string) int {
	if g := t.streams.Load(); g != nil {
		return g.Open(tenant)
	}
	return 0
}

// tenantUsage is what one tenant's clusters hold in the store, all together: what its
// maxObjects and maxBytes bound, and, per collection, what its sinks receive of its own
// clusters (what quotas.maxCollectionBytes bounds). Guarded by store.mu.
type tenantUsage struct {
	name    string
	objects int
	bytes   int64
	coll    map[string]int64
	gauges  tenantGauges
}

// usageLocked returns tenant's usage, starting it if it has none. The caller holds mu.
func (s *store) usageLocked(tenant string) *tenantUsage {
	u := s.usage[tenant]
	if u == nil {
		u = &tenantUsage{name: tenant, coll: map[string]int64{}}
		if tenant != "" { // a cluster whose tenant the live configuration does not say yet
			u.gauges = s.metrics.tenantUsage(tenant)
		}
		s.usage[tenant] = u
		u.gauges.set(u)
	}
	return u
}

// countLocked adds r (sign 1) to what d and its tenant hold, or takes it away (-1). The
// caller holds mu.
func (s *store) countLocked(d *clusterData, r *resource, sign int) {
	size := int64(sign) * servedSize(r)
	d.objects += sign
	d.bytes += size
	d.coll[r.collection] += size
	u := d.usage.Load()
	u.objects += sign
	u.bytes += size
	u.coll[r.collection] += size
	u.gauges.set(u)
}

// moveLocked makes d count in tenant's usage instead of its current tenant's. The caller
// holds mu.
func (s *store) moveLocked(d *clusterData, tenant string) {
	from := d.usage.Load()
	if from.name == tenant {
		return
	}
	to := s.usageLocked(tenant)
	for coll, held := range d.colls {
		var b int64
		for _, r := range held {
			b += servedSize(r)
		}
		from.coll[coll] -= b
		to.coll[coll] += b
	}
	from.objects -= d.objects
	from.bytes -= d.bytes
	to.objects += d.objects
	to.bytes += d.bytes
	d.usage.Store(to)
	from.gauges.set(from)
	to.gauges.set(to)
}

// retenant brings the store's tenants up to a reload's configuration, once the clusters it
// removed are gone: writes, picks and the admin API's answers go by its tenancy from here
// on (the views follow in reroute), each cluster's objects count in its tenant's usage now
// (a cluster that moved takes them along), and what is kept of a tenant no longer
// configured (its usage, push pacing and metric series) is forgotten.
func (s *store) retenant(comp *compiled) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tenants = comp.tenants
	for _, d := range s.clusters {
		s.moveLocked(d, comp.tenants.OfCluster(d.name))
	}
	keep := func(name string) bool {
		return comp.tenants.Has(name) || name == noTenant && !comp.tenants.Single()
	}
	for name, u := range s.usage {
		if keep(name) {
			continue
		}
		if u.objects != 0 || u.bytes != 0 { // every cluster has moved to a configured tenant, or left
			s.log.Error("a tenant no longer configured still holds objects; its usage is kept", "tenant", name, "objects", u.objects, "bytes", u.bytes)
			continue
		}
		delete(s.usage, name)
	}
	s.tenanted.Store(len(s.usage) > 1)
	s.load.retain(keep)
	s.metrics.retainTenants(func(name string) bool { return keep(name) || s.usage[name] != nil }, s.load.open)
}
