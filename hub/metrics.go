package hub

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/procmetrics"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Metrics are the hub's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	ready          prometheus.Gauge
	clusterUp      *prometheus.GaugeVec
	resourcesGauge *prometheus.GaugeVec
	rejections     *prometheus.CounterVec
	refusals       *prometheus.CounterVec
	viewsGauge     prometheus.Gauge
	reloads        *procmetrics.Reloads
	certs          *procmetrics.Certificates
	conflictsGauge prometheus.Gauge
	tlsRejections  *prometheus.CounterVec
	connsRefused   *prometheus.CounterVec
	breakerOpen    *prometheus.GaugeVec
	deletionsHeld  *prometheus.GaugeVec
	breakerTrips   *prometheus.CounterVec
	takeovers      *prometheus.CounterVec
	competingGauge *prometheus.GaugeVec
	unknownGauge   *prometheus.GaugeVec

	// By tenant: the configured ones, and noTenant for the peers of none; a reload forgets
	// the series of a tenant it removed (retainTenants).
	tenantStreamsGauge   *prometheus.GaugeVec
	tenantStreamsRefused *prometheus.CounterVec
	tenantObjects        *prometheus.GaugeVec
	tenantBytes          *prometheus.GaugeVec
	tenantPushesDelayed  *prometheus.CounterVec
	tenantPushDelay      *prometheus.CounterVec
	tenantsMu            sync.Mutex      // guards tenantNames
	tenantNames          map[string]bool // the tenants with series
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
			Help: "Resources rejected (ownership, validation, quota) or losing a conflict, by cluster and collection (the refusals of meshfed_hub_refusals_total, by collection instead of reason)."}, []string{"cluster", "collection"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refusals_total",
			Help: "Objects a cluster pushed that are not served, by cluster and reason (not_owned, invalid, over_quota, conflict): the refusal events of /api/events."}, []string{"cluster", "reason"}),
		viewsGauge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "views",
			Help: "Distinct routing subsets currently served (one shared view each)."}),
		reloads: procmetrics.NewReloads(reg, sub),
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
	m.competingGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cluster_competing_writers",
		Help: "1 while a cluster has two live writers: a stream of its source was refused, in the last 10 minutes, because another that had just taken over was still open (two minions with one identity)."}, []string{"cluster"})
	m.unknownGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cluster_state_unknown",
		Help: "1 while the hub does not know a cluster's last state (its state file could not be read whole, or its writes were failing when the hub stopped): its tenant's sinks are not served until its minion resyncs or an operator releases it."}, []string{"cluster"})
	m.connsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "connections_refused_total",
		Help: "Connections refused or closed before their TLS handshake completed, by listener and reason (max_connections: the process's cap; pending_per_ip: the address's connections in handshake; handshake_timeout: not completed in time)."}, []string{"listener", "reason"})
	reg.MustRegister(m.breakerOpen, m.deletionsHeld, m.breakerTrips, m.takeovers, m.competingGauge, m.unknownGauge, m.connsRefused)
	const tsub = "tenant"
	m.tenantStreamsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: tsub, Name: "streams",
		Help: "Streams a tenant's peers (minions, relays, sinks) have open on the hub's listeners, all together; tenant=\"(none)\": the peers of no tenant."}, []string{"tenant"})
	m.tenantStreamsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: tsub, Name: "streams_rejected_total",
		Help: "Streams refused by the tenant's limits, by reason (tenant_rate_limited, tenant_too_many_streams)."}, []string{"tenant", "reason"})
	m.tenantObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: tsub, Name: "objects",
		Help: "Objects a tenant's clusters hold, all together (what tenantLimits.maxObjects bounds)."}, []string{"tenant"})
	m.tenantBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: tsub, Name: "bytes",
		Help: "Bytes a tenant's clusters' objects add up to as served, all together (what tenantLimits.maxBytes bounds)."}, []string{"tenant"})
	m.tenantPushesDelayed = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: tsub, Name: "pushes_delayed_total",
		Help: "Pushes of a tenant's clusters that waited for its pushesPerSecond (on their own streams; nothing is dropped)."}, []string{"tenant"})
	m.tenantPushDelay = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: tsub, Name: "push_delay_seconds_total",
		Help: "Time the pushes of a tenant's clusters waited for its pushesPerSecond, all together."}, []string{"tenant"})
	m.tenantNames = map[string]bool{}
	reg.MustRegister(m.tenantStreamsGauge, m.tenantStreamsRefused, m.tenantObjects, m.tenantBytes, m.tenantPushesDelayed, m.tenantPushDelay)
	reg.MustRegister(m.ready, m.clusterUp, m.resourcesGauge, m.rejections, m.viewsGauge, m.conflictsGauge, m.tlsRejections)
	reg.MustRegister(m.refusals)
	m.certs = procmetrics.Register(reg)
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
	// Every reason's series exists from the cluster's configuration on: the first refusal of
	// a kind is then an increase, which rate() and increase() see.
	for _, reason := range api.RefusalReasons {
		m.refusals.WithLabelValues(cluster, reason)
	}
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

// reloaded records the changes of the configuration file (nil, which records nothing, for
// a nil m).
func (m *Metrics) reloaded() *procmetrics.Reloads {
	if m == nil {
		return nil
	}
	return m.reloads
}

// event counts what the hub notes (note) that has a metric: refusals, by reason class.
func (m *Metrics) event(e api.Event) {
	if m == nil || e.Kind != api.EventRefusal {
		return
	}
	m.refusals.WithLabelValues(e.Cluster, e.Reason).Inc()
}

// certificates are the hub's TLS credentials: its certificate and trust bundle, the
// configured files' or the development CA's.
func (m *Metrics) certificates(src *meshtls.Source) {
	if m == nil {
		return
	}
	m.certs.Identity(src)
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

// connRefused counts a connection refused or closed before its handshake (connlimit).
func (m *Metrics) connRefused(listener, reason string) {
	if m == nil {
		return
	}
	m.connsRefused.WithLabelValues(listener, reason).Inc()
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

func (m *Metrics) stateUnknown(cluster string, on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.unknownGauge.WithLabelValues(cluster).Set(v)
}

func (m *Metrics) competing(cluster string, on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.competingGauge.WithLabelValues(cluster).Set(v)
}

// forgetCluster drops a removed cluster's series.
func (m *Metrics) forgetCluster(cluster string) {
	if m == nil {
		return
	}
	m.clusterUp.DeleteLabelValues(cluster)
	m.resourcesGauge.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	m.rejections.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	m.refusals.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	m.breakerOpen.DeleteLabelValues(cluster)
	m.deletionsHeld.DeleteLabelValues(cluster)
	m.breakerTrips.DeleteLabelValues(cluster)
	m.takeovers.DeleteLabelValues(cluster)
	m.competingGauge.DeleteLabelValues(cluster)
	m.unknownGauge.DeleteLabelValues(cluster)
}

// tenantSeen records that tenant has series, for retainTenants.
func (m *Metrics) tenantSeen(tenant string) {
	m.tenantsMu.Lock()
	defer m.tenantsMu.Unlock()
	m.tenantNames[tenant] = true
}

func (m *Metrics) tenantStreams(tenant string, open int) {
	if m == nil {
		return
	}
	m.tenantSeen(tenant)
	m.tenantStreamsGauge.WithLabelValues(tenant).Set(float64(open))
}

// tenantStreamsGone drops the streams gauge of a tenant a reload removed, once its last
// stream has ended.
func (m *Metrics) tenantStreamsGone(tenant string) {
	if m == nil {
		return
	}
	m.tenantStreamsGauge.DeleteLabelValues(tenant)
}

func (m *Metrics) tenantStreamRefused(tenant, reason string) {
	if m == nil {
		return
	}
	m.tenantSeen(tenant)
	m.tenantStreamsRefused.WithLabelValues(tenant, reason).Inc()
}

func (m *Metrics) tenantPushDelayed(tenant string, wait time.Duration) {
	if m == nil {
		return
	}
	m.tenantSeen(tenant)
	m.tenantPushesDelayed.WithLabelValues(tenant).Inc()
	m.tenantPushDelay.WithLabelValues(tenant).Add(wait.Seconds())
}

// tenantGauges are a tenant's usage series, bound once (the store sets them on every
// change). The zero value records nothing.
type tenantGauges struct{ objects, bytes prometheus.Gauge }

func (m *Metrics) tenantUsage(tenant string) tenantGauges {
	if m == nil {
		return tenantGauges{}
	}
	m.tenantSeen(tenant)
	return tenantGauges{objects: m.tenantObjects.WithLabelValues(tenant), bytes: m.tenantBytes.WithLabelValues(tenant)}
}

func (g tenantGauges) set(u *tenantUsage) {
	if g.objects == nil {
		return
	}
	g.objects.Set(float64(u.objects))
	g.bytes.Set(float64(u.bytes))
}

// retainTenants drops the series of every tenant keep does not keep; the streams gauge of
// one whose peers still have streams open (open) goes with the last of them.
func (m *Metrics) retainTenants(keep func(tenant string) bool, open func(tenant string) int) {
	if m == nil {
		return
	}
	m.tenantsMu.Lock()
	var gone []string
	for name := range m.tenantNames {
		if !keep(name) {
			gone = append(gone, name)
			delete(m.tenantNames, name)
		}
	}
	m.tenantsMu.Unlock() // open takes the stream groups' lock, under which they record here
	for _, name := range gone {
		m.tenantStreamsRefused.DeletePartialMatch(prometheus.Labels{"tenant": name})
		m.tenantObjects.DeleteLabelValues(name)
		m.tenantBytes.DeleteLabelValues(name)
		m.tenantPushesDelayed.DeleteLabelValues(name)
		m.tenantPushDelay.DeleteLabelValues(name)
		if open(name) == 0 {
			m.tenantStreamsGauge.DeleteLabelValues(name)
		}
	}
}
