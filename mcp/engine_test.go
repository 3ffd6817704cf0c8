package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// pair connects a Source and a Sink over direction d and returns a function that ends the
// connection (the client side's context) and waits for it to stop.
func pair(t *testing.T, d direction, src *Source, sink *Sink) (disconnect func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	switch d {
	case sourceServes:
		addr := serve(t, func(s *grpc.Server) { NewSourceServer(src, ServerConfig{Logger: testLogger(t)}).Register(s) })
		cc := dial(t, addr)
		go func() { done <- sink.PullFrom(ctx, cc) }()
	case sinkServes:
		addr := serve(t, func(s *grpc.Server) {
			NewSinkServer(func(context.Context, *StreamInfo) (*Sink, error) { return sink, nil }, ServerConfig{Logger: testLogger(t)}).Register(s)
		})
		cc := dial(t, addr)
		go func() { done <- src.PushTo(ctx, cc) }()
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("client ended with %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// pushLog records the pushes a sink received.
type pushLog struct {
	mu     sync.Mutex
	events []PushEvent
}

func (p *pushLog) hook(_ *StreamInfo, e PushEvent) {
	p.mu.Lock()
	p.events = append(p.events, e)
	p.mu.Unlock()
}

func (p *pushLog) since(n int) []PushEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]PushEvent(nil), p.events[n:]...)
}

func (p *pushLog) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.events)
}

func TestEngineConvergesUnderBurst(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs, dr)
		rec := newRecorder()
		sink := newTestSink(t, rec, []string{vs, dr})
		pair(t, d, newTestSource(t, c), sink)
		waitSynced(t, sink)
		want := map[string]string{}
		for i := range 1000 {
			name := fmt.Sprintf("ns/r%03d", i%100)
			switch {
			case i%7 == 3:
				c.Remove(vs, name)
				delete(want, name)
			default:
				c.Put(vs, entry(t, name, fmt.Sprint(i)))
				want[name] = fmt.Sprint(i)
			}
		}
		rec.waitState(t, vs, want)
		if n := rec.changeCount(); n >= 1000 {
			t.Errorf("%d pushes applied for 1,000 changes: nothing was coalesced", n)
		}
	})
}

func TestEngineReconnectResumesWithoutFullResend(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		for i := range 100 {
			c.Put(vs, entry(t, fmt.Sprintf("ns/r%03d", i), "1"))
		}
		rec := newRecorder()
		log := &pushLog{}
		src := newTestSource(t, c)
		sink := newTestSink(t, rec, []string{vs}, func(o *SinkOptions) { o.Hooks.Pushed = log.hook })
		disconnect := pair(t, d, src, sink)
		want := map[string]string{}
		for i := range 100 {
			want[fmt.Sprintf("ns/r%03d", i)] = "1"
		}
		rec.waitState(t, vs, want)
		waitVersions(t, sink, vs, want) // recorded after Apply returns: what the next stream declares
		disconnect()

		// While disconnected: one update, one delete.
		c.Put(vs, entry(t, "ns/r007", "2"))
		c.Remove(vs, "ns/r008")
		want["ns/r007"] = "2"
		delete(want, "ns/r008")
		n := log.len()
		disconnect = pair(t, d, src, sink)
		rec.waitState(t, vs, want)
		got := log.since(n)
		if len(got) != 1 || !got[0].Incremental || got[0].Resources != 1 || got[0].Removed != 1 {
			t.Fatalf("pushes after reconnect = %+v, want one incremental push of 1 resource and 1 removal", got)
		}
		waitVersions(t, sink, vs, want)
		disconnect()

		// Nothing changed: the reconnect costs one empty push.
		n = log.len()
		pair(t, d, src, sink)
		deadline := time.Now().Add(waitFor)
		for log.len() == n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := log.since(n); len(got) != 1 || got[0].Resources != 0 || got[0].Removed != 0 {
			t.Fatalf("pushes after idle reconnect = %+v, want one empty push", got)
		}
	})
}

func TestEngineMarshalsEachResourceOnce(t *testing.T) {
	c := NewCache(vs)
	for i := range 50 {
		c.Put(vs, entry(t, fmt.Sprintf("ns/r%02d", i), "1"))
	}
	src := newTestSource(t, c)
	addr := serve(t, func(s *grpc.Server) {
		NewSourceServer(src, ServerConfig{Logger: testLogger(t), StreamBurst: 100}).Register(s)
	})
	const streams = 20
	recs := make([]*recorder, streams)
	want := map[string]string{}
	for i := range 50 {
		want[fmt.Sprintf("ns/r%02d", i)] = "1"
	}
	res0, body0 := ResourceEncodes(), BodyEncodes()
	for i := range recs {
		recs[i] = newRecorder()
		sink := newTestSink(t, recs[i], []string{vs})
		cc := dial(t, addr)
		goRun(t, func(ctx context.Context) error { return sink.PullFrom(ctx, cc) })
	}
	for _, r := range recs {
		r.waitState(t, vs, want)
	}
	if n := ResourceEncodes() - res0; n != 0 {
		t.Errorf("serving %d streams marshaled %d resources, want 0", streams, n)
	}
	if n := BodyEncodes() - body0; n != 1 {
		t.Errorf("serving %d streams assembled %d bodies, want 1", streams, n)
	}
	res0, body0 = ResourceEncodes(), BodyEncodes()
	c.Put(vs, entry(t, "ns/r00", "2"))
	want["ns/r00"] = "2"
	for _, r := range recs {
		r.waitState(t, vs, want)
	}
	if n := ResourceEncodes() - res0; n != 1 {
		t.Errorf("one change marshaled %d resources, want 1", n)
	}
	if n := BodyEncodes() - body0; n != 1 {
		t.Errorf("one change to %d streams assembled %d bodies, want 1", streams, n)
	}
}

func TestEngineStuckPeerDoesNotBlockOthers(t *testing.T) {
	c := NewCache()
	big := make([]*Entry, 0, 8)
	for i := range 8 {
		r := res(fmt.Sprintf("ns/big%d", i), "1", string(make([]byte, 512<<10)))
		e, err := NewEntry(r)
		if err != nil {
			t.Fatal(err)
		}
		big = append(big, e)
	}
	var colls []string
	for i := range 8 {
		name := fmt.Sprintf("big/%d", i)
		colls = append(colls, name)
		c.Put(name, big...) // 4 MiB per collection
	}
	c.Put(vs, entry(t, "ns/a", "1"))
	src := newTestSource(t, c, func(o *SourceOptions) { o.MaxMessageSize = 8 << 20 })
	addr := serve(t, func(s *grpc.Server) { NewSourceServer(src, ServerConfig{Logger: testLogger(t)}).Register(s) })

	// The stuck sink subscribes to 32 MiB and never reads.
	stuckCC := dial(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := mcppb.NewResourceSourceClient(stuckCC).EstablishResourceStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range colls {
		if err := st.Send(&mcppb.RequestResources{Collection: name}); err != nil {
			t.Fatal(err)
		}
	}
	// A healthy sink on the same server still gets every change.
	rec := newRecorder()
	sink := newTestSink(t, rec, []string{vs})
	cc := dial(t, addr)
	goRun(t, func(ctx context.Context) error { return sink.PullFrom(ctx, cc) })
	rec.waitState(t, vs, map[string]string{"ns/a": "1"})
	for i := 2; i < 20; i++ {
		c.Put(vs, entry(t, "ns/a", fmt.Sprint(i)))
	}
	rec.waitState(t, vs, map[string]string{"ns/a": "19"})
}

func TestEngineStreamsEndOnCancel(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		closed := make(chan *StreamInfo, 4)
		hooks := Hooks{StreamClosed: func(i *StreamInfo, _ error) { closed <- i }}
		src := newTestSource(t, c, func(o *SourceOptions) { o.Hooks = hooks })
		rec := newRecorder()
		sink := newTestSink(t, rec, []string{vs}, func(o *SinkOptions) { o.Hooks = hooks })
		disconnect := pair(t, d, src, sink)
		waitSynced(t, sink)
		disconnect() // asserts the client returned context.Canceled
		roles := map[string]bool{}
		for range 2 {
			select {
			case i := <-closed:
				roles[i.Role+"/"+i.Transport] = true
			case <-time.After(waitFor):
				t.Fatalf("streams closed: %v, want both sides", roles)
			}
		}
		if len(roles) != 2 {
			t.Fatalf("closed = %v", roles)
		}
	})
}

func TestServerAdmission(t *testing.T) {
	reg := newTestMetrics(t)
	c := NewCache(vs)
	src := newTestSource(t, c)
	addr := serve(t, func(s *grpc.Server) {
		NewSourceServer(src, ServerConfig{RefusalDelay: -1, Logger: testLogger(t), StreamRate: 0.001, StreamBurst: 3, Metrics: reg.m}).Register(s)
	})
	cc := dial(t, addr)
	open := func() error {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		st, err := mcppb.NewResourceSourceClient(cc).EstablishResourceStream(ctx)
		if err != nil {
			return err
		}
		// A refused stream's reason comes with Recv (Send may see only io.EOF).
		if err := st.Send(&mcppb.RequestResources{Collection: vs}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = st.Recv()
		return err
	}
	for i := range 3 {
		if err := open(); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if err := open(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("4th stream: %v, want ResourceExhausted", err)
	}
	if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", "rate_limited"); n != 1 {
		t.Errorf("streams_rejected_total{rate_limited} = %v", n)
	}

	// Authentication and per-stream refusal.
	denied := serve(t, func(s *grpc.Server) {
		NewSourceServer(src, ServerConfig{Logger: testLogger(t), Authenticate: func(context.Context) (string, error) {
			return "", status.Error(codes.PermissionDenied, "unknown identity")
		}}).Register(s)
		NewSinkServer(func(context.Context, *StreamInfo) (*Sink, error) { return nil, errors.New("no such cluster") },
			ServerConfig{Logger: testLogger(t)}).Register(s)
	})
	dcc := dial(t, denied)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := mcppb.NewResourceSourceClient(dcc).EstablishResourceStream(ctx)
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("unauthenticated source stream: %v", err)
	}
	if err := src.PushTo(ctx, dcc); status.Code(err) != codes.PermissionDenied {
		t.Errorf("refused sink stream: %v", err)
	}
}

func TestEngineMetrics(t *testing.T) {
	reg := newTestMetrics(t)
	c := NewCache(vs)
	c.Put(vs, entry(t, "ns/a", "1"))
	src := newTestSource(t, c, func(o *SourceOptions) { o.Metrics = reg.m })
	rec := newRecorder()
	sink := newTestSink(t, rec, []string{vs}, func(o *SinkOptions) { o.Metrics = reg.m })
	disconnect := pair(t, sourceServes, src, sink)
	rec.waitState(t, vs, map[string]string{"ns/a": "1"})
	deadline := time.Now().Add(waitFor)
	for reg.counter(t, "meshfed_mcp_acks_total", "role", "source") < 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for _, tc := range []struct {
		name   string
		labels []string
	}{
		{"meshfed_mcp_pushes_total", []string{"role", "source", "collection", vs, "kind", "full"}},
		{"meshfed_mcp_pushes_total", []string{"role", "sink", "collection", vs}},
		{"meshfed_mcp_acks_total", []string{"role", "source", "collection", vs}},
		{"meshfed_mcp_acks_total", []string{"role", "sink", "collection", vs}},
		{"meshfed_mcp_push_ack_latency_seconds", []string{"collection", vs}},
		{"meshfed_mcp_bytes_total", []string{"role", "source", "direction", "sent"}},
		{"meshfed_mcp_bytes_total", []string{"role", "sink", "direction", "received"}},
		{"meshfed_mcp_streams_total", []string{"role", "source", "transport", "server"}},
		{"meshfed_mcp_streams_total", []string{"role", "sink", "transport", "client"}},
	} {
		if reg.counter(t, tc.name, tc.labels...) < 1 {
			t.Errorf("%s%v not recorded", tc.name, tc.labels)
		}
	}
	disconnect()
	for reg.counter(t, "meshfed_mcp_streams_open") != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := reg.counter(t, "meshfed_mcp_streams_open"); n != 0 {
		t.Errorf("streams_open = %v after close", n)
	}
}

// waitVersions waits until sink has recorded want as the versions it holds for collection
// (it records them after its Applier returns, so a test that saw the Applier's state and
// reconnects at once could otherwise declare older versions).
func waitVersions(t *testing.T, sink *Sink, collection string, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !mapsEqual(sink.Versions(collection), want) {
		if time.Now().After(deadline) {
			t.Fatalf("sink versions %v, want %v", sink.Versions(collection), want)
		}
		time.Sleep(time.Millisecond)
	}
}
