package mcp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitFor = 10 * time.Second // upper bound on any wait; tests never assert durations

// testLogger logs to t.Log until the test ends, then discards.
func testLogger(t testing.TB) *slog.Logger { return testlog.New(t) }

// res builds a resource whose body is a StringValue, so tests can check content.
func res(name, version, content string) *mcpapi.Resource {
	body, err := anypb.New(wrapperspb.String(content))
	if err != nil {
		panic(err)
	}
	return &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: version}, Body: body}
}

func entry(t testing.TB, name, version string) *Entry {
	t.Helper()
	e, err := NewEntry(res(name, version, name+"@"+version))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// serve starts a gRPC server on 127.0.0.1:0 with the engine's options, registers services
// with reg, and stops it when the test ends.
func serve(t testing.TB, reg func(*grpc.Server), opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(append(ServerOptions(), opts...)...)
	reg(s)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return lis.Addr().String()
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// goRun runs fn in a goroutine until the test ends: the context is cancelled and fn awaited.
func goRun(t testing.TB, fn func(ctx context.Context) error) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() { defer close(done); errc <- fn(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return errc
}

// direction names the two gRPC topologies; together they exercise the four role/transport
// combinations.
type direction string

const (
	sourceServes direction = "source=server,sink=client" // ResourceSource service
	sinkServes   direction = "source=client,sink=server" // ResourceSink service
)

var directions = []direction{sourceServes, sinkServes}

// rawSink is a hand-driven sink peer, for testing the source role message by message.
type rawSink struct {
	t    testing.TB
	incr map[string]bool // the incremental flag requested per collection, echoed in ACKs
	send func(*mcppb.RequestResources) error
	recv chan *mcppb.Resources
	errc chan error
}

// newRawSink connects a hand-driven sink to src over direction d.
func newRawSink(t testing.TB, src *Source, d direction) *rawSink {
	t.Helper()
	r := &rawSink{t: t, incr: map[string]bool{}, recv: make(chan *mcppb.Resources, 1024), errc: make(chan error, 1)}
	switch d {
	case sourceServes:
		addr := serve(t, func(s *grpc.Server) { NewSourceServer(src, ServerConfig{Logger: testLogger(t)}).Register(s) })
		cc := dial(t, addr)
		ctx, cancel := context.WithCancel(context.Background())
		st, err := mcppb.NewResourceSourceClient(cc).EstablishResourceStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.send = st.Send
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				m, err := st.Recv()
				if err != nil {
					r.errc <- err
					return
				}
				r.recv <- m
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
	case sinkServes:
		streams := make(chan grpc.BidiStreamingServer[mcppb.Resources, mcppb.RequestResources])
		handlerDone := make(chan struct{})
		stop := make(chan struct{})
		var stopOnce sync.Once
		addr := serve(t, func(s *grpc.Server) {
			mcppb.RegisterResourceSinkServer(s, &rawSinkServer{fn: func(st grpc.BidiStreamingServer[mcppb.Resources, mcppb.RequestResources]) error {
				streams <- st
				select {
				case <-stop:
				case <-st.Context().Done():
				}
				return nil
			}})
		})
		cc := dial(t, addr)
		pushErr := goRun(t, func(ctx context.Context) error {
			defer close(handlerDone)
			return src.PushTo(ctx, cc)
		})
		_ = pushErr
		var st grpc.BidiStreamingServer[mcppb.Resources, mcppb.RequestResources]
		select {
		case st = <-streams:
		case <-time.After(waitFor):
			t.Fatal("source did not dial the sink")
		}
		r.send = st.Send
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				m, err := st.Recv()
				if err != nil {
					r.errc <- err
					return
				}
				if m.Nonce == "" && m.Collection == TriggerCollection {
					continue // the trigger PushTo sends first; a sink ignores it
				}
				r.recv <- m
			}
		}()
		t.Cleanup(func() { stopOnce.Do(func() { close(stop) }); <-done })
	}
	return r
}

type rawSinkServer struct {
	mcppb.UnimplementedResourceSinkServer
	fn func(grpc.BidiStreamingServer[mcppb.Resources, mcppb.RequestResources]) error
}

func (s *rawSinkServer) EstablishResourceStream(st grpc.BidiStreamingServer[mcppb.Resources, mcppb.RequestResources]) error {
	return s.fn(st)
}

func (r *rawSink) request(collection string, incremental bool, initial map[string]string) {
	r.t.Helper()
	r.incr[collection] = incremental
	if err := r.send(&mcppb.RequestResources{Collection: collection, Incremental: incremental, InitialResourceVersions: initial, SinkNode: &mcppb.SinkNode{Id: "raw-sink"}}); err != nil {
		r.t.Fatalf("send request: %v", err)
	}
}

func (r *rawSink) ack(m *mcppb.Resources) {
	r.t.Helper()
	if err := r.send(&mcppb.RequestResources{Collection: m.Collection, ResponseNonce: m.Nonce, Incremental: r.incr[m.Collection]}); err != nil {
		r.t.Fatalf("send ack: %v", err)
	}
}

func (r *rawSink) sendReq(req *mcppb.RequestResources) {
	r.t.Helper()
	if err := r.send(req); err != nil {
		r.t.Fatalf("send: %v", err)
	}
}

// next waits for the next push.
func (r *rawSink) next() *mcppb.Resources {
	r.t.Helper()
	select {
	case m := <-r.recv:
		return m
	case err := <-r.errc:
		r.t.Fatalf("stream ended while waiting for a push: %v", err)
	case <-time.After(waitFor):
		r.t.Fatal("no push arrived")
	}
	return nil
}

// none asserts that no push arrives while the source handles a round trip: it subscribes a
// probe collection and waits for the probe's answer, which the source sends after anything
// it would have sent before. Pushes of other collections arriving first fail the test.
func (r *rawSink) none(probe string) {
	r.t.Helper()
	r.request(probe, false, nil)
	for {
		m := r.next()
		if m.Collection == probe {
			r.ack(m)
			return
		}
		r.t.Fatalf("unexpected push of %s (nonce %s, %d resources)", m.Collection, m.Nonce, len(m.Resources))
	}
}

// names lists the resource names of a push, sorted.
func names(m *mcppb.Resources) []string {
	var out []string
	for _, r := range m.Resources {
		out = append(out, r.GetMetadata().GetName()+"@"+r.GetMetadata().GetVersion())
	}
	sort.Strings(out)
	return out
}

func equal(a, b []string) bool { return slices.Equal(a, b) }

// rawSource is a hand-driven source peer, for testing the sink role message by message.
type rawSource struct {
	t    testing.TB
	send func(*mcppb.Resources) error
	recv chan *mcppb.RequestResources
	errc chan error
}

// newRawSource connects a hand-driven source to sink over direction d. newSink is used by the
// SinkServer for each stream (sinkServes); with sourceServes the sink dials a raw
// ResourceSource server. The source says it resumes (ResumesHeader), as this engine's do.
func newRawSource(t testing.TB, sink *Sink, d direction) *rawSource {
	t.Helper()
	return newRawSourceAs(t, sink, d, true)
}

// newRawSourceAs is newRawSource for a source that says it resumes or, like Istio's, not.
func newRawSourceAs(t testing.TB, sink *Sink, d direction, resumes bool) *rawSource {
	t.Helper()
	r := &rawSource{t: t, recv: make(chan *mcppb.RequestResources, 1024), errc: make(chan error, 1)}
	switch d {
	case sinkServes:
		addr := serve(t, func(s *grpc.Server) {
			NewSinkServer(func(context.Context, *StreamInfo) (*Sink, error) { return sink, nil }, ServerConfig{Logger: testLogger(t)}).Register(s)
		})
		cc := dial(t, addr)
		ctx, cancel := context.WithCancel(context.Background())
		if resumes {
			ctx = metadata.NewOutgoingContext(ctx, resumesMD)
		}
		st, err := mcppb.NewResourceSinkClient(cc).EstablishResourceStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.send = st.Send
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				m, err := st.Recv()
				if err != nil {
					r.errc <- err
					return
				}
				r.recv <- m
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
	case sourceServes:
		streams := make(chan grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources])
		stop := make(chan struct{})
		addr := serve(t, func(s *grpc.Server) {
			mcppb.RegisterResourceSourceServer(s, &rawSourceServer{fn: func(st grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]) error {
				if resumes {
					if err := st.SendHeader(resumesMD); err != nil {
						return err
					}
				}
				streams <- st
				select {
				case <-stop:
				case <-st.Context().Done():
				}
				return nil
			}})
		})
		cc := dial(t, addr)
		goRun(t, func(ctx context.Context) error { return sink.PullFrom(ctx, cc) })
		var st grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]
		select {
		case st = <-streams:
		case <-time.After(waitFor):
			t.Fatal("sink did not dial the source")
		}
		r.send = st.Send
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				m, err := st.Recv()
				if err != nil {
					r.errc <- err
					return
				}
				r.recv <- m
			}
		}()
		t.Cleanup(func() { close(stop); <-done })
	}
	return r
}

type rawSourceServer struct {
	mcppb.UnimplementedResourceSourceServer
	fn func(grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]) error
}

func (s *rawSourceServer) EstablishResourceStream(st grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]) error {
	return s.fn(st)
}

func (r *rawSource) push(m *mcppb.Resources) {
	r.t.Helper()
	if err := r.send(m); err != nil {
		r.t.Fatalf("send push: %v", err)
	}
}

func (r *rawSource) next() *mcppb.RequestResources {
	r.t.Helper()
	select {
	case m := <-r.recv:
		return m
	case err := <-r.errc:
		r.t.Fatalf("stream ended while waiting for a request: %v", err)
	case <-time.After(waitFor):
		r.t.Fatal("no request arrived")
	}
	return nil
}

// recorder is an Applier that keeps each collection's state and the changes it saw.
type recorder struct {
	mu      sync.Mutex
	cond    *sync.Cond
	state   map[string]map[string]string // collection -> name -> version
	content map[string]map[string]string // collection -> name -> body string
	changes []*Change
	reject  func(*Change) error
}

func newRecorder() *recorder {
	r := &recorder{state: map[string]map[string]string{}, content: map[string]map[string]string{}}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *recorder) Apply(_ context.Context, c *Change) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reject != nil {
		if err := r.reject(c); err != nil {
			return err
		}
	}
	r.changes = append(r.changes, c)
	st, ct := r.state[c.Collection], r.content[c.Collection]
	if !c.Incremental || st == nil {
		st, ct = map[string]string{}, map[string]string{}
	}
	for i, e := range c.Entries {
		res := c.Resources[i]
		var s wrapperspb.StringValue
		if res.Body != nil {
			if err := res.Body.UnmarshalTo(&s); err != nil {
				return fmt.Errorf("body of %s: %w", e.Name, err)
			}
		}
		st[e.Name], ct[e.Name] = e.Version, s.Value
	}
	for _, n := range c.Removed {
		delete(st, n)
		delete(ct, n)
	}
	r.state[c.Collection], r.content[c.Collection] = st, ct
	r.cond.Broadcast()
	return nil
}

// waitState waits until collection holds exactly want (name -> version).
func (r *recorder) waitState(t testing.TB, collection string, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	stop := time.AfterFunc(waitFor, func() { r.mu.Lock(); r.cond.Broadcast(); r.mu.Unlock() })
	defer stop.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for !mapsEqual(r.state[collection], want) {
		if time.Now().After(deadline) {
			t.Fatalf("collection %s: have %v, want %v", collection, r.state[collection], want)
		}
		r.cond.Wait()
	}
}

func (r *recorder) changeCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.changes)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func newTestSource(t testing.TB, w Watcher, opts ...func(*SourceOptions)) *Source {
	t.Helper()
	o := SourceOptions{Watcher: w, Logger: testLogger(t)}
	for _, f := range opts {
		f(&o)
	}
	s, err := NewSource(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newTestSink(t testing.TB, a Applier, collections []string, opts ...func(*SinkOptions)) *Sink {
	t.Helper()
	o := SinkOptions{Collections: collections, Applier: a, Logger: testLogger(t), Node: &mcppb.SinkNode{Id: "test-sink"}}
	for _, f := range opts {
		f(&o)
	}
	k, err := NewSink(o)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var _ = io.EOF
var _ = proto.Size

func sortStrings(s []string) { sort.Strings(s) }

func protoSize(m proto.Message) int { return proto.Size(m) }

// waitSynced waits until sink has received a push for every collection.
func waitSynced(t testing.TB, sink *Sink) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !sink.Synced() {
		if time.Now().After(deadline) {
			t.Fatal("sink never synced")
		}
		time.Sleep(time.Millisecond)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
