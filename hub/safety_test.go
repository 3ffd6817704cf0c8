package hub

import (
	"fmt"
	"math/rand"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub/durable"
	"github.com/meshfed/meshfed/mcp"
)

// a deletion the cluster itself makes of an object the reload's breaker holds is
// forgotten when a corrected reload un-holds it: the object stays served although its
// source deleted it (until the minion happens to reconnect).
func TestClusterDeletionOfAReloadHeldObjectSurvivesTheFix(t *testing.T) {
	h := testHub(t, breakerHub)
	clk := withClock(h)
	sink := watchAs(t, h, "", "istiod")
	all := objects("shop", 12)
	mustApply(t, h, "east", push(t, vsColl, all...))
	typo := strings.Replace(breakerHub, "namespaces: [shop]", "namespaces: [shoop]", 1)
	reload(t, h, typo)
	// The cluster deletes shop/o00 (an incremental push: only the deletion).
	err := h.Apply("east", &mcp.Change{Collection: vsColl, Incremental: true, Removed: []string{"shop/o00"}})
	t.Logf("delete during the typo: %v", err)
	reload(t, h, breakerHub) // the fix
	clk.advance(time.Hour)
	h.settleBreakers()
	if b := h.Clusters()[0].Breaker; b != nil {
		t.Logf("breaker: %+v", b)
	}
	if strings.Contains(sink.names(vsColl), "shop/o00") {
		t.Errorf("shop/o00, deleted by its cluster, is still served after the fix and settle: %s", sink.names(vsColl))
	}
}

// a resource the current ownership refuses at restore stays in the state file; the
// cluster's later deletion of it is never recorded, and a restart under the old ownership
// serves it again.
func TestRestoreForgetsWhatOwnershipRefuses(t *testing.T) {
	dir := t.TempDir()
	a, stop := persistedHub(t, persistHub, dir, nil)
	mustApply(t, a, "east", push(t, vsColl, "shop/a", "shop/b"))
	stop()
	narrowed := strings.Replace(persistHub, "namespaces: [shop]", "namespaces: [shop2]", 1)
	b, stop := persistedHub(t, narrowed, dir, nil)
	// east's source now holds nothing: a full state without any object.
	_ = b.Apply("east", push(t, vsColl))
	stop()
	st, err := durable.Open(filepath.Join(dir, StateFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	state, _ := st.Load()
	st.Close()
	if n := len(state["east"].Collections[vsColl]); n != 0 {
		t.Errorf("state file still holds %d of east's VirtualServices its source deleted", n)
	}
	c, _ := persistedHub(t, persistHub, dir, nil)
	if got := servedBytes(t, c, vsColl); len(got) != 0 {
		t.Errorf("restart under the old ownership serves deleted objects: %d", len(got))
	}
}

// a staleness drop (not judged) empties what the open breaker holds but leaves it
// open: status and meshfed_hub_breaker_open say open, 0 held, forever.
func TestBreakerClosesWhenStalenessDropsWhatItHeld(t *testing.T) {
	h := testHub(t, breakerHub+"staleness: {default: 1h}\n")
	clk := withClock(h)
	s := ownSession(t, h, "east", "10.0.0.1:1")
	if err := h.apply(s.s, push(t, vsColl, objects("shop", 12)...)); err != nil {
		t.Fatal(err)
	}
	_ = h.apply(s.s, push(t, vsColl))
	h.sessionClosed(s.s)
	clk.advance(2 * time.Hour)
	h.expireStale()
	h.settleBreakers()
	if b := h.Clusters()[0].Breaker; b != nil {
		t.Errorf("breaker after the staleness drop emptied it: %+v", *b)
	}
}

// a reload that disables the breaker leaves an open one open: what it holds is never
// settled, and once the source resends the deletions it stays "open, 0 held".
func TestDisablingTheBreakerClosesIt(t *testing.T) {
	h := testHub(t, breakerHub)
	clk := withClock(h)
	mustApply(t, h, "east", push(t, vsColl, objects("shop", 12)...))
	_ = h.Apply("east", push(t, vsColl))
	reload(t, h, breakerHub+"breaker: {disabled: true}\n")
	clk.advance(time.Hour)
	h.settleBreakers()
	t.Logf("after disabling: %+v", h.Clusters()[0].Breaker)
	_ = h.Apply("east", push(t, vsColl))
	if b := h.Clusters()[0].Breaker; b != nil {
		t.Errorf("breaker after disabling and the deletions resent: %+v", *b)
	}
}

// a restored cluster whose TTL had already passed is served (the hub is ready at once)
// until the first housekeeping tick drops it.
func TestRestoredStatePastItsTTLIsNeverServed(t *testing.T) {
	dir := t.TempDir()
	twoHoursAgo := func() time.Time { return time.Now().Add(-2 * time.Hour) }
	a, stop := persistedHub(t, persistHub, dir, twoHoursAgo)
	mustApply(t, a, "east", push(t, vsColl, "shop/a"))
	mustApply(t, a, "west", push(t, vsColl, "pay/a"))
	_ = a.Apply("east", push(t, drColl))
	_ = a.Apply("west", push(t, drColl))
	stop()
	b, _ := persistedHub(t, persistHub+"staleness: {default: 1h}\n", dir, nil)
	sink := watchAs(t, b, "", "istiod")
	t.Logf("ready %v, served %q", b.Ready(), sink.names(vsColl))
	if b.Ready() && sink.names(vsColl) != "" {
		t.Errorf("ready and serving objects past their TTL: %q", sink.names(vsColl))
	}
}

// quota accounting never drifts: random writes, holds, settles, releases, reloads.
func TestStoreAccountingNeverDrifts(t *testing.T) {
	h := testHub(t, breakerHub)
	clk := withClock(h)
	rng := newRand(1)
	names := objects("shop", 30)
	pnames := objects("pay", 30)
	check := func(step int) {
		s := h.store
		s.mu.Lock()
		defer s.mu.Unlock()
		coll := map[string]int64{}
		for _, idx := range s.index {
			for _, c := range idx {
				for _, r := range c {
					coll[r.collection] += servedSize(r)
				}
			}
		}
		for c, v := range s.usage[DefaultTenant].coll {
			if coll[c] != v {
				t.Fatalf("step %d: the tenant's usage of %s = %d, index says %d", step, c, v, coll[c])
			}
		}
		for _, d := range s.clusters {
			n, b := 0, int64(0)
			for _, m := range d.colls {
				for _, r := range m {
					n++
					b += servedSize(r)
				}
			}
			if n != d.objects || b != d.bytes {
				t.Fatalf("step %d: %s objects %d/%d bytes %d/%d", step, d.name, d.objects, n, d.bytes, b)
			}
			cnt := 0
			for _, m := range d.held.names {
				cnt += len(m)
			}
			if cnt != d.held.count {
				t.Fatalf("step %d: %s held count %d, names %d", step, d.name, d.held.count, cnt)
			}
		}
	}
	for step := 0; step < 3000; step++ {
		cl, ns := "east", names
		if rng.Intn(2) == 0 {
			cl, ns = "west", pnames
		}
		coll := vsColl
		if rng.Intn(2) == 0 {
			coll = drColl
		}
		switch rng.Intn(8) {
		case 0, 1, 2:
			var pick []string
			for _, n := range ns {
				if rng.Intn(3) > 0 {
					pick = append(pick, n)
				}
			}
			_ = h.Apply(cl, push(t, coll, pick...))
		case 3:
			_ = h.Apply(cl, push(t, coll))
		case 4:
			clk.advance(time.Duration(rng.Intn(3)) * time.Second)
			h.settleBreakers()
		case 5:
			_, _ = h.ReleaseBreaker(cl, "op", digestOf(t, h, cl))
		case 6:
			if rng.Intn(2) == 0 {
				reload(t, h, strings.Replace(breakerHub, "namespaces: [shop]", "namespaces: [shoop]", 1))
			} else {
				reload(t, h, breakerHub)
			}
		case 7:
			c := push(t, coll, ns[rng.Intn(len(ns))])
			c.Incremental = true
			c.Removed = []string{ns[rng.Intn(len(ns))]}
			_ = h.Apply(cl, c)
		}
		check(step)
	}
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }

// concurrent takeovers, pushes, closes and settles under -race.
func TestConcurrentTakeoversNeverMixStates(t *testing.T) {
	// Each takeover replaces the two objects the previous writer had: within a window, the
	// breaker would hold them as a drain, and what is tested is that writes never interleave.
	h := testHub(t, breakerHub+"breaker: {window: 0s}\n")
	sink := watchAs(t, h, "", "istiod")
	done := make(chan struct{})
	var sessions [4]*fakeSession
	for i := range sessions {
		sessions[i] = ownSession(t, h, "east", fmt.Sprintf("10.0.0.%d:1", i))
	}
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				s := sessions[i]
				names := []string{fmt.Sprintf("shop/w%d-a", i), fmt.Sprintf("shop/w%d-b", i)}
				_ = h.apply(s.s, push(t, vsColl, names...))
				got := sink.names(vsColl)
				if got != "" && strings.Count(got, ",") != 1 {
					select {
					case <-done:
					default:
						t.Errorf("mixed state: %s", got)
						close(done)
					}
				}
				if j%50 == 49 {
					h.sessionClosed(s.s)
					sessions[i] = ownSession(t, h, "east", fmt.Sprintf("10.0.1.%d:%d", i, j))
				}
			}
		}()
	}
	wg.Wait()
}

// a rollout that renames every object (same count before and after) trips the breaker;
// old and new objects are then served side by side until a release.
func TestBreakerLetsARenameThrough(t *testing.T) {
	h := testHub(t, breakerHub)
	withClock(h)
	sink := watchAs(t, h, "", "istiod")
	var v1, v2 []string
	for i := range 12 {
		v1 = append(v1, fmt.Sprintf("shop/app%02d-v1", i))
		v2 = append(v2, fmt.Sprintf("shop/app%02d-v2", i))
	}
	mustApply(t, h, "east", push(t, vsColl, v1...))
	err := h.Apply("east", push(t, vsColl, v2...))
	t.Logf("rename: %v", err)
	if n := countNames(sink.names(vsColl)); n != 12 {
		t.Errorf("a rename of 12 objects serves %d (breaker: %+v)", n, h.Clusters()[0].Breaker)
	}
}

// the ownership typo that a hot reload's breaker holds is applied silently when it
// arrives with a restart (a ConfigMap rollout): every restored object refused, no breaker.
func TestBreakerGuardsATypoArrivingWithARestart(t *testing.T) {
	dir := t.TempDir()
	a, stop := persistedHub(t, persistHub, dir, nil)
	mustApply(t, a, "east", push(t, vsColl, objects("shop", 12)...))
	_ = a.Apply("east", push(t, drColl))
	_ = a.Apply("west", push(t, vsColl))
	_ = a.Apply("west", push(t, drColl))
	stop()
	typo := strings.Replace(persistHub, "namespaces: [shop]", "namespaces: [shoop]", 1)
	b, _ := persistedHub(t, typo, dir, nil)
	sink := watchAs(t, b, "", "istiod")
	t.Logf("ready %v, breaker %+v", b.Ready(), b.Clusters()[0].Breaker)
	if n := countNames(sink.names(vsColl)); n != 12 {
		t.Errorf("after a restart with the typo, %d of east's 12 objects are served (ready %v)", n, b.Ready())
	}
}
