package interop

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
)

// The hub and the minion with Istio's own MCP peers, in their default configuration (every
// built-in collection), against sources that serve fewer: Istio 1.6-era sources know no
// WasmPlugin, Telemetry, ProxyConfig or TrafficExtension, and end the whole stream when
// asked for one.

func vsSpec(hosts ...string) *networking.VirtualService {
	return &networking.VirtualService{Hosts: hosts}
}

// runTestHub runs a development-mode hub of one cluster, east (identity "east"), owning
// everything, with every built-in collection (unless change says otherwise), until the
// test ends.
func runTestHub(t *testing.T, change func(*hub.Config)) *hub.Hub {
	t.Helper()
	cfg := hub.Defaults()
	cfg.Insecure = true
	cfg.Ingest, cfg.Serve, cfg.HTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.StateDir = t.TempDir()
	cfg.Clusters = []hub.ClusterConfig{{Name: "east", Identities: []string{"east"}, Namespaces: []string{"*"}, Hosts: []string{"*"}}}
	cfg.Routing = routing.Config{Default: &routing.Rule{Name: "everything"}}
	if change != nil {
		change(cfg)
	}
	h, err := hub.New(cfg, testLogger(t, "hub: "), hub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub Run", h.Run)
	waitUntil(t, "the hub listening", func() (bool, string) { i, s, _ := h.Addrs(); return i != "" && s != "", "" })
	return h
}

// othersThan lists the built-in collections but keep.
func othersThan(keep string) []string {
	var out []string
	for _, c := range kinds.Collections() {
		if c != keep {
			out = append(out, c)
		}
	}
	return out
}

// TestHubIngestFromIstioSourceServingOnlyVirtualServices: a Galley-style source (Istio's
// source client, dialing the hub) that serves only VirtualServices, against a hub in its
// default configuration. Every other collection is refused by the source leaving the stream
// it was asked on (twice, to be told from a reconnect); the hub goes on without each, and
// the cluster syncs: its
// VirtualService is served, its status names the refused collections, each is counted once,
// and the stream that carries VirtualServices stays up for later changes.
func TestHubIngestFromIstioSourceServingOnlyVirtualServices(t *testing.T) {
	t.Parallel()
	h := runTestHub(t, nil)
	ingest, serve, _ := h.Addrs()
	istio := startPeer(t, peerConfig{mode: "source-client", addr: ingest, collections: []string{collA}, meta: mcp.DevIdentityHeader + "=east"})
	istio.setSpecs(collA, "vs-1", map[string]proto.Message{"default/reviews": vsSpec("reviews.example.com")})

	// Istio's client dials again a second after leaving a stream, and a refusal takes two.
	waitUntilFor(t, 2*time.Minute, "cluster east synced", func() (bool, string) { return h.ClusterSynced("east"), fmt.Sprint(h.Clusters()) })
	st := h.Clusters()[0]
	if got, want := slices.Sorted(maps.Keys(st.RefusedCollections)), othersThan(collA); !slices.Equal(got, want) {
		t.Errorf("status refusedCollections = %v, want %v", got, want)
	}
	if st.Resources[collA] != 1 {
		t.Errorf("status resources = %v, want 1 %s", st.Resources, collA)
	}
	for _, c := range othersThan(collA) {
		if n := metric(t, h.Registry(), "meshfed_mcp_collections_refused_total", map[string]string{"collection": c}); n != 1 {
			t.Errorf("collections_refused_total{%s} = %v, want 1", c, n)
		}
	}

	// A sink of the hub gets it, and the change that follows arrives on the same stream.
	sink := pullFromHub(t, serve, collA)
	waitUntil(t, "the sink holding default/reviews@1", func() (bool, string) {
		v := sink.Versions(collA)
		return v["default/reviews"] == "east/1", fmt.Sprint(v)
	})
	streams := metric(t, h.Registry(), "meshfed_mcp_streams_total", map[string]string{"role": "sink", "transport": "server"})
	if want := float64(2*len(othersThan(collA)) + 1); streams != want {
		t.Errorf("ingest streams = %v, want %v: two left waiting per refused collection, and the one that goes on", streams, want)
	}
	istio.setSpecs(collA, "vs-2", map[string]proto.Message{"default/reviews@2": vsSpec("reviews.example.com", "r.example.com")})
	waitUntil(t, "the sink holding default/reviews@2", func() (bool, string) {
		v := sink.Versions(collA)
		return v["default/reviews"] == "east/2", fmt.Sprint(v)
	})
	if now := metric(t, h.Registry(), "meshfed_mcp_streams_total", map[string]string{"role": "sink", "transport": "server"}); now != streams {
		t.Errorf("ingest streams = %v after a change, want still %v", now, streams)
	}
}

// pullFromHub runs a sink of collections pulling from the hub's ResourceSource until the
// test ends.
func pullFromHub(t *testing.T, serve string, collections ...string) *mcp.Sink {
	t.Helper()
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: collections, Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error { return nil }),
		Logger: testLogger(t, "hub sink: ")})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(serve, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	runLoop(t, testLogger(t, "hub sink: "), "Sink.PullFrom", func(ctx context.Context) error { return sink.PullFrom(ctx, cc) })
	return sink
}

// startFollowingMinion runs a development-mode minion of cluster east in its default
// configuration but for its source, mcp://addr, until the test ends.
func startFollowingMinion(t *testing.T, addr string) *minion.Minion {
	t.Helper()
	cfg := minion.Defaults()
	cfg.Cluster, cfg.Insecure, cfg.HTTP = "east", true, ""
	cfg.Sources = []minion.SourceConfig{{URL: "mcp://" + addr}}
	cfg.Destinations.Listen = "127.0.0.1:0"
	cfg.Destinations.Backoff = ops.Backoff{Initial: ops.D(20 * time.Millisecond), Max: ops.D(200 * time.Millisecond)}
	m, err := minion.New(cfg, testLogger(t, "minion: "), minion.NewTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "minion Run", m.Run)
	return m
}

// TestMinionFollowsIstioSourceServingOnlyVirtualServices: a minion in its default
// configuration follows Istio's source server, which serves only VirtualServices. Each
// other collection ends a stream; the minion goes on without it, becomes ready and publishes
// the VirtualService, and its status names what the upstream refused.
func TestMinionFollowsIstioSourceServingOnlyVirtualServices(t *testing.T) {
	t.Parallel()
	istio := startPeer(t, peerConfig{mode: "source-server", addr: "127.0.0.1:0", collections: []string{collA}})
	istio.setSpecs(collA, "vs-1", map[string]proto.Message{"default/reviews": vsSpec("reviews.example.com")})
	m := startFollowingMinion(t, istio.addr)
	waitUntil(t, "the minion ready with the VirtualService", func() (bool, string) {
		return m.Ready() && m.Cache().Len(collA) == 1, fmt.Sprint(m.Status())
	})
	src := m.Status().Sources[0]
	if got, want := slices.Sorted(maps.Keys(src.RefusedCollections)), othersThan(collA); !slices.Equal(got, want) {
		t.Errorf("source refusedCollections = %v, want %v", got, want)
	}
}

// TestMinionFollowsIncrementalIstioSourceAcrossDeletions: Istio's incremental source ignores
// the versions a sink declares and sends a new stream's first push of all but one collection
// flagged incremental, without the deletions made while the stream was down. The minion,
// in its default configuration, follows such a source across a restart that deleted an
// object of each collection, and publishes neither.
func TestMinionFollowsIncrementalIstioSourceAcrossDeletions(t *testing.T) {
	t.Parallel()
	istio := startPeer(t, peerConfig{mode: "source-server", addr: "127.0.0.1:0", collections: []string{collA, collB}, incremental: true})
	both := func(version string, names ...string) {
		vs, dr := map[string]proto.Message{}, map[string]proto.Message{}
		for _, n := range names {
			vs[n] = vsSpec(n[len("default/"):] + ".example.com")
			dr[n] = &networking.DestinationRule{Host: n[len("default/"):] + ".example.com"}
		}
		istio.setSpecs(collA, "vs-"+version, vs)
		istio.setSpecs(collB, "dr-"+version, dr)
	}
	both("1", "default/ratings", "default/reviews")
	m := startFollowingMinion(t, istio.addr)
	// Settled first: ready, its negotiation done (the restart below is a restart of a source
	// the minion follows, not one in the middle of its subscription).
	waitUntil(t, "the minion ready, holding both objects of each collection", func() (bool, string) {
		return m.Ready() && m.Cache().Len(collA) == 2 && m.Cache().Len(collB) == 2, fmt.Sprint(m.Status())
	})

	istio = istio.restart()
	both("2", "default/reviews")
	waitUntil(t, "the minion holding only default/reviews of each collection", func() (bool, string) {
		return m.Cache().Len(collA) == 1 && m.Cache().Len(collB) == 1, fmt.Sprint(m.Status())
	})
}

// TestHubAcksIstioSourcePartlyRefusedPush: Istio's incremental source reads a NACK as
// "nothing applied" and sends its next push against the version it last had ACKed, so a
// resource sent after that and then deleted is never listed as removed. The hub applies a
// push but for the resources it refuses; to a source that does not resume it ACKs such a
// push (the refusal stays in status), so a deletion made while a refusal stands arrives.
func TestHubAcksIstioSourcePartlyRefusedPush(t *testing.T) {
	t.Parallel()
	h := runTestHub(t, func(cfg *hub.Config) {
		cfg.Collections = []string{collA}
		cfg.Clusters[0].Namespaces = []string{"default"}
	})
	ingest, _, _ := h.Addrs()
	istio := startPeer(t, peerConfig{mode: "source-client", addr: ingest, collections: []string{collA}, incremental: true, meta: mcp.DevIdentityHeader + "=east"})
	istio.setSpecs(collA, "v1", map[string]proto.Message{"default/keep": vsSpec("keep.example.com")})
	waitUntil(t, "east holding default/keep", func() (bool, string) { st := h.Clusters()[0]; return st.Resources[collA] == 1, fmt.Sprint(st) })
	// One refused (namespace other is not east's), one accepted, then the accepted one deleted.
	istio.setSpecs(collA, "v2", map[string]proto.Message{"default/keep": vsSpec("keep.example.com"), "default/gone": vsSpec("gone.example.com"), "other/x": vsSpec("x.example.com")})
	waitUntil(t, "east holding default/gone, other/x refused", func() (bool, string) {
		st := h.Clusters()[0]
		return st.Resources[collA] == 2 && len(st.Rejections[collA]) == 1, fmt.Sprint(st)
	})
	istio.setSpecs(collA, "v3", map[string]proto.Message{"default/keep": vsSpec("keep.example.com"), "other/x": vsSpec("x.example.com")})
	waitUntil(t, "default/gone removed at the hub", func() (bool, string) { st := h.Clusters()[0]; return st.Resources[collA] == 1, fmt.Sprint(st) })
	if st := h.Clusters()[0]; len(st.Rejections[collA]) != 1 {
		t.Errorf("rejections = %v, want other/x still refused", st.Rejections)
	}
}

// TestHubFollowsIncrementalIstioSourceAcrossDeletions: Istio's incremental source client
// (Galley with incremental on) restarted after deletions: its new stream's first push of all
// but one collection says incremental and lists everything without removals. The hub, in
// its default behaviour, takes each collection's first push on a stream from a source that
// does not resume as its full state, so neither deleted object stays served.
func TestHubFollowsIncrementalIstioSourceAcrossDeletions(t *testing.T) {
	t.Parallel()
	h := runTestHub(t, func(cfg *hub.Config) { cfg.Collections = []string{collA, collB} })
	ingest, _, _ := h.Addrs()
	cfg := peerConfig{mode: "source-client", addr: ingest, collections: []string{collA, collB}, incremental: true, meta: mcp.DevIdentityHeader + "=east"}
	istio := startPeer(t, cfg)
	both := func(version string, names ...string) {
		vs, dr := map[string]proto.Message{}, map[string]proto.Message{}
		for _, n := range names {
			vs[n] = vsSpec(n[len("default/"):] + ".example.com")
			dr[n] = &networking.DestinationRule{Host: n[len("default/"):] + ".example.com"}
		}
		istio.setSpecs(collA, "vs-"+version, vs)
		istio.setSpecs(collB, "dr-"+version, dr)
	}
	held := func(n int) func() (bool, string) {
		return func() (bool, string) {
			st := h.Clusters()[0]
			return st.Resources[collA] == n && st.Resources[collB] == n, fmt.Sprint(st.Resources)
		}
	}
	both("1", "default/ratings", "default/reviews")
	waitUntil(t, "east holding both objects of each collection", held(2))

	istio.kill()
	istio = startPeer(t, cfg)
	both("2", "default/reviews")
	waitUntil(t, "east holding only default/reviews of each collection", held(1))
}
