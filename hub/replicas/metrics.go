package replicas

import "github.com/prometheus/client_golang/prometheus"

// metrics are the replica layer's, in the hub's namespace.
type metrics struct {
	replicas prometheus.Gauge
	held     *prometheus.GaugeVec
	followed *prometheus.GaugeVec
	follows  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "meshfed", "hub"
	m := &metrics{
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "replicas",
			Help: "Live replicas this replica sees, itself included."}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cluster_held",
			Help: "1 while this replica holds the cluster's newest minion session (its peers follow it from here)."}, []string{"cluster"}),
		followed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cluster_followed",
			Help: "1 while this replica follows the cluster from the replica holding it."}, []string{"cluster"}),
		follows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "follows_started_total",
			Help: "Streams started to follow a cluster from the replica holding it (a rise outside restarts means handovers)."}),
	}
	reg.MustRegister(m.replicas, m.held, m.followed, m.follows)
	return m
}

// view records the replica view after a reconciliation: live replicas, and per cluster
// whether this replica holds it or follows it.
func (m *metrics) view(live int, held, followed map[string]bool, clusters []string) {
	m.replicas.Set(float64(live))
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, c := range clusters {
		m.held.WithLabelValues(c).Set(b(held[c]))
		m.followed.WithLabelValues(c).Set(b(followed[c]))
	}
}

// forget drops a removed cluster's series.
func (m *metrics) forget(cluster string) {
	m.held.DeleteLabelValues(cluster)
	m.followed.DeleteLabelValues(cluster)
}
