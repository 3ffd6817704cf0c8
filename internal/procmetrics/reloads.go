package procmetrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a change of a configuration file.
const (
	ReloadApplied = "applied"
	ReloadRefused = "refused"
)

// Reloads counts a program's changes of its configuration file, as
// meshfed_<subsystem>_config_reloads_total{result}, and says whether the last one was
// applied and when one last was (..._config_last_reload_successful and
// ..._config_last_reload_success_timestamp_seconds, as Prometheus names its own). A nil
// *Reloads records nothing.
type Reloads struct {
	total    *prometheus.CounterVec
	ok, okAt prometheus.Gauge
	now      func() time.Time

	mu           sync.Mutex
	at, previous time.Time // the running configuration's success, and the one before
}

// NewReloads registers the reload metrics of subsystem ("hub", "minion") with reg. The
// configuration the program starts with counts as applied now: it does not start without
// one.
func NewReloads(reg prometheus.Registerer, subsystem string) *Reloads {
	const ns = "meshfed"
	r := &Reloads{now: time.Now,
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: subsystem, Name: "config_reloads_total",
			Help: "Changes of the configuration file, by result (applied|refused)."}, []string{"result"}),
		ok: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: subsystem, Name: "config_last_reload_successful",
			Help: "1 if the last change of the configuration file was applied (or there was none since the start), 0 if it was refused: the program runs an older configuration than the file."}),
		okAt: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: subsystem, Name: "config_last_reload_success_timestamp_seconds",
			Help: "When the running configuration was applied (the start, or the last change applied), Unix seconds."}),
	}
	reg.MustRegister(r.total, r.ok, r.okAt)
	r.applied()
	return r
}

// Record counts a change by result (ReloadApplied, ReloadRefused); a refused one leaves the
// time of the last success as it was.
func (r *Reloads) Record(result string) {
	if r == nil {
		return
	}
	r.total.WithLabelValues(result).Inc()
	if result == ReloadApplied {
		r.applied()
		return
	}
	r.ok.Set(0)
}

// Current records that the file says what runs again (an operator put back the running
// configuration after a refused change): the last reload is no longer failed, and the
// running configuration's time stays.
func (r *Reloads) Current() {
	if r == nil {
		return
	}
	r.ok.Set(1)
}

// FailedToStart records that the change last applied could not run (a listen address in
// use) and the previous configuration runs again: a refusal, and the success time is the
// previous configuration's.
func (r *Reloads) FailedToStart() {
	if r == nil {
		return
	}
	r.total.WithLabelValues(ReloadRefused).Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = r.previous
	r.ok.Set(0)
	r.okAt.Set(float64(r.at.Unix()))
}

func (r *Reloads) applied() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.previous, r.at = r.at, r.now()
	r.ok.Set(1)
	r.okAt.Set(float64(r.at.Unix()))
}
