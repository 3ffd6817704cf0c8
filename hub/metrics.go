package hub

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the hub's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	ready          prometheus.Gauge
	clusterUp      *prometheus.GaugeVec
	resourcesGauge *prometheus.GaugeVec
	rejections     *prometheus.CounterVec
	viewsGauge     prometheus.Gauge
	reloads        *prometheus.CounterVec
	conflictsGauge prometheus.Gauge
	tlsRejections  *prometheus.CounterVec
	breakerOpen    *prometheus.GaugeVec
	deletionsHeld  *prometheus.GaugeVec
	breakerTrips   *prometheus.CounterVec
	takeovers      *prometheus.CounterVec
}

// NewMetrics creates the hub's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "meshfed", "hub"
	m := &Metrics{
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "ready",
			Help: "1 once the hub serves sinks (every cluster synced, or the warm-up passed)."}),
		clusterUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cluster_connected",
			Help: "1 while a cluster has a live ingest stream."}, []string{"cluster"}),
		resourcesGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cluster_resources",
			Help: "Accepted resources a cluster holds, by collection."}, []string{"cluster", "collection"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rejections_total",
			Help: "Resources rejected (ownership, validation) or losing a conflict, by cluster and collection."}, []string{"cluster", "collection"}),
		viewsGauge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "views",
			Help: "Distinct routing subsets currently served (one shared view each)."}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "config_reloads_total",
			Help: "Changes of the configuration file, by result (applied|refused)."}, []string{"result"}),
	}
	m.conflictsGauge = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "conflicts",
		Help: "Collection/names published by more than one cluster (one served, the others held)."})
	m.tlsRejections = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "tls_rejections_total",
		Help: "TLS handshakes refused, by reason (no_certificate, unknown_authority, expired, not_yet_valid, multiple_identities, plaintext, invalid)."}, []string{"reason"})
	m.breakerOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "breaker_open",
		Help: "1 while a cluster's mass-deletion breaker is open (its deletions held until it recovers or an operator releases it)."}, []string{"cluster"})
	m.deletionsHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "deletions_held",
		Help: "Deletions a cluster's breaker holds (open, or settling); their objects are still served."}, []string{"cluster"})
	m.breakerTrips = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "breaker_trips_total",
		Help: "Times a cluster's mass-deletion breaker opened."}, []string{"cluster"})
	m.takeovers = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cluster_takeovers_total",
		Help: "Streams of a cluster's source that took over from another still open (one writer per cluster: the previous one is closed)."}, []string{"cluster"})
	reg.MustRegister(m.breakerOpen, m.deletionsHeld, m.breakerTrips, m.takeovers)
	reg.MustRegister(m.ready, m.clusterUp, m.resourcesGauge, m.rejections, m.viewsGauge, m.reloads, m.conflictsGauge, m.tlsRejections)
	return m
}

func (m *Metrics) connected(cluster string, up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.clusterUp.WithLabelValues(cluster).Set(v)
}

func (m *Metrics) resources(cluster, collection string, n int) {
	if m == nil {
		return
	}
	m.resourcesGauge.WithLabelValues(cluster, collection).Set(float64(n))
}

func (m *Metrics) rejected(cluster, collection string) {
	if m == nil {
		return
	}
	m.rejections.WithLabelValues(cluster, collection).Inc()
}

func (m *Metrics) views(n int) {
	if m == nil {
		return
	}
	m.viewsGauge.Set(float64(n))
}

func (m *Metrics) reload(result string) {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues(result).Inc()
}

func (m *Metrics) conflicts(n int) {
	if m == nil {
		return
	}
	m.conflictsGauge.Set(float64(n))
}

func (m *Metrics) tlsRejected(reason string) {
	if m == nil {
		return
	}
	m.tlsRejections.WithLabelValues(reason).Inc()
}

func (m *Metrics) breaker(cluster string, open bool, held int) {
	if m == nil {
		return
	}
	v := 0.0
	if open {
		v = 1
	}
	m.breakerOpen.WithLabelValues(cluster).Set(v)
	m.deletionsHeld.WithLabelValues(cluster).Set(float64(held))
}

func (m *Metrics) breakerTripped(cluster string) {
	if m == nil {
		return
	}
	m.breakerTrips.WithLabelValues(cluster).Inc()
}

func (m *Metrics) takeover(cluster string) {
	if m == nil {
		return
	}
	m.takeovers.WithLabelValues(cluster).Inc()
}

// forgetCluster drops a removed cluster's series.
func (m *Metrics) forgetCluster(cluster string) {
	if m == nil {
		return
	}
	m.clusterUp.DeleteLabelValues(cluster)
	m.resourcesGauge.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	m.rejections.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	m.breakerOpen.DeleteLabelValues(cluster)
	m.deletionsHeld.DeleteLabelValues(cluster)
	m.breakerTrips.DeleteLabelValues(cluster)
	m.takeovers.DeleteLabelValues(cluster)
}
