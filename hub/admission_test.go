package hub

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

// Admission on a running hub: real listeners, mutual TLS, gRPC clients.

// records is a slog handler keeping every record, to count the lines a test caused.
type records struct {
	mu   sync.Mutex // guards recs
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// count returns how many records have a message starting with prefix, and how many of
// those are at level WARN or above.
func (r *records) count(prefix string) (all, warn int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if strings.HasPrefix(rec.Message, prefix) {
			all++
			if rec.Level >= slog.LevelWarn {
				warn++
			}
		}
	}
	return all, warn
}

// pki is a test CA with the hub's certificate and peers' credentials.
type pki struct {
	t              *testing.T
	dir, bundle    string
	ca             *tlstest.CA
	hubCert, hubKy string
}

func newPKI(t *testing.T) *pki {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ca")
	bundle := filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, bundle, ca)
	cert, key, _ := ca.Issue(t, dir, "hub", "127.0.0.1", "spiffe://mesh.test/hub/h")
	return &pki{t: t, dir: dir, bundle: bundle, ca: ca, hubCert: cert, hubKy: key}
}

// files issues a certificate with names (URI SANs, DNS names) and returns it as files,
// with the bundle.
func (p *pki) files(prefix string, names ...string) meshtls.Files {
	cert, key, _ := p.ca.Issue(p.t, p.dir, prefix, names...)
	return meshtls.Files{Cert: cert, Key: key, CA: p.bundle}
}

// creds are client credentials for a certificate with names (URI SANs, DNS names).
func (p *pki) creds(prefix string, names ...string) credentials.TransportCredentials {
	cert, key, _ := p.ca.Issue(p.t, p.dir, prefix, names...)
	s, err := meshtls.NewSource(meshtls.Files{Cert: cert, Key: key, CA: p.bundle}, nil)
	if err != nil {
		p.t.Fatal(err)
	}
	return credentials.NewTLS(s.ClientConfig(""))
}

// runTLSHub runs a hub with mutual TLS on loopback whose one cluster, east, has not
// connected (so it is warming up for an hour), logging to log.
func runTLSHub(t *testing.T, p *pki, log *slog.Logger) (h *Hub, ingest, serve string) {
	t.Helper()
	return runTLSHubWith(t, p, log, nil)
}

// runTLSHubWith is runTLSHub with the configuration changed by edit (if not nil) first.
func runTLSHubWith(t *testing.T, p *pki, log *slog.Logger, edit func(*Config)) (h *Hub, ingest, serve string) {
	t.Helper()
	cfg, err := ParseConfig([]byte(`
tls: {certFile: ` + p.hubCert + `, keyFile: ` + p.hubKy + `, caFile: ` + p.bundle + `}
trustDomain: mesh.test
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
warmUp: 1h
collections: [istio/networking/v1alpha3/virtualservices]
clusters: [{name: east, namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	// Refusals answered at once: the tests loop on them by the thousand, to see them counted
	// and logged (TestRefusalsWaitOutTheDelay, in mcp, tests the delay).
	cfg.Limits.RefusalDelay = Duration{}
	if edit != nil {
		edit(cfg)
	}
	h, err = New(cfg, log, Options{})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub", h.Run)
	testwait.For(t, 10*time.Second, "the hub's listeners", func() bool {
		ingest, serve, _ = h.Addrs()
		return ingest != "" && serve != ""
	})
	return h, ingest, serve
}

func clientConn(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// subscribe opens a ResourceSource stream on cc as a sink does and returns its first
// answer's error.
func subscribe(cc *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := mcppb.NewResourceSourceClient(cc).EstablishResourceStream(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&mcppb.RequestResources{Collection: vsColl}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = st.Recv()
	return err
}

func rejected(t *testing.T, h *Hub, reason string) float64 {
	return promtest.Sum(t, h.Registry(), "meshfed_mcp_streams_rejected_total", map[string]string{"reason": reason})
}

// A stock Istio sink redials in a tight loop while the hub warms up. Its refusals are not
// authentication failures: they are counted as warming_up (or rate_limited: the loop is
// rate limited too) and logged in a line per reason per interval, and the sink is told to
// retry (Unavailable with a RetryInfo). A minion's relay waits for the warm-up as sinks do;
// a minion's pushes do not (they end it), and then the sink is served.
func TestWarmUpRefusalsAreNotAuthFailures(t *testing.T) {
	const attempts = 2000
	p := newPKI(t)
	log := &records{}
	h, ingest, serve := runTLSHub(t, p, slog.New(log))
	sink := clientConn(t, serve, p.creds("istiod", "spiffe://mesh.test/sink/istiod"))

	start := time.Now()
	err := subscribe(sink)
	s := status.Convert(err)
	if s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "the hub is warming up: waiting for clusters [east]") ||
		!strings.Contains(s.Message(), "retry in") {
		t.Fatalf("a sink during the warm-up: %v, want Unavailable saying why and when to retry", err)
	}
	var retry time.Duration
	for _, d := range s.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri.GetRetryDelay().AsDuration()
		}
	}
	if retry <= 0 || retry > warmUpRetry {
		t.Errorf("RetryInfo delay %v, want one in (0, %v]", retry, warmUpRetry)
	}
	for range attempts - 1 {
		if err := subscribe(sink); status.Code(err) != codes.Unavailable && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("attempt: %v", err)
		}
	}
	elapsed := time.Since(start)
	warming, limited := rejected(t, h, "warming_up"), rejected(t, h, "rate_limited")
	if n := rejected(t, h, "unauthenticated"); n != 0 || warming == 0 || warming+limited != attempts {
		t.Errorf("%d attempts: %v unauthenticated, %v warming_up, %v rate_limited; want none unauthenticated, the rest warming up or rate limited",
			attempts, n, warming, limited)
	}
	lines, warns := log.count("refusing stream")
	// One line per reason (warming_up, rate_limited) per interval of a minute.
	if most := 2 * (1 + int(elapsed/time.Minute)); lines > most {
		t.Errorf("%d attempts in %v logged %d lines (%d at WARN), want at most %d", attempts, elapsed.Round(time.Millisecond), lines, warns, most)
	}
	t.Logf("%d attempts in %v: %v warming_up, %v rate_limited; %d log lines (%d at WARN)", attempts, elapsed.Round(time.Millisecond), warming, limited, lines, warns)

	// The relay waits for the warm-up too, refused for it and not as unauthenticated.
	east := p.creds("east", "spiffe://mesh.test/cluster/east")
	relay := clientConn(t, ingest, east)
	before := rejected(t, h, "warming_up")
	if err := subscribe(relay); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "the hub is warming up") {
		t.Fatalf("a relay during the warm-up: %v, want Unavailable (warming up)", err)
	}
	if after := rejected(t, h, "warming_up"); after != before+1 || rejected(t, h, "unauthenticated") != 0 {
		t.Errorf("the relay's refusal: warming_up %v → %v, unauthenticated %v", before, after, rejected(t, h, "unauthenticated"))
	}

	// The minion's pushes are admitted during the warm-up: they end it.
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: mcp.NewCache(vsColl), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	push := clientConn(t, ingest, east)
	testrun.Start(t, "east's pushes", func(ctx context.Context) error {
		if err := src.PushTo(ctx, push); err != nil && ctx.Err() == nil {
			return err
		}
		return nil
	})
	testwait.For(t, 10*time.Second, "the hub ready once east has synced", h.Ready)
	testwait.For(t, 10*time.Second, "the sink served", func() bool { return subscribe(sink) == nil })
}

// A cluster and a sink are known by their certificate's one URI SAN, a canonical SPIFFE ID,
// as an operator is (issue 25, finding 9): a certificate with only a common name that looks
// like east's ID does not push as east (Unauthenticated), one that looks like a sink's does
// not subscribe, and a sink's URI SAN whose path a URI parser would read as another is no
// sink's (PermissionDenied); each refusal says why.
func TestClusterAndSinkAreCanonicalSPIFFEIDs(t *testing.T) {
	p := newPKI(t)
	_, ingest, serve := runTLSHub(t, p, slog.New(slog.DiscardHandler))
	cnCreds := func(prefix, cn string) credentials.TransportCredentials {
		cert, key, _ := p.ca.IssueCN(t, p.dir, prefix, cn)
		s, err := meshtls.NewSource(meshtls.Files{Cert: cert, Key: key, CA: p.bundle}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(s.ClientConfig(""))
	}
	// A minion's push stream: the hub, its sink, speaks first (it asks for the collections),
	// unless it refuses the stream.
	push := func(cc *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := mcppb.NewResourceSinkClient(cc).EstablishResourceStream(ctx)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	if err := push(clientConn(t, ingest, p.creds("east", "spiffe://mesh.test/cluster/east"))); err != nil {
		t.Fatalf("east's own certificate: %v", err)
	}
	for _, tc := range []struct {
		name string
		try  func() error
		code codes.Code
		says string
	}{
		{"a cluster's ID as the common name", func() error {
			return push(clientConn(t, ingest, cnCreds("east-cn", "spiffe://mesh.test/cluster/east")))
		},
			codes.Unauthenticated, `its common name "spiffe://mesh.test/cluster/east" looks like a SPIFFE ID`},
		{"a sink's ID as the common name", func() error {
			return subscribe(clientConn(t, serve, cnCreds("sink-cn", "spiffe://mesh.test/sink/istiod")))
		},
			codes.Unauthenticated, "looks like a SPIFFE ID"},
		{"a sink's path through ..", func() error {
			return subscribe(clientConn(t, serve, p.creds("dots", "spiffe://mesh.test/sink/istiod/../../cluster/east")))
		}, codes.PermissionDenied, `identity "spiffe://mesh.test/sink/istiod/../../cluster/east" is not a sink identity`},
	} {
		if err := tc.try(); status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.code, tc.says)
		}
	}
}

// A fleet of sinks sharing one identity (istiods of one service account) beyond
// limits.maxStreamsPerPeer has the rest refused, and whoever runs the hub must find out
// why (issue 25, finding 9.4): the refusal is logged at WARN, once per identity per
// interval however many are refused, naming the identity, the cap, the setting to raise
// and the metric that counts them; the refused sink is told the setting too.
func TestTooManyStreamsOfOneIdentityTellTheUserWhatToRaise(t *testing.T) {
	const max, over = 3, 5
	p := newPKI(t)
	log := &records{}
	h, _, serve := runTLSHubWith(t, p, slog.New(log), func(c *Config) { c.Limits.MaxStreamsPerPeer = max })
	mustApply(t, h, "east", vsPush(t, "shop/a")) // east has synced: the hub serves sinks
	testwait.For(t, 10*time.Second, "the hub ready", h.Ready)
	const id = "spiffe://mesh.test/sink/istiod"
	fleet := clientConn(t, serve, p.creds("istiod", id))
	for i := range max {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		st, err := mcppb.NewResourceSourceClient(fleet).EstablishResourceStream(ctx)
		if err == nil {
			err = st.Send(&mcppb.RequestResources{Collection: vsColl})
		}
		if err == nil {
			_, err = st.Recv()
		}
		if err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, max, err)
		}
	}
	for range over {
		err := subscribe(fleet)
		if s := status.Convert(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), "limits.maxStreamsPerPeer") {
			t.Fatalf("a stream beyond the cap: %v, want ResourceExhausted naming limits.maxStreamsPerPeer", err)
		}
	}
	if n := rejected(t, h, "too_many_streams"); n != over {
		t.Errorf("too_many_streams = %v, want %d", n, over)
	}
	const msg = "refusing stream: peer has too many streams open"
	if all, warn := log.count(msg); all != 1 || warn != 1 {
		t.Fatalf("%d refusals logged %d lines (%d at WARN), want 1 at WARN", over, all, warn)
	}
	got := log.last(msg)
	for k, v := range map[string]string{"identity": id, "max_per_peer": "3", "raise": "limits.maxStreamsPerPeer", "reason": "too_many_streams",
		"metric": `meshfed_mcp_streams_rejected_total{reason="too_many_streams"}`} {
		if got[k] != v {
			t.Errorf("the refusal's line: %s=%q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// A plaintext client on the TLS listeners, and a certificate with two SPIFFE IDs, are
// refused at the handshake and counted by reason.
func TestRefusedHandshakesCounted(t *testing.T) {
	p := newPKI(t)
	h, _, serve := runTLSHub(t, p, slog.New(slog.DiscardHandler))
	tlsRejected := func(reason string) float64 {
		return promtest.Sum(t, h.Registry(), "meshfed_hub_tls_rejections_total", map[string]string{"reason": reason})
	}
	if err := subscribe(clientConn(t, serve, insecure.NewCredentials())); err == nil {
		t.Fatal("a plaintext client was served")
	}
	testwait.For(t, 10*time.Second, "the plaintext client counted", func() bool { return tlsRejected(meshtls.RejectPlaintext) > 0 })

	two := p.creds("two", "spiffe://mesh.test/sink/a", "spiffe://mesh.test/sink/b")
	if err := subscribe(clientConn(t, serve, two)); err == nil {
		t.Fatal("a certificate with two SPIFFE IDs was served")
	}
	testwait.For(t, 10*time.Second, "the two-ID certificate counted", func() bool { return tlsRejected(meshtls.RejectMultipleIdentities) > 0 })
}

// PeerIdentity takes a certificate's identity by meshtls's rule: a certificate with two URI
// SANs names no one.
func TestPeerIdentityRefusesTwoURIs(t *testing.T) {
	p := newPKI(t)
	leaf := func(prefix string, names ...string) *x509.Certificate {
		cf, _, _ := p.ca.Issue(t, p.dir, prefix, names...)
		b, err := os.ReadFile(cf)
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		cert *x509.Certificate
		want string
		code codes.Code
	}{
		{leaf("one", "spiffe://mesh.test/sink/one"), "spiffe://mesh.test/sink/one", codes.OK},
		{leaf("two", "spiffe://mesh.test/sink/a", "spiffe://mesh.test/sink/b"), "", codes.Unauthenticated},
	} {
		ti := credentials.TLSInfo{}
		ti.State.PeerCertificates = []*x509.Certificate{tc.cert}
		ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: ti})
		id, err := PeerIdentity(ctx, false)
		if id != tc.want || status.Code(err) != tc.code {
			t.Errorf("PeerIdentity(%v) = %q, %v; want %q, %v", tc.cert.URIs, id, err, tc.want, tc.code)
		}
	}
}

// The limits section: its defaults, what a file sets, and errors naming the field. The
// configuration's 0 is "none", passed to the engine as such (its own 0 is its default).
func TestLimitsConfig(t *testing.T) {
	const base = "insecure: true\nclusters: [{name: a, identities: [a]}]\n"
	cfg, err := ParseConfig([]byte(base + "limits: {streamBurst: 7}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Limits; l.StreamBurst != 7 || l.MaxStreamsPerPeer != 1024 || l.IdleTimeout.Duration != 30*time.Second {
		t.Errorf("limits %+v, want the defaults but streamBurst", l)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"limits: {maxStreamsPerPeer: -1}", "limits.maxStreamsPerPeer: -1 is negative"},
		{"limits: {idleTimeout: soon}", "limits.idleTimeout:"},
		{"limits: {idleTimeout: -1s}", "limits.idleTimeout:"},
	} {
		if _, err := ParseConfig([]byte(base + tc.yaml + "\n")); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
	h := testHub(t, base+"limits: {maxStreamsPerPeer: 0, idleTimeout: 0s}\n")
	if sc := h.serverConfig(nil); sc.MaxStreamsPerPeer >= 0 || sc.IdleTimeout >= 0 || sc.Ready == nil {
		t.Errorf("serverConfig = %+v, want no cap, no idle timeout and the warm-up", sc)
	}
	h = testHub(t, base)
	if sc := h.serverConfig(nil); sc.MaxStreamsPerPeer != 1024 || sc.IdleTimeout != 30*time.Second || sc.MaxStreamsPerPeerSetting != "limits.maxStreamsPerPeer" {
		t.Errorf("serverConfig = %+v, want the configured cap and idle timeout", sc)
	}
}
