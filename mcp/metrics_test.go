package mcp

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

type testMetrics struct {
	reg *prometheus.Registry
	m   *Metrics
}

func newTestMetrics(t testing.TB) *testMetrics {
	reg := prometheus.NewRegistry()
	return &testMetrics{reg: reg, m: NewMetrics(reg)}
}

// counter returns the value of the counter or gauge family name whose labels include
// labelPairs, summed over the matching series.
func (tm *testMetrics) counter(t testing.TB, name string, labelPairs ...string) float64 {
	t.Helper()
	fams, err := tm.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labelPairs) {
				continue
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return total
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
