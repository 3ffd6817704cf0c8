package mcp

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metrics are the engine's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	streamsOpen     *prometheus.GaugeVec
	streamsTotal    *prometheus.CounterVec
	streamsRejected *prometheus.CounterVec
	pushes          *prometheus.CounterVec
	acks            *prometheus.CounterVec
	nacks           *prometheus.CounterVec
	bytes           *prometheus.CounterVec
	ackLatency      *prometheus.HistogramVec
	ignoredReqs     *prometheus.CounterVec
	pushErrors      *prometheus.CounterVec
	refusedColls    *prometheus.CounterVec

	// received bytes per role, bound once: every request and push adds to them.
	recvSource, recvSink prometheus.Counter
}

// NewMetrics creates the engine's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "meshfed", "mcp"
	m := &Metrics{
		streamsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "streams_open",
			Help: "MCP streams currently open, by role (source|sink) and transport (server|client)."}, []string{"role", "transport"}),
		streamsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "streams_total",
			Help: "MCP streams opened, by role and transport."}, []string{"role", "transport"}),
		streamsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "streams_rejected_total",
			Help: "MCP streams refused by admission, or closed for idling, by reason (unauthenticated, permission_denied, unavailable, rate_limited, warming_up, too_many_streams, idle, refused; and, with ServerConfig.Groups, <kind>_rate_limited and <kind>_too_many_streams, e.g. tenant_rate_limited)."}, []string{"reason"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "pushes_total",
			Help: "Resources messages sent (role=source) or received (role=sink), by collection and kind (full|incremental)."}, []string{"role", "collection", "kind"}),
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "acks_total",
			Help: "ACKs received (role=source) or sent (role=sink), by collection."}, []string{"role", "collection"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "nacks_total",
			Help: "NACKs received (role=source) or sent (role=sink), by collection and reason (the gRPC code of the error detail)."}, []string{"role", "collection", "reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bytes_total",
			Help: "MCP message bytes, by role and direction (sent|received)."}, []string{"role", "direction"}),
		ackLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "push_ack_latency_seconds",
			Help:    "Time from sending a push to receiving its ACK or NACK, by collection.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"collection"}),
		ignoredReqs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ignored_messages_total",
			Help: "Messages ignored by the engine, by reason (stale_nonce, no_collection, unknown_collection, trigger, ...)."}, []string{"reason"}),
		pushErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "push_errors_total",
			Help: "Pushes or resources that could not be sent, by collection and reason."}, []string{"collection", "reason"}),
		refusedColls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "collections_refused_total",
			Help: "Collections a peer refused to serve, each counted once per refusal (the sink goes on without it), by collection."}, []string{"collection"}),
	}
	reg.MustRegister(m.streamsOpen, m.streamsTotal, m.streamsRejected, m.pushes, m.acks, m.nacks, m.bytes, m.ackLatency, m.ignoredReqs, m.pushErrors, m.refusedColls)
	m.recvSource, m.recvSink = m.bytes.WithLabelValues("source", "received"), m.bytes.WithLabelValues("sink", "received")
	return m
}

func (m *Metrics) streamOpened(i *StreamInfo) {
	if m == nil {
		return
	}
	m.streamsOpen.WithLabelValues(i.Role, i.Transport).Inc()
	m.streamsTotal.WithLabelValues(i.Role, i.Transport).Inc()
}

func (m *Metrics) streamClosed(i *StreamInfo) {
	if m == nil {
		return
	}
	m.streamsOpen.WithLabelValues(i.Role, i.Transport).Dec()
}

func (m *Metrics) streamRejected(reason string) {
	if m == nil {
		return
	}
	m.streamsRejected.WithLabelValues(reason).Inc()
}

func kind(incremental bool) string {
	if incremental {
		return "incremental"
	}
	return "full"
}

func (m *Metrics) received(collection string, incremental bool, bytes int) {
	if m == nil {
		return
	}
	m.pushes.WithLabelValues("sink", collection, kind(incremental)).Inc()
	m.bytes.WithLabelValues("sink", "received").Add(float64(bytes))
}

func (m *Metrics) sinkAck(collection string, code codes.Code, bytes int) {
	if m == nil {
		return
	}
	if code == codes.OK {
		m.acks.WithLabelValues("sink", collection).Inc()
	} else {
		m.nacks.WithLabelValues("sink", collection, code.String()).Inc()
	}
	m.bytes.WithLabelValues("sink", "sent").Add(float64(bytes))
}

func (m *Metrics) addBytesReceived(role string, n int) {
	if m == nil {
		return
	}
	switch role {
	case "source":
		m.recvSource.Add(float64(n))
	case "sink":
		m.recvSink.Add(float64(n))
	default:
		m.bytes.WithLabelValues(role, "received").Add(float64(n))
	}
}

func (m *Metrics) ignored(reason string) {
	if m == nil {
		return
	}
	m.ignoredReqs.WithLabelValues(reason).Inc()
}

func (m *Metrics) refused(collection string) {
	if m == nil {
		return
	}
	m.refusedColls.WithLabelValues(collection).Inc()
}

func (m *Metrics) pushError(collection, reason string) {
	if m == nil {
		return
	}
	m.pushErrors.WithLabelValues(collection, reason).Inc()
}

// sourceCollectionMetrics are one collection's source-side series, bound once per
// subscription so the push and ACK paths do no label lookups. Nil-safe.
type sourceCollectionMetrics struct {
	pushFull, pushIncr, acks, bytesSent prometheus.Counter
	latency                             prometheus.Observer
	m                                   *Metrics
	collection                          string
}

func (m *Metrics) sourceCollection(collection string) *sourceCollectionMetrics {
	if m == nil {
		return nil
	}
	return &sourceCollectionMetrics{
		pushFull:   m.pushes.WithLabelValues("source", collection, "full"),
		pushIncr:   m.pushes.WithLabelValues("source", collection, "incremental"),
		acks:       m.acks.WithLabelValues("source", collection),
		bytesSent:  m.bytes.WithLabelValues("source", "sent"),
		latency:    m.ackLatency.WithLabelValues(collection),
		m:          m,
		collection: collection,
	}
}

func (c *sourceCollectionMetrics) push(incremental bool, bytes int) {
	if c == nil {
		return
	}
	if incremental {
		c.pushIncr.Inc()
	} else {
		c.pushFull.Inc()
	}
	c.bytesSent.Add(float64(bytes))
}

func (c *sourceCollectionMetrics) ack(latency time.Duration) {
	if c == nil {
		return
	}
	c.acks.Inc()
	c.latency.Observe(latency.Seconds())
}

func (c *sourceCollectionMetrics) nack(code codes.Code, latency time.Duration) {
	if c == nil {
		return
	}
	c.m.nacks.WithLabelValues("source", c.collection, code.String()).Inc()
	c.latency.Observe(latency.Seconds())
}

// sinkAckAs counts an ACK (code OK) or NACK received by a source of the given role.
func (m *Metrics) sinkAckAs(role, collection string, code codes.Code) {
	if m == nil {
		return
	}
	if code == codes.OK {
		m.acks.WithLabelValues(role, collection).Inc()
	} else {
		m.nacks.WithLabelValues(role, collection, code.String()).Inc()
	}
}

// xdsPushed counts one MCP-over-xDS response (always a full state).
func (m *Metrics) xdsPushed(collection string, bytes int) {
	if m == nil {
		return
	}
	m.pushes.WithLabelValues("source", collection, "xds_full").Inc()
	m.bytes.WithLabelValues("source", "sent").Add(float64(bytes))
}
