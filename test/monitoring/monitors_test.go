package monitoring

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/deploy"
)

// object finds the rendered object of kind and name in the base dir.
func object(t *testing.T, dir, kind, name string) map[string]any {
	t.Helper()
	objs, err := deploy.Render(filepath.Join(root, "deploy", dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if md, _ := o["metadata"].(map[string]any); o["kind"] == kind && md["name"] == name {
			return o
		}
	}
	t.Fatalf("deploy/%s renders no %s %s", dir, kind, name)
	return nil
}

// field reads a nested field of a rendered object.
func field(o map[string]any, path ...string) any {
	var v any = o
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	return v
}

func stringMap(v any) map[string]string {
	out := map[string]string{}
	m, _ := v.(map[string]any)
	for k, x := range m {
		s, _ := x.(string)
		out[k] = s
	}
	return out
}

// portNames returns the names of a list of ports (a Service's or a container's).
func portNames(v any) []string {
	var out []string
	ports, _ := v.([]any)
	for _, p := range ports {
		if name, ok := field(p.(map[string]any), "name").(string); ok {
			out = append(out, name)
		}
	}
	return out
}

// selects checks that a monitor in namespace monNS, with selector sel in namespaces ns,
// selects an object with these labels in namespace objNS. An empty namespaceSelector is
// the monitor's own namespace, as the operator reads it.
func selects(t *testing.T, what string, monNS string, sel metav1.LabelSelector, ns monitoringv1.NamespaceSelector, objLabels map[string]string, objNS string) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(&sel)
	if err != nil || s.Empty() || !s.Matches(labels.Set(objLabels)) {
		t.Errorf("%s: selector %v (%v) does not select %v", what, sel, err, objLabels)
	}
	names := ns.MatchNames
	if len(names) == 0 {
		names = []string{monNS}
	}
	if !ns.Any && !slices.Contains(names, objNS) {
		t.Errorf("%s: looks in namespaces %v, not in %s", what, names, objNS)
	}
}

// The ServiceMonitor scrapes the hub's Service (deploy/hub) on a port that Service has.
func TestServiceMonitorSelectsTheHub(t *testing.T) {
	sms := rendered[monitoringv1.ServiceMonitor](t, "ServiceMonitor")
	svc := object(t, "hub", "Service", "meshfed-hub")
	svcNS, _ := field(svc, "metadata", "namespace").(string)
	for _, sm := range sms {
		selects(t, "ServiceMonitor "+sm.Name, sm.Namespace, sm.Spec.Selector, sm.Spec.NamespaceSelector, stringMap(field(svc, "metadata", "labels")), svcNS)
		if len(sm.Spec.Endpoints) == 0 {
			t.Errorf("ServiceMonitor %s: no endpoints", sm.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.Contains(portNames(field(svc, "spec", "ports")), ep.Port) || ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor %s: endpoint port %q path %q, want a port of Service meshfed-hub (%v) and /metrics", sm.Name, ep.Port, ep.Path, portNames(field(svc, "spec", "ports")))
			}
		}
	}
}

// The minion's PodMonitor scrapes the minion's pods (deploy/minion) on a port of theirs.
func TestPodMonitorSelectsTheMinion(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(packDir, "podmonitor-minion.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pm monitoringv1.PodMonitor
	if err := yaml.UnmarshalStrict(data, &pm); err != nil {
		t.Fatalf("podmonitor-minion.yaml: %v", err)
	}
	if pm.Kind != "PodMonitor" || pm.APIVersion != "monitoring.coreos.com/v1" {
		t.Errorf("podmonitor-minion.yaml: %s %s, want monitoring.coreos.com/v1 PodMonitor", pm.APIVersion, pm.Kind)
	}
	dep := object(t, "minion", "Deployment", "meshfed-minion")
	depNS, _ := field(dep, "metadata", "namespace").(string)
	selects(t, "PodMonitor "+pm.Name, pm.Namespace, pm.Spec.Selector, pm.Spec.NamespaceSelector, stringMap(field(dep, "spec", "template", "metadata", "labels")), depNS)
	containers, _ := field(dep, "spec", "template", "spec", "containers").([]any)
	if len(containers) == 0 {
		t.Fatal("Deployment meshfed-minion has no containers")
	}
	ports := portNames(field(containers[0].(map[string]any), "ports"))
	if len(pm.Spec.PodMetricsEndpoints) == 0 {
		t.Error("PodMonitor: no endpoints")
	}
	for _, ep := range pm.Spec.PodMetricsEndpoints {
		if ep.Port == nil || !slices.Contains(ports, *ep.Port) || ep.Path != "/metrics" {
			t.Errorf("PodMonitor: endpoint port %v path %q, want a port of the minion's container (%v) and /metrics", ep.Port, ep.Path, ports)
		}
	}
}
