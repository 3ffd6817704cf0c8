package hub

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/mcp"
)

// queueAt starts a writer of key that records its turn in order once it holds g, and
// returns once it waits (g is held: it cannot get in before the test lets it).
func queueAt(g *fairGate, wg *sync.WaitGroup, order *[]string, key string) {
	want := g.waiting() + 1
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.enter(key)
		*order = append(*order, key) // the gate excludes every other writer
		g.leave()
	}()
	for g.waiting() != want {
		runtime.Gosched()
	}
}

// Writers waiting for the gate get in by turns of their keys, each key's in the order they
// came: a key with many writers queued delays another key's by one write at most.
func TestFairGateTakesKeysInTurns(t *testing.T) {
	g := newFairGate()
	g.enter("holder")
	var order []string
	var wg sync.WaitGroup
	for _, k := range []string{"a", "a", "a", "a", "a", "b", "c", "b", "a"} {
		queueAt(g, &wg, &order, k)
	}
	g.leave()
	wg.Wait()
	if got, want := strings.Join(order, " "), "a b c a b a a a a"; got != want {
		t.Errorf("order %q, want %q", got, want)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy || len(g.turns) != 0 || len(g.queues) != 0 {
		t.Errorf("after every writer left: busy %v, turns %v, queues %v", g.busy, g.turns, g.queues)
	}
}

// A key that comes while another's writers wait is next but one, however many wait; and
// the turns go on with the keys that still have writers.
func TestFairGateLateKeyWaitsOneWrite(t *testing.T) {
	for _, queued := range []int{1, 10, 100} {
		t.Run(fmt.Sprint(queued), func(t *testing.T) {
			g := newFairGate()
			g.enter("flood")
			var order []string
			var wg sync.WaitGroup
			for range queued {
				queueAt(g, &wg, &order, "flood")
			}
			queueAt(g, &wg, &order, "quiet")
			g.leave()
			wg.Wait()
			at := -1
			for i, k := range order {
				if k == "quiet" {
					at = i
				}
			}
			if at != 1 {
				t.Errorf("with %d writers of another key queued, the late key got in at %d, want 1 (after the first of them)", queued, at)
			}
		})
	}
}

// One writer at a time, whatever the keys (the race detector checks inside).
func TestFairGateExcludes(t *testing.T) {
	g := newFairGate()
	inside, total := 0, 0
	var wg sync.WaitGroup
	for k := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				g.enter(fmt.Sprint(k % 3))
				inside++
				if inside != 1 {
					t.Errorf("%d writers inside", inside)
				}
				total++
				inside--
				g.leave()
			}
		}()
	}
	wg.Wait()
	if total != 8*200 {
		t.Errorf("%d writes, want %d", total, 8*200)
	}
}

// benchHub is tenantHub for a benchmark, its write path with or without the gate.
func benchHub(b *testing.B, gated bool) *Hub {
	b.Helper()
	h := testHub(b, strings.Replace(tenantHub, "  ACME\n", "", 1))
	if !gated {
		h.store.gate = nil
	}
	return h
}

// edit is an incremental push of one VirtualService, name, at version.
func edit(b testing.TB, name string, version int) *mcp.Change {
	body, err := anypb.New(&networking.VirtualService{Hosts: []string{"reviews"}})
	if err != nil {
		b.Fatal(err)
	}
	r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: fmt.Sprint(version)}, Body: body}
	e, err := mcp.NewEntry(r)
	if err != nil {
		b.Fatal(err)
	}
	return &mcp.Change{Collection: vsColl, Incremental: true, Entries: []*mcp.Entry{e}, Resources: []*mcpapi.Resource{r}}
}

// The write path with the gate, against the same path without it, in the same run: one
// writer (uncontended), and writers of both tenants at once (contended, where the gate
// hands the store over in turns). gate/enter-leave is the gate alone.
func BenchmarkWritePath(b *testing.B) {
	for _, mode := range []string{"baseline", "gate"} {
		b.Run("uncontended/"+mode, func(b *testing.B) {
			h := benchHub(b, mode == "gate")
			changes := make([]*mcp.Change, 64)
			for i := range changes {
				changes[i] = edit(b, fmt.Sprintf("shop/o%d", i%8), i)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := h.Apply("east", changes[i%len(changes)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("contended/"+mode, func(b *testing.B) {
			h := benchHub(b, mode == "gate")
			var next atomic.Int32
			clusters := []struct{ name, ns string }{{"east", "shop"}, {"west", "cart"}, {"north", "bank"}}
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				cl := clusters[int(next.Add(1))%len(clusters)]
				changes := make([]*mcp.Change, 64)
				for i := range changes {
					changes[i] = edit(b, fmt.Sprintf("%s/o%d", cl.ns, i%8), i)
				}
				for i := 0; pb.Next(); i++ {
					if err := h.Apply(cl.name, changes[i%len(changes)]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	b.Run("gate/enter-leave", func(b *testing.B) {
		g := newFairGate()
		for b.Loop() {
			g.enter("a")
			g.leave()
		}
	})
}

// What a write costs under the store's lock as other tenants' sinks are added: every
// tenant has one view open (one sink each), and only tenant t000's cluster writes. Its
// sinks are the same whatever the number of tenants; what grows is the others'.
func BenchmarkWriteWithOtherTenantsViews(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			var y strings.Builder
			y.WriteString("insecure: true\ncollections: [istio/networking/v1alpha3/virtualservices]\nwarmUp: 1h\ntenants:\n")
			for i := range n {
				fmt.Fprintf(&y, "- name: t%03d\n  sinks: [\"t%03d-*\"]\n  clusters: [{name: c%03d, identities: [c%03d], namespaces: [n%03d], hosts: [\"*.n%03d.svc.cluster.local\"]}]\n  routing: {rules: [{name: all, identities: [\"*\"]}]}\n", i, i, i, i, i, i)
			}
			h := testHub(b, y.String())
			for i := range n {
				info := mcp.NewStreamInfo(fmt.Sprintf("t%03d-istiod", i), nil, func() {})
				_, cancel, _ := router{h}.Watch(info, vsColl, func() {})
				b.Cleanup(cancel)
			}
			changes := make([]*mcp.Change, 64)
			for i := range changes {
				changes[i] = edit(b, fmt.Sprintf("n000/o%d", i%8), i)
			}
			for i := 0; b.Loop(); i++ {
				if err := h.Apply("c000", changes[i%len(changes)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
