package procmetrics

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfed/meshfed/internal/buildinfo"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

const expiry = "meshfed_tls_certificate_expiry_timestamp_seconds"

// source is a TLS source whose certificate expires at until, issued by ca and trusting ca.
func source(t *testing.T, ca *tlstest.CA, until time.Time) *meshtls.Source {
	t.Helper()
	dir := t.TempDir()
	bundle := filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, bundle, ca)
	cert, key, _ := ca.IssueValid(t, dir, "leaf", time.Now().Add(-time.Hour), until, "spiffe://mesh.test/hub/h")
	src, err := meshtls.NewSource(meshtls.Files{Cert: cert, Key: key, CA: bundle}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// The build's labels are buildinfo's; the identity reports its certificate and bundle, the
// relay its certificate only; a program without TLS reports no certificate.
func TestRegister(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := Register(reg)
	info := buildinfo.Read()
	if v := promtest.Sum(t, reg, "meshfed_build_info", map[string]string{"version": info.Version, "revision": info.Revision, "goversion": info.GoVersion}); v != 1 {
		t.Errorf("meshfed_build_info = %v, want 1 with the build's labels", v)
	}
	if v := promtest.Sum(t, reg, expiry, nil); v != 0 {
		t.Errorf("expiry without TLS = %v, want no series", v)
	}
	ca := tlstest.NewCA(t, "ca")
	identityUntil := time.Now().Add(3 * time.Hour).Truncate(time.Second)
	relayUntil := time.Now().Add(5 * time.Hour).Truncate(time.Second)
	c.Identity(source(t, ca, identityUntil))
	c.Relay(source(t, ca, relayUntil))
	for role, want := range map[string]time.Time{RoleIdentity: identityUntil, RoleCA: ca.Cert.NotAfter, RoleRelay: relayUntil} {
		if v := promtest.Sum(t, reg, expiry, map[string]string{"role": role}); v != float64(want.Unix()) {
			t.Errorf("%s{role=%q} = %v, want %v", expiry, role, v, want.Unix())
		}
	}
	c.Identity(nil)
	c.Relay(nil)
	if v := promtest.Sum(t, reg, expiry, nil); v != 0 {
		t.Errorf("expiry after the sources are gone = %v, want no series", v)
	}
	var none *Certificates
	none.Identity(nil) // a nil collector records nothing, without panicking
}

// The registry a program serves has the Go runtime's and the process's metrics.
func TestNewRegistry(t *testing.T) {
	fams, err := NewRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range fams {
		have[f.GetName()] = true
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if !have[name] {
			t.Errorf("no %s", name)
		}
	}
}
