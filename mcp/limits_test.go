package mcp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

func bigCache(t *testing.T, n, size int) (*Cache, map[string]string) {
	t.Helper()
	c := NewCache(vs)
	want := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("ns/r%03d", i)
		e, err := NewEntry(res(name, "1", strings.Repeat("x", size)))
		if err != nil {
			t.Fatal(err)
		}
		c.Put(vs, e)
		want[name] = "1"
	}
	return c, want
}

func TestMessageSizeLimits(t *testing.T) {
	// 60 resources of ~1 KiB: about 60 KiB of state.
	c, want := bigCache(t, 60, 1000)
	t.Run("matched limits split into fitting pushes", func(t *testing.T) {
		src := newTestSource(t, c, func(o *SourceOptions) { o.MaxMessageSize = 16 << 10 })
		addr := serve(t, func(s *grpc.Server) { NewSourceServer(src, ServerConfig{Logger: testLogger(t)}).Register(s) })
		rec := newRecorder()
		log := &pushLog{}
		sink := newTestSink(t, rec, []string{vs}, func(o *SinkOptions) {
			o.MaxMessageSize = 16 << 10
			o.Hooks.Pushed = log.hook
		})
		cc := dial(t, addr)
		goRun(t, func(ctx context.Context) error { return sink.PullFrom(ctx, cc) })
		rec.waitState(t, vs, want)
		if n := log.len(); n < 4 {
			t.Errorf("%d pushes for 60 KiB under a 16 KiB limit", n)
		}
	})
	t.Run("a sink limit below the source's fails clearly", func(t *testing.T) {
		src := newTestSource(t, c) // 4 MiB
		addr := serve(t, func(s *grpc.Server) { NewSourceServer(src, ServerConfig{Logger: testLogger(t)}).Register(s) })
		sink := newTestSink(t, newRecorder(), []string{vs}, func(o *SinkOptions) { o.MaxMessageSize = 16 << 10 })
		err := sink.PullFrom(context.Background(), dial(t, addr))
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("PullFrom = %v, want ResourceExhausted", err)
		}
	})
	t.Run("a server receive limit refuses oversized pushes", func(t *testing.T) {
		src := newTestSource(t, c)
		rec := newRecorder()
		sink := newTestSink(t, rec, []string{vs})
		addr := serve(t, func(s *grpc.Server) {
			NewSinkServer(func(context.Context, *StreamInfo) (*Sink, error) { return sink, nil }, ServerConfig{Logger: testLogger(t)}).Register(s)
		}, grpc.MaxRecvMsgSize(16<<10))
		err := src.PushTo(context.Background(), dial(t, addr))
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("PushTo = %v, want ResourceExhausted", err)
		}
	})
}

// identityFromMetadata authenticates test peers by a header, so one test process can act as
// several peers.
func identityFromMetadata(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-test-identity"); len(v) == 1 {
		return v[0], nil
	}
	return "", status.Error(codes.Unauthenticated, "no x-test-identity")
}

func TestTightRedialLoopDoesNotHurtOthers(t *testing.T) {
	reg := newTestMetrics(t)
	c := NewCache(vs)
	c.Put(vs, entry(t, "ns/a", "0"))
	src := newTestSource(t, c, func(o *SourceOptions) { o.Metrics = reg.m })
	addr := serve(t, func(s *grpc.Server) {
		NewSourceServer(src, ServerConfig{RefusalDelay: -1, Logger: discardLogger(), Metrics: reg.m, Authenticate: identityFromMetadata,
			StreamRate: 5, StreamBurst: 5}).Register(s)
	})
	// A healthy sink, authenticated as "good".
	rec := newRecorder()
	sink := newTestSink(t, rec, []string{vs})
	goodCC := dial(t, addr)
	goRun(t, func(ctx context.Context) error {
		return sink.PullFrom(metadata.AppendToOutgoingContext(ctx, "x-test-identity", "good"), goodCC)
	})
	rec.waitState(t, vs, map[string]string{"ns/a": "0"})

	// A storm: 4 goroutines redial as fast as they can, 250 times each (bounded).
	stormCC := dial(t, addr)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-test-identity", "storm")
			for range 250 {
				ctx, cancel := context.WithCancel(ctx)
				st, err := mcppb.NewResourceSourceClient(stormCC).EstablishResourceStream(ctx)
				if err == nil {
					_ = st.Send(&mcppb.RequestResources{Collection: vs})
					_, _ = st.Recv()
				}
				cancel()
			}
		}()
	}
	// The healthy sink keeps up with changes throughout.
	for i := 1; i <= 50; i++ {
		c.Put(vs, entry(t, "ns/a", fmt.Sprint(i)))
		if i%10 == 0 {
			rec.waitState(t, vs, map[string]string{"ns/a": fmt.Sprint(i)})
		}
	}
	wg.Wait()
	rejected := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", "rate_limited")
	if rejected < 900 {
		t.Errorf("%v of 1,000 storm streams rejected; the limit (burst 5, 5/s) admits few", rejected)
	}
	c.Put(vs, entry(t, "ns/a", "final"))
	rec.waitState(t, vs, map[string]string{"ns/a": "final"})
}
