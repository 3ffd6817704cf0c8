package hub

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfed/meshfed/hub/api"
)

// stateCollector reports, at scrape time, what the hub's state already says: whether each
// configured cluster has synced, and the connected sinks by fleet and state, as the sink
// listing (sinkRegistry.each) judges them. Reading it when scraped, rather than keeping
// gauges up to date on every push and ACK, costs one walk over the clusters and the sinks
// per scrape (tens of milliseconds for 10,000 sinks on 2 busy cores: BenchmarkScrape) and
// nothing on the serving path.
//
// A fleet is the sinks of one tenant that the same routing rules select (they receive the
// same objects): its label is the route's rules key (the rules' names joined by commas). The
// series are bounded by the combinations of configured rules that connected sinks match,
// not by the sinks.
type stateCollector struct {
	h                                      *Hub
	clusterSynced, fleetSinks, fleetBehind *prometheus.Desc
	// The state file's health (persist on): failing to write, its failed commits, what is
	// queued.
	fileFailing, fileFailures, fileQueued *prometheus.Desc
}

func newStateCollector(h *Hub) *stateCollector {
	const ns, sub = "meshfed", "hub"
	return &stateCollector{h: h,
		clusterSynced: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "cluster_synced"),
			"1 once a stream has delivered every collection of a configured cluster since the hub started (or the cluster was added), 0 until then: the clusters the warm-up waits for.",
			[]string{"cluster"}, nil),
		fleetSinks: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "fleet_sinks"),
			"Connected sinks by tenant, fleet (the routing rules that select them, joined by commas; (none): no rule) and state (Synced, Syncing: a push unanswered for less than sinkStaleAfter, Stale: for longer, NACKed: its last answer to a collection's latest push was a NACK).",
			[]string{"tenant", "fleet", "state"}, nil),
		fleetBehind: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "fleet_oldest_unacked_seconds"),
			"How long the fleet's oldest unanswered push has waited for its ACK or NACK, in seconds (0: every push answered).",
			[]string{"tenant", "fleet"}, nil),
		fileFailing: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "state_file_failing"),
			"1 while the state file does not keep what the hub serves: its writes fail (a full disk, I/O errors), it is read-only, or it could not be opened; a restart would then serve an older state. 0 while it keeps up.",
			nil, nil),
		fileFailures: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "state_file_write_failures_total"),
			"Failed commits of the state file, retries included.",
			nil, nil),
		fileQueued: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "state_file_queued"),
			"Writes of the state file not on disk yet (one per resource, cluster metadata or drop, coalesced).",
			nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.clusterSynced
	ch <- c.fleetSinks
	ch <- c.fleetBehind
	ch <- c.fileFailing
	ch <- c.fileFailures
	ch <- c.fileQueued
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, cs := range c.h.clusterList() {
		cs.mu.Lock()
		synced, removed := cs.synced, cs.removed
		cs.mu.Unlock()
		if !removed {
			ch <- prometheus.MustNewConstMetric(c.clusterSynced, prometheus.GaugeValue, boolValue(synced), cs.name)
		}
	}
	if c.h.cfg.Persist {
		failing, failures, queued := c.h.stateFileHealth()
		ch <- prometheus.MustNewConstMetric(c.fileFailing, prometheus.GaugeValue, boolValue(failing))
		ch <- prometheus.MustNewConstMetric(c.fileFailures, prometheus.CounterValue, float64(failures))
		ch <- prometheus.MustNewConstMetric(c.fileQueued, prometheus.GaugeValue, float64(queued))
	}
	now := c.h.sinks.now() // the clock the sinks' states are judged by
	for _, f := range c.h.fleets(vendor(c.h.current().comp)) {
		tenant, rules := labelOrNone(f.rt.tenant), labelOrNone(f.rt.sub.Key()) // the route's, as the dashboard's fleets
		// Every state of a fleet has a series, 0 included: an alert on one state sees it
		// clear, and a panel stacks the same states for every fleet.
		for _, state := range api.SinkStates {
			ch <- prometheus.MustNewConstMetric(c.fleetSinks, prometheus.GaugeValue, float64(countOf(f.StateCounts, state)), tenant, rules, state)
		}
		behind := 0.0
		if f.OldestBehind != nil {
			behind = now.Sub(*f.OldestBehind).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(c.fleetBehind, prometheus.GaugeValue, behind, tenant, rules)
	}
}

// labelOrNone is s, or noTenant's "(none)" for an empty label (which Prometheus would drop).
func labelOrNone(s string) string {
	if s == "" {
		return noTenant
	}
	return s
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
