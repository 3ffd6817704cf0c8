package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/testkit/bench/load"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
)

// hubCollection is not one of Istio's host-claiming kinds: the ACL checks it by namespace
// alone, so the benchmark resources (StringValue bodies) are accepted as they are.
const hubCollection = "bench/resources"

// benchHub runs a development-mode hub with clusters c000..c(n-1), every sink receiving
// everything, on loopback.
type benchHub struct {
	h      *hub.Hub
	cancel func()
	done   chan error
	ingest string
	serve  string
	dir    string // its state directory, removed at stop
}

// startHub runs a hub for the bench kind with clusters c000.. (disjoint namespaces when
// several), adjusted by tune (nil: none) before it starts, in a state directory of its own:
// the hub keeps the clusters' state, as it does by default (what that costs is in every
// row), and a run must neither find the previous run's state nor leave its own behind.
func startHub(clusters int, tune func(*hub.Config)) (*benchHub, error) {
	cfg := hubConfig(clusters, tune)
	dir, err := os.MkdirTemp("", "meshfed-bench-hub-")
	if err != nil {
		return nil, err
	}
	cfg.StateDir = dir
	if err := cfg.Validate(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	h, err := hub.New(cfg, quietLogger(), hub.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &benchHub{h: h, cancel: cancel, done: make(chan error, 1), dir: dir}
	go func() { b.done <- h.Run(ctx) }()
	for i := 0; ; i++ {
		ing, srv, _ := h.Addrs()
		if ing != "" && srv != "" {
			b.ingest, b.serve = ing, srv
			break
		}
		if i > 1000 {
			b.stop()
			return nil, fmt.Errorf("hub did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b, nil
}

// hubConfig is the bench hub's configuration (insecure, on loopback, without a state
// directory): clusters c000.. (disjoint namespaces when several), every sink receiving
// everything, no limits or quotas in the way; tune (nil: none) adjusts it.
func hubConfig(clusters int, tune func(*hub.Config)) *hub.Config {
	cfg := hub.Defaults()
	cfg.Insecure, cfg.Ingest, cfg.Serve, cfg.Collections = true, "127.0.0.1:0", "127.0.0.1:0", []string{hubCollection}
	cfg.Kinds = []kinds.Kind{{Collection: hubCollection, Group: "bench.meshfed.io", Version: "v1", Resource: "resources", Kind: "Resource"}}
	cfg.Routing = routing.Config{Default: &routing.Rule{Name: "all"}}
	cfg.WarmUp = hub.Duration{Duration: time.Minute}
	cfg.Limits = hub.LimitsConfig{StreamsPerSecond: 1e9, StreamBurst: 1 << 30}
	// Unbounded: these rows measure scale (a million resources in one collection, sent
	// to incremental sinks in split pushes) and speed, not the quotas.
	cfg.Quotas = hub.QuotaConfig{MaxCollectionBytes: -1}
	for i := range clusters {
		name := clusterName(i)
		ns := "*"
		if clusters > 1 {
			ns = name // disjoint namespaces
		}
		cfg.Clusters = append(cfg.Clusters, hub.ClusterConfig{Name: name, Identities: []string{name}, Namespaces: []string{ns}, Hosts: []string{"*"}})
	}
	if tune != nil {
		tune(cfg)
	}
	return cfg
}

func clusterName(i int) string { return fmt.Sprintf("c%03d", i) }

func (b *benchHub) stop() { b.cancel(); <-b.done; os.RemoveAll(b.dir) }

// cluster pushes a cache to the hub as one cluster, like a minion.
type cluster struct {
	cancel func()
	done   chan struct{}
}

// connect pushes cache to the hub as cluster name, like a minion; hooks (may be zero)
// follow its stream.
func (b *benchHub) connect(name string, cache *mcp.Cache, hooks mcp.Hooks) (*cluster, error) {
	return pushTo(b.ingest, name, cache, hooks)
}

// pushTo pushes cache to the hub's ingest address as cluster name (the development
// identity header of an insecure hub), like a minion; hooks (may be zero) follow its stream.
func pushTo(ingest, name string, cache *mcp.Cache, hooks mcp.Hooks) (*cluster, error) {
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: cache, Logger: quietLogger(), MaxMessageSize: 64 << 20, Hooks: hooks})
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(ingest, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer conn.Close()
		_ = src.PushTo(metadata.AppendToOutgoingContext(ctx, hub.DevIdentityHeader, name), conn)
	}()
	return c, nil
}

func (c *cluster) stop() { c.cancel(); <-c.done }

func (b *benchHub) waitReady() error {
	for i := 0; !b.h.Ready(); i++ {
		if i > 6000 {
			return fmt.Errorf("hub not ready after 60s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// HubFanout measures one change from a cluster, through the hub, to cfg.Streams sinks (each
// ACKing), per change: the minion → hub push and ACK, the ACL, the merge, one view update
// and the fan-out. Compare with BaselineFanout for the same cfg.
func HubFanout(cfg FanoutConfig) (Result, error) {
	b, err := startHub(1, nil)
	if err != nil {
		return Result{}, err
	}
	defer b.stop()
	cache := mcp.NewCache(hubCollection)
	for i := range cfg.Resources {
		if _, err := cache.PutResources(hubCollection, Resource(i, 0, cfg.ResourceBytes)); err != nil {
			return Result{}, err
		}
	}
	cl, err := b.connect("c000", cache, mcp.Hooks{})
	if err != nil {
		return Result{}, err
	}
	defer cl.stop()
	if err := b.waitReady(); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan int, cfg.Streams)
	wait, err := ackClientsFor(ctx, b.serve, hubCollection, cfg.Streams, cfg.Incremental, got)
	if err != nil {
		cancel()
		return Result{}, err
	}
	defer func() { cancel(); wait() }()
	for range cfg.Streams {
		<-got
	}
	changes := make([]*mcpapi.Resource, cfg.Changes+1)
	for i := 1; i <= cfg.Changes; i++ {
		changes[i] = Resource(i%max(cfg.Resources, 1), i, cfg.ResourceBytes)
	}
	r0, b0 := mcp.ResourceEncodes(), mcp.BodyEncodes()
	per, bytes, allocs := measure(cfg, got, func(i int) {
		if _, err := cache.PutResources(hubCollection, changes[i]); err != nil {
			panic(err)
		}
	})
	n := float64(cfg.Changes)
	return Result{PerChange: per, BytesPerChange: bytes, AllocsPerChange: allocs,
		ResourceEncodes: float64(mcp.ResourceEncodes()-r0) / n, BodyEncodes: float64(mcp.BodyEncodes()-b0) / n}, nil
}

// StoreResult is the hub's cost of one change with many resources stored.
type StoreResult struct {
	Resources int
	// CPUPerChange is process CPU (user+system) per one-resource change: ACL, store, merge
	// and one view with one connected sink.
	CPUPerChange time.Duration
	// AllocsPerChange over the process.
	AllocsPerChange float64
	// HeapMiB is the heap the stored resources take (received and served forms, the index
	// and one view).
	HeapMiB float64
}

// HubStore loads n resources into a hub (through Hub.Apply, in batches) with one sink
// connected, then measures changes of one resource.
func HubStore(n, changes, size int, tune func(*hub.Config)) (StoreResult, error) {
	b, err := startHub(1, func(c *hub.Config) {
		c.HTTP = "127.0.0.1:0" // /api/state: the file has caught up before the changes are measured
		if tune != nil {
			tune(c)
		}
	})
	if err != nil {
		return StoreResult{}, err
	}
	defer b.stop()
	heap0 := heapMiB()
	const batch = 10000
	for start := 0; start < n; start += batch {
		c := &mcp.Change{Collection: hubCollection, Incremental: true}
		for i := start; i < min(start+batch, n); i++ {
			r := Resource(i, 0, size)
			e, err := mcp.NewEntry(r)
			if err != nil {
				return StoreResult{}, err
			}
			c.Entries, c.Resources = append(c.Entries, e), append(c.Resources, r)
		}
		if err := b.h.Apply("c000", c); err != nil {
			return StoreResult{}, err
		}
	}
	res := StoreResult{Resources: n}
	// Applying marked the cluster synced, so the hub is ready. One sink: the view exists
	// and is kept up to date.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.waitReady(); err != nil {
		return res, err
	}
	// The sink gets the stored state in several pushes (each at most the message limit):
	// count receipts, and wait until they stop before measuring.
	got := make(chan int, 64)
	wait, err := ackClientsFor(ctx, b.serve, hubCollection, 1, true, got)
	if err != nil {
		return res, err
	}
	defer func() { cancel(); wait() }()
	var received atomic.Int64
	tick := make(chan struct{}, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-got:
				received.Add(1)
				select {
				case tick <- struct{}{}:
				default:
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() { cancel(); <-drained }()
	for last := int64(-1); ; {
		time.Sleep(200 * time.Millisecond)
		if r := received.Load(); r > 0 && r == last {
			break
		} else {
			last = r
		}
	}
	res.HeapMiB = heapMiB() - heap0
	_, _, httpAddr := b.h.Addrs()
	if err := stateWritten(httpAddr); err != nil {
		return res, err
	}

	warm := changes / 4
	pre := make([]*mcp.Change, warm+changes) // distinct versions: every change is pushed
	for i := range pre {
		r := Resource(i%n, i+1, size)
		e, err := mcp.NewEntry(r)
		if err != nil {
			return res, err
		}
		pre[i] = &mcp.Change{Collection: hubCollection, Incremental: true, Entries: []*mcp.Entry{e}, Resources: []*mcpapi.Resource{r}}
	}
	apply := func(c *mcp.Change) error {
		before := received.Load()
		if err := b.h.Apply("c000", c); err != nil {
			return err
		}
		for received.Load() == before { // the sink received it: the change is done
			<-tick
		}
		return nil
	}
	for _, c := range pre[:warm] { // warm up: the first changes after the load pay for it
		if err := apply(c); err != nil {
			return res, err
		}
	}
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	cpu0 := cpuTime()
	for _, c := range pre[warm:] {
		before := received.Load()
		if err := b.h.Apply("c000", c); err != nil {
			return res, err
		}
		for received.Load() == before { // the sink received it: the change is done
			<-tick
		}
	}
	res.CPUPerChange = (cpuTime() - cpu0) / time.Duration(changes)
	runtime.ReadMemStats(&ms1)
	res.AllocsPerChange = float64(ms1.Mallocs-ms0.Mallocs) / float64(changes)
	return res, nil
}

// stateWritten waits until the state file of the hub whose http listener is addr holds
// everything the hub was given (no write queued), so a measurement that follows does not
// include the writer catching up.
func stateWritten(addr string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		resp, err := http.Get("http://" + addr + "/api/state")
		if err != nil {
			return err
		}
		var st api.State
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("/api/state: %w", err)
		}
		if !st.Persist || st.Queued == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the state file still has %d writes queued after 5 minutes", st.Queued)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// IdleResult is the memory of idle connected sinks.
type IdleResult struct {
	Sinks                   int
	PerSinkKiB, BaselineKiB float64
}

// IdleSinks connects n sinks to a hub serving a small collection and measures the heap
// per connected, idle sink (after its first push and ACK), and the same for a bare gRPC
// ResourceSource server holding n idle streams. Both include the client side of the
// streams, which runs in this process.
func IdleSinks(n int) (IdleResult, error) {
	res := IdleResult{Sinks: n}
	measureIdle := func(addr string) (float64, func(), error) {
		heap0 := heapMiB()
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan int, n)
		wait, err := ackClientsFor(ctx, addr, hubCollection, n, false, got)
		if err != nil {
			cancel()
			return 0, nil, err
		}
		for range n {
			<-got
		}
		per := (heapMiB() - heap0) * 1024 / float64(n)
		return per, func() { cancel(); wait() }, nil
	}

	b, err := startHub(1, nil)
	if err != nil {
		return res, err
	}
	cache := mcp.NewCache(hubCollection)
	for i := range 10 {
		if _, err := cache.PutResources(hubCollection, Resource(i, 0, 128)); err != nil {
			return res, err
		}
	}
	cl, err := b.connect("c000", cache, mcp.Hooks{})
	if err != nil {
		return res, err
	}
	if err := b.waitReady(); err != nil {
		return res, err
	}
	per, stop, err := measureIdle(b.serve)
	if err != nil {
		return res, err
	}
	res.PerSinkKiB = per
	stop()
	cl.stop()
	b.stop()

	// Baseline: the same clients on the bare source, which sends one message and then holds.
	lis, err := listen()
	if err != nil {
		return res, err
	}
	var first []*mcpapi.Resource
	for i := range 10 {
		first = append(first, Resource(i, 0, 128))
	}
	msg, err := proto.Marshal(&mcppb.Resources{Collection: hubCollection, Resources: first})
	if err != nil {
		return res, err
	}
	bare := load.NewBare()
	bare.Stage(msg, nil)
	bare.Publish()
	srv := bare.Server()
	go srv.Serve(lis)
	defer srv.Stop()
	per, stop, err = measureIdle(lis.Addr().String())
	if err != nil {
		return res, err
	}
	res.BaselineKiB = per
	stop()
	return res, nil
}

// LatencyResult is the distribution of minion → hub → sink delivery times.
type LatencyResult struct {
	Clusters, Sinks, Changes int
	P50, P99, Max            time.Duration
}

// HubLatency connects clusters sources and sinks sinks to one hub, then makes changes one
// at a time, each in the next cluster, and records for every sink the time from the change
// at the cluster's cache to the sink receiving it.
func HubLatency(clusters, sinks, changes int, tune func(*hub.Config)) (LatencyResult, error) {
	res := LatencyResult{Clusters: clusters, Sinks: sinks, Changes: changes}
	b, err := startHub(clusters, tune)
	if err != nil {
		return res, err
	}
	defer b.stop()
	caches := make([]*mcp.Cache, clusters)
	for i := range clusters {
		caches[i] = mcp.NewCache(hubCollection)
		name := fmt.Sprintf("c%03d", i)
		for j := range 10 {
			r := Resource(j, 0, 256)
			r.Metadata.Name = fmt.Sprintf("%s/r%02d", name, j)
			if _, err := caches[i].PutResources(hubCollection, r); err != nil {
				return res, err
			}
		}
		cl, err := b.connect(name, caches[i], mcp.Hooks{})
		if err != nil {
			return res, err
		}
		defer cl.stop()
	}
	if err := b.waitReady(); err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan int, sinks)
	wait, err := ackClientsFor(ctx, b.serve, hubCollection, sinks, true, got)
	if err != nil {
		cancel()
		return res, err
	}
	defer func() { cancel(); wait() }()
	for range sinks {
		<-got
	}
	lat := make([]time.Duration, 0, sinks*changes)
	for i := range changes {
		c := i % clusters
		r := Resource(i, i+1, 256)
		r.Metadata.Name = fmt.Sprintf("c%03d/r%02d", c, i%10)
		e, err := mcp.NewEntry(r)
		if err != nil {
			return res, err
		}
		t0 := time.Now()
		caches[c].Put(hubCollection, e)
		for range sinks {
			<-got
			lat = append(lat, time.Since(t0))
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	res.P50, res.P99, res.Max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	return res, nil
}
