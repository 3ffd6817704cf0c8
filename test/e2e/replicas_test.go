package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/replicas"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// replicaConfig is twoClusterConfig as replica name of a group joining seeds.
func replicaConfig(name string, seeds ...string) *hub.Config {
	cfg := twoClusterConfig()
	// Short probes: memberlist's last probe goroutine outlives Shutdown by up to a probe
	// interval, and goleak checks for it at the end of the package.
	cfg.Replicas = hub.DefaultReplicas()
	cfg.Replicas.Name, cfg.Replicas.Gossip, cfg.Replicas.Seeds, cfg.Replicas.Profile = name, "127.0.0.1:0", seeds, "local"
	cfg.Replicas.ProbeInterval = hub.Duration{Duration: 200 * time.Millisecond}
	cfg.WarmUp = hub.Duration{Duration: 20 * time.Second}
	return cfg
}

// replicaHub is a hub with the replica layer plugged in.
type replicaHub struct {
	*hub.Hub
	layer *replicas.Layer
}

func (r replicaHub) Replicas() *api.ReplicaStatus { return r.layer.Status() }
func (r replicaHub) GossipAddr() string           { return r.layer.GossipAddr() }

// startReplica runs a replica hub until stop is called or the test ends.
func startReplica(t *testing.T, cfg *hub.Config) (h replicaHub, stop func()) {
	t.Helper()
	cfg.Ingest, cfg.Serve, cfg.HTTP = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.StateDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	core, layer, err := replicas.New(cfg, logger(t).With("side", "hub-"+cfg.Replicas.Name), nil)
	if err != nil {
		t.Fatal(err)
	}
	h = replicaHub{core, layer}
	stop = testrun.Start(t, "hub "+cfg.Replicas.Name+" Run", h.Run)
	waitFor(t, 10*time.Second, "replica listening", func() bool { i, s, _ := h.Addrs(); return s != "" && i != "" && h.Replicas() != nil })
	return h, stop
}

func gossipAddr(t *testing.T, h replicaHub) string {
	t.Helper()
	return h.GossipAddr()
}

// In one process, three replicas: each cluster's minion on one replica, sinks on every
// replica see both clusters; the minion moving to another replica, and a replica leaving,
// never make a sink see a deletion.
func TestReplicasInProcess(t *testing.T) {
	a, _ := startReplica(t, replicaConfig("a"))
	seed := gossipAddr(t, a)
	b, stopB := startReplica(t, replicaConfig("b", seed))
	c, _ := startReplica(t, replicaConfig("c", seed))
	all := []replicaHub{a, b, c}
	waitFor(t, 10*time.Second, "three replicas", func() bool {
		for _, h := range all {
			if len(h.Replicas().Replicas) != 3 {
				return false
			}
		}
		return true
	})

	eastDir, westDir := t.TempDir(), t.TempDir()
	writeFile(t, eastDir, "shop/a.yaml", vsYAML("a", "shop", "", "a.shop.example.com"))
	writeFile(t, westDir, "pay/b.yaml", vsYAML("b", "pay", "", "b.pay.example.com"))
	ingest := func(h replicaHub) string { i, _, _ := h.Addrs(); return i }
	serve := func(h replicaHub) string { _, s, _ := h.Addrs(); return s }
	_, stopEast := runMinion(t, "east", eastDir, ingest(a))
	runMinion(t, "west", westDir, ingest(b))

	var sinks []*sinkClient
	for i, h := range all {
		sinks = append(sinks, runSink(t, serve(h), "global", fmt.Sprintf("global-%d", i), i%2 == 0))
	}
	want := "pay/b@west,shop/a@east"
	converged := func(want string) func() bool {
		return func() bool {
			for _, s := range sinks {
				if s.view(vs) != want {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 20*time.Second, "every sink sees both clusters", converged(want))
	held := func(h replicaHub, cluster string) string {
		for _, cs := range h.Clusters() {
			if cs.Name == cluster && cs.HeldBy != nil {
				return cs.HeldBy.Replica
			}
		}
		return ""
	}
	if got := held(c, "east") + held(c, "west"); got != "ab" {
		t.Fatalf("c sees east and west held by %q", got)
	}
	waitFor(t, 5*time.Second, "c follows east from a and west from b", func() bool {
		f := c.Replicas().Following
		return f["east"] == "a" && f["west"] == "b"
	})
	waitFor(t, 5*time.Second, "c's metrics: three replicas, two follows started", func() bool {
		return metric(t, c.Hub, "meshfed_hub_replicas") == 3 && metric(t, c.Hub, "meshfed_hub_follows_started_total") >= 2
	})

	// East's minion moves from a to c, with a change made on the way.
	stopEast()
	writeFile(t, eastDir, "shop/a2.yaml", vsYAML("a2", "shop", "", "a2.shop.example.com"))
	runMinion(t, "east", eastDir, ingest(c))
	want = "pay/b@west,shop/a2@east,shop/a@east"
	waitFor(t, 20*time.Second, "every sink sees the change made through c", converged(want))
	waitFor(t, 10*time.Second, "c holds east everywhere", func() bool {
		return held(a, "east") == "c" && held(b, "east") == "c" && held(c, "east") == "c"
	})

	// b (holding west) leaves: west stays served everywhere (kept under the staleness
	// policy) and its minion, redialling b, is gone until it is pointed elsewhere.
	stopB()
	sinks = []*sinkClient{sinks[0], sinks[2]}
	waitFor(t, 10*time.Second, "no one holds west", func() bool { return held(a, "west") == "" && held(c, "west") == "" })
	time.Sleep(300 * time.Millisecond)
	if got := sinks[0].view(vs); got != want {
		t.Fatalf("after b left, a's sink sees %s", got)
	}
	for i, s := range sinks {
		if r := s.removals(); len(r) > 0 {
			t.Errorf("sink %d saw deletions: %s", i, strings.Join(r, "; "))
		}
	}
}

// The replica-to-replica service on the ingest listener admits only replica identities,
// and only for a cluster the replica holds: a cluster's minion may not read another
// cluster's resources, and a replica that does not hold a cluster answers "not here"
// instead of an empty state a follower would apply as deletions.
func TestReplicaPeerStreamsRefused(t *testing.T) {
	a, _ := startReplica(t, replicaConfig("a"))
	dir := t.TempDir()
	writeFile(t, dir, "shop/a.yaml", vsYAML("a", "shop", "", "a.shop.example.com"))
	ingest, _, _ := a.Addrs()
	runMinion(t, "east", dir, ingest)
	waitFor(t, 10*time.Second, "a holds east", func() bool {
		st := a.Replicas()
		return st != nil && st.Authorities["east"].Replica == "a"
	})
	conn, err := grpc.NewClient(ingest, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tc := range []struct {
		identity, cluster string
		code              codes.Code
		want              string
	}{
		// A cluster's identity here is its minion's relay: routed like a sink once the hub is
		// ready (west has not synced), never given the replica feed.
		{"east", "east", codes.Unavailable, "the hub is warming up"},
		{"hub/x", "west", codes.FailedPrecondition, `does not hold cluster "west"`},
		{"hub/x", "nope", codes.InvalidArgument, "not a cluster this replica keeps"},
		{"hub/x", "east", codes.OK, ""},
	} {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), hub.DevIdentityHeader, tc.identity), 10*time.Second)
		st, err := mcppb.NewResourceSourceClient(conn).EstablishResourceStream(ctx)
		if err == nil {
			err = st.Send(&mcppb.RequestResources{Collection: vs, SinkNode: &mcppb.SinkNode{Id: "x", Annotations: map[string]string{replicas.ForwardClusterAnnotation: tc.cluster}}})
		}
		var m *mcppb.Resources
		if err == nil || errors.Is(err, io.EOF) { // a refused stream's reason comes with Recv
			m, err = st.Recv()
		}
		cancel()
		switch {
		case tc.code == codes.OK && (err != nil || len(m.GetResources()) != 1):
			t.Errorf("%s following %s: %v, %d resources; want east's one resource", tc.identity, tc.cluster, err, len(m.GetResources()))
		case tc.code != codes.OK && (status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s following %s: %v; want %v containing %q", tc.identity, tc.cluster, err, tc.code, tc.want)
		}
	}
}

// publishAs pushes cache to addr as identity (insecure mode) until stop is called.
func publishAs(t *testing.T, addr, identity string, cache *mcp.Cache) (stop func()) {
	t.Helper()
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: cache, Logger: logger(t).With("side", "publisher")})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), hub.DevIdentityHeader, identity))
	done := make(chan struct{})
	go func() { defer close(done); _ = src.PushTo(ctx, conn) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done; conn.Close() }) }
	t.Cleanup(stop)
	return stop
}

// Sessions of one cluster on one replica: a second stream of the same minion (a reconnect
// before the old stream is noticed dead) takes over, closing the old one, and holds a newer
// epoch (one writer per cluster); when it ends, the cluster is released and the peers'
// streams following it are closed.
func TestReplicaSessions(t *testing.T) {
	a, _ := startReplica(t, replicaConfig("a"))
	ingest, _, _ := a.Addrs()
	cache := mcp.NewCache(vs, dr)
	if _, err := cache.PutResources(vs, &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "shop/a", Version: "1"},
		Body: mustAny(t, &networking.VirtualService{Hosts: []string{"a.shop.example.com"}})}); err != nil {
		t.Fatal(err)
	}
	authority := func() string {
		au, ok := a.Replicas().Authorities["east"]
		if !ok {
			return "none"
		}
		return fmt.Sprintf("%s@%d", au.Replica, au.Epoch)
	}
	stop1 := publishAs(t, ingest, "east", cache)
	waitFor(t, 10*time.Second, "the first stream holds east", func() bool { return authority() == "a@1" })

	// A follower (as a replica would) receives east.
	conn, err := grpc.NewClient(ingest, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), hub.DevIdentityHeader, "hub/b"))
	defer cancel()
	st, err := mcppb.NewResourceSourceClient(conn).EstablishResourceStream(ctx)
	if err == nil {
		err = st.Send(&mcppb.RequestResources{Collection: vs, SinkNode: &mcppb.SinkNode{Id: "b", Annotations: map[string]string{replicas.ForwardClusterAnnotation: "east"}}})
	}
	if err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || len(m.GetResources()) != 1 {
		t.Fatalf("follower: %v, %d resources", err, len(m.GetResources()))
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()

	stop2 := publishAs(t, ingest, "east", cache)
	waitFor(t, 10*time.Second, "the second stream holds east at a newer epoch", func() bool { return authority() == "a@2" })
	waitFor(t, 10*time.Second, "the first stream closed: one writer per cluster", func() bool {
		for _, c := range a.Clusters() {
			if c.Name == "east" {
				return c.Streams == 1
			}
		}
		return false
	})
	select {
	case err := <-ended:
		t.Fatalf("the follower's stream ended while a still held east: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	stop2()
	stop1()
	waitFor(t, 10*time.Second, "east released", func() bool { return authority() == "none" })
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower's stream was not closed when east was released")
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A sink that only listens and a minion that only listens, configured on every replica:
// one replica at a time dials each (rendezvous hashing over the live replicas), and when
// that replica goes, another takes over without the sink losing anything.
func TestReplicasShareDialOuts(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	eastAddr := listeningMinion(t, "east", east)
	var open atomic.Int32
	sc, sinkAddr := listeningSink(t, mcp.Hooks{StreamOpened: func(*mcp.StreamInfo) { open.Add(1) }, StreamClosed: func(*mcp.StreamInfo, error) { open.Add(-1) }})

	config := func(name string, seeds ...string) *hub.Config {
		cfg := replicaConfig(name, seeds...)
		cfg.Poll = []hub.PollCluster{{Cluster: "east", Addr: eastAddr}}
		cfg.DialSinks = []hub.DialSink{{Name: "listener", Addr: sinkAddr, NodeID: "global-dialed"}}
		cfg.Backoff = ops.Backoff{Initial: ops.D(20 * time.Millisecond), Max: ops.D(200 * time.Millisecond)}
		return cfg
	}
	a, stopA := startReplica(t, config("a"))
	b, stopB := startReplica(t, config("b", a.GossipAddr()))
	c, stopC := startReplica(t, config("c", a.GossipAddr()))
	byName := map[string]replicaHub{"a": a, "b": b, "c": c}
	stops := map[string]func(){"a": stopA, "b": stopB, "c": stopC}
	var ingests []string
	for _, h := range []replicaHub{a, b, c} {
		i, _, _ := h.Addrs()
		ingests = append(ingests, i)
	}
	runMinion(t, "west", west, strings.Join(ingests, ","))

	// runner returns which live replicas run task.
	runner := func(task string) []string {
		var out []string
		for name, h := range byName {
			for _, r := range h.Replicas().Runs {
				if r == task {
					out = append(out, name)
				}
			}
		}
		return out
	}
	settled := func() bool {
		for _, h := range byName {
			if len(h.Replicas().Replicas) != len(byName) {
				return false
			}
		}
		return len(runner("dialSink/listener")) == 1 && len(runner("poll/east")) == 1 && open.Load() == 1
	}
	waitFor(t, 20*time.Second, "one replica dials the sink and one polls east", settled)
	waitFor(t, 20*time.Second, "the listening sink's view", func() bool { return sc.view(vs) == "pay/api@west,shop/cart@east" })

	gone := runner("dialSink/listener")[0]
	stops[gone]()
	delete(byName, gone)
	waitFor(t, 30*time.Second, "another replica dials the sink, one polls east", settled)
	writeFile(t, east, "shop/more.yaml", vsYAML("more", "shop", "", "more.shop.example.com"))
	waitFor(t, 20*time.Second, "a polled change reaches the dialed sink", func() bool {
		return sc.view(vs) == "pay/api@west,shop/cart@east,shop/more@east"
	})
	if r := sc.removals(); len(r) > 0 {
		t.Errorf("the listening sink was sent deletions: %v", r)
	}
}

// version returns the served version of collection/name at the sink, or "".
func (s *sinkClient) version(collection, name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[collection][name].GetMetadata().GetVersion()
}

// A minion stream that a newer session on another replica has replaced (the minion
// reconnected elsewhere before this stream was noticed dead) writes nothing any more: the
// replica follows the newer session and ends the old stream, and the old source's return
// is refused as competing while the newer session is live, so its late push is not
// applied.
func TestReplicaSupersededSession(t *testing.T) {
	cfg := func(name string, seeds ...string) *hub.Config {
		c := replicaConfig(name, seeds...)
		c.WarmUp = hub.Duration{Duration: 500 * time.Millisecond} // west never comes
		return c
	}
	a, _ := startReplica(t, cfg("a"))
	b, _ := startReplica(t, cfg("b", a.GossipAddr()))
	ingestA, serveA, _ := a.Addrs()
	ingestB, _, _ := b.Addrs()
	put := func(c *mcp.Cache, name, version string) {
		t.Helper()
		if _, err := c.PutResources(vs, &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: version},
			Body: mustAny(t, &networking.VirtualService{Hosts: []string{"a.shop.example.com"}})}); err != nil {
			t.Fatal(err)
		}
	}
	old, fresh := mcp.NewCache(vs, dr), mcp.NewCache(vs, dr)
	put(old, "shop/a", "1")
	publishAs(t, ingestA, "east", old)
	sink := runSink(t, serveA, "global", "global-a", true)
	waitFor(t, 10*time.Second, "a serves east's first session", func() bool { return sink.version(vs, "shop/a") == "east/1" })

	put(fresh, "shop/a", "2")
	publishAs(t, ingestB, "east", fresh) // the minion's new session, on b
	waitFor(t, 10*time.Second, "a follows the newer session on b", func() bool {
		au := a.Replicas().Authorities["east"]
		return au.Replica == "b" && sink.version(vs, "shop/a") == "east/2"
	})
	put(old, "shop/a", "3") // a late push on the replaced stream
	time.Sleep(300 * time.Millisecond)
	put(fresh, "shop/b", "1") // a barrier through the newer session
	waitFor(t, 10*time.Second, "the barrier", func() bool { return sink.version(vs, "shop/b") == "east/1" })
	if v := sink.version(vs, "shop/a"); v != "east/2" {
		t.Fatalf("a applied the replaced stream's push: shop/a is %s, want east/2", v)
	}
}
