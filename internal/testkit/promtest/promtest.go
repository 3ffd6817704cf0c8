// Package promtest reads metrics back from a Prometheus registry in tests, as a scrape
// would see them.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Sum adds up the series of the counter or gauge family name whose labels include want
// (nil: every series). A family that does not exist sums to 0.
func Sum(t testing.TB, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}
