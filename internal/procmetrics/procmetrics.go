// Package procmetrics holds the metrics every meshfed program exports whatever its role:
// the Go runtime's and the process's (NewRegistry), which build is running
// (meshfed_build_info), when the TLS certificates it presents and trusts expire
// (meshfed_tls_certificate_expiry_timestamp_seconds), and how the changes of its
// configuration file went (Reloads). The hub and the minion register them next to their own
// metrics, so that one dashboard and one set of alerts read both the same way.
//
// It is not a place for what only one of them measures: those metrics live in the hub's
// and the minion's metrics.go.
package procmetrics

import (
	"maps"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/meshfed/meshfed/internal/buildinfo"
	meshtls "github.com/meshfed/meshfed/tls"
)

// The roles of a program's certificates: the certificate expiry metric's role label.
const (
	// RoleIdentity is the program's own certificate, presented to every peer on its
	// listeners and when it dials.
	RoleIdentity = "identity"
	// RoleCA is the first certificate of its trust bundle to expire: from then on, peers
	// whose chains end there are refused, and peers that trust only it refuse the program.
	RoleCA = "ca"
	// RoleRelay is the minion relay's serving certificate (what its cluster's istiod checks).
	RoleRelay = "relay"
)

// NewRegistry returns a registry for a program's /metrics with the Go runtime's and the
// process's collectors (go_*, process_*: CPU, memory, file descriptors), which the
// dashboard reads.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Register registers meshfed_build_info (read once: the build does not change while it
// runs) and an empty certificate expiry collector with reg, and returns the collector.
func Register(reg prometheus.Registerer) *Certificates {
	info := buildinfo.Read()
	build := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "meshfed", Name: "build_info",
		Help:        "Always 1; its labels say which build is running: the module version, the VCS revision it was built from and the Go version.",
		ConstLabels: prometheus.Labels{"version": info.Version, "revision": info.Revision, "goversion": info.GoVersion}})
	build.Set(1)
	c := &Certificates{desc: prometheus.NewDesc("meshfed_tls_certificate_expiry_timestamp_seconds",
		"When a certificate the program uses expires (NotAfter, Unix seconds), by role: identity (its own certificate), ca (the first of its trust bundle to expire), relay (the minion relay's serving certificate). Read at scrape time from the files in use, so a rotation shows once the files are reloaded.",
		[]string{"role"}, nil)}
	reg.MustRegister(build, c)
	return c
}

// Certificates reports the expiry of the certificates a program uses, read at scrape time
// from their sources (which reload rotated files). A nil *Certificates records nothing.
type Certificates struct {
	desc *prometheus.Desc

	mu      sync.Mutex // guards sources
	sources map[string]*meshtls.Source
}

// Identity makes src the program's identity: its certificate (RoleIdentity) and bundle
// (RoleCA). A nil src reports neither (a program without TLS).
func (c *Certificates) Identity(src *meshtls.Source) {
	c.set(RoleIdentity, src)
}

// Relay makes src the relay's serving certificate (RoleRelay); nil: none.
func (c *Certificates) Relay(src *meshtls.Source) {
	c.set(RoleRelay, src)
}

func (c *Certificates) set(role string, src *meshtls.Source) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sources == nil {
		c.sources = map[string]*meshtls.Source{}
	}
	if src == nil {
		delete(c.sources, role)
		return
	}
	c.sources[role] = src
}

// Describe implements prometheus.Collector.
func (c *Certificates) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *Certificates) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	srcs := maps.Clone(c.sources)
	c.mu.Unlock() // NotAfter may read the files: not under this lock
	for role, src := range srcs {
		cert, bundle := src.NotAfter()
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(cert.Unix()), role)
		if role == RoleIdentity && !bundle.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(bundle.Unix()), RoleCA)
		}
	}
}
