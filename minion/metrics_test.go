package minion

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfed/meshfed/internal/procmetrics"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

// The configuration the minion starts with counts as loaded; a refused change sets the
// gauge to 0 and keeps the time of the last success; an applied one sets both.
func TestReloadMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	ok := func() float64 { return promtest.Sum(t, reg, "meshfed_minion_config_last_reload_successful", nil) }
	at := func() float64 {
		return promtest.Sum(t, reg, "meshfed_minion_config_last_reload_success_timestamp_seconds", nil)
	}
	started := at()
	if ok() != 1 || started == 0 {
		t.Fatalf("at the start: successful %v at %v; want 1 at the start time", ok(), started)
	}
	m.reloaded().Record(procmetrics.ReloadRefused)
	if ok() != 0 || at() != started {
		t.Errorf("after a refusal: successful %v at %v; want 0, the last success kept (%v)", ok(), at(), started)
	}
	m.reloaded().Record(procmetrics.ReloadApplied)
	if ok() != 1 || at() < started {
		t.Errorf("after an applied change: successful %v at %v; want 1 at a time no earlier than the start (%v)", ok(), at(), started)
	}
}

// A minion with TLS and a relay serving TLS reports its certificate, its bundle and the
// relay's certificate; the minion that replaces it without TLS reports none.
func TestCertificateMetrics(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "mesh-ca")
	bundle := filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, bundle, ca)
	mc, mk, _ := ca.Issue(t, dir, "minion-east", "spiffe://mesh.test/cluster/east")
	rc, rk, _ := ca.Issue(t, dir, "relay", "relay.east")
	cfg := fsConfig(t.TempDir(), "push://127.0.0.1:1")
	cfg.TLS, cfg.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: mc, Key: mk, CA: bundle}}, false
	cfg.Relay = &RelayConfig{Listen: "127.0.0.1:0", TLS: &meshtls.Files{Cert: rc, Key: rk, CA: bundle}}
	tel := NewTelemetry()
	if _, err := New(cfg, testLog(t), tel); err != nil {
		t.Fatal(err)
	}
	expiry := func(role string) float64 {
		return promtest.Sum(t, tel.Registry, "meshfed_tls_certificate_expiry_timestamp_seconds", map[string]string{"role": role})
	}
	for _, role := range []string{"identity", "ca", "relay"} {
		if expiry(role) == 0 {
			t.Errorf("no expiry of the %s certificate", role)
		}
	}
	if want := float64(ca.Cert.NotAfter.Unix()); expiry("ca") != want {
		t.Errorf("ca expiry %v, want the CA's NotAfter %v", expiry("ca"), want)
	}
	if _, err := New(fsConfig(t.TempDir(), "push://127.0.0.1:1"), testLog(t), tel); err != nil {
		t.Fatal(err)
	}
	if v := promtest.Sum(t, tel.Registry, "meshfed_tls_certificate_expiry_timestamp_seconds", nil); v != 0 {
		t.Errorf("a minion without TLS still reports certificates (sum %v)", v)
	}
}
