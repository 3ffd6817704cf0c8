package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/meshfed/meshfed/internal/testkit/kubetest"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/minion"
)

const vsCollection = "istio/networking/v1alpha3/virtualservices"

// vsContent is a realistic VirtualService's content (what an informer or a file yields).
func vsContent(i int) map[string]any {
	host := fmt.Sprintf("svc%05d.shop.svc.cluster.local", i)
	return map[string]any{
		"spec": map[string]any{
			"hosts":    []any{host, fmt.Sprintf("svc%05d.example.com", i)},
			"gateways": []any{"istio-system/shop-gateway", "mesh"},
			"http": []any{map[string]any{
				"match": []any{map[string]any{"uri": map[string]any{"prefix": "/api/v2"}, "headers": map[string]any{"x-canary": map[string]any{"exact": "yes"}}}},
				"route": []any{
					map[string]any{"destination": map[string]any{"host": host, "subset": "v2"}, "weight": int64(10)},
					map[string]any{"destination": map[string]any{"host": host, "subset": "v1"}, "weight": int64(90)},
				},
				"timeout": "3s",
				"retries": map[string]any{"attempts": int64(3), "perTryTimeout": "1s", "retryOn": "5xx,reset"},
			}},
		},
	}
}

// ConvertResult is one conversion-throughput measurement.
type ConvertResult struct {
	PerSec, BaselinePerSec float64
	Allocs, BaselineAllocs float64 // per object
	Bytes                  float64 // encoded Resource size
}

// ConvertThroughput converts n VirtualServices with minion.Convert and, in the same run, does
// the irreducible part of that work as the baseline: a strict protojson decode of the spec
// into the typed message and one proto.Marshal.
func ConvertThroughput(n int) (ConvertResult, error) {
	kind, _ := minion.LookupBuiltin(vsCollection)
	objs := make([]*minion.Object, n)
	for i := range objs {
		objs[i] = &minion.Object{Namespace: "shop", Name: fmt.Sprintf("vs%05d", i), Created: time.Unix(1700000000, 0),
			Labels: map[string]string{"app": "shop", "team": "checkout"}, Annotations: map[string]string{"owner": "checkout@example.com"},
			Content: vsContent(i)}
	}
	var r ConvertResult
	var ms0, ms1 runtime.MemStats
	for _, o := range objs[:min(n, 500)] { // warm up both paths
		if _, err := minion.Convert(kind, o); err != nil {
			return r, err
		}
	}

	runtime.GC()
	runtime.ReadMemStats(&ms0)
	start := time.Now()
	for _, o := range objs {
		b, err := json.Marshal(o.Content["spec"])
		if err != nil {
			return r, err
		}
		msg := &networking.VirtualService{}
		if err := protojson.Unmarshal(b, msg); err != nil {
			return r, err
		}
		if _, err := proto.Marshal(msg); err != nil {
			return r, err
		}
	}
	r.BaselinePerSec = float64(n) / time.Since(start).Seconds()
	runtime.ReadMemStats(&ms1)
	r.BaselineAllocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(n)

	runtime.GC()
	runtime.ReadMemStats(&ms0)
	start = time.Now()
	var size int
	for _, o := range objs {
		e, err := minion.Convert(kind, o)
		if err != nil {
			return r, err
		}
		size += len(e.Encoded)
	}
	r.PerSec = float64(n) / time.Since(start).Seconds()
	runtime.ReadMemStats(&ms1)
	r.Allocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(n)
	r.Bytes = float64(size) / float64(n)
	return r, nil
}

// SyncResult is one initial-sync measurement against a real apiserver.
type SyncResult struct {
	Objects int
	// Create is how long creating the objects took (setup, not measured work).
	Create time.Duration
	// Sync: minion start to a connected sink holding every object. Baseline: the LIST an
	// informer starts with, of the same objects by the same identity (the least a watcher
	// must do).
	Sync, BaselineList time.Duration
	// Heap growth while the minion holds the objects (informer cache, entries, store), and
	// the baseline's: the LIST result held in memory. In MiB.
	HeapMiB, BaselineHeapMiB float64
}

// KubeInitialSync starts etcd + kube-apiserver, creates n VirtualServices, then measures a
// minion's initial sync to a ResourceSink server in this process.
func KubeInitialSync(n int, repoRoot string) (res SyncResult, err error) {
	r := &runner{}
	defer r.close()
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(fatal)
			if !ok {
				panic(p)
			}
			err = f
		}
	}()
	env, sa := kubetest.StartForMinion(r, repoRoot)
	env.CreateNamespace("bench")
	kind, _ := minion.LookupBuiltin(vsCollection)
	admin := env.Config(env.Admin)
	admin.QPS, admin.Burst = 5000, 5000
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return res, err
	}
	ri := dyn.Resource(kind.GVR()).Namespace("bench")
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Value
	next := atomic.Int64{}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				u := &unstructured.Unstructured{Object: vsContent(i)}
				u.SetAPIVersion("networking.istio.io/v1alpha3")
				u.SetKind("VirtualService")
				u.SetName(fmt.Sprintf("vs%05d", i))
				u.SetLabels(map[string]string{"app": "shop"})
				if _, err := ri.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return res, fmt.Errorf("creating objects: %v", e)
	}
	res.Objects, res.Create = n, time.Since(start)

	// Baseline: the LIST an informer starts with (resourceVersion "0": served from the
	// apiserver's watch cache), by the minion's identity, held in memory.
	saDyn, err := dynamic.NewForConfig(env.Config(sa))
	if err != nil {
		return res, err
	}
	heap0 := heapMiB()
	start = time.Now()
	var items []unstructured.Unstructured
	opts := metav1.ListOptions{Limit: 500, ResourceVersion: "0"}
	for {
		list, err := saDyn.Resource(kind.GVR()).List(context.Background(), opts)
		if err != nil {
			return res, err
		}
		items = append(items, list.Items...)
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			break
		}
	}
	res.BaselineList = time.Since(start)
	res.BaselineHeapMiB = heapMiB() - heap0
	if len(items) != n {
		return res, fmt.Errorf("listed %d objects, want %d", len(items), n)
	}
	runtime.KeepAlive(items)
	items = nil

	// The minion, as its ServiceAccount, pushing to a ResourceSink that only counts.
	var held atomic.Int64
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vsCollection}, Logger: quietLogger(), MaxMessageSize: 64 << 20,
		Applier: mcp.ApplierFunc(func(_ context.Context, c *mcp.Change) error {
			if !c.Incremental {
				held.Store(0)
			}
			held.Add(int64(len(c.Entries) - len(c.Removed)))
			return nil
		})})
	if err != nil {
		return res, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := grpc.NewServer(append(mcp.ServerOptions(), grpc.MaxRecvMsgSize(64<<20))...)
	mcp.NewSinkServer(func(context.Context, *mcp.StreamInfo) (*mcp.Sink, error) { return sink, nil }, mcp.ServerConfig{Logger: quietLogger()}).Register(srv)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cfg := minion.Defaults()
	cfg.Cluster, cfg.Insecure, cfg.HTTP = "bench", true, ""
	cfg.Sources = []minion.SourceConfig{{URL: "k8s://" + env.Kubeconfig(sa)}}
	cfg.Collections = []string{vsCollection}
	cfg.Destinations.Push = []string{"push://" + lis.Addr().String()}
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	heap0 = heapMiB()
	start = time.Now()
	m, err := minion.New(cfg, quietLogger(), minion.NewTelemetry())
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Minute)
	for held.Load() != int64(n) {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("sink holds %d of %d objects after 5m", held.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.Sync = time.Since(start)
	res.HeapMiB = heapMiB() - heap0
	runtime.KeepAlive(m)
	return res, nil
}

func heapMiB() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// runner is a kubetest.TB outside of `go test`: Fatal panics with a fatal that
// KubeInitialSync recovers, and cleanups run when it returns.
type runner struct {
	cleanups []func()
}

type fatal string

func (f fatal) Error() string { return string(f) }

func (r *runner) Helper()                           {}
func (r *runner) Fatal(args ...any)                 { panic(fatal(fmt.Sprint(args...))) }
func (r *runner) Fatalf(format string, args ...any) { panic(fatal(fmt.Sprintf(format, args...))) }
func (r *runner) Cleanup(f func())                  { r.cleanups = append(r.cleanups, f) }
func (r *runner) Logf(format string, args ...any)   {}
func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "meshfed-bench-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (r *runner) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}
