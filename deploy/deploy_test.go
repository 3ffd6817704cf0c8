package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/kubetest"
	"github.com/meshfed/meshfed/minion"
)

// bases are the kustomize bases, relative to this package's directory.
var bases = []string{"hub", "minion"}

func mustRender(t *testing.T, dir string) []object {
	t.Helper()
	objs, err := render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// find returns the object of kind and name in objs.
func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.kind() == kind && o.name() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in %d rendered objects", kind, name, len(objs))
	return object{}
}

// typed converts o into a typed API object, refusing fields the type does not have.
func typed[T any](t *testing.T, o object) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.obj, &v, true); err != nil {
		t.Fatalf("%s: %v", o, err)
	}
	return &v
}

// warnings collects the apiserver's warning headers.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// TestRenderedManifestsAreValidKubernetes renders both bases and has a real kube-apiserver
// accept every object: server-side apply with dry-run (full admission and validation,
// nothing stored) and strict field validation (an unknown or duplicated field is an error),
// with no warnings. Objects of the bases are checked against the apiserver's idea of their
// scope, so Render's list of cluster-scoped kinds cannot drift either. Two broken objects
// show that the check can fail.
func TestRenderedManifestsAreValidKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	env := kubetest.Start(t)
	// Dry-run objects are admitted like real ones: their namespace must exist.
	env.CreateNamespace("meshfed")

	cfg := env.Config(env.Admin)
	warn := &warnings{}
	cfg.WarningHandler = warn
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resource := func(u *unstructured.Unstructured) (dynamic.ResourceInterface, *meta.RESTMapping, error) {
		gvk := u.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			mapper.Reset()
			if mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				return nil, nil, fmt.Errorf("the apiserver does not serve %s: %v", gvk, err)
			}
		}
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			return dyn.Resource(mapping.Resource).Namespace(u.GetNamespace()), mapping, nil
		}
		return dyn.Resource(mapping.Resource), mapping, nil
	}
	force := true
	dryApply := func(u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		ri, _, err := resource(u)
		if err != nil {
			return nil, err
		}
		body, err := json.Marshal(u.Object)
		if err != nil {
			return nil, err
		}
		return ri.Patch(t.Context(), u.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			DryRun:          []string{metav1.DryRunAll},
			FieldManager:    "deploy-test",
			Force:           &force,
			FieldValidation: metav1.FieldValidationStrict,
		})
	}

	var deployments []object
	for _, dir := range bases {
		for _, o := range mustRender(t, dir) {
			u := &unstructured.Unstructured{Object: o.obj}
			_, mapping, err := resource(u)
			if err != nil {
				t.Errorf("%s: %v", o, err)
				continue
			}
			namespaced := mapping.Scope.Name() == meta.RESTScopeNameNamespace
			if namespaced != (o.namespace() != "") {
				t.Errorf("%s: namespaced=%v for the apiserver, but rendered with namespace %q", o, namespaced, o.namespace())
				continue
			}
			got, err := dryApply(u)
			if err != nil {
				t.Errorf("%s: refused by kube-apiserver: %v", o, err)
				continue
			}
			if w := warn.take(); len(w) > 0 {
				t.Errorf("%s: kube-apiserver warned: %q", o, w)
			}
			if got.GetName() != o.name() || got.GetNamespace() != o.namespace() {
				t.Errorf("%s: dry-run answered %s/%s", o, got.GetNamespace(), got.GetName())
			}
			t.Logf("%s: accepted", o)
			if o.kind() == "Deployment" {
				deployments = append(deployments, o)
			}
		}
	}

	// The dry runs stored nothing.
	deployGVR := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	for _, o := range deployments {
		_, err := dyn.Resource(deployGVR).Namespace(o.namespace()).Get(t.Context(), o.name(), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s: after the dry run, get answered %v, want NotFound", o, err)
		}
	}

	// Controls: the same check refuses an unknown field and an invalid value.
	if len(deployments) == 0 {
		t.Fatal("no Deployment rendered")
	}
	for name, breakIt := range map[string]func(*unstructured.Unstructured){
		"unknown field": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(1), "spec", "replica")
		},
		"invalid value": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(-1), "spec", "replicas")
		},
	} {
		u := (&unstructured.Unstructured{Object: deployments[0].obj}).DeepCopy()
		breakIt(u)
		if _, err := dryApply(u); err == nil {
			t.Errorf("control %q: a broken Deployment was accepted", name)
		} else {
			t.Logf("control %q: refused as expected: %v", name, err)
		}
		warn.take()
	}
}

// gossipPorts are the container's (and the gossip Service's) port names for memberlist,
// which gossips over UDP and TCP on the same port number.
var gossipPorts = map[string]corev1.Protocol{"gossip-tcp": corev1.ProtocolTCP, "gossip-udp": corev1.ProtocolUDP}

// protocol is p, or TCP (Kubernetes' default for ports) when unset.
func protocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// TestHubConfigMapParses: the ConfigMap's hub.yaml is a valid hub configuration (the TLS
// and gossip key files it names need not exist: ParseConfig does not read them) for one
// replica of several, and it agrees with the Deployment: the -config path is the mounted
// key, the TLS files and the gossip key are the mounted Secrets' keys, the listeners and the
// gossip address listen on every interface on the container's named ports, and seedDNS is
// the headless gossip Service on that port. The replicas' name and advertise address are
// left to their per-pod defaults.
func TestHubConfigMapParses(t *testing.T) {
	objs := mustRender(t, "hub")
	cm := typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "meshfed-hub"))
	data, ok := cm.Data["hub.yaml"]
	if !ok {
		t.Fatal("ConfigMap meshfed-hub has no hub.yaml")
	}
	cfg, err := hub.ParseConfig([]byte(data))
	if err != nil {
		t.Fatalf("ConfigMap meshfed-hub hub.yaml: %v", err)
	}
	if cfg.Insecure || cfg.TLS == nil {
		t.Error("hub.yaml: production configuration without tls (or with insecure)")
	}
	if cfg.Replicas == nil {
		t.Fatal("hub.yaml: no replicas section: the Deployment's replicas would each be a separate hub, holding only the clusters that happen to connect to it")
	}
	// ParseConfig requires it with replicas; it is what the shared certificate's hub
	// identity must be in.
	if cfg.TrustDomain == "" {
		t.Error("hub.yaml: no trustDomain: replicas authenticate each other as spiffe://<trustDomain>/hub/<name>")
	}
	// The defaults of name (the host name) and advertise (the pod IP) differ on every
	// replica; a value in the shared ConfigMap would be the same for all of them.
	var raw struct {
		Replicas map[string]any `json:"replicas"`
	}
	if err := yaml.Unmarshal([]byte(data), &raw); err != nil {
		t.Fatalf("ConfigMap meshfed-hub hub.yaml: %v", err)
	}
	for _, field := range []string{"name", "advertise"} {
		if v, set := raw.Replicas[field]; set {
			t.Errorf("hub.yaml replicas.%s is %v: leave it unset, so that each replica takes its pod's (every replica shares this ConfigMap)", field, v)
		}
	}

	dep := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "meshfed-hub"))
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	// mounted returns the path at which the container sees key of the ConfigMap or Secret
	// named source, or "" if it does not mount it.
	mounted := func(source, key string) string {
		for _, m := range c.VolumeMounts {
			v := volumes[m.Name]
			if (v.ConfigMap != nil && v.ConfigMap.Name == source) || (v.Secret != nil && v.Secret.SecretName == source) {
				return m.MountPath + "/" + key
			}
		}
		return ""
	}
	if want := []string{"-config", mounted("meshfed-hub", "hub.yaml")}; !slices.Equal(c.Args, want) {
		t.Errorf("hub args %q, want %q", c.Args, want)
	}
	for field, f := range map[string][3]string{
		"tls.certFile":     {cfg.TLS.Cert, "meshfed-hub-tls", "tls.crt"},
		"tls.keyFile":      {cfg.TLS.Key, "meshfed-hub-tls", "tls.key"},
		"tls.caFile":       {cfg.TLS.CA, "meshfed-hub-tls", "ca.crt"},
		"replicas.keyFile": {cfg.Replicas.KeyFile, "meshfed-hub-gossip", "key"},
	} {
		got, secret, key := f[0], f[1], f[2]
		want := mounted(secret, key)
		if want == "" {
			t.Errorf("hub.yaml %s: the container does not mount the Secret %s", field, secret)
		} else if got != want {
			t.Errorf("hub.yaml %s is %q, want the Secret %s's %s at %q", field, got, secret, key, want)
		}
	}
	ports := map[string]corev1.ContainerPort{}
	for _, p := range c.Ports {
		ports[p.Name] = p
	}
	for field, addr := range map[string]string{"ingest": cfg.Ingest, "serve": cfg.Serve, "http": cfg.HTTP} {
		if want := fmt.Sprintf("0.0.0.0:%d", ports[field].ContainerPort); addr != want {
			t.Errorf("hub.yaml %s is %q, want %q (every interface, the container's port %q)", field, addr, want, field)
		}
	}
	for name, proto := range gossipPorts {
		p, ok := ports[name]
		if !ok || protocol(p.Protocol) != proto {
			t.Errorf("hub container: no %s port %q for replicas.gossip (memberlist uses both UDP and TCP)", proto, name)
			continue
		}
		if want := fmt.Sprintf("0.0.0.0:%d", p.ContainerPort); cfg.Replicas.Gossip != want {
			t.Errorf("hub.yaml replicas.gossip is %q, want %q (every interface, the container's port %q)", cfg.Replicas.Gossip, want, name)
		}
	}
	// The seeds are every hub pod, on the gossip port: seedDNS resolves the headless
	// Service's name to the pods' IPs, and memberlist dials them on seedDNS's port.
	gsvc := find(t, objs, "Service", "meshfed-hub-gossip")
	_, gossipPort, _ := net.SplitHostPort(cfg.Replicas.Gossip)
	if want := fmt.Sprintf("%s.%s.svc.cluster.local:%s", gsvc.name(), gsvc.namespace(), gossipPort); cfg.Replicas.SeedDNS != want {
		t.Errorf("hub.yaml replicas.seedDNS is %q, want %q (the headless Service %s, on the gossip port)", cfg.Replicas.SeedDNS, want, gsvc.name())
	}
}

// TestHubObjectsAgree checks what the apiserver does not: the hub base has the expected
// objects (and no Secret: the TLS one comes from the user's PKI, the gossip key from the
// operator), the Deployment runs three replicas that rollouts and drains replace one at a
// time, preferably on different nodes, and the Services, the PodDisruptionBudget and the
// NetworkPolicy select the hub's pods, on ports (numbers and protocols) the container has.
func TestHubObjectsAgree(t *testing.T) {
	objs := mustRender(t, "hub")
	var got []string
	for _, o := range objs {
		got = append(got, o.kind()+"/"+o.name())
	}
	want := []string{"Namespace/meshfed", "ServiceAccount/meshfed-hub", "ConfigMap/meshfed-hub", "Deployment/meshfed-hub",
		"Service/meshfed-hub", "Service/meshfed-hub-gossip", "PodDisruptionBudget/meshfed-hub", "NetworkPolicy/meshfed-hub"}
	if !slices.Equal(got, want) {
		t.Errorf("hub base renders %q, want %q", got, want)
	}
	for _, dir := range bases {
		for _, o := range mustRender(t, dir) {
			if o.kind() == "Secret" {
				t.Errorf("%s: the bases must not carry Secrets", o)
			}
		}
	}

	sa := typed[corev1.ServiceAccount](t, find(t, objs, "ServiceAccount", "meshfed-hub"))
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("ServiceAccount meshfed-hub: automountServiceAccountToken must be false (the hub never calls the API)")
	}
	dep := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "meshfed-hub"))
	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("Deployment runs as %q, want %q", dep.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	podLabels := labels.Set(dep.Spec.Template.Labels)
	selects := func(what string, sel *metav1.LabelSelector) {
		t.Helper()
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || s.Empty() || !s.Matches(podLabels) {
			t.Errorf("%s: selector %v (%v) does not select the hub's pods %v", what, sel, err, podLabels)
		}
	}
	selects("Deployment", dep.Spec.Selector)

	// Three replicas, replaced one at a time, the new one first: an old replica goes only
	// once its replacement is ready, i.e. has followed every held cluster from its peers.
	if r := dep.Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("Deployment replicas %v, want 3", ptrString(r))
	}
	st := dep.Spec.Strategy
	if ru := st.RollingUpdate; st.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
		ru.MaxSurge == nil || ru.MaxSurge.String() != "1" || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "0" {
		t.Errorf("Deployment strategy %q %+v, want RollingUpdate with maxSurge 1 and maxUnavailable 0 (a new replica is ready before an old one goes)", st.Type, ru)
	}
	// Preferably one replica per node. Preferred only: required, it would leave the
	// rollout's extra replica unschedulable on a cluster with as many nodes as replicas.
	if aff := dep.Spec.Template.Spec.Affinity; aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Error("Deployment: no preferred podAntiAffinity: all replicas may land on one node")
	} else {
		if len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			t.Error("Deployment: required podAntiAffinity: the rollout's extra replica would not schedule where there are only as many nodes as replicas")
		}
		for i, w := range aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			if w.PodAffinityTerm.TopologyKey != corev1.LabelHostname {
				t.Errorf("Deployment podAntiAffinity[%d]: topologyKey %q, want %s", i, w.PodAffinityTerm.TopologyKey, corev1.LabelHostname)
			}
			selects(fmt.Sprintf("Deployment podAntiAffinity[%d]", i), w.PodAffinityTerm.LabelSelector)
		}
	}

	ports := map[string]corev1.ContainerPort{}
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		p.Protocol = protocol(p.Protocol)
		ports[p.Name] = p
	}
	// service checks that svc selects the hub's pods and that its ports, named names, each
	// reach the container's port of the same name, number and protocol.
	service := func(svc *corev1.Service, names ...string) {
		t.Helper()
		selects("Service "+svc.Name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
		var got []string
		for _, p := range svc.Spec.Ports {
			got = append(got, p.Name)
			c, ok := ports[p.Name]
			if !ok || p.TargetPort.StrVal != p.Name || c.ContainerPort != p.Port || c.Protocol != protocol(p.Protocol) {
				t.Errorf("Service %s port %s (%d/%s -> %s) does not reach the container's port %s (%d/%s)",
					svc.Name, p.Name, p.Port, protocol(p.Protocol), p.TargetPort.String(), p.Name, c.ContainerPort, c.Protocol)
			}
		}
		if !slices.Equal(got, names) {
			t.Errorf("Service %s ports %q, want %q", svc.Name, got, names)
		}
	}

	svc := typed[corev1.Service](t, find(t, objs, "Service", "meshfed-hub"))
	service(svc, "ingest", "serve", "http")
	if !svc.Spec.PublishNotReadyAddresses {
		t.Error("Service meshfed-hub: publishNotReadyAddresses must be true: minions must reach a replica that is warming up (not ready) to resync it")
	}

	gsvc := typed[corev1.Service](t, find(t, objs, "Service", "meshfed-hub-gossip"))
	service(gsvc, "gossip-tcp", "gossip-udp")
	for _, p := range gsvc.Spec.Ports {
		if want, ok := gossipPorts[p.Name]; ok && protocol(p.Protocol) != want {
			t.Errorf("Service meshfed-hub-gossip port %s: protocol %s, want %s", p.Name, protocol(p.Protocol), want)
		}
	}
	if gsvc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service meshfed-hub-gossip: clusterIP %q, want None (headless: replicas.seedDNS must resolve to every replica, not to one virtual IP)", gsvc.Spec.ClusterIP)
	}
	if !gsvc.Spec.PublishNotReadyAddresses {
		t.Error("Service meshfed-hub-gossip: publishNotReadyAddresses must be true: a replica is not ready until it has joined its peers (on a first install, none is)")
	}

	pdb := typed[policyv1.PodDisruptionBudget](t, find(t, objs, "PodDisruptionBudget", "meshfed-hub"))
	selects("PodDisruptionBudget", pdb.Spec.Selector)
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" {
		t.Errorf("PodDisruptionBudget minAvailable %v, maxUnavailable %v: want maxUnavailable 1 only (drains evict one replica at a time)", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}

	np := typed[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "meshfed-hub"))
	selects("NetworkPolicy", &np.Spec.PodSelector)
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("NetworkPolicy policyTypes %v, want [Ingress] (egress unrestricted)", np.Spec.PolicyTypes)
	}
	// from[protocol/port] is who may reach a port: "anyone", "prometheus" (Prometheus pods
	// in any namespace), "hub-pods" (the Deployment's pods, in the policy's namespace), or
	// "other".
	from := map[string][]string{}
	for _, r := range np.Spec.Ingress {
		who := "anyone"
		if len(r.From) > 0 {
			who = "other"
			f := r.From[0]
			switch {
			case len(r.From) != 1 || f.IPBlock != nil || f.PodSelector == nil:
			case f.NamespaceSelector != nil && len(f.NamespaceSelector.MatchLabels)+len(f.NamespaceSelector.MatchExpressions) == 0 &&
				f.PodSelector.MatchLabels["app.kubernetes.io/name"] == "prometheus":
				who = "prometheus"
			case f.NamespaceSelector == nil && reflect.DeepEqual(f.PodSelector, dep.Spec.Selector):
				who = "hub-pods"
			}
		}
		for _, p := range r.Ports {
			if p.Port == nil || p.Port.IntVal == 0 {
				t.Errorf("NetworkPolicy: rule port %v: want a port number", p.Port)
				continue
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			key := fmt.Sprintf("%s/%d", proto, p.Port.IntVal)
			from[key] = append(from[key], who)
		}
	}
	wantFrom := map[string]string{"ingest": "anyone", "serve": "anyone", "http": "prometheus", "gossip-tcp": "hub-pods", "gossip-udp": "hub-pods"}
	for name, p := range ports {
		want, ok := wantFrom[name]
		if !ok {
			t.Errorf("container port %s: this test does not say who may reach it", name)
			continue
		}
		key := fmt.Sprintf("%s/%d", p.Protocol, p.ContainerPort)
		if got := from[key]; !slices.Equal(got, []string{want}) {
			t.Errorf("NetworkPolicy: port %s (%s) is open to %q, want %q only", name, key, got, want)
		}
		delete(from, key)
	}
	for name := range wantFrom {
		if _, ok := ports[name]; !ok {
			t.Errorf("the hub container has no port %s", name)
		}
	}
	for key, who := range from {
		t.Errorf("NetworkPolicy: opens %s to %q, which is no port of the hub container", key, who)
	}
}

// ptrString is *p, or "nil".
func ptrString[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

// TestDeploymentsAreHardened: every container of both Deployments runs as a non-root user
// with a read-only root filesystem, no privilege escalation, no capabilities and the
// runtime's seccomp profile, has resource requests and a memory limit, and has readiness
// and liveness probes on a port it declares.
func TestDeploymentsAreHardened(t *testing.T) {
	for _, dir := range bases {
		n := 0
		for _, o := range mustRender(t, dir) {
			if o.kind() != "Deployment" {
				continue
			}
			n++
			dep := typed[appsv1.Deployment](t, o)
			pod := dep.Spec.Template.Spec
			psc := pod.SecurityContext
			if psc == nil {
				psc = &corev1.PodSecurityContext{}
			}
			if pod.HostNetwork || pod.HostPID || pod.HostIPC {
				t.Errorf("%s: uses host namespaces", o)
			}
			for i, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
				where := fmt.Sprintf("%s container %s", o, c.Name)
				sc := c.SecurityContext
				if sc == nil {
					t.Errorf("%s: no securityContext", where)
					continue
				}
				if v := cmp(sc.RunAsNonRoot, psc.RunAsNonRoot); v == nil || !*v {
					t.Errorf("%s: runAsNonRoot is not true", where)
				}
				if v := cmp(sc.RunAsUser, psc.RunAsUser); v == nil || *v == 0 {
					t.Errorf("%s: runAsUser is not a non-zero user", where)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: readOnlyRootFilesystem is not true", where)
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: allowPrivilegeEscalation is not false", where)
				}
				if sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s: privileged", where)
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s: capabilities %v, want drop [ALL] and nothing added", where, sc.Capabilities)
				}
				if v := cmp(sc.SeccompProfile, psc.SeccompProfile); v == nil || v.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("%s: seccompProfile is not RuntimeDefault", where)
				}
				req := c.Resources.Requests
				if req.Cpu().IsZero() || req.Memory().IsZero() {
					t.Errorf("%s: resource requests %v, want cpu and memory", where, req)
				}
				if c.Resources.Limits.Memory().IsZero() {
					t.Errorf("%s: no memory limit", where)
				}
				if i < len(pod.InitContainers) {
					continue // init containers have no probes
				}
				for probeName, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
					if p == nil || p.HTTPGet == nil {
						t.Errorf("%s: no %s (httpGet)", where, probeName)
						continue
					}
					port := p.HTTPGet.Port
					if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
						return cp.Name == port.StrVal || (port.StrVal == "" && cp.ContainerPort == port.IntVal)
					}) {
						t.Errorf("%s: %s port %s is not a port of the container", where, probeName, port.String())
					}
				}
			}
		}
		if n != 1 {
			t.Errorf("%s: %d Deployments, want 1", dir, n)
		}
	}
}

// cmp returns the container's setting if it has one, else the pod's (Kubernetes' rule for
// the fields a container's securityContext can override).
func cmp[T any](container, pod *T) *T {
	if container != nil {
		return container
	}
	return pod
}

// stage is one stage of a Dockerfile: its image, its name and its instructions.
type stage struct {
	image, name string
	instrs      []string // "RUN ...", "USER ...", continuation lines joined
}

// parseDockerfile returns the ARGs before the first FROM (with their defaults) and the stages.
func parseDockerfile(t *testing.T, path string) (args map[string]string, stages []stage) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	args = map[string]string{}
	var instr strings.Builder
	var instrs []string
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && instr.Len() == 0) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			instr.WriteString(cont)
			continue
		}
		instr.WriteString(line)
		instrs = append(instrs, instr.String())
		instr.Reset()
	}
	for _, in := range instrs {
		f := strings.Fields(in)
		switch strings.ToUpper(f[0]) {
		case "FROM":
			var rest []string
			for _, w := range f[1:] {
				if !strings.HasPrefix(w, "--") {
					rest = append(rest, w)
				}
			}
			s := stage{image: rest[0]}
			if len(rest) == 3 && strings.EqualFold(rest[1], "AS") {
				s.name = rest[2]
			}
			stages = append(stages, s)
		case "ARG":
			if len(stages) == 0 {
				k, v, _ := strings.Cut(f[1], "=")
				args[k] = v
			}
			fallthrough
		default:
			if len(stages) > 0 {
				stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
			}
		}
	}
	return args, stages
}

// TestDockerfileShape checks the Dockerfile without a Docker engine: a golang build stage
// on go.mod's Go version building both commands statically (CGO_ENABLED=0, -trimpath,
// stripped), and runtime stages on distroless static nonroot that run as 65532, the last
// (default) one being the hub's; and the .dockerignore keeps history and caches out.
func TestDockerfileShape(t *testing.T) {
	args, stages := parseDockerfile(t, filepath.Join("..", "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a build stage and a runtime stage", len(stages))
	}
	build := stages[0]
	if !strings.HasPrefix(build.image, "golang:") {
		t.Fatalf("Dockerfile: first stage FROM %s, want golang:", build.image)
	}
	// The Go version: the ARG's default, or the tag itself.
	version := strings.TrimPrefix(build.image, "golang:")
	if m := regexp.MustCompile(`^\$\{?(\w+)\}?$`).FindStringSubmatch(version); m != nil {
		version = args[m[1]]
	}
	gomod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod: no go directive")
	}
	if version != string(m[1]) {
		t.Errorf("Dockerfile builds with Go %q, go.mod says go %s", version, m[1])
	}
	var buildRun string
	for _, in := range build.instrs {
		if strings.HasPrefix(in, "RUN") && strings.Contains(in, "go build") {
			buildRun = in
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags="-s -w"`, "./cmd/hub", "./cmd/minion", "/out"} {
		if !strings.Contains(buildRun, want) {
			t.Errorf("Dockerfile: the go build step %q lacks %s", buildRun, want)
		}
	}

	entrypoints := map[string]string{}
	for i, s := range stages[1:] {
		where := fmt.Sprintf("Dockerfile stage %d (%s)", i+2, s.name)
		if s.image != "gcr.io/distroless/static-debian12:nonroot" {
			t.Errorf("%s: FROM %s, want gcr.io/distroless/static-debian12:nonroot", where, s.image)
		}
		var user string
		for _, in := range s.instrs {
			f := strings.Fields(in)
			switch strings.ToUpper(f[0]) {
			case "USER":
				user = f[1]
			case "ENTRYPOINT":
				var ep []string
				if err := json.Unmarshal([]byte(strings.TrimSpace(in[len(f[0]):])), &ep); err != nil || len(ep) != 1 {
					t.Errorf("%s: %s: want the exec form with one binary", where, in)
				} else {
					entrypoints[s.name] = ep[0]
				}
			case "COPY":
				if !strings.Contains(in, "--from="+build.name) || !strings.HasSuffix(in, "/usr/local/bin/") {
					t.Errorf("%s: %s: want binaries copied from the build stage to /usr/local/bin/", where, in)
				}
			}
		}
		if user != "65532:65532" && user != "65532" {
			t.Errorf("%s: USER %q, want 65532", where, user)
		}
	}
	last := stages[len(stages)-1]
	if entrypoints[last.name] != "/usr/local/bin/hub" {
		t.Errorf("Dockerfile: the final (default) stage runs %q, want /usr/local/bin/hub", entrypoints[last.name])
	}

	ignore, err := os.ReadFile(filepath.Join("..", ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", ".cache", "*.test"} {
		if !slices.Contains(strings.Fields(string(ignore)), want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}

// TestRender checks the renderer itself: namespaces applied to namespaced objects only,
// comment-only documents skipped, and every unsupported input refused with an error naming
// the file.
func TestRender(t *testing.T) {
	write := func(t *testing.T, files map[string]string) string {
		dir := t.TempDir()
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	const kust = "namespace: ns\nresources: [a.yaml]\n"

	dir := write(t, map[string]string{
		"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + kust,
		"a.yaml": "# comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n" +
			"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n---\n" +
			"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: ns}\n",
	})
	objs, err := Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		md := o["metadata"].(map[string]any)
		got = append(got, fmt.Sprintf("%s %v/%v", o["kind"], md["namespace"], md["name"]))
	}
	if want := []string{"ConfigMap ns/c", "ClusterRole <nil>/r", "Service ns/s"}; !slices.Equal(got, want) {
		t.Errorf("rendered %q, want %q", got, want)
	}

	const cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		file  string // the file the error must name
		want  string // and what else it must say
	}{
		{"other key", map[string]string{"kustomization.yaml": kust + "commonLabels: {a: b}\n", "a.yaml": cm}, "kustomization.yaml", `"commonLabels"`},
		{"directory", map[string]string{"kustomization.yaml": "resources: [../a.yaml]\n"}, "kustomization.yaml", "not a file name"},
		{"no resources", map[string]string{"kustomization.yaml": "namespace: ns\n"}, "kustomization.yaml", "resources"},
		{"missing file", map[string]string{"kustomization.yaml": kust}, "a.yaml", "no such file"},
		{"bad yaml", map[string]string{"kustomization.yaml": kust, "a.yaml": cm + "---\nkind: [\n"}, "a.yaml", "document 2 (line 5)"},
		{"not an object", map[string]string{"kustomization.yaml": kust, "a.yaml": "- a\n"}, "a.yaml", "document 1"},
		{"no name", map[string]string{"kustomization.yaml": kust, "a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n"}, "a.yaml", "metadata.name: required"},
		{"no kind", map[string]string{"kustomization.yaml": kust, "a.yaml": "apiVersion: v1\nmetadata: {name: c}\n"}, "a.yaml", "kind: required"},
		{"other namespace", map[string]string{"kustomization.yaml": kust, "a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: other}\n"}, "a.yaml", `"other"`},
		{"duplicate", map[string]string{"kustomization.yaml": kust, "a.yaml": cm + "---\n" + cm}, "a.yaml", "also defined"},
		{"separator with text", map[string]string{"kustomization.yaml": kust, "a.yaml": cm + "--- # next\n" + cm}, "a.yaml", `exactly "---"`},
		{"no objects", map[string]string{"kustomization.yaml": kust, "a.yaml": "# nothing\n"}, "a.yaml", "no objects"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := write(t, tc.files)
			_, err := Render(dir)
			if err == nil {
				t.Fatal("rendered, want an error")
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, tc.file)) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one naming %s and saying %s", err, tc.file, tc.want)
			}
			var pe *os.PathError
			if tc.name != "missing file" && errors.As(err, &pe) {
				t.Errorf("error %q: a file error, want a rendering error", err)
			}
		})
	}
}

// TestMinionConfigMapParses: the minion's ConfigMap holds a configuration the minion
// accepts, with mutual TLS from the mounted Secret.
func TestMinionConfigMapParses(t *testing.T) {
	objs := mustRender(t, "minion")
	cm := typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "meshfed-minion"))
	cfg, err := minion.ParseConfig([]byte(cm.Data["minion.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap meshfed-minion minion.yaml: %v", err)
	}
	if cfg.TLS == nil || !strings.HasPrefix(cfg.TLS.Cert, "/etc/meshfed/tls/") {
		t.Errorf("minion.yaml: tls = %+v, want the mounted Secret's files", cfg.TLS)
	}
}

// TestMinionRelayObjectsAgree: the minion's relay, as deployed, is reachable and keeps its
// state: the ConfigMap's relay listens on the container's port "relay", which the Service
// meshfed-relay targets, also while the minion is not ready (its relay serves before its
// own sources have synced); its state file is on a writable volume.
func TestMinionRelayObjectsAgree(t *testing.T) {
	objs := mustRender(t, "minion")
	cm := typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "meshfed-minion"))
	cfg, err := minion.ParseConfig([]byte(cm.Data["minion.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Relay == nil || cfg.Relay.StateFile == "" {
		t.Fatalf("minion.yaml: relay = %+v, want a listener and a state file", cfg.Relay)
	}
	_, port, err := net.SplitHostPort(cfg.Relay.Listen)
	if err != nil {
		t.Fatal(err)
	}
	dep := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "meshfed-minion"))
	c := dep.Spec.Template.Spec.Containers[0]
	var containerPort int32
	for _, p := range c.Ports {
		if p.Name == "relay" {
			containerPort = p.ContainerPort
		}
	}
	if fmt.Sprint(containerPort) != port {
		t.Errorf("relay listens on port %s; the container's port relay is %d", port, containerPort)
	}
	svc := typed[corev1.Service](t, find(t, objs, "Service", "meshfed-relay"))
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != "relay" {
		t.Errorf("Service meshfed-relay ports %+v, want one targeting the container's port relay", svc.Spec.Ports)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Error("Service meshfed-relay: publishNotReadyAddresses must be true: the relay serves before its minion is ready")
	}
	writable := false
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(cfg.Relay.StateFile, m.MountPath+"/") && !m.ReadOnly {
			writable = true
		}
	}
	if !writable {
		t.Errorf("relay.stateFile %s is on no writable volume of the container", cfg.Relay.StateFile)
	}
}
