package minion

import (
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
	reloads       *procmetrics.Reloads
	resyncs       *prometheus.CounterVec
	certs         *procmetrics.Certificates
	connsRefused  *prometheus.CounterVec
	// The relay's state file: vectors without labels, so that a minion without one exports
	// none of them.
	relayResets   *prometheus.CounterVec
	relayFailures *prometheus.CounterVec
	relayKept     *prometheus.GaugeVec
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
		reloads: procmetrics.NewReloads(reg, sub),
	}
	m.resyncs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "resyncs_skipped_total",
		Help: "Informer resyncs of unchanged objects, skipped without converting or publishing, by collection."}, []string{"collection"})
	m.connsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "connections_refused_total",
		Help: "Connections refused or closed before their handshake completed, by listener (listen, relay, http) and reason (max_connections: the process's cap; pending_per_ip: the address's connections in handshake; handshake_timeout: not completed in time)."}, []string{"listener", "reason"})
	m.relayResets = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_state_file_resets_total",
		Help: "Relay state files found damaged (not a bbolt file, truncated, damaged pages, another layout, a record that does not decode) and moved aside: the relay started a new one and served nothing the damaged one held."}, nil)
	m.relayFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_state_file_write_failures_total",
		Help: "Failed writes of the relay's state file, retries included: the relay then serves the hub's pushes from memory, and a restart serves nothing until the hub answers."}, nil)
	m.relayKept = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "relay_state_file_kept",
		Help: "1 while the relay's state file holds what the relay serves, so that a restart serves it until the hub answers; 0 while it cannot be opened or written (the log and /status say why)."}, nil)
	reg.MustRegister(m.objectsGauge, m.conversions, m.problemsGauge, m.rejections, m.connected, m.connects, m.resyncs,
		m.connsRefused, m.relayResets, m.relayFailures, m.relayKept)
	m.certs = procmetrics.Register(reg)
	return m
}

// connRefused counts a connection refused or closed before its handshake (connlimit).
func (m *Metrics) connRefused(listener, reason string) {
	if m == nil {
		return
	}
	m.connsRefused.WithLabelValues(listener, reason).Inc()
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

// reloaded records the changes of the configuration file (nil, which records nothing, for
// a nil m).
func (m *Metrics) reloaded() *procmetrics.Reloads {
	if m == nil {
		return nil
	}
	return m.reloads
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

func (m *Metrics) relayFileReset() {
	if m == nil {
		return
	}
	m.relayResets.WithLabelValues().Inc()
}

func (m *Metrics) relayFileWriteFailed() {
	if m == nil {
		return
	}
	m.relayFailures.WithLabelValues().Inc()
}

// relayFileCounters starts the state file's counters at 0, with a relay that has one: a
// counter that first appears at 1 shows no increase.
func (m *Metrics) relayFileCounters() {
	if m == nil {
		return
	}
	m.relayResets.WithLabelValues().Add(0)
	m.relayFailures.WithLabelValues().Add(0)
}

// relayFileKept says whether the relay's state file holds what the relay serves.
func (m *Metrics) relayFileKept(kept bool) {
	if m == nil {
		return
	}
	v := 0.0
	if kept {
		v = 1
	}
	m.relayKept.WithLabelValues().Set(v)
}

// relayFileClosed removes the kept gauge with the file: the next configuration may have none.
func (m *Metrics) relayFileClosed() {
	if m == nil {
		return
	}
	m.relayKept.Reset()
}
