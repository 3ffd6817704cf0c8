package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/meshfed/meshfed/internal/testkit/kubetest"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/mcp/kinds"
	"github.com/meshfed/meshfed/minion"
)

// TestKubeMinionThroughHub: Kubernetes objects in a real kube-apiserver, read by a minion
// running as its least-privilege ServiceAccount, pushed to a real hub, served to a real
// sink; an object the hub's ACL refuses gets a Warning Event naming the hub's reason.
func TestKubeMinionThroughHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	env, sa := kubetest.StartForMinion(t, root)
	env.CreateNamespace("shop")
	env.CreateNamespace("pay")

	h := runHub(t, twoClusterConfig())
	ingest, serve, _ := h.Addrs()
	sink := runSink(t, serve, "", "global-istiod", true)

	startMinion(t, minionConfig("east", "k8s://"+env.Kubeconfig(sa), ingest))
	west := t.TempDir()
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	runMinion(t, "west", west, ingest)
	waitFor(t, 60*time.Second, "hub ready", h.Ready)

	k, _ := kinds.Lookup(vs)
	ri := env.Dynamic().Resource(k.GVR())
	create := func(ns, name, host string) {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"hosts": []any{host}},
		}}
		if _, err := ri.Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("shop", "cart", "cart.shop.example.com")
	create("shop", "hijack", "api.pay.example.com") // a host west owns
	waitFor(t, 20*time.Second, "served through the hub", func() bool { return sink.view(vs) == "pay/api@west,shop/cart@east" })

	waitFor(t, 20*time.Second, "a RejectedByHub event with the hub's reason", func() bool {
		list, err := env.Clientset().CoreV1().Events("shop").List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.SelectorFromSet(fields.Set{"involvedObject.name": "hijack", "type": corev1.EventTypeWarning}).String()})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Reason == minion.ReasonRejectedByHub && strings.Contains(e.Message, `host "api.pay.example.com" is not owned by cluster "east" (owned by "west")`) {
				return true
			}
		}
		return false
	})

	// Deleting in Kubernetes removes it at the sink.
	if err := ri.Namespace("shop").Delete(context.Background(), "cart", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "deletion served", func() bool { return sink.view(vs) == "pay/api@west" })
}
