package hub

import (
	"crypto/rand"
	"encoding/hex"
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
//
// Events are numbered twice: across the journal, as the vendor's operators see them, and
// within their tenant's ring, as that tenant's operators see them, so that the gaps in a
// tenant's numbers do not tell it how much happened to the others. Numbers start again
// with the process: boot tells a client that asks with another process's numbers (the hub
// restarted, or a replica behind the same address answered) to start again.
type journal struct {
	mu    sync.Mutex
	boot  string
	seq   uint64
	rings map[string]*ring
}

type ring struct {
	buf     []kept // the last len(buf) events, oldest at next once full
	next    int
	seq     uint64 // the ring's own numbering
	evicted kept   // the last event pushed out
}

// kept is an event with its number in its ring (its Seq is the journal's).
type kept struct {
	api.Event
	own uint64
}

func newJournal() *journal {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &journal{boot: hex.EncodeToString(b), rings: map[string]*ring{}}
}

func (j *journal) add(e api.Event) {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.rings[e.Tenant]
	if r == nil {
		r = &ring{}
		j.rings[e.Tenant] = r
	}
	j.seq++
	r.seq++
	e.Seq = j.seq
	k := kept{e, r.seq}
	if len(r.buf) < eventsPerTenant {
		r.buf = append(r.buf, k)
		return
	}
	r.evicted = r.buf[r.next]
	r.buf[r.next] = k
	r.next = (r.next + 1) % eventsPerTenant
}

// since returns the kept events v may see after seq (in v's numbering), oldest first, at
// most limit (the newest ones, Dropped set, when there are more). A seq of another process
// (boot is not this journal's, or seq is beyond its newest) is answered from the start,
// with Reset set.
func (j *journal) since(v viewer, seq uint64, boot string, limit int) api.Events {
	j.mu.Lock()
	out := api.Events{Events: []api.Event{}, Boot: j.boot}
	number := func(k kept) uint64 { return k.Seq } // v's numbering
	newest := j.seq
	if !v.isVendor() {
		number, newest = func(k kept) uint64 { return k.own }, 0
		if r := j.rings[v.tenant]; r != nil {
			newest = r.seq
		}
	}
	if boot != "" && boot != j.boot || seq > newest {
		seq, out.Reset = 0, true
	}
	for tenant, r := range j.rings {
		if !v.isVendor() && tenant != v.tenant {
			continue
		}
		out.Dropped = out.Dropped || r.evicted.own != 0 && number(r.evicted) > seq
		for _, k := range r.buf {
			if n := number(k); n > seq {
				e := k.Event
				e.Seq = n
				out.Events = append(out.Events, e)
			}
		}
	}
	j.mu.Unlock()
	sort.Slice(out.Events, func(a, b int) bool { return out.Events[a].Seq < out.Events[b].Seq })
	if limit > 0 && len(out.Events) > limit {
		out.Events, out.Dropped = out.Events[len(out.Events)-limit:], true
	}
	// Next is v's newest, seen or not: what v cannot see is not asked again.
	out.Next = newest
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
	return h.events.since(vendor(h.current().comp), since, "", 0)
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

// serveEvents is GET /api/events?since=SEQ&boot=BOOT&limit=N.
func (h *Hub) serveEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := onlyParams(q, "since", "boot", "limit"); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
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
	WriteJSON(w, h.events.since(h.viewerOf(r), since, q.Get("boot"), limit))
}
