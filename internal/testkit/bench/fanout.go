// Package bench holds the scenarios behind `make bench` (cmd/mcpbench) and the Go
// benchmarks, each next to a baseline measured in the same run (the machine is noisy: read
// the ratios): the engine's fan-out against raw gRPC sending the same bytes; the minion's
// conversion against a bare strict decode and its initial sync from a real kube-apiserver
// against the informer's own LIST; the hub's fan-out, CPU per change by stored resources,
// idle sink memory and end-to-end latency; hub replicas as processes: recovery after a
// replica is killed against the same sinks' first subscription, and the CPU per change of
// 2 and 3 replicas against 1; and the versus table (versus.go): meshfed's hub, Istio 1.8's
// own MCP source and bare gRPC as processes, driven by one load process (package load).
//
// It is test and tooling code; nothing in the product imports it.
package bench

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/testkit/bench/load"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// Collection is the collection every scenario uses.
const Collection = "istio/networking/v1alpha3/virtualservices"

// FanoutConfig describes one fan-out scenario.
type FanoutConfig struct {
	// Streams is the number of sink streams.
	Streams int
	// Resources in the collection.
	Resources int
	// Changes is the number of one-resource changes measured.
	Changes int
	// Incremental sinks get one-resource deltas; otherwise every push is the full state.
	Incremental bool
	// ResourceBytes is the approximate size of one resource's body.
	ResourceBytes int
}

// Result is what one scenario measured.
type Result struct {
	// PerChange is the wall time from a change to the last stream's ACK, averaged.
	PerChange time.Duration
	// ResourceEncodes and BodyEncodes per change (engine runs only).
	ResourceEncodes, BodyEncodes float64
	// BytesPerChange pushed to all streams together.
	BytesPerChange float64
	// AllocsPerChange over the whole process (server and clients).
	AllocsPerChange float64
}

// Resource returns resource i at version v with a body of about size bytes.
func Resource(i, v, size int) *mcpapi.Resource {
	pad := make([]byte, size)
	for j := range pad {
		pad[j] = 'a' + byte((i+j)%26)
	}
	// A Struct: what a kind without an Istio message (the bench's) carries, and what the
	// hub's ingest checks such a kind's bodies are.
	spec, err := structpb.NewStruct(map[string]any{"spec": string(pad)})
	if err != nil {
		panic(err) // a string always converts
	}
	body, _ := anypb.New(spec)
	return &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: fmt.Sprintf("bench/r%06d", i), Version: strconv.Itoa(v)}, Body: body}
}

// ackClients opens n ResourceSource streams to addr that receive pushes undecoded, ACK each
// at once and report every receipt on got. They stop when ctx ends.
func ackClients(ctx context.Context, addr string, n int, incremental bool, got chan<- int) (wait func(), err error) {
	return ackClientsFor(ctx, addr, Collection, n, incremental, got)
}

// ackClientsFor is ackClients for another collection.
func ackClientsFor(ctx context.Context, addr, collection string, n int, incremental bool, got chan<- int) (wait func(), err error) {
	perConn := 100
	var conns []*grpc.ClientConn
	var wg sync.WaitGroup
	codecOpt := grpc.ForceCodecV2(load.RawCodec{})
	for i := 0; i < n; i++ {
		if i%perConn == 0 {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, err
			}
			conns = append(conns, cc)
		}
		cc := conns[len(conns)-1]
		st, err := cc.NewStream(ctx, &mcppb.ResourceSource_ServiceDesc.Streams[0], mcppb.ResourceSource_EstablishResourceStream_FullMethodName, codecOpt)
		if err != nil {
			return nil, err
		}
		if err := st.SendMsg(&mcppb.RequestResources{Collection: collection, Incremental: incremental}); err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var f load.RawMsg
				if err := st.RecvMsg(&f); err != nil {
					return
				}
				nonce := load.ScanNonce(f.B)
				if err := st.SendMsg(&mcppb.RequestResources{Collection: collection, ResponseNonce: nonce, Incremental: incremental}); err != nil {
					return
				}
				select {
				case got <- len(f.B):
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	return func() {
		wg.Wait()
		for _, cc := range conns {
			cc.Close()
		}
	}, nil
}

func listen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// measure runs cfg.Changes changes through change() and waits, after each, for all streams
// to receive and ACK it.
func measure(cfg FanoutConfig, got <-chan int, change func(i int)) (time.Duration, float64, float64) {
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	var bytes int
	start := time.Now()
	for i := 1; i <= cfg.Changes; i++ {
		change(i)
		for range cfg.Streams {
			bytes += <-got
		}
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	n := float64(cfg.Changes)
	return elapsed / time.Duration(cfg.Changes), float64(bytes) / n, float64(ms1.Mallocs-ms0.Mallocs) / n
}

// EngineFanout measures the engine: a SourceServer over a Cache, cfg.Streams ACKing clients.
func EngineFanout(cfg FanoutConfig) (Result, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cache := mcp.NewCache(Collection)
	for i := range cfg.Resources {
		if _, err := cache.PutResources(Collection, Resource(i, 0, cfg.ResourceBytes)); err != nil {
			return Result{}, err
		}
	}
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: cache, Logger: quietLogger()})
	if err != nil {
		return Result{}, err
	}
	lis, err := listen()
	if err != nil {
		return Result{}, err
	}
	srv := grpc.NewServer(mcp.SourceServerOptions()...)
	mcp.NewSourceServer(src, mcp.ServerConfig{Logger: quietLogger(), StreamRate: 1e9, StreamBurst: 1 << 30}).Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()

	got := make(chan int, cfg.Streams)
	wait, err := ackClients(ctx, lis.Addr().String(), cfg.Streams, cfg.Incremental, got)
	if err != nil {
		return Result{}, err
	}
	defer func() { cancel(); srv.Stop(); wait() }()
	for range cfg.Streams { // initial state
		<-got
	}
	changes := make([]*mcpapi.Resource, cfg.Changes+1) // built outside the measurement, as the baseline's
	for i := 1; i <= cfg.Changes; i++ {
		changes[i] = Resource(i%max(cfg.Resources, 1), i, cfg.ResourceBytes)
	}
	r0, b0 := mcp.ResourceEncodes(), mcp.BodyEncodes()
	per, bytes, allocs := measure(cfg, got, func(i int) {
		e, err := mcp.NewEntry(changes[i]) // marshaling the change is the engine's work
		if err != nil {
			panic(err)
		}
		cache.Put(Collection, e)
	})
	n := float64(cfg.Changes)
	return Result{
		PerChange:       per,
		ResourceEncodes: float64(mcp.ResourceEncodes()-r0) / n,
		BodyEncodes:     float64(mcp.BodyEncodes()-b0) / n,
		BytesPerChange:  bytes,
		AllocsPerChange: allocs,
	}, nil
}

// BaselineFanout measures raw gRPC doing the same transport work: the bare ResourceSource
// (load.Bare) sending every stream the same pre-encoded message (what the engine would
// send) and reading its ACK, with no engine in between.
func BaselineFanout(cfg FanoutConfig) (Result, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// msgFor is version's message: the full state (one resource at version), or with
	// incremental the changed resource alone.
	msgFor := func(version int, incremental bool) []byte {
		var rs []*mcpapi.Resource
		if incremental {
			rs = []*mcpapi.Resource{Resource(version%max(cfg.Resources, 1), version, cfg.ResourceBytes)}
		} else {
			for i := range cfg.Resources {
				v := 0
				if version > 0 && i == version%max(cfg.Resources, 1) {
					v = version
				}
				rs = append(rs, Resource(i, v, cfg.ResourceBytes))
			}
		}
		b, _ := proto.Marshal(&mcppb.Resources{Collection: Collection, SystemVersionInfo: strconv.Itoa(version), Resources: rs, Incremental: incremental})
		return b
	}
	bare := load.NewBare()
	bare.Stage(msgFor(0, false), nil)
	bare.Publish()
	lis, err := listen()
	if err != nil {
		return Result{}, err
	}
	srv := bare.Server()
	go srv.Serve(lis)
	got := make(chan int, cfg.Streams)
	wait, err := ackClients(ctx, lis.Addr().String(), cfg.Streams, cfg.Incremental, got)
	if err != nil {
		srv.Stop()
		return Result{}, err
	}
	defer func() { cancel(); srv.Stop(); wait() }()
	for range cfg.Streams {
		<-got
	}
	full, delta := make([][]byte, cfg.Changes+1), make([][]byte, cfg.Changes+1) // pre-encoded: the baseline pays no encoding
	for i := 1; i <= cfg.Changes; i++ {
		full[i] = msgFor(i, false)
		if cfg.Incremental {
			delta[i] = msgFor(i, true)
		}
	}
	per, bytes, allocs := measure(cfg, got, func(i int) {
		bare.Stage(full[i], delta[i])
		bare.Publish()
	})
	return Result{PerChange: per, BytesPerChange: bytes, AllocsPerChange: allocs}, nil
}
