package hub

import "testing"

// BenchmarkScrape is one scrape of a hub with 100 clusters and 10,000 sinks in 20 fleets
// (scaleHub): the cluster and fleet gauges are computed then, from the sink listing.
func BenchmarkScrape(b *testing.B) {
	h := scaleHub(b)
	fams, err := h.Registry().Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "meshfed_hub_fleet_sinks" {
			b.ReportMetric(float64(len(f.GetMetric())), "fleet_series")
		}
	}
	for b.Loop() {
		if _, err := h.Registry().Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
