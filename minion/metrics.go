package minion

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfed/meshfed/internal/procmetrics"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Metrics are the minion's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	objectsGauge  *prometheus.GaugeVec
	conversions   *prometheus.CounterVec
	problemsGauge *prometheus.GaugeVec
	rejections    *prometheus.CounterVec
	connected     *prometheus.GaugeVec
	connects      *prometheus.CounterVec
	reloads       *prometheus.CounterVec
	reloadOK      prometheus.Gauge
	reloadOKAt    prometheus.Gauge
	resyncs       *prometheus.CounterVec
	certs         *procmetrics.Certificates
}

// NewMetrics creates the minion's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "meshfed", "minion"
	m := &Metrics{
		objectsGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "objects",
			Help: "Objects a source currently publishes, by source and collection."}, []string{"source", "collection"}),
		conversions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "conversions_total",
			Help: "Object conversions, by collection and result (ok|invalid)."}, []string{"collection", "result"}),
		problemsGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "source_problems",
			Help: "Current input problems (syntax errors, invalid objects) per source."}, []string{"source"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "hub_rejections_total",
			Help: "Resources the hub rejected, by collection."}, []string{"collection"}),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "destination_connected",
			Help: "1 while the push stream to a destination is up."}, []string{"destination"}),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "destination_connects_total",
			Help: "Stream attempts to a push destination, by result (established: the hub asked for collections; failed: it never did)."}, []string{"destination", "result"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "config_reloads_total",
			Help: "Changes of the configuration file, by result (applied|refused)."}, []string{"result"}),
	}
	m.resyncs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "resyncs_skipped_total",
		Help: "Informer resyncs of unchanged objects, skipped without converting or publishing, by collection."}, []string{"collection"})
	m.reloadOK = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "config_last_reload_successful",
		Help: "1 if the last change of the configuration file was applied (or there was none since the start), 0 if it was refused."})
	m.reloadOKAt = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "config_last_reload_success_timestamp_seconds",
		Help: "When the running configuration was applied (the start, or the last change applied), Unix seconds."})
	// The configuration the minion starts with is its first successful load (it does not
	// start without one), as Prometheus counts its own.
	m.reloadOK.Set(1)
	m.reloadOKAt.Set(float64(time.Now().Unix()))
	reg.MustRegister(m.objectsGauge, m.conversions, m.problemsGauge, m.rejections, m.connected, m.connects, m.reloads, m.resyncs, m.reloadOK, m.reloadOKAt)
	m.certs = procmetrics.Register(reg)
	return m
}

func (m *Metrics) conversion(collection string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "invalid"
	}
	m.conversions.WithLabelValues(collection, result).Inc()
}

func (m *Metrics) objects(source, collection string, n int) {
	if m == nil {
		return
	}
	m.objectsGauge.WithLabelValues(source, collection).Set(float64(n))
}

func (m *Metrics) problems(source string, n int) {
	if m == nil {
		return
	}
	m.problemsGauge.WithLabelValues(source).Set(float64(n))
}

func (m *Metrics) destination(addr string, up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.connected.WithLabelValues(addr).Set(v)
}

func (m *Metrics) connect(addr, result string) {
	if m == nil {
		return
	}
	m.connects.WithLabelValues(addr, result).Inc()
}

// reload counts a change of the configuration file by result, "applied" or "refused"; a
// refused one leaves the time of the last success as it was.
func (m *Metrics) reload(result string) {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues(result).Inc()
	if result != "applied" {
		m.reloadOK.Set(0)
		return
	}
	m.reloadOK.Set(1)
	m.reloadOKAt.Set(float64(time.Now().Unix()))
}

// certificates are the ones the running configuration uses: its identity's and its
// relay's (nil: none).
func (m *Metrics) certificates(identity, relay *meshtls.Source) {
	if m == nil {
		return
	}
	m.certs.Identity(identity)
	m.certs.Relay(relay)
}

func (m *Metrics) resync(collection string) {
	if m == nil {
		return
	}
	m.resyncs.WithLabelValues(collection).Inc()
}
