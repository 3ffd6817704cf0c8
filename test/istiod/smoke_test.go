package istiod

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/istiodtest"
	"github.com/meshfed/meshfed/internal/testkit/kubetest"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	vsColl = "istio/networking/v1alpha3/virtualservices"
	vsType = "networking.istio.io/VirtualService"
)

// runHub starts an insecure in-process hub on loopback: cluster "east" (identity "east")
// owns namespace "shop" and every host, and every sink gets everything.
func runHub(t *testing.T) *hub.Hub {
	t.Helper()
	cfg := hub.Defaults()
	cfg.Ingest, cfg.Serve, cfg.HTTP = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.StateDir = t.TempDir()
	cfg.Insecure = true
	cfg.Clusters = []hub.ClusterConfig{{Name: "east", Identities: []string{"east"}, Namespaces: []string{"shop"}, Hosts: []string{"*"}}}
	cfg.Routing = routing.Config{Default: &routing.Rule{Name: "everything"}}
	cfg.WarmUp = hub.Duration{Duration: time.Hour} // ready only once east has synced
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(cfg, testlog.New(t).With("side", "hub"), hub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub Run", h.Run)
	testwait.For(t, 10*time.Second, "hub listening", func() bool { _, s, _ := h.Addrs(); return s != "" })
	return h
}

// vs is a VirtualService resource named ns/name at version with hosts.
type vs struct {
	name, version string
	hosts         []string
}

// push is a VirtualService push of east: the full state, or (incremental) vss added and
// removed deleted.
func push(t *testing.T, incremental bool, vss []vs, removed ...string) *mcp.Change {
	t.Helper()
	c := &mcp.Change{Collection: vsColl, Incremental: incremental, Removed: removed}
	for _, v := range vss {
		body, err := anypb.New(&networking.VirtualService{Hosts: v.hosts, Http: []*networking.HTTPRoute{{ // istiod refuses a VirtualService without routes
			Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: v.hosts[0]}}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: v.name, Version: v.version}, Body: body}
		e, err := mcp.NewEntry(r)
		if err != nil {
			t.Fatal(err)
		}
		c.Entries, c.Resources = append(c.Entries, e), append(c.Resources, r)
	}
	return c
}

// applyRefusing applies c as east, which must be refused for exactly the resource refused
// (a namespace east does not own) and nothing else.
func applyRefusing(t *testing.T, h *hub.Hub, c *mcp.Change, refused string) {
	t.Helper()
	err := h.Apply("east", c)
	if err == nil || !strings.Contains(err.Error(), refused) {
		t.Fatalf("east's push: want %s refused, got %v", refused, err)
	}
}

// hosts returns the spec.hosts of a configz object.
func hosts(t *testing.T, o istiodtest.Object) []string {
	t.Helper()
	var spec struct {
		Hosts []string `json:"hosts"`
	}
	if err := json.Unmarshal(o.Spec, &spec); err != nil {
		t.Fatalf("spec of %s: %v", o.Key(), err)
	}
	return spec.Hosts
}

// syncEast makes east synced at the hub: an empty full state of every collection but
// VirtualServices, which the caller has pushed.
func syncEast(t *testing.T, h *hub.Hub) {
	t.Helper()
	for _, coll := range h.Config().Collections {
		if coll != vsColl {
			if err := h.Apply("east", &mcp.Change{Collection: coll}); err != nil {
				t.Fatalf("empty push of %s: %v", coll, err)
			}
		}
	}
	testwait.For(t, 10*time.Second, "hub ready (east synced)", h.Ready)
}

// startIstiod runs istiod against env with the hub as its only config source (plaintext)
// and waits until it is ready.
func startIstiod(t *testing.T, env *kubetest.Env, h *hub.Hub) *istiodtest.Istiod {
	t.Helper()
	_, serve, _ := h.Addrs()
	istiod := istiodtest.Start(t, istiodtest.Options{Kubeconfig: env.Kubeconfig(env.Admin), ConfigSource: "xds://" + serve})
	istiod.WaitReady(t, 3*time.Minute)
	return istiod
}

// waitConfigz polls istiod's configz until cond holds, and returns it; an object of
// namespace pay (never east's) showing up in it fails the test at once.
func waitConfigz(t *testing.T, istiod *istiodtest.Istiod, what string, cond func(c istiodtest.Configz) bool) istiodtest.Configz {
	t.Helper()
	var last istiodtest.Configz
	testwait.For(t, time.Minute, what, func() bool {
		c, err := istiod.FetchConfigz()
		if err != nil {
			t.Logf("configz: %v", err)
			return false
		}
		for typ, objs := range c.Objects() {
			for key := range objs {
				if strings.HasPrefix(key, "pay/") {
					t.Fatalf("istiod holds %s %s, which the hub refused", typ, key)
				}
			}
		}
		last = c
		return cond(c)
	})
	return last
}

// vsKeys is a configz condition: istiod's VirtualServices are exactly want (sorted).
func vsKeys(want ...string) func(c istiodtest.Configz) bool {
	return func(c istiodtest.Configz) bool { return slices.Equal(c.Keys(vsType), want) }
}

const rogue = "pay/rogue" // namespace pay is not east's

var rogueVS = vs{rogue, "1", []string{"rogue.pay.example.com"}}

// TestIstiodFollowsHubOverXDS: a real istiod whose only config source is the hub (plaintext
// MCP over xDS) gets ready, holds what the hub serves, follows an update, an added object
// and deletions (incremental and full-state), and never holds the object the hub's ACL
// refused.
func TestIstiodFollowsHubOverXDS(t *testing.T) {
	start := time.Now()
	env := kubetest.Start(t)
	h := runHub(t)
	applyRefusing(t, h, push(t, false, []vs{{"shop/cart", "1", []string{"cart.shop.example.com"}}, rogueVS}), rogue)
	syncEast(t, h)
	kubeStarted := time.Since(start)
	istiod := startIstiod(t, env, h)
	readyAfter := time.Since(start)

	c := waitConfigz(t, istiod, "istiod holds shop/cart", vsKeys("shop/cart"))
	cart, _ := c.Get(vsType, "shop/cart")
	if got := hosts(t, cart); !slices.Equal(got, []string{"cart.shop.example.com"}) {
		t.Fatalf("shop/cart hosts in istiod: %v", got)
	}
	rv1 := cart.Metadata.ResourceVersion
	if rv1 == "" {
		t.Fatal("shop/cart has no resourceVersion in istiod")
	}
	t.Logf("shop/cart in istiod: resourceVersion %q, annotations %v", rv1, cart.Metadata.Annotations)

	// An update (new version, new hosts) and a new object, in one full-state push.
	applyRefusing(t, h, push(t, false, []vs{
		{"shop/cart", "2", []string{"cart.shop.example.com", "basket.shop.example.com"}},
		{"shop/extra", "1", []string{"extra.shop.example.com"}},
		rogueVS,
	}), rogue)
	c = waitConfigz(t, istiod, "istiod follows the update of shop/cart and holds shop/extra", func(c istiodtest.Configz) bool {
		o, ok := c.Get(vsType, "shop/cart")
		return vsKeys("shop/cart", "shop/extra")(c) && ok && len(hosts(t, o)) == 2
	})
	cart, _ = c.Get(vsType, "shop/cart")
	if got := hosts(t, cart); !slices.Equal(got, []string{"cart.shop.example.com", "basket.shop.example.com"}) {
		t.Fatalf("shop/cart hosts in istiod after the update: %v", got)
	}
	if rv2 := cart.Metadata.ResourceVersion; rv2 == "" || rv2 == rv1 {
		t.Fatalf("shop/cart's resourceVersion in istiod after the update: %q (before: %q)", rv2, rv1)
	}

	// An incremental deletion of shop/cart.
	if err := h.Apply("east", push(t, true, nil, "shop/cart")); err != nil {
		t.Fatal(err)
	}
	waitConfigz(t, istiod, "istiod drops shop/cart", vsKeys("shop/extra"))

	// A full-state push with nothing in it deletes the rest.
	if err := h.Apply("east", push(t, false, nil)); err != nil {
		t.Fatal(err)
	}
	waitConfigz(t, istiod, "istiod holds no VirtualService", vsKeys())

	if !istiod.Ready() || istiod.Exited() {
		t.Fatalf("istiod no longer ready at the end:\n%s", istiod.Output())
	}
	t.Logf("timings: kube-apiserver and hub %v, istiod ready %v after the test's start, test body %v",
		kubeStarted.Round(time.Millisecond), readyAfter.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestIstiodRestartResyncs: the harness's Kill and Restart. A killed istiod is gone (not
// ready, exited); restarted, it gets ready again on new ports and holds the hub's state as
// it is now, including what changed while it was down.
func TestIstiodRestartResyncs(t *testing.T) {
	env := kubetest.Start(t)
	h := runHub(t)
	if err := h.Apply("east", push(t, false, []vs{{"shop/cart", "1", []string{"cart.shop.example.com"}}})); err != nil {
		t.Fatal(err)
	}
	syncEast(t, h)
	istiod := startIstiod(t, env, h)
	waitConfigz(t, istiod, "istiod holds shop/cart", vsKeys("shop/cart"))

	istiod.Kill()
	if !istiod.Exited() || istiod.Ready() {
		t.Fatalf("after Kill: exited %v, ready %v", istiod.Exited(), istiod.Ready())
	}
	applyRefusing(t, h, push(t, false, []vs{{"shop/other", "1", []string{"other.shop.example.com"}}, rogueVS}), rogue)

	istiod.Restart()
	istiod.WaitReady(t, 3*time.Minute)
	waitConfigz(t, istiod, "the restarted istiod holds only shop/other", vsKeys("shop/other"))
	if istiod.GRPCAddr() == "" {
		t.Error("the restarted istiod logged no gRPC address")
	}
}
