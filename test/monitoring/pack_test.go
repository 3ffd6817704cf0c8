package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/meshfed/meshfed/deploy"
)

// root is the repository's root, from this package's directory.
const root = "../.."

var packDir = filepath.Join(root, "deploy", "monitoring")

// rendered renders the monitoring base and returns its objects of kind, decoded strictly
// into T (a field the operator's type does not have is an error).
func rendered[T any](t *testing.T, kind string) []*T {
	t.Helper()
	objs, err := deploy.Render(packDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []*T
	for _, o := range objs {
		if o["kind"] != kind {
			continue
		}
		v := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o, v, true); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		t.Fatalf("deploy/monitoring renders no %s", kind)
	}
	return out
}

// rules returns the rendered PrometheusRule.
func rules(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	prs := rendered[monitoringv1.PrometheusRule](t, "PrometheusRule")
	if len(prs) != 1 {
		t.Fatalf("deploy/monitoring renders %d PrometheusRules, want 1", len(prs))
	}
	return prs[0]
}

// dashboard returns the Grafana dashboard, as JSON values.
func dashboard(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(packDir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	return d
}
