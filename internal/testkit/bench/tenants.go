package bench

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
)

// The noisy-tenant scenario: tenant A uses everything its tenant limits admit (pushes at
// its push limit, streams opened in a tight loop, a fleet of sinks that never ACK) while
// tenant B's latency is measured, against the same with A idle, in the same run. It is the
// noisy-neighbour row (safety.go) one level up: there a cluster against another of the same
// tenant, here a tenant against another.
//
// Every goroutine the scenario starts runs under a pprof label "bench" (hub, a-flood,
// a-loop, a-sinks, b-source, b-sinks; goroutines inherit their creator's labels, gRPC's
// included), so that a CPU profile of a run (mcpbench -cpuprofile) tells the hub's time
// from the load's: everything runs in one process.

// TenantsConfig describes the noisy-tenant scenario.
type TenantsConfig struct {
	// AClusters are tenant A's clusters. Each floods, on its own quota (the hub's default
	// per-cluster one); together they want more than A's pushesPerSecond, so that A's
	// tenant limit is what paces A.
	AClusters int
	// ASinks subscribe as A's sinks, each with its own identity, receive their first push
	// and then neither read nor ACK again.
	ASinks int
	// LoopWorkers open streams as A's sinks in a tight loop while A is noisy, sharing
	// LoopConns connections (default: one each, at most 2): subscribe, wait for the first
	// push or the refusal, close, again. So LoopWorkers is the most streams the loop has in
	// flight: a hub that answers a refusal late slows a few workers, not many.
	// LoopIdentities is how many sink identities of A they take in turn: a tenant's fleet
	// has many, and with one the hub's per-peer limit refuses the loop before the tenant's
	// limit has anything to do.
	LoopWorkers, LoopConns, LoopIdentities int
	// LoopRate caps the streams the loop opens per second, all workers together (0: as
	// fast as it can): how much of a refusal storm the hub takes within the target.
	LoopRate float64
	// BSinks follow tenant B's one cluster and ACK every push at once; each of B's changes
	// is timed at each of them.
	BSinks int
	// Changes of B measured per condition (A idle, A noisy), in Rounds alternating the two
	// so that both see the same machine.
	Changes, Rounds int
	// Resources each cluster holds, and the body size of each.
	Resources, Size int
	// Gap is the pause between two of B's changes: B stays far below its own limits.
	Gap time.Duration
	// ALimits override the hub's tenantLimits for A (nil: the hub's defaults, as for B).
	ALimits *hub.TenantLimits
	// WarmUp bounds the wait, at the start of each noisy block, for A's pushes and the
	// loop's admitted streams to settle at A's limits (the bursts its buckets saved while
	// idle spent). A block whose A is still faster after it is measured anyway and counted
	// in TenantsResult.Unpaced. Default 10s.
	WarmUp time.Duration
}

// TenantDeliveries are tenant B's changes in one condition.
type TenantDeliveries struct {
	// Latencies: B's cache to a sink, every sink's receipt of every change.
	Latencies
	// Ingest: per change, B's push to the hub's ACK, as B's source measures it.
	Ingest Latencies
	// Cores is the process's CPU (hub, every source, sink and the loop) per second of wall
	// time while B was measured.
	Cores float64
	// HeapMiB is the process's heap after GC at the end of the condition's blocks (A still
	// noisy in the noisy ones), the largest.
	HeapMiB float64
}

// TenantsResult is tenant B's minion → hub → sink latency with A idle and with A noisy,
// and what A achieved while B was measured under it.
type TenantsResult struct {
	Idle, Noisy TenantDeliveries
	// APushLimit is the rate A's pushes should settle at: A's pushesPerSecond, or its
	// clusters' quotas together when those are lower. AStreamLimit is A's streamsPerSecond,
	// the rate the loop's streams should be admitted at once A's burst is spent.
	APushLimit, AStreamLimit float64
	// APushesPerSec is the rate of A's pushes the hub applied, all its clusters together;
	// AChangesPerPush how many of A's changes one push carried, on average.
	APushesPerSec, AChangesPerPush float64
	// Loop: the streams the loop opened per second, those the hub admitted (the first push
	// arrived) per second, and the refusals by gRPC code, while B was measured; LoopStreams
	// is every stream it opened, warm-ups included.
	LoopPerSec, LoopAdmittedPerSec float64
	LoopRefused                    map[string]int64
	LoopStreams                    int64
	// NoisySeconds is the time B was measured under A's noise.
	NoisySeconds float64
	// Unpaced is how many noisy blocks started with A's pushes still above APushLimit, or
	// the loop's streams still admitted above AStreamLimit, after the warm-up (see
	// TenantsConfig.WarmUp).
	Unpaced int
}

const (
	tenantA, tenantB = "a", "b"
	// Sink identities: sinkA + anything is A's (the tenant's pattern is sinkA + "*").
	sinkA, sinkB = "sink-a-", "sink-b-"
)

func aCluster(i int) string { return fmt.Sprintf("a%03d", i) }

const bCluster = "b000"

// labelled runs f with the pprof label bench=what: it and every goroutine it starts (and
// they start) carry it.
func labelled(what string, f func()) {
	pprof.Do(context.Background(), pprof.Labels("bench", what), func(context.Context) { f() })
}

// NoisyTenant runs two tenants on one hub (development mode: identities are the header's;
// the hub's default per-peer stream limits and tenant limits, A's overridden by
// cfg.ALimits). A: cfg.AClusters clusters flooding, cfg.ASinks sinks that never ACK, and
// cfg.LoopWorkers opening streams as A's sinks as fast as they can. B: one cluster with a
// minion's source and cfg.BSinks sinks that ACK at once. B makes one change at a time
// (one resource), cfg.Gap apart, and the time from B's cache to each of B's sinks is
// recorded, in rounds alternating A idle and A noisy.
func NoisyTenant(cfg TenantsConfig) (TenantsResult, error) {
	var res TenantsResult
	cfg.Rounds = max(cfg.Rounds, 1)
	cfg.LoopIdentities = max(cfg.LoopIdentities, 1)
	if cfg.WarmUp <= 0 {
		cfg.WarmUp = 10 * time.Second
	}
	perBlock := max(cfg.Changes/cfg.Rounds, 1)
	defaults := hub.Defaults()
	aLimits := defaults.TenantLimits
	if l := cfg.ALimits; l != nil {
		if l.PushesPerSecond != 0 {
			aLimits.PushesPerSecond = l.PushesPerSecond
		}
		if l.StreamsPerSecond != 0 {
			aLimits.StreamsPerSecond = l.StreamsPerSecond
		}
	}
	res.APushLimit = min(aLimits.PushesPerSecond, float64(cfg.AClusters)*defaults.Quotas.PushesPerSecond)
	res.AStreamLimit = aLimits.StreamsPerSecond

	var b *benchHub
	var err error
	labelled("hub", func() {
		b, err = startHub(0, func(c *hub.Config) {
			// Production's per-peer limits: the loop must get past them (it changes
			// identity) for A's tenant limits to be what holds it.
			c.Limits = defaults.Limits
			// And production's per-cluster quotas (startHub lifts them): A's clusters
			// flood at theirs.
			c.Quotas = defaults.Quotas
			c.Routing = routing.Config{}
			all := routing.Config{Default: &routing.Rule{Name: "all"}}
			a := hub.TenantConfig{Name: tenantA, Sinks: []string{sinkA + "*"}, Routing: all, Limits: cfg.ALimits}
			for i := range cfg.AClusters {
				n := aCluster(i)
				a.Clusters = append(a.Clusters, hub.ClusterConfig{Name: n, Identities: []string{n}, Namespaces: []string{n}})
			}
			// B's cluster changes about every Gap, faster than a cluster's default quota
			// (20/s) lets it for long: its own quota is lifted, so that only A can slow it
			// (B's tenant limits stay the defaults, far above what B does).
			bt := hub.TenantConfig{Name: tenantB, Sinks: []string{sinkB + "*"}, Routing: all,
				Clusters: []hub.ClusterConfig{{Name: bCluster, Identities: []string{bCluster}, Namespaces: []string{bCluster},
					Quotas: &hub.QuotaConfig{PushesPerSecond: 1e6, PushBurst: 1e6}}}}
			c.Tenants = []hub.TenantConfig{a, bt}
		})
	})
	if err != nil {
		return res, err
	}
	defer b.stop()

	name := func(cluster string, j int) string { return fmt.Sprintf("%s/r%04d", cluster, j%cfg.Resources) }
	source := func(label, cl string, mark byte) (*mcp.Cache, *pushWatch, *cluster, error) {
		cache := mcp.NewCache(hubCollection)
		put := make([]*mcp.Entry, cfg.Resources)
		for j := range put {
			put[j] = markedResource(name(cl, j), mark, 0, cfg.Size)
		}
		cache.Put(hubCollection, put...)
		w := newPushWatch()
		var c *cluster
		var err error
		labelled(label, func() { c, err = b.connect(cl, cache, w.hooks()) })
		return cache, w, c, err
	}
	aCaches, aWatches := make([]*mcp.Cache, cfg.AClusters), make([]*pushWatch, cfg.AClusters)
	for i := range cfg.AClusters {
		cache, w, c, err := source("a-flood", aCluster(i), 'A')
		if err != nil {
			return res, err
		}
		defer c.stop()
		aCaches[i], aWatches[i] = cache, w
	}
	bCache, bWatch, bc, err := source("b-source", bCluster, 'B')
	if err != nil {
		return res, err
	}
	defer bc.stop()
	if err := b.waitReady(); err != nil {
		return res, err
	}
	var aSinks, bSinks *markSinks
	labelled("a-sinks", func() {
		aSinks, err = startMarkSinks(b.serve, cfg.ASinks, "A", 0, func(int) bool { return true }, func(i int) string { return fmt.Sprintf("%s%04d", sinkA, i) })
	})
	if err != nil {
		return res, err
	}
	defer aSinks.stop()
	if err := aSinks.waitFirst(); err != nil {
		return res, fmt.Errorf("A's sinks: %w", err)
	}
	labelled("b-sinks", func() {
		bSinks, err = startMarkSinks(b.serve, cfg.BSinks, "B", 'B', nil, func(i int) string { return fmt.Sprintf("%s%04d", sinkB, i) })
	})
	if err != nil {
		return res, err
	}
	defer bSinks.stop()
	if err := bSinks.waitFirst(); err != nil {
		return res, fmt.Errorf("B's sinks: %w", err)
	}
	var lp *streamLoop
	if cfg.LoopConns <= 0 {
		cfg.LoopConns = min(cfg.LoopWorkers, 2)
	}
	labelled("a-loop", func() {
		lp, err = newStreamLoop(b.serve, cfg.LoopWorkers, min(cfg.LoopConns, cfg.LoopWorkers), cfg.LoopIdentities, cfg.LoopRate)
	})
	if err != nil {
		return res, err
	}
	defer lp.close()

	aSeq := make([]int, cfg.AClusters)
	bSeq := 0
	// flood runs A's cluster i's flood until stop is closed: a change as soon as its
	// previous push was sent. It returns its last change's cache version.
	flood := func(i int, stop <-chan struct{}) uint64 {
		for {
			aSeq[i]++
			v := aCaches[i].Put(hubCollection, markedResource(name(aCluster(i), aSeq[i]), 'A', aSeq[i], cfg.Size))
			select {
			case <-aWatches[i].sent:
			case <-stop:
				return v
			}
		}
	}
	aAcks := func() int64 {
		var n int64
		for _, w := range aWatches {
			n += w.acks.Load()
		}
		return n
	}
	measureB := func(c *samples) error {
		return measureChanges(c, changer{cache: bCache, watch: bWatch, sinks: bSinks, n: cfg.BSinks, gap: cfg.Gap,
			next: func() *mcp.Entry { bSeq++; return markedResource(name(bCluster, bSeq), 'B', bSeq, cfg.Size) }, seq: func() int { return bSeq }}, perBlock)
	}
	var idle, noisy samples
	var noisyTime time.Duration
	var measuredPushes, aPushes, aChanges int64
	var loopN loopCounts
	for range cfg.Rounds {
		if err := measureB(&idle); err != nil {
			return res, err
		}
		idle.heap = max(idle.heap, heapMiB())

		stop := make(chan struct{})
		var wg sync.WaitGroup
		last := make([]uint64, cfg.AClusters)
		seq0, acks0 := sum(aSeq), aAcks()
		labelled("a-flood", func() {
			for i := range cfg.AClusters {
				wg.Add(1)
				go func() { defer wg.Done(); last[i] = flood(i, stop) }()
			}
		})
		labelled("a-loop", lp.start)
		// Warm up: A spends what its buckets saved while it was idle before B is measured,
		// so that B meets A at its limits.
		paced := waitPacedBy(cfg.WarmUp, pace{aAcks, res.APushLimit}, pace{lp.admitted, res.AStreamLimit})
		if !paced {
			res.Unpaced++
		}
		measured0, c0, t0 := aAcks(), lp.counts(), time.Now()
		err = measureB(&noisy)
		noisyTime += time.Since(t0)
		measuredPushes += aAcks() - measured0
		c1 := lp.counts()
		loopN = loopN.add(c1.sub(c0))
		if err == nil {
			noisy.heap = max(noisy.heap, heapMiB())
		}
		lp.stop()
		close(stop)
		wg.Wait()
		if err != nil {
			return res, err
		}
		// Quiet again: A's last changes are applied (its sinks never take them).
		for i, w := range aWatches {
			if err := w.waitAcked(last[i]); err != nil {
				return res, fmt.Errorf("A's cluster %s: %w", aCluster(i), err)
			}
		}
		aChanges += int64(sum(aSeq) - seq0)
		aPushes += aAcks() - acks0
	}
	dist := func(s samples) TenantDeliveries {
		return TenantDeliveries{Latencies: distribution(s.all), Ingest: distribution(s.ingest), Cores: s.cpu.Seconds() / s.wall.Seconds(), HeapMiB: s.heap}
	}
	res.Idle, res.Noisy = dist(idle), dist(noisy)
	res.NoisySeconds = noisyTime.Seconds()
	res.APushesPerSec = float64(measuredPushes) / noisyTime.Seconds()
	res.AChangesPerPush = float64(aChanges) / float64(max(aPushes, 1))
	res.LoopPerSec = float64(loopN.opened) / noisyTime.Seconds()
	res.LoopAdmittedPerSec = float64(loopN.admitted) / noisyTime.Seconds()
	res.LoopRefused = loopN.refused
	res.LoopStreams = lp.counts().opened
	return res, nil
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// pace is a counter that should grow at about rate a second.
type pace struct {
	count func() int64
	rate  float64
}

// waitPacedBy waits until every counter grows at about its rate: two windows in a row in
// which each grew by no more than 1.5 times its rate. It gives up after bound, and says
// whether the rates were reached.
func waitPacedBy(bound time.Duration, paces ...pace) bool {
	const window = 100 * time.Millisecond
	calm := 0
	before := make([]int64, len(paces))
	for deadline := time.Now().Add(bound); calm < 2; {
		if time.Now().After(deadline) {
			return false
		}
		for i, p := range paces {
			before[i] = p.count()
		}
		time.Sleep(window)
		calm++
		for i, p := range paces {
			if p.count()-before[i] > int64(p.rate*window.Seconds()*1.5)+1 {
				calm = 0
			}
		}
	}
	return true
}

// streamLoop opens streams as A's sinks in a tight loop while started: each worker, on one
// of the loop's connections, subscribes, waits for the first push (the hub admitted the
// stream) or the refusal, closes the stream and starts over, taking the next identity.
type streamLoop struct {
	conns      []*grpc.ClientConn
	workers    int
	identities int
	rate       float64      // streams per second, all workers together; 0: no cap
	next       atomic.Int64 // the next identity's number

	mu     sync.Mutex
	c      loopCounts
	cancel func() // stops the running workers
	wg     sync.WaitGroup
}

// loopCounts are the loop's streams: opened (as the worker opens it), admitted, and
// refused by gRPC code (as the answer arrives).
type loopCounts struct {
	opened, admitted int64
	refused          map[string]int64
}

func (c loopCounts) sub(o loopCounts) loopCounts {
	out := loopCounts{opened: c.opened - o.opened, admitted: c.admitted - o.admitted, refused: map[string]int64{}}
	for k, v := range c.refused {
		if d := v - o.refused[k]; d != 0 {
			out.refused[k] = d
		}
	}
	return out
}

func (c loopCounts) add(o loopCounts) loopCounts {
	out := loopCounts{opened: c.opened + o.opened, admitted: c.admitted + o.admitted, refused: map[string]int64{}}
	for k, v := range c.refused {
		out.refused[k] += v
	}
	for k, v := range o.refused {
		out.refused[k] += v
	}
	return out
}

// newStreamLoop dials the loop's connections; the workers run between start and stop.
func newStreamLoop(addr string, workers, conns, identities int, perSecond float64) (*streamLoop, error) {
	l := &streamLoop{workers: workers, identities: identities, rate: perSecond, c: loopCounts{refused: map[string]int64{}}}
	for range conns {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			l.close()
			return nil, err
		}
		l.conns = append(l.conns, cc)
	}
	return l, nil
}

func (l *streamLoop) start() {
	run, stop := context.WithCancel(context.Background())
	l.cancel = stop
	var pace *rate.Limiter
	if l.rate > 0 {
		pace = rate.NewLimiter(rate.Limit(l.rate), 1)
	}
	codecOpt := grpc.ForceCodecV2(discardCodec{proto: encoding.GetCodecV2("proto")})
	for w := range l.workers {
		cc := l.conns[w%len(l.conns)]
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for run.Err() == nil {
				if pace != nil && pace.Wait(run) != nil {
					return
				}
				id := fmt.Sprintf("%sloop-%05d", sinkA, l.next.Add(1)%int64(l.identities))
				ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(run, hub.DevIdentityHeader, id))
				l.mu.Lock()
				l.c.opened++
				l.mu.Unlock()
				admitted, code := l.once(ctx, cc, codecOpt)
				cancel()
				if run.Err() != nil { // stopped mid-stream: neither admitted nor refused
					return
				}
				l.mu.Lock()
				if admitted {
					l.c.admitted++
				} else {
					l.c.refused[code]++
				}
				l.mu.Unlock()
			}
		}()
	}
}

// once opens one stream and says whether the hub admitted it (its first push arrived), or
// else the code it was refused with.
func (l *streamLoop) once(ctx context.Context, cc *grpc.ClientConn, codecOpt grpc.CallOption) (bool, string) {
	st, err := cc.NewStream(ctx, &mcppb.ResourceSource_ServiceDesc.Streams[0], mcppb.ResourceSource_EstablishResourceStream_FullMethodName, codecOpt)
	if err != nil {
		return false, status.Code(err).String()
	}
	// A refused stream may be over before the subscription is sent (SendMsg's io.EOF):
	// RecvMsg has the status either way.
	_ = st.SendMsg(&mcppb.RequestResources{Collection: hubCollection, Incremental: true})
	if err = st.RecvMsg(&discarded{}); err == nil {
		return true, ""
	}
	return false, status.Code(err).String()
}

// discardCodec receives a discarded without reading it: the loop only needs to know that a
// push arrived, and keeping each admitted stream's first push (A's whole view) would make
// the loop's garbage, in this process, a cost of the hub's.
type discardCodec struct{ proto encoding.CodecV2 }

type discarded struct{}

func (c discardCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c discardCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if _, ok := v.(*discarded); ok {
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

func (discardCodec) Name() string { return "proto" }

// admitted is how many of the loop's streams the hub admitted so far.
func (l *streamLoop) admitted() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.admitted
}

func (l *streamLoop) counts() loopCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.add(loopCounts{})
}

func (l *streamLoop) stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *streamLoop) close() {
	for _, cc := range l.conns {
		cc.Close()
	}
}
