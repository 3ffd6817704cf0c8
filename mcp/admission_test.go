package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/mcp/kinds"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// logCapture is a slog handler keeping every record, to count the lines a test caused.
type logCapture struct {
	mu   sync.Mutex // guards recs
	recs []slog.Record
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

// lines returns the records whose message starts with prefix, each as its message and
// its attributes.
func (c *logCapture) lines(prefix string) []map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]string
	for _, r := range c.recs {
		if !strings.HasPrefix(r.Message, prefix) {
			continue
		}
		m := map[string]string{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}

// serverKind is one of the services admission guards, served over real gRPC.
type serverKind struct {
	name string
	// start serves the service with cfg and returns its address and admission (for the
	// test's clock).
	start func(t *testing.T, w *Cache, cfg ServerConfig) (string, *admission)
	// open opens a stream as identity and sends the peer's first message, and returns the
	// stream's first answer's error (nil: admitted and answered); or, silent, sends nothing
	// and returns the error the stream ends with. Cancelling ctx ends the stream.
	open func(ctx context.Context, cc *grpc.ClientConn, identity string, silent bool) error
}

func serverKinds() []serverKind {
	id := func(ctx context.Context, identity string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "x-test-identity", identity)
	}
	return []serverKind{
		{
			name: "ResourceSource",
			start: func(t *testing.T, w *Cache, cfg ServerConfig) (string, *admission) {
				srv := NewSourceServer(newTestSource(t, w, func(o *SourceOptions) { o.Metrics = cfg.Metrics }), cfg)
				return serve(t, func(s *grpc.Server) { srv.Register(s) }), srv.adm
			},
			open: func(ctx context.Context, cc *grpc.ClientConn, identity string, silent bool) error {
				st, err := mcppb.NewResourceSourceClient(cc).EstablishResourceStream(id(ctx, identity))
				if err != nil {
					return err
				}
				if !silent {
					if err := st.Send(&mcppb.RequestResources{Collection: vs}); err != nil && !errors.Is(err, io.EOF) {
						return err // on io.EOF the stream has ended: Recv says why
					}
				}
				return recvUntil(silent, func() error { _, err := st.Recv(); return err })
			},
		},
		{
			name: "ResourceSink",
			start: func(t *testing.T, w *Cache, cfg ServerConfig) (string, *admission) {
				srv := NewSinkServer(func(context.Context, *StreamInfo) (*Sink, error) {
					return newTestSink(t, newRecorder(), []string{vs}, func(o *SinkOptions) { o.Metrics = cfg.Metrics }), nil
				}, cfg)
				return serve(t, func(s *grpc.Server) { srv.Register(s) }), srv.adm
			},
			open: func(ctx context.Context, cc *grpc.ClientConn, identity string, silent bool) error {
				st, err := mcppb.NewResourceSinkClient(cc).EstablishResourceStream(id(ctx, identity))
				if err != nil {
					return err
				}
				if !silent {
					if err := st.Send(&mcppb.Resources{Collection: TriggerCollection}); err != nil && !errors.Is(err, io.EOF) {
						return err // on io.EOF the stream has ended: Recv says why
					}
				}
				return recvUntil(silent, func() error { _, err := st.Recv(); return err }) // the server asks first
			},
		},
		{
			name: "MCP over xDS",
			start: func(t *testing.T, w *Cache, cfg ServerConfig) (string, *admission) {
				srv, err := NewXDSServer(w, XDSOptions{Server: cfg, Resolve: func(url string) (string, bool) {
					k, ok := kinds.ForTypeURL(url)
					return k.Collection, ok
				}})
				if err != nil {
					t.Fatal(err)
				}
				return serve(t, func(s *grpc.Server) { srv.Register(s) }), srv.adm
			},
			open: func(ctx context.Context, cc *grpc.ClientConn, identity string, silent bool) error {
				st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(id(ctx, identity))
				if err != nil {
					return err
				}
				if !silent {
					if err := st.Send(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL}); err != nil && !errors.Is(err, io.EOF) {
						return err // on io.EOF the stream has ended: Recv says why
					}
				}
				return recvUntil(silent, func() error { _, err := st.Recv(); return err })
			},
		},
	}
}

// recvUntil receives once, or, silent, until the stream ends.
func recvUntil(silent bool, recv func() error) error {
	for {
		if err := recv(); err != nil || !silent {
			return err
		}
	}
}

// openOnce is k.open with a context ended when it returns.
func (k serverKind) openOnce(cc *grpc.ClientConn, identity string) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	return k.open(ctx, cc, identity, false)
}

// A peer retrying in a tight loop while the server is not ready: it is told to wait
// (Unavailable and a RetryInfo), it is rate limited, and its thousands of refusals are
// counted by reason, none of them as an authentication failure, in a line per reason
// (until the interval passes, when the next line tells how many were not logged). Every
// kind of server, xDS included, logs its rate-limit refusals.
func TestNotReadyTightLoopIsCalm(t *testing.T) {
	const attempts, burst = 2000, 20
	for _, k := range serverKinds() {
		t.Run(k.name, func(t *testing.T) {
			reg := newTestMetrics(t)
			logs := &logCapture{}
			ready := func(*StreamInfo) (time.Duration, string, bool) {
				return 3 * time.Second, "warming up: waiting for cluster east", false
			}
			addr, adm := k.start(t, NewCache(vs), ServerConfig{RefusalDelay: -1, Logger: slog.New(logs), Metrics: reg.m,
				Authenticate: identityFromMetadata, Ready: ready, StreamRate: 5, StreamBurst: burst})
			var clock atomic.Pointer[time.Time]
			now := time.Unix(1e9, 0)
			clock.Store(&now)
			adm.now = func() time.Time { return *clock.Load() } // no refill: the count of each reason is exact
			cc := dial(t, addr)

			err := k.openOnce(cc, "istiod")
			s := status.Convert(err)
			if s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "warming up: waiting for cluster east; retry in 3s") {
				t.Fatalf("first attempt: %v, want Unavailable saying why and when to retry", err)
			}
			if d := retryDelay(s); d != 3*time.Second {
				t.Errorf("RetryInfo delay %v, want 3s", d)
			}
			for range attempts - 1 {
				if err := k.openOnce(cc, "istiod"); status.Code(err) != codes.Unavailable && status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("attempt: %v", err)
				}
			}
			counts := map[string]float64{}
			for _, r := range []string{rejectWarmingUp, rejectRateLimited, rejectUnauthenticated, rejectUnavailable} {
				counts[r] = reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", r)
			}
			if counts[rejectWarmingUp] != burst || counts[rejectRateLimited] != attempts-burst || counts[rejectUnauthenticated] != 0 || counts[rejectUnavailable] != 0 {
				t.Errorf("refusals by reason %v, want %d warming_up and %d rate_limited", counts, burst, attempts-burst)
			}
			lines := logs.lines("refusing stream")
			if len(lines) != 2 || lines[0]["reason"] != rejectWarmingUp || lines[1]["reason"] != rejectRateLimited {
				t.Fatalf("%d attempts logged %d lines %v, want one warming_up and one rate_limited", attempts, len(lines), lines)
			}
			t.Logf("%d attempts: %d log lines", attempts, len(lines))

			// An interval later the limiter has refilled: the next refusal is logged, with
			// the count of those that were not.
			later := now.Add(2 * time.Minute)
			clock.Store(&later)
			if err := k.openOnce(cc, "istiod"); status.Code(err) != codes.Unavailable {
				t.Fatalf("after the interval: %v", err)
			}
			lines = logs.lines("refusing stream")
			if len(lines) != 3 || lines[2]["reason"] != rejectWarmingUp || lines[2]["suppressed"] != fmt.Sprint(burst-1) {
				t.Errorf("after the interval: lines %v, want a warming_up line with suppressed=%d", lines, burst-1)
			}
		})
	}
}

func retryDelay(s *status.Status) time.Duration {
	for _, d := range s.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// Authentication refusals are counted by what they are.
func TestAuthenticationRefusalReasons(t *testing.T) {
	k := serverKinds()[2] // MCP over xDS: each kind admits through the same code
	reg := newTestMetrics(t)
	addr, _ := k.start(t, NewCache(vs), ServerConfig{RefusalDelay: -1, Logger: testLogger(t), Metrics: reg.m,
		Authenticate: func(ctx context.Context) (string, error) {
			id, err := identityFromMetadata(ctx)
			if err == nil && id != "sink" {
				return "", status.Errorf(codes.PermissionDenied, "%s may not subscribe", id)
			}
			return id, err
		}})
	cc := dial(t, addr)
	if err := k.openOnce(cc, "minion"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("minion: %v, want PermissionDenied", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx) // no identity
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("no identity: %v, want Unauthenticated", err)
	}
	if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", rejectPermissionDenied); n != 1 {
		t.Errorf("permission_denied = %v, want 1", n)
	}
	if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", rejectUnauthenticated); n != 1 {
		t.Errorf("unauthenticated = %v, want 1", n)
	}
}

// One peer may keep MaxStreamsPerPeer streams open: one more is refused, naming the cap,
// while its open streams and other peers go on; a closed stream frees its place.
func TestStreamsPerPeerCap(t *testing.T) {
	const max = 3
	for _, k := range serverKinds() {
		t.Run(k.name, func(t *testing.T) {
			reg := newTestMetrics(t)
			c := NewCache(vs)
			c.Put(vs, entry(t, "ns/a", "0"))
			addr, _ := k.start(t, c, ServerConfig{RefusalDelay: -1, Logger: testLogger(t), Metrics: reg.m, Authenticate: identityFromMetadata,
				StreamRate: 1e6, StreamBurst: 1e6, MaxStreamsPerPeer: max})
			cc := dial(t, addr)
			// hold opens a stream that stays open until the test ends, once admitted.
			hold := func(identity string) (stop func()) {
				ctx, cancel := context.WithCancel(context.Background())
				if err := k.open(ctx, cc, identity, false); err != nil {
					cancel()
					t.Fatalf("%s: %v", identity, err)
				}
				return cancel
			}
			var held []func()
			for range max {
				held = append(held, hold("a"))
			}
			t.Cleanup(func() {
				for _, stop := range held {
					stop()
				}
			})
			err := k.openOnce(cc, "a")
			if s := status.Convert(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), fmt.Sprintf("at most %d per peer", max)) {
				t.Fatalf("stream %d of one peer: %v, want ResourceExhausted naming the cap", max+1, err)
			}
			if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", rejectTooManyStreams); n != 1 {
				t.Errorf("too_many_streams = %v, want 1", n)
			}
			held = append(held, hold("b")) // another peer
			if n := reg.counter(t, "meshfed_mcp_streams_open", "transport", "server"); n != max+1 {
				t.Errorf("%v streams open, want a's %d and b's", n, max)
			}
			held[0]()
			waitUntil(t, "a's closed stream frees its place", func() bool { return k.openOnce(cc, "a") == nil })
		})
	}
}

// waitUntil polls cond until it holds (for what a peer cannot be told: when the server
// has seen its stream end).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A stream whose peer says nothing is closed after IdleTimeout, counted as idle, and frees
// its place; a stream whose peer spoke is not, however long it is then quiet.
func TestIdleStreamClosed(t *testing.T) {
	for _, k := range serverKinds() {
		t.Run(k.name, func(t *testing.T) {
			reg := newTestMetrics(t)
			logs := &logCapture{}
			addr, _ := k.start(t, NewCache(vs), ServerConfig{RefusalDelay: -1, Logger: slog.New(logs), Metrics: reg.m, Authenticate: identityFromMetadata,
				IdleTimeout: 100 * time.Millisecond, MaxStreamsPerPeer: 1})
			cc := dial(t, addr)
			// The speaking stream opens first: it would idle first.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := k.open(ctx, cc, "speaks", false); err != nil {
				t.Fatal(err)
			}
			sctx, scancel := context.WithTimeout(context.Background(), waitFor)
			defer scancel()
			err := k.open(sctx, cc, "silent", true)
			if s := status.Convert(err); s.Code() != codes.DeadlineExceeded || !strings.Contains(s.Message(), "no message within 100ms") {
				t.Fatalf("silent stream: %v, want DeadlineExceeded saying it sent nothing", err)
			}
			if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", rejectIdle); n != 1 {
				t.Errorf("idle = %v, want 1", n)
			}
			if lines := logs.lines("closing stream"); len(lines) != 1 || lines[0]["reason"] != rejectIdle {
				t.Errorf("log %v, want one idle line", lines)
			}
			// The idle stream's place is free once it is told (the cap is 1).
			if err := k.openOnce(cc, "silent"); err != nil {
				t.Errorf("after the idle stream closed: %v", err)
			}
			if n := reg.counter(t, "meshfed_mcp_streams_open", "transport", "server", "role", roleOf(k)); n < 1 {
				t.Errorf("the speaking stream was closed (%v open)", n)
			}
			if err := ctx.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func roleOf(k serverKind) string {
	if k.name == "ResourceSink" {
		return "sink"
	}
	return "source"
}

// The idle timeout and the first message race: whichever wins, a stream is either closed
// as idle or served, never both.
func TestIdleTimeoutRacesFirstMessage(t *testing.T) {
	k := serverKinds()[0]
	reg := newTestMetrics(t)
	addr, _ := k.start(t, NewCache(vs), ServerConfig{RefusalDelay: -1, Logger: discardLogger(), Metrics: reg.m, Authenticate: identityFromMetadata,
		StreamRate: 1e6, StreamBurst: 1e6, IdleTimeout: time.Millisecond})
	cc := dial(t, addr)
	idled := 0
	for range 200 {
		err := k.openOnce(cc, "racer")
		switch status.Code(err) {
		case codes.OK:
		case codes.DeadlineExceeded:
			idled++
		default:
			t.Fatalf("stream: %v", err)
		}
	}
	if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", rejectIdle); int(n) != idled {
		t.Errorf("%v counted idle, %d seen idle", n, idled)
	}
}

// A stream refused for exceeding a limit is answered only after RefusalDelay: a peer
// looping on refusals waits instead of spinning (a client that gives up first sees its own
// deadline, not the refusal). Once MaxHeldRefusals are waiting, a refusal is answered at
// once.
func TestRefusalsWaitOutTheDelay(t *testing.T) {
	for _, k := range serverKinds() {
		t.Run(k.name, func(t *testing.T) {
			c := NewCache(vs)
			c.Put(vs, entry(t, "ns/a", "0"))
			addr, adm := k.start(t, c, ServerConfig{Logger: testLogger(t), Authenticate: identityFromMetadata,
				StreamRate: 1e-9, StreamBurst: 1, RefusalDelay: time.Hour, MaxHeldRefusals: 1})
			cc := dial(t, addr)
			if err := k.openOnce(cc, "a"); err != nil { // its burst
				t.Fatalf("a's first stream: %v", err)
			}
			// a's next stream is over its rate: held for an hour, so its client gives up
			// first (a cancel, not a deadline: gRPC would tell the server the deadline).
			ctx, cancel := context.WithCancel(context.Background())
			defer time.AfterFunc(300*time.Millisecond, cancel).Stop()
			if err := k.open(ctx, cc, "a", false); status.Code(err) != codes.Canceled {
				t.Fatalf("a stream over the rate: %v, want it held until its client gave up", err)
			}
			waitUntil(t, "the server to see the client give up", func() bool { return len(adm.held) == 0 })
			// Hold one (until the test ends); the next refusal is then answered at once.
			ctx2, cancel2 := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = k.open(ctx2, cc, "a", false) }()
			t.Cleanup(func() { cancel2(); <-done })
			waitUntil(t, "a refusal held", func() bool { return len(adm.held) == 1 })
			if err := k.openOnce(cc, "a"); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a refusal while the holding place is taken: %v, want ResourceExhausted at once", err)
			}
		})
	}
}
