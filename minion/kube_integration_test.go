package minion

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/kubetest"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
)

// The integration tier: a real etcd + kube-apiserver with Istio's CRDs from
// test/kube/crds.yaml and the minion's RBAC from deploy/minion/rbac.yaml
// (kubetest.StartForMinion), and a minion that authenticates as its ServiceAccount — so every subtest also proves that the deployed
// least-privilege role is enough. What the minion publishes is observed at a real
// ResourceSink gRPC server (hubSim).

var vsGVR = LookupBuiltinMust(vsColl).GVR()

// LookupBuiltinMust is LookupBuiltin for names known to exist.
func LookupBuiltinMust(c string) Kind {
	k, ok := LookupBuiltin(c)
	if !ok {
		panic(c)
	}
	return k
}

type kubeFixture struct {
	env   *kubetest.Env
	dyn   dynamic.Interface
	core  kubernetes.Interface
	kcfg  string // the minion's kubeconfig (its ServiceAccount)
	ctx   context.Context
	saCli kubernetes.Interface
}

func startKube(t *testing.T) *kubeFixture {
	t.Helper()
	env, sa := kubetest.StartForMinion(t, repoRoot(t))
	saCli, err := kubernetes.NewForConfig(env.Config(sa))
	if err != nil {
		t.Fatal(err)
	}
	return &kubeFixture{env: env, dyn: env.Dynamic(), core: env.Clientset(), kcfg: env.Kubeconfig(sa),
		ctx: context.Background(), saCli: saCli}
}

func repoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(dir) // this package is one level below the root
}

// runMinion runs a minion with cfg until the test ends.
func runMinion(t *testing.T, cfg *Config) *Minion {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := New(cfg, testLog(t), NewTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "minion Run", m.Run)
	return m
}

func (f *kubeFixture) minionConfig(hub *hubSim, src SourceConfig) *Config {
	src.URL = "k8s://" + f.kcfg
	c := testConfig("east", []SourceConfig{src}, "push://"+hub.Addr)
	c.Destinations.Backoff = ops.Backoff{Initial: ops.D(20 * time.Millisecond), Max: ops.D(500 * time.Millisecond)}
	return c
}

func vsObject(ns, name string, hosts []string, labels map[string]string, extraSpec map[string]any) *unstructured.Unstructured {
	hs := make([]any, len(hosts))
	for i, h := range hosts {
		hs[i] = h
	}
	spec := map[string]any{"hosts": hs}
	for k, v := range extraSpec {
		spec[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
	if labels != nil {
		u.SetLabels(labels)
	}
	return u
}

func (f *kubeFixture) create(t *testing.T, u *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	out, err := f.dyn.Resource(vsGVR).Namespace(u.GetNamespace()).Create(f.ctx, u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s/%s: %v", u.GetNamespace(), u.GetName(), err)
	}
	return out
}

func (f *kubeFixture) update(t *testing.T, ns, name string, mutate func(u *unstructured.Unstructured)) {
	t.Helper()
	ri := f.dyn.Resource(vsGVR).Namespace(ns)
	for range 10 {
		u, err := ri.Get(f.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mutate(u)
		if _, err = ri.Update(f.ctx, u, metav1.UpdateOptions{}); err == nil {
			return
		} else if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
	t.Fatalf("update %s/%s: conflicts", ns, name)
}

func (f *kubeFixture) delete(t *testing.T, ns, name string) {
	t.Helper()
	if err := f.dyn.Resource(vsGVR).Namespace(ns).Delete(f.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// events returns the Warning events recorded on an object, as "Reason: message".
func (f *kubeFixture) events(t *testing.T, ns, name string) []string {
	t.Helper()
	list, err := f.core.CoreV1().Events(ns).List(f.ctx, metav1.ListOptions{
		FieldSelector: fields.SelectorFromSet(fields.Set{"involvedObject.name": name, "type": corev1.EventTypeWarning}).String()})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, fmt.Sprintf("%s: %s (x%d)", e.Reason, e.Message, max(e.Count, 1)))
	}
	return out
}

func hostsOf(t *testing.T, h *hubSim, name string) string {
	r := h.get(vsColl, name)
	if r == nil {
		return "<absent>"
	}
	return strings.Join(body(t, r, &networking.VirtualService{}).GetHosts(), ",")
}

func TestKubeIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	f := startKube(t)

	t.Run("least-privilege identity", func(t *testing.T) {
		// The RBAC grants Istio kinds and events only: the minion's identity cannot read
		// secrets, and can list virtual services.
		if _, err := f.saCli.CoreV1().Secrets("default").List(f.ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("listing secrets as the minion: err = %v, want Forbidden", err)
		}
	})

	t.Run("create update delete", func(t *testing.T) {
		f.env.CreateNamespace("shop")
		f.create(t, vsObject("shop", "pre", []string{"pre.shop.svc"}, nil, nil)) // exists before the minion starts
		hub := startHubSim(t, vsColl, drColl)
		m := runMinion(t, f.minionConfig(hub, SourceConfig{}))
		waitFor(t, 30*time.Second, "initial sync at the hub", func() bool { return hub.names(vsColl) == "shop/pre" })
		if !m.Ready() {
			t.Error("minion not ready after publishing")
		}
		r := hub.get(vsColl, "shop/pre")
		if r.GetMetadata().GetCreateTime() == nil || r.GetMetadata().GetVersion() == "" {
			t.Errorf("metadata = %v", r.GetMetadata())
		}

		f.create(t, vsObject("shop", "cart", []string{"cart.shop.svc"}, map[string]string{"app": "cart"}, nil))
		waitFor(t, 10*time.Second, "create", func() bool { return hostsOf(t, hub, "shop/cart") == "cart.shop.svc" })
		if got := hub.get(vsColl, "shop/cart").GetMetadata().GetLabels()["app"]; got != "cart" {
			t.Errorf("labels not published: %q", got)
		}
		v1 := hub.get(vsColl, "shop/cart").GetMetadata().GetVersion()

		f.update(t, "shop", "cart", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedStringSlice(u.Object, []string{"cart.shop.svc", "cart.example.com"}, "spec", "hosts")
		})
		waitFor(t, 10*time.Second, "update", func() bool { return hostsOf(t, hub, "shop/cart") == "cart.shop.svc,cart.example.com" })
		if v2 := hub.get(vsColl, "shop/cart").GetMetadata().GetVersion(); v2 == v1 {
			t.Errorf("version did not change on update: %s", v2)
		}

		// A change that does not touch what is published (a status-only write bumps the
		// resourceVersion) is not pushed again.
		before := hub.pushes()
		st, err := f.dyn.Resource(vsGVR).Namespace("shop").Get(f.ctx, "cart", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedField(st.Object, "seen", "status", "note")
		if _, err := f.dyn.Resource(vsGVR).Namespace("shop").UpdateStatus(f.ctx, st, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.update(t, "shop", "pre", func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"x": "y"}) })
		waitFor(t, 10*time.Second, "label change", func() bool {
			r := hub.get(vsColl, "shop/pre")
			return r != nil && r.GetMetadata().GetLabels()["x"] == "y"
		})
		if got := hub.pushes() - before; got != 1 {
			t.Errorf("%d pushes for one published change and one unpublished one, want 1", got)
		}

		f.delete(t, "shop", "cart")
		waitFor(t, 10*time.Second, "delete", func() bool { return hub.names(vsColl) == "shop/pre" })
		f.delete(t, "shop", "pre")
		waitFor(t, 10*time.Second, "delete", func() bool { return hub.names(vsColl) == "" })
	})

	t.Run("invalid spec", func(t *testing.T) {
		f.env.CreateNamespace("bad")
		hub := startHubSim(t, vsColl, drColl)
		m := runMinion(t, f.minionConfig(hub, SourceConfig{}))
		f.create(t, vsObject("bad", "typo", []string{"a.bad.svc"}, nil, map[string]any{"hostz": []any{"x"}}))
		f.create(t, vsObject("bad", "good", []string{"good.bad.svc"}, nil, nil))
		waitFor(t, 30*time.Second, "the valid object", func() bool { return hub.get(vsColl, "bad/good") != nil })
		waitFor(t, 10*time.Second, "a Warning event on the invalid object", func() bool {
			ev := f.events(t, "bad", "typo")
			return len(ev) == 1 && strings.HasPrefix(ev[0], ReasonInvalidSpec+": ") && strings.Contains(ev[0], "hostz")
		})
		t.Logf("event: %v", f.events(t, "bad", "typo"))
		if hub.get(vsColl, "bad/typo") != nil {
			t.Fatal("an invalid object was published")
		}
		if got := promtest.Sum(t, m.reg, "meshfed_minion_conversions_total", map[string]string{"collection": vsColl, "result": "invalid"}); got < 1 {
			t.Errorf("invalid conversions metric = %v", got)
		}
		// Fixing it publishes it.
		f.update(t, "bad", "typo", func(u *unstructured.Unstructured) { unstructured.RemoveNestedField(u.Object, "spec", "hostz") })
		waitFor(t, 10*time.Second, "the fixed object", func() bool { return hostsOf(t, hub, "bad/typo") == "a.bad.svc" })
		// A published object that becomes invalid keeps its last good version at the hub.
		f.update(t, "bad", "good", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "not-a-list", "spec", "hosts")
		})
		waitFor(t, 10*time.Second, "a Warning event on the broken object", func() bool { return len(f.events(t, "bad", "good")) == 1 })
		if got := hostsOf(t, hub, "bad/good"); got != "good.bad.svc" {
			t.Errorf("after breaking it, the hub holds %q, want the last good version", got)
		}
	})

	t.Run("namespace and label filter", func(t *testing.T) {
		f.env.CreateNamespace("team-a")
		f.env.CreateNamespace("team-b")
		hub := startHubSim(t, vsColl, drColl)
		runMinion(t, f.minionConfig(hub, SourceConfig{Namespaces: []string{"team-a"}, LabelSelector: "mesh=shared"}))
		f.create(t, vsObject("team-a", "shared", []string{"s.a"}, map[string]string{"mesh": "shared"}, nil))
		f.create(t, vsObject("team-a", "private", []string{"p.a"}, nil, nil))
		f.create(t, vsObject("team-b", "shared", []string{"s.b"}, map[string]string{"mesh": "shared"}, nil))
		waitFor(t, 30*time.Second, "the selected object", func() bool { return hub.get(vsColl, "team-a/shared") != nil })
		// Relabelling moves an object into and out of the selection.
		f.update(t, "team-a", "private", func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"mesh": "shared"}) })
		waitFor(t, 10*time.Second, "relabelled in", func() bool { return hub.names(vsColl) == "team-a/private,team-a/shared" })
		f.update(t, "team-a", "shared", func(u *unstructured.Unstructured) { u.SetLabels(nil) })
		waitFor(t, 10*time.Second, "relabelled out", func() bool { return hub.names(vsColl) == "team-a/private" })
	})

	t.Run("resync does not republish or reconvert", func(t *testing.T) {
		f.env.CreateNamespace("resync")
		for i := range 5 {
			f.create(t, vsObject("resync", fmt.Sprintf("vs%d", i), []string{"h"}, nil, nil))
		}
		f.create(t, vsObject("resync", "broken", []string{"h"}, nil, map[string]any{"nope": true}))
		hub := startHubSim(t, vsColl, drColl)
		m := runMinion(t, f.minionConfig(hub, SourceConfig{Namespaces: []string{"resync"}, Resync: &Duration{Duration: time.Second}}))
		waitFor(t, 30*time.Second, "sync", func() bool { return strings.Count(hub.names(vsColl), ",") == 4 })
		waitFor(t, 10*time.Second, "event", func() bool { return len(f.events(t, "resync", "broken")) == 1 })
		conv := promtest.Sum(t, m.reg, "meshfed_minion_conversions_total", map[string]string{"collection": vsColl, "result": "ok"})
		pushes := hub.pushes()
		// Two resyncs of all six objects (1s is client-go's minimum period) must have happened.
		waitFor(t, 30*time.Second, "two resyncs", func() bool {
			return promtest.Sum(t, m.reg, "meshfed_minion_resyncs_skipped_total", map[string]string{"collection": vsColl}) >= 12
		})
		if got := promtest.Sum(t, m.reg, "meshfed_minion_conversions_total", map[string]string{"collection": vsColl, "result": "ok"}); got != conv {
			t.Errorf("resyncs reconverted unchanged objects: conversions %v -> %v", conv, got)
		}
		if got := hub.pushes(); got != pushes {
			t.Errorf("resyncs caused %d pushes", got-pushes)
		}
		if ev := f.events(t, "resync", "broken"); len(ev) != 1 || !strings.HasSuffix(ev[0], "(x1)") {
			t.Errorf("events after resyncs = %v, want one, recorded once", ev)
		}
	})

	t.Run("hub rejection becomes an event", func(t *testing.T) {
		f.env.CreateNamespace("rej")
		hub := startHubSim(t, vsColl, drColl)
		const why = `host "pay.example.com" is owned by cluster west`
		hub.mu.Lock()
		hub.reject = func(_ string, r *mcpapi.Resource) string {
			if r.GetMetadata().GetName() == "rej/denied" {
				return why
			}
			return ""
		}
		hub.mu.Unlock()
		m := runMinion(t, f.minionConfig(hub, SourceConfig{Namespaces: []string{"rej"}}))
		f.create(t, vsObject("rej", "denied", []string{"pay.example.com"}, nil, nil))
		f.create(t, vsObject("rej", "fine", []string{"fine.rej.svc"}, nil, nil))
		waitFor(t, 30*time.Second, "the accepted object", func() bool { return hub.get(vsColl, "rej/fine") != nil })
		waitFor(t, 10*time.Second, "a RejectedByHub event", func() bool {
			ev := f.events(t, "rej", "denied")
			return len(ev) == 1 && ev[0] == ReasonRejectedByHub+": "+why+" (x1)"
		})
		if got := promtest.Sum(t, m.reg, "meshfed_minion_hub_rejections_total", map[string]string{"collection": vsColl}); got < 1 {
			t.Errorf("rejections metric = %v", got)
		}
		if len(f.events(t, "rej", "fine")) != 0 {
			t.Errorf("an accepted object got events: %v", f.events(t, "rej", "fine"))
		}
	})

	t.Run("a deletion the hub holds becomes an event", func(t *testing.T) {
		f.env.CreateNamespace("held")
		hub := startHubSim(t, vsColl, drColl)
		const why = "deletion held: the hub's mass-deletion breaker for cluster \"kube\" is open"
		hub.mu.Lock()
		hub.hold = func(_, name string) string {
			if name == "held/gone" {
				return why
			}
			return ""
		}
		hub.mu.Unlock()
		runMinion(t, f.minionConfig(hub, SourceConfig{Namespaces: []string{"held"}}))
		f.create(t, vsObject("held", "gone", []string{"gone"}, nil, nil))
		waitFor(t, 30*time.Second, "the object at the hub", func() bool { return hub.get(vsColl, "held/gone") != nil })
		f.delete(t, "held", "gone")
		waitFor(t, 10*time.Second, "a DeletionHeldByHub event on the deleted object", func() bool {
			ev := f.events(t, "held", "gone")
			return len(ev) == 1 && ev[0] == ReasonDeletionHeldByHub+": "+why+" (x1)"
		})
		if hub.get(vsColl, "held/gone") == nil {
			t.Error("the hub simulator removed a held deletion")
		}
	})

	t.Run("apiserver restart", func(t *testing.T) {
		f.env.CreateNamespace("restart")
		f.create(t, vsObject("restart", "a", []string{"a"}, nil, nil))
		f.create(t, vsObject("restart", "b", []string{"b"}, nil, nil))
		hub := startHubSim(t, vsColl, drColl)
		runMinion(t, f.minionConfig(hub, SourceConfig{Namespaces: []string{"restart"}}))
		waitFor(t, 30*time.Second, "sync", func() bool { return hub.names(vsColl) == "restart/a,restart/b" })
		f.env.StopAPIServer()
		time.Sleep(2 * time.Second) // the informers notice and retry
		if got := hub.names(vsColl); got != "restart/a,restart/b" {
			t.Fatalf("while the apiserver is down the hub holds %q", got)
		}
		f.env.StartAPIServer()
		f.create(t, vsObject("restart", "c", []string{"c"}, nil, nil))
		f.delete(t, "restart", "a")
		waitFor(t, 60*time.Second, "changes after the restart", func() bool { return hub.names(vsColl) == "restart/b,restart/c" })
		if rm := hub.removals(vsColl); len(rm) != 1 || rm[0] != "restart/a" {
			t.Errorf("removals at the hub = %v, want only restart/a", rm)
		}
	})
}
