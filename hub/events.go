package hub

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"

	"github.com/meshfed/meshfed/hub/api"
)

// eventsPerTenant is how many recent events the hub keeps of each tenant (and of the
// vendor's own): a tenant whose clusters refuse objects in a loop pushes out its own
// history, not another tenant's. 512 covers a bad rollout's refusals and the reloads
// around it; logs and metrics have everything.
const eventsPerTenant = 512

// journal keeps the recent events, a ring per tenant ("" is the vendor's own: reloads and
// replicas). Adding one is a lock and a copy: it is called on the paths that refuse,
// connect and reload, never per served resource.
type journal struct {
	mu    sync.Mutex
	seq   uint64
	rings map[string]*ring
}

type ring struct {
	buf     []api.Event // the last len(buf) events, oldest at next once full
	next    int
	evicted uint64 // the Seq of the last event pushed out
}

func newJournal() *journal { return &journal{rings: map[string]*ring{}} }

func (j *journal) add(e api.Event) api.Event {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	e.Seq = j.seq
	r := j.rings[e.Tenant]
	if r == nil {
		r = &ring{}
		j.rings[e.Tenant] = r
	}
	if len(r.buf) < eventsPerTenant {
		r.buf = append(r.buf, e)
	} else {
		r.evicted = r.buf[r.next].Seq
		r.buf[r.next] = e
		r.next = (r.next + 1) % eventsPerTenant
	}
	return e
}

// since returns the kept events after seq that v may see, oldest first, at most limit (the
// newest ones, Dropped set, when there are more).
func (j *journal) since(v viewer, seq uint64, limit int) api.Events {
	j.mu.Lock()
	out := api.Events{Events: []api.Event{}}
	for tenant, r := range j.rings {
		if !v.isVendor() && tenant != v.tenant {
			continue
		}
		out.Dropped = out.Dropped || r.evicted > seq
		for _, e := range r.buf {
			if e.Seq > seq {
				out.Events = append(out.Events, e)
			}
		}
	}
	last := j.seq
	j.mu.Unlock()
	sort.Slice(out.Events, func(a, b int) bool { return out.Events[a].Seq < out.Events[b].Seq })
	if limit > 0 && len(out.Events) > limit {
		out.Events, out.Dropped = out.Events[len(out.Events)-limit:], true
	}
	// Next is the journal's newest, seen or not: what v cannot see is not asked again.
	out.Next = max(seq, last)
	return out
}

// forget drops the events of tenants the configuration no longer has.
func (j *journal) forget(keep func(tenant string) bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for t := range j.rings {
		if t != "" && !keep(t) {
			delete(j.rings, t)
		}
	}
}

// Events returns the kept events after since, as the vendor's operators see them.
func (h *Hub) Events(since uint64) api.Events {
	return h.events.since(vendor(h.current().comp), since, 0)
}

// Note records an event a layer saw (the replica layer: replicas joining and leaving, a
// cluster's authority moving); see note.
func (h *Hub) Note(e api.Event) { h.note(e) }

// note records e, of the cluster's tenant when it names a cluster and no tenant.
func (h *Hub) note(e api.Event) {
	if e.Tenant == "" && e.Cluster != "" {
		e.Tenant = h.current().comp.tenants.OfCluster(e.Cluster)
	}
	e.Time = h.now()
	h.events.add(e)
	h.metrics.event(e) // the events that have a metric: refusals by reason
}

// serveEvents is GET /api/events?since=SEQ&limit=N.
func (h *Hub) serveEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since uint64
	limit := eventsPerTenant
	if s := q.Get("since"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("since: %q is not an event's seq (a number)", s), http.StatusBadRequest)
			return
		}
		since = n
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			http.Error(w, fmt.Sprintf("limit: %q is not a positive number", s), http.StatusBadRequest)
			return
		}
		limit = n
	}
	WriteJSON(w, h.events.since(h.viewerOf(r), since, limit))
}
