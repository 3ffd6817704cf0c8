package mcp

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// groupOf puts a peer "x-N" in group "x", with the limits limits gives it.
func groupOf(limits func(group string) GroupLimits) func(*StreamInfo) (string, GroupLimits) {
	return func(info *StreamInfo) (string, GroupLimits) {
		g, _, _ := strings.Cut(info.Identity, "-")
		return g, limits(g)
	}
}

// openGroup tracks what PeerGroupsConfig.Opened reported last, per group.
type openGroup struct {
	mu   sync.Mutex // guards last
	last map[string]int
}

func (o *openGroup) opened(group string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last[group] = n
}

func (o *openGroup) get(group string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last[group]
}

// One group's peers share MaxStreams across every server of the Groups, whichever peer and
// service: one more stream is refused with ResourceExhausted, counted under the group's
// reason, while another group's peers are admitted; a stream that ends frees its place; the
// limits are asked per stream, so a new limit applies to the next stream.
func TestGroupMaxStreamsSpansServersAndPeers(t *testing.T) {
	reg := newTestMetrics(t)
	var max atomic.Int32
	max.Store(3)
	seen := &openGroup{last: map[string]int{}}
	var refused sync.Map
	groups := NewPeerGroups(PeerGroupsConfig{Kind: "tenant", Logger: testLogger(t), Opened: seen.opened,
		Refused: func(g, reason string) { refused.Store(g+"/"+reason, true) },
		Of: groupOf(func(g string) GroupLimits {
			if g == "a" {
				return GroupLimits{MaxStreams: int(max.Load())}
			}
			return GroupLimits{}
		})})
	cfg := ServerConfig{RefusalDelay: -1, Logger: testLogger(t), Metrics: reg.m, Authenticate: identityFromMetadata, Groups: groups,
		StreamRate: 1e6, StreamBurst: 1e6}
	c := NewCache(vs)
	c.Put(vs, entry(t, "ns/a", "0"))
	kinds := serverKinds()
	mcpKind, xdsKind := kinds[0], kinds[2]
	mcpAddr, _ := mcpKind.start(t, c, cfg)
	xdsAddr, _ := xdsKind.start(t, c, cfg)
	mcpCC, xdsCC := dial(t, mcpAddr), dial(t, xdsAddr)

	var held []func()
	t.Cleanup(func() {
		for _, stop := range held {
			stop()
		}
	})
	conn := func(k serverKind) *grpc.ClientConn {
		if k.name == xdsKind.name {
			return xdsCC
		}
		return mcpCC
	}
	hold := func(k serverKind, identity string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		if err := k.open(ctx, conn(k), identity, false); err != nil {
			cancel()
			t.Fatalf("%s on %s: %v", identity, k.name, err)
		}
		held = append(held, cancel)
	}
	hold(mcpKind, "a-1")
	hold(mcpKind, "a-2")
	hold(xdsKind, "a-3")
	if n := groups.Open("a"); n != 3 || seen.get("a") != 3 {
		t.Fatalf("group a: Open %d, Opened told %d; want 3", n, seen.get("a"))
	}
	for _, k := range []serverKind{mcpKind, xdsKind} {
		err := k.openOnce(conn(k), "a-4")
		if s := status.Convert(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), `tenant "a": 3 open, at most 3`) {
			t.Fatalf("a fourth stream of group a on %s: %v, want ResourceExhausted naming the group and its cap", k.name, err)
		}
	}
	if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", "tenant_too_many_streams"); n != 2 {
		t.Errorf("tenant_too_many_streams = %v, want 2", n)
	}
	if _, ok := refused.Load("a/tenant_too_many_streams"); !ok {
		t.Error("Refused was not told")
	}
	hold(xdsKind, "b-1") // another group is not held back by a's
	hold(mcpKind, "b-2")
	if n := groups.Open("b"); n != 2 {
		t.Errorf("group b: %d open, want 2", n)
	}

	held[0]() // one of a's streams ends: its place is free
	waitUntil(t, "a's ended stream frees its place", func() bool { return groups.Open("a") == 2 })
	hold(xdsKind, "a-5")
	max.Store(5) // asked per stream: the next one sees the new limit
	hold(mcpKind, "a-6")
	if n := groups.Open("a"); n != 4 || seen.get("a") != 4 {
		t.Errorf("group a: Open %d, Opened told %d; want 4", n, seen.get("a"))
	}
}

// A group's peers opening streams faster than its rate, all together, are refused with
// ResourceExhausted and a RetryInfo, counted under the group's reason and logged once per
// group and reason per interval whichever server refused; another group opens its streams.
// The per-peer rate does not refuse them: each peer opens one.
func TestGroupRateIsSharedByItsPeers(t *testing.T) {
	const burst, attempts = 5, 40
	reg := newTestMetrics(t)
	logs := &logCapture{}
	groups := NewPeerGroups(PeerGroupsConfig{Kind: "tenant", Logger: slog.New(logs),
		Of: groupOf(func(string) GroupLimits { return GroupLimits{StreamsPerSecond: 1, StreamBurst: burst} })})
	now := time.Unix(1e9, 0)
	groups.now = func() time.Time { return now } // no refill: the counts are exact
	cfg := ServerConfig{RefusalDelay: -1, Logger: slog.New(logs), Metrics: reg.m, Authenticate: identityFromMetadata, Groups: groups}
	c := NewCache(vs)
	kinds := serverKinds()
	srcAddr, _ := kinds[0].start(t, c, cfg)
	sinkAddr, _ := kinds[1].start(t, c, cfg)
	srcCC, sinkCC := dial(t, srcAddr), dial(t, sinkAddr)
	admitted := 0
	for i := range attempts {
		k, cc := kinds[0], srcCC
		if i%2 == 1 {
			k, cc = kinds[1], sinkCC
		}
		err := k.openOnce(cc, fmt.Sprintf("a-%d", i))
		switch s := status.Convert(err); {
		case err == nil:
			admitted++
		case s.Code() == codes.ResourceExhausted && strings.Contains(s.Message(), `peers of tenant "a": at most 1 per second, burst 5`):
			if d := retryDelay(s); d != time.Second {
				t.Errorf("RetryInfo %v, want 1s", d)
			}
		default:
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if admitted != burst {
		t.Errorf("%d of group a's %d streams admitted, want its burst, %d", admitted, attempts, burst)
	}
	if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", "tenant_rate_limited"); n != attempts-burst {
		t.Errorf("tenant_rate_limited = %v, want %d", n, attempts-burst)
	}
	if n := reg.counter(t, "meshfed_mcp_streams_rejected_total", "reason", rejectRateLimited); n != 0 {
		t.Errorf("rate_limited (per peer) = %v, want 0", n)
	}
	if err := kinds[0].openOnce(srcCC, "b-1"); err != nil {
		t.Errorf("group b after a's storm: %v", err)
	}
	lines := logs.lines("refusing stream")
	if len(lines) != 1 || lines[0]["reason"] != "tenant_rate_limited" || lines[0]["tenant"] != "a" {
		t.Errorf("%d refusals on two servers logged %v, want one tenant_rate_limited line for a", attempts-burst, lines)
	}
}
