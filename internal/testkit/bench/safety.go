package bench

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/bench/load"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// The hub's safety scenarios (issue 14): a cluster flooding at its push quota next to a
// quiet one, and a sink that never ACKs. Each is measured against a baseline in the same
// run.

// pushWatch follows one cluster's source as the hub answers it: the pushes the hub ACKed
// and the latest source version ACKed.
type pushWatch struct {
	acks  atomic.Int64  // ACKs (applied pushes)
	acked atomic.Uint64 // the latest version ACKed
	nacks atomic.Int64
	nack  atomic.Value  // string: the last NACK's message
	took  atomic.Int64  // the last ACK's latency (push to ACK), in nanoseconds
	sent  chan struct{} // poked (non-blocking) after every push the source sends
	ack   chan struct{} // poked (non-blocking) after every ACK
}

func newPushWatch() *pushWatch {
	return &pushWatch{sent: make(chan struct{}, 1), ack: make(chan struct{}, 1)}
}

func (w *pushWatch) hooks() mcp.Hooks {
	poke := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	return mcp.Hooks{
		Pushed: func(*mcp.StreamInfo, mcp.PushEvent) { poke(w.sent) },
		Acked: func(_ *mcp.StreamInfo, e mcp.AckEvent) {
			if e.Code != codes.OK {
				w.nacks.Add(1)
				w.nack.Store(e.Message)
			} else {
				w.acks.Add(1)
				w.took.Store(int64(e.Latency))
				for v := w.acked.Load(); e.Version > v && !w.acked.CompareAndSwap(v, e.Version); v = w.acked.Load() {
				}
			}
			poke(w.ack)
		},
	}
}

// waitAcked waits until the hub has ACKed version v of the source.
func (w *pushWatch) waitAcked(v uint64) error {
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for w.acked.Load() < v {
		select {
		case <-w.ack:
		case <-timeout.C:
			return fmt.Errorf("the hub did not ACK version %d in 30s (last %d, %d NACKs, the last: %v)", v, w.acked.Load(), w.nacks.Load(), w.nack.Load())
		}
	}
	return nil
}

// markedResource is resource name whose body carries mark (a letter and a sequence
// number) first, then lowercase padding up to about size bytes: a sink finds the mark in a
// push's bytes without decoding it.
func markedResource(name string, mark byte, seq, size int) *mcp.Entry {
	m := markOf(mark, seq)
	pad := make([]byte, max(size-len(m), 0))
	for j := range pad {
		pad[j] = 'a' + byte((seq+j)%26)
	}
	// A Struct: the bench kind has no message type, and a hub that checks bodies wants its
	// content as a Struct.
	spec, err := structpb.NewStruct(map[string]any{"spec": m + string(pad)})
	if err != nil {
		panic(err)
	}
	body, err := anypb.New(spec)
	if err != nil {
		panic(err)
	}
	e, err := mcp.NewEntry(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: m}, Body: body})
	if err != nil {
		panic(err)
	}
	return e
}

const markDigits = 8

func markOf(mark byte, seq int) string { return fmt.Sprintf("%c#%0*d", mark, markDigits, seq) }

// maxMark returns the highest sequence number marked with mark in b, or -1.
func maxMark(b []byte, mark byte) int {
	prefix := []byte{mark, '#'}
	best := -1
	for {
		i := bytes.Index(b, prefix)
		if i < 0 {
			return best
		}
		b = b[i+len(prefix):]
		if len(b) < markDigits {
			return best
		}
		n := 0
		for _, d := range b[:markDigits] {
			if d < '0' || d > '9' {
				n = -1
				break
			}
			n = n*10 + int(d-'0')
		}
		best = max(best, n)
	}
}

// markSinks are incremental sinks of hubCollection that ACK every push at once and look
// for marks in it: the highest of each mark seen so far, per sink, and a receipt (the
// sequence number, the time the push arrived, and the time the sink's previous push
// arrived) each time a sink sees a new highest of the reported mark.
type markSinks struct {
	n        int
	highest  map[byte][]atomic.Int64 // mark -> per sink
	receipts chan receipt
	first    chan struct{} // one per sink, at its first push
	cancel   func()
	wg       sync.WaitGroup
	conns    []*grpc.ClientConn
}

type receipt struct {
	seq      int
	at, prev time.Time // this push's arrival, and the sink's previous push's
}

// samples are one condition's deliveries of B's changes: at every sink (all; clear and
// behind split them by whether a push of another cluster reached that sink after the change
// was made), B's push to the hub's ACK (ingest), and the process's CPU over wall time.
type samples struct {
	all, ingest, clear, behind []time.Duration
	cpu, wall                  time.Duration
	heap                       float64 // MiB after GC, the largest seen (where a row records it)
}

// changer makes one cluster's measured changes: next puts the next one in its cache and
// seq says its number; n sinks receive them, watch follows the hub's ACKs.
type changer struct {
	cache *mcp.Cache
	watch *pushWatch
	sinks *markSinks
	n     int
	gap   time.Duration
	next  func() *mcp.Entry
	seq   func() int
}

// measureChanges makes count changes through ch, each awaited at every sink and ACKed by
// the hub, gap apart, and adds what they took to c.
func measureChanges(c *samples, ch changer, count int) error {
	cpu0, wall0 := cpuTime(), time.Now()
	defer func() { c.cpu, c.wall = c.cpu+cpuTime()-cpu0, c.wall+time.Since(wall0) }()
	for range count {
		e := ch.next()
		seq := ch.seq()
		got := 0
		t0 := time.Now()
		v := ch.cache.Put(hubCollection, e)
		timeout := time.NewTimer(30 * time.Second)
		for range ch.n {
			select {
			case r := <-ch.sinks.receipts:
				if r.seq != seq {
					timeout.Stop()
					return fmt.Errorf("a sink received B's change %d while %d was expected", r.seq, seq)
				}
				got++
				d := r.at.Sub(t0)
				c.all = append(c.all, d)
				if r.prev.After(t0) {
					c.behind = append(c.behind, d)
				} else {
					c.clear = append(c.clear, d)
				}
			case <-timeout.C:
				return fmt.Errorf("B's change %d (version %d) reached %d of %d sinks in 30s; the hub ACKed B's version %d (%d NACKs, the last: %v); sinks' highest B: %v",
					seq, v, got, ch.n, ch.watch.acked.Load(), ch.watch.nacks.Load(), ch.watch.nack.Load(), ch.sinks.highestOf('B'))
			}
		}
		timeout.Stop()
		if err := ch.watch.waitAcked(v); err != nil {
			return err
		}
		c.ingest = append(c.ingest, time.Duration(ch.watch.took.Load()))
		time.Sleep(ch.gap)
	}
	return nil
}

// startMarkSinks connects n sinks to addr. Sinks in stall receive their first push and then
// neither read nor ACK again. Receipts are sent for report. With identity, sink i subscribes
// as identity(i), in the development identity header (so that the hub takes it for a
// tenant's).
func startMarkSinks(addr string, n int, marks string, report byte, stall func(i int) bool, identity func(i int) string) (*markSinks, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &markSinks{n: n, highest: map[byte][]atomic.Int64{}, receipts: make(chan receipt, 2*n), first: make(chan struct{}, n), cancel: cancel}
	for _, m := range []byte(marks) {
		h := make([]atomic.Int64, n)
		for i := range h {
			h[i].Store(-1)
		}
		s.highest[m] = h
	}
	codecOpt := grpc.ForceCodecV2(load.RawCodec{})
	for i := range n {
		if i%100 == 0 {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				s.stop()
				return nil, err
			}
			s.conns = append(s.conns, cc)
		}
		cc := s.conns[len(s.conns)-1]
		sctx := ctx
		if identity != nil {
			sctx = metadata.AppendToOutgoingContext(ctx, hub.DevIdentityHeader, identity(i))
		}
		st, err := cc.NewStream(sctx, &mcppb.ResourceSource_ServiceDesc.Streams[0], mcppb.ResourceSource_EstablishResourceStream_FullMethodName, codecOpt)
		if err == nil {
			err = st.SendMsg(&mcppb.RequestResources{Collection: hubCollection, Incremental: true})
		}
		if err != nil {
			s.stop()
			return nil, err
		}
		stalls := stall != nil && stall(i)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			var prev time.Time
			for first := true; ; first = false {
				var f load.RawMsg
				if err := st.RecvMsg(&f); err != nil {
					return
				}
				at := time.Now()
				if first {
					s.first <- struct{}{}
					if stalls {
						<-ctx.Done()
						return
					}
				}
				if err := st.SendMsg(&mcppb.RequestResources{Collection: hubCollection, ResponseNonce: load.ScanNonce(f.B), Incremental: true}); err != nil {
					return
				}
				r := receipt{seq: -1, at: at, prev: prev}
				prev = at
				for m, h := range s.highest {
					if seq := maxMark(f.B, m); int64(seq) > h[i].Load() {
						h[i].Store(int64(seq))
						if m == report {
							r.seq = seq
						}
					}
				}
				if r.seq >= 0 && !first {
					select {
					case s.receipts <- r:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	return s, nil
}

// waitFirst waits until every sink has received its first push.
func (s *markSinks) waitFirst() error {
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	for range s.n {
		select {
		case <-s.first:
		case <-timeout.C:
			return fmt.Errorf("not every sink received its first push in 60s")
		}
	}
	return nil
}

// waitSeen waits until every sink has seen mark's seq.
func (s *markSinks) waitSeen(mark byte, seq int) error {
	deadline := time.Now().Add(30 * time.Second)
	for i := range s.n {
		for s.highest[mark][i].Load() < int64(seq) {
			if time.Now().After(deadline) {
				return fmt.Errorf("sink %d did not see %s in 30s (it saw %d)", i, markOf(mark, seq), s.highest[mark][i].Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// highestOf counts the sinks by the highest of mark they saw.
func (s *markSinks) highestOf(mark byte) map[int64]int {
	out := map[int64]int{}
	for i := range s.highest[mark] {
		out[s.highest[mark][i].Load()]++
	}
	return out
}

func (s *markSinks) stop() {
	s.cancel()
	s.wg.Wait()
	for _, cc := range s.conns {
		cc.Close()
	}
}

// NeighbourConfig describes the noisy-neighbour scenario.
type NeighbourConfig struct {
	// Sinks follow the hub; each receives both clusters' resources (one collection).
	Sinks int
	// Changes of cluster B measured, in each condition (A idle, A flooding).
	Changes int
	// Rounds alternate A idle and A flooding, Changes/Rounds of B's changes each, so that
	// both conditions see the same machine.
	Rounds int
	// Resources each cluster holds, and the body size of each.
	Resources, Size int
	// PushesPerSecond and PushBurst are A's push quota.
	PushesPerSecond float64
	PushBurst       int
	// Gap is the pause between two of B's changes: B stays far below its own quota (the
	// hub's default), so that only A's flood can slow it.
	Gap time.Duration
}

// Latencies is a delivery-time distribution.
type Latencies struct {
	P50, P99, Max time.Duration
	N             int
}

func distribution(lat []time.Duration) Latencies {
	if len(lat) == 0 {
		return Latencies{}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return Latencies{P50: lat[len(lat)/2], P99: lat[len(lat)*99/100], Max: lat[len(lat)-1], N: len(lat)}
}

// Deliveries are cluster B's changes in one condition (A idle, or A flooding).
type Deliveries struct {
	// Latencies: B's cache to a sink, every sink's receipt of every change.
	Latencies
	// Ingest: per change, B's push to the hub's ACK, as B's source measures it (the ACL,
	// the store, the merge and the view update happen in between).
	Ingest Latencies
	// Behind are the receipts by a sink that received another push (A's) after B's change
	// was made. The engine keeps one push outstanding per collection: if that push was
	// outstanding when B's change reached the view, B's change waited for the sink's ACK
	// of it; if it was sent while B's change was still on its way in, it held nothing up.
	// So Behind is an upper bound on the receipts A's pushes held up. Clear are the others.
	Clear, Behind Latencies
	// Cores is the process's CPU (hub, both clusters' sources, the sinks) per second of
	// wall time while B was measured.
	Cores float64
}

func deliveries(all, ingest, clear, behind []time.Duration) Deliveries {
	return Deliveries{Latencies: distribution(all), Ingest: distribution(ingest), Clear: distribution(clear), Behind: distribution(behind)}
}

// NeighbourResult is cluster B's minion → hub → sink latency with A idle and with A
// flooding at its quota, and what A achieved.
type NeighbourResult struct {
	Idle, Flood Deliveries
	// APushesPerSec is the rate of A's pushes the hub applied while B was measured under
	// the flood (after each flood block's warm-up, which drains A's burst).
	APushesPerSec float64
	// AChangesPerPush is how many of A's changes one of its pushes carried, on average.
	AChangesPerPush float64
	// FloodSeconds is the time B was measured under the flood.
	FloodSeconds float64
}

// NoisyNeighbour runs two clusters on one hub: A (c000), whose pushes are paced by its
// quota (cfg.PushesPerSecond, cfg.PushBurst), and B (c001), on the hub's default quota.
// cfg.Sinks incremental sinks follow the hub and ACK at once. B makes one change at a time
// (one resource), cfg.Gap apart, and the time from B's cache to each sink is recorded, in
// rounds alternating A idle and A flooding: A changes one of its resources each time its
// source sends a push, so that a change always waits for the next push and A pushes as
// fast as the hub lets it.
func NoisyNeighbour(cfg NeighbourConfig) (NeighbourResult, error) {
	var res NeighbourResult
	cfg.Rounds = max(cfg.Rounds, 1)
	perBlock := max(cfg.Changes/cfg.Rounds, 1)
	a, bName := clusterName(0), clusterName(1)
	b, err := startHub(2, func(c *hub.Config) {
		c.Clusters[0].Quotas = &hub.QuotaConfig{PushesPerSecond: cfg.PushesPerSecond, PushBurst: cfg.PushBurst}
	})
	if err != nil {
		return res, err
	}
	defer b.stop()
	caches := []*mcp.Cache{mcp.NewCache(hubCollection), mcp.NewCache(hubCollection)}
	watches := []*pushWatch{newPushWatch(), newPushWatch()}
	name := func(cluster string, j int) string { return fmt.Sprintf("%s/r%04d", cluster, j%cfg.Resources) }
	for i, cl := range []string{a, bName} {
		put := make([]*mcp.Entry, cfg.Resources)
		for j := range put {
			put[j] = markedResource(name(cl, j), "AB"[i], 0, cfg.Size)
		}
		caches[i].Put(hubCollection, put...)
		c, err := b.connect(cl, caches[i], watches[i].hooks())
		if err != nil {
			return res, err
		}
		defer c.stop()
	}
	if err := b.waitReady(); err != nil {
		return res, err
	}
	sinks, err := startMarkSinks(b.serve, cfg.Sinks, "AB", 'B', nil, nil)
	if err != nil {
		return res, err
	}
	defer sinks.stop()
	if err := sinks.waitFirst(); err != nil {
		return res, err
	}

	aSeq, bSeq := 0, 0
	// flood runs A's flood until stop is closed: a change as soon as A's previous push was
	// sent. It returns A's last change and its cache version.
	flood := func(stop <-chan struct{}) (seq int, version uint64) {
		for {
			aSeq++
			version = caches[0].Put(hubCollection, markedResource(name(a, aSeq), 'A', aSeq, cfg.Size))
			select {
			case <-watches[0].sent:
			case <-stop:
				return aSeq, version
			}
		}
	}
	measureB := func(c *samples) error {
		return measureChanges(c, changer{cache: caches[1], watch: watches[1], sinks: sinks, n: cfg.Sinks, gap: cfg.Gap,
			next: func() *mcp.Entry { bSeq++; return markedResource(name(bName, bSeq), 'B', bSeq, cfg.Size) }, seq: func() int { return bSeq }}, perBlock)
	}
	var idle, flooded samples
	var floodTime time.Duration
	var measuredPushes, aPushes, aChanges int64
	for range cfg.Rounds {
		if err := measureB(&idle); err != nil {
			return res, err
		}
		stop := make(chan struct{})
		type last struct {
			seq     int
			version uint64
		}
		done := make(chan last, 1)
		seq0, acks0 := aSeq, watches[0].acks.Load()
		go func() { s, v := flood(stop); done <- last{s, v} }()
		// Warm up: A spends what its burst holds (its bucket refilled while it was idle)
		// before B is measured, so that B meets A pushing at its rate.
		warmErr := waitPaced(watches[0], cfg.PushesPerSecond)
		measured0, t0 := watches[0].acks.Load(), time.Now()
		if warmErr == nil {
			err = measureB(&flooded)
		}
		floodTime += time.Since(t0)
		measuredPushes += watches[0].acks.Load() - measured0
		close(stop)
		l := <-done
		if warmErr != nil {
			return res, warmErr
		}
		if err != nil {
			return res, err
		}
		// Quiet again: A's last change is applied and every sink has it.
		if err := watches[0].waitAcked(l.version); err != nil {
			return res, err
		}
		if err := sinks.waitSeen('A', l.seq); err != nil {
			return res, err
		}
		aChanges += int64(l.seq - seq0)
		aPushes += watches[0].acks.Load() - acks0
	}
	res.Idle = deliveries(idle.all, idle.ingest, idle.clear, idle.behind)
	res.Flood = deliveries(flooded.all, flooded.ingest, flooded.clear, flooded.behind)
	res.Idle.Cores, res.Flood.Cores = idle.cpu.Seconds()/idle.wall.Seconds(), flooded.cpu.Seconds()/flooded.wall.Seconds()
	res.FloodSeconds = floodTime.Seconds()
	res.APushesPerSec = float64(measuredPushes) / floodTime.Seconds()
	res.AChangesPerPush = float64(aChanges) / float64(max(aPushes, 1))
	return res, nil
}

// waitPaced waits until the source w watches is being paced at about rate pushes a second:
// two windows in a row in which the hub ACKed no more than 1.5 times the rate.
func waitPaced(w *pushWatch, rate float64) error {
	const window = 50 * time.Millisecond
	limit := int64(rate*window.Seconds()*1.5) + 1
	calm := 0
	for deadline := time.Now().Add(30 * time.Second); calm < 2; {
		if time.Now().After(deadline) {
			return fmt.Errorf("the flooding cluster was not paced at %.0f pushes/s after 30s", rate)
		}
		before := w.acks.Load()
		time.Sleep(window)
		if w.acks.Load()-before <= limit {
			calm++
		} else {
			calm = 0
		}
	}
	return nil
}

// StalledConfig describes the stalled-sink scenario.
type StalledConfig struct {
	// Resources in the one cluster's collection, and their body size.
	Resources, Size int
	// Early and Changes: the heap is measured after Early changes and after Changes.
	Early, Changes int
}

// StalledResult is the process heap (after GC) with a sink that never ACKs, and with one
// that ACKs every push (the baseline), after cfg.Early and after cfg.Changes changes.
type StalledResult struct {
	StalledEarlyMiB, StalledLateMiB float64
	AckingEarlyMiB, AckingLateMiB   float64
}

// StalledSink runs one cluster pushing cfg.Changes one-resource changes, each its own push
// and version at the hub (the cluster's push quota is lifted, and each change waits for
// the hub's ACK of the previous one), to a hub followed by one incremental sink: once a sink
// that receives its first push and then neither reads nor ACKs, once (the baseline) a sink
// that ACKs every push. Everything runs in this process; the heap is the process's.
func StalledSink(cfg StalledConfig) (StalledResult, error) {
	var res StalledResult
	var err error
	if res.AckingEarlyMiB, res.AckingLateMiB, err = stalledRun(cfg, false); err != nil {
		return res, fmt.Errorf("acking sink: %w", err)
	}
	if res.StalledEarlyMiB, res.StalledLateMiB, err = stalledRun(cfg, true); err != nil {
		return res, fmt.Errorf("stalled sink: %w", err)
	}
	return res, nil
}

func stalledRun(cfg StalledConfig, stall bool) (early, late float64, err error) {
	name := clusterName(0)
	b, err := startHub(1, func(c *hub.Config) {
		c.Clusters[0].Quotas = &hub.QuotaConfig{PushesPerSecond: 1e9, PushBurst: 1 << 30}
	})
	if err != nil {
		return 0, 0, err
	}
	defer b.stop()
	cache := mcp.NewCache(hubCollection)
	res := func(j int) string { return fmt.Sprintf("bench/r%04d", j%cfg.Resources) }
	put := make([]*mcp.Entry, cfg.Resources)
	for j := range put {
		put[j] = markedResource(res(j), 'S', 0, cfg.Size)
	}
	cache.Put(hubCollection, put...)
	w := newPushWatch()
	c, err := b.connect(name, cache, w.hooks())
	if err != nil {
		return 0, 0, err
	}
	defer c.stop()
	if err := b.waitReady(); err != nil {
		return 0, 0, err
	}
	sinks, err := startMarkSinks(b.serve, 1, "S", 0, func(int) bool { return stall }, nil)
	if err != nil {
		return 0, 0, err
	}
	defer sinks.stop()
	if err := sinks.waitFirst(); err != nil {
		return 0, 0, err
	}
	heapAt := func(seq int) (float64, error) {
		if !stall { // the baseline sink has caught up
			if err := sinks.waitSeen('S', seq); err != nil {
				return 0, err
			}
		}
		return heapMiB(), nil
	}
	for seq := 1; seq <= cfg.Changes; seq++ {
		v := cache.Put(hubCollection, markedResource(res(seq), 'S', seq, cfg.Size))
		if err := w.waitAcked(v); err != nil {
			return 0, 0, err
		}
		if seq == cfg.Early {
			if early, err = heapAt(seq); err != nil {
				return 0, 0, err
			}
		}
	}
	late, err = heapAt(cfg.Changes)
	return early, late, err
}
