package e2e

import (
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
)

// A standing refusal must not make every later push grow. A cluster owns namespace shop;
// its minion follows an upstream MCP source (configuration forwarding: changes reach the
// minion in milliseconds), which holds two VirtualServices in a namespace the cluster does
// not own. Then 50 VirtualServices are created and deleted, one at a time, each waited for
// at the hub. The bytes on the minion's push stream and the NACKs it receives are measured,
// and compared with the same run without the refused objects.
//
// The hub applies a push but for the refused resources and says so in its NACK
// (mcp.RejectionError); the minion's source takes the version as held, so the refused
// objects are not resent with every later push.
func TestStandingRefusalCostsNoResends(t *testing.T) {
	without := refusalRun(t, false)
	with := refusalRun(t, true)
	ratio := float64(with.bytes) / float64(without.bytes)
	t.Logf("50 creates + 50 deletes: %d bytes, %d NACKs without a standing refusal; %d bytes, %d NACKs with two (ratio %.3f); %d rejection reports",
		without.bytes, without.nacks, with.bytes, with.nacks, ratio, with.rejections)
	if ratio > 1.1 {
		t.Errorf("bytes with a standing refusal = %.2f× the bytes without, want ≤ 1.1×", ratio)
	}
	if with.nacks != 0 || without.nacks != 0 {
		t.Errorf("NACKs during the changes: %d with the refusal, %d without; want 0", with.nacks, without.nacks)
	}
	if with.rejections != 2 {
		t.Errorf("the minion reported %d rejections, want 2: one per refused object version", with.rejections)
	}
}

type refusalCost struct{ bytes, nacks, rejections int }

func refusalRun(t *testing.T, refused bool) refusalCost {
	cfg := hub.Defaults()
	cfg.Insecure = true
	cfg.Clusters = []hub.ClusterConfig{{Name: "east", Identities: []string{"east"}, Namespaces: []string{"shop"}, Hosts: []string{"*"}}}
	cfg.Collections = []string{vs}
	cfg.Routing = routing.Config{Default: &routing.Rule{Name: "everything"}}
	// The run deletes its 50 objects one by one within a second: the breaker's window
	// would hold them (a drain), and what is measured is the refusals' cost.
	cfg.Breaker.Window = hub.Duration{}
	h := runHub(t, cfg)
	ingest, _, _ := h.Addrs()

	// The upstream the minion follows.
	up := mcp.NewCache(vs)
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: up, Logger: logger(t).With("side", "upstream")})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(mcp.ServerOptions()...)
	mcp.NewSourceServer(src, mcp.ServerConfig{Logger: logger(t)}).Register(gs)
	go gs.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(gs.Stop)

	put := func(ns, name, version string) {
		body, err := anypb.New(&networking.VirtualService{Hosts: []string{name + "." + ns + ".example.com"}})
		if err != nil {
			t.Fatal(err)
		}
		e, err := mcp.NewEntry(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: ns + "/" + name, Version: version}, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		up.Put(vs, e)
	}
	put("shop", "standing", "1")
	if refused {
		put("other", "a", "1")
		put("other", "b", "1")
	}

	mcfg := minion.Defaults()
	mcfg.Cluster, mcfg.Insecure, mcfg.HTTP, mcfg.Collections = "east", true, "", []string{vs}
	mcfg.Sources = []minion.SourceConfig{{URL: "mcp://" + lis.Addr().String()}}
	mcfg.Destinations.Push = []string{"push://" + ingest}
	mcfg.Destinations.Backoff = ops.Backoff{Initial: ops.D(20 * time.Millisecond), Max: ops.D(300 * time.Millisecond)}
	tel := minion.NewTelemetry()
	m, err := minion.New(mcfg, logger(t).With("side", "minion"), tel)
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "minion Run", m.Run)

	held := func(n int) {
		t.Helper()
		waitFor(t, 10*time.Second, fmt.Sprintf("the hub holding %d of east's VirtualServices", n), func() bool {
			return h.Clusters()[0].Resources[vs] == n
		})
	}
	held(1)
	if refused {
		waitFor(t, 10*time.Second, "the hub reporting the two refusals", func() bool { return len(h.Clusters()[0].Rejections[vs]) == 2 })
	}
	sent, source := map[string]string{"role": "source", "direction": "sent"}, map[string]string{"role": "source"}
	bytes0, nacks0 := promtest.Sum(t, tel.Registry, "meshfed_mcp_bytes_total", sent), promtest.Sum(t, tel.Registry, "meshfed_mcp_nacks_total", source)
	for i := range 50 {
		put("shop", fmt.Sprintf("vs-%02d", i), "1")
		held(2 + i)
	}
	for i := range 50 {
		up.Remove(vs, fmt.Sprintf("shop/vs-%02d", i))
		held(50 - i)
	}
	return refusalCost{
		bytes:      int(promtest.Sum(t, tel.Registry, "meshfed_mcp_bytes_total", sent) - bytes0),
		nacks:      int(promtest.Sum(t, tel.Registry, "meshfed_mcp_nacks_total", source) - nacks0),
		rejections: int(promtest.Sum(t, tel.Registry, "meshfed_minion_hub_rejections_total", nil)),
	}
}
