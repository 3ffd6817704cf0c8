package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub"
	admincli "github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

const td = "mesh.test"

// pki is a test mesh PKI: one CA and a bundle file.
type pki struct {
	dir    string
	ca     *tlstest.CA
	bundle string
}

func newPKI(t *testing.T) *pki {
	p := &pki{dir: t.TempDir(), ca: tlstest.NewCA(t, "mesh-ca")}
	p.bundle = filepath.Join(p.dir, "ca.crt")
	tlstest.WriteBundle(t, p.bundle, p.ca)
	return p
}

func (p *pki) creds(t *testing.T, prefix string, names ...string) credentials.TransportCredentials {
	c, k, _ := p.ca.Issue(t, p.dir, prefix, names...)
	return credsFrom(t, c, k, p.bundle)
}

// hubConfig is a hub with mutual TLS from p and trust domain td, clusters east (shop) and
// west (pay), serving VirtualServices and DestinationRules.
func (p *pki) hubConfig(t *testing.T) *hub.Config {
	hc, hk, _ := p.ca.Issue(t, p.dir, "hub", "127.0.0.1", "spiffe://"+td+"/hub/h1")
	cfg := hub.Defaults()
	cfg.TLS = &meshtls.Config{Files: meshtls.Files{Cert: hc, Key: hk, CA: p.bundle}}
	cfg.TrustDomain = td
	cfg.Clusters = []hub.ClusterConfig{
		{Name: "east", Namespaces: []string{"shop"}, Hosts: []string{"*.shop.example.com"}},
		{Name: "west", Namespaces: []string{"pay"}, Hosts: []string{"*.pay.example.com"}},
	}
	cfg.Collections = []string{vs, dr}
	cfg.WarmUp = hub.Duration{Duration: time.Minute}
	return cfg
}

func credsFrom(t *testing.T, cert, key, bundle string) credentials.TransportCredentials {
	src, err := meshtls.NewSource(meshtls.Files{Cert: cert, Key: key, CA: bundle}, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(src.ClientConfig(""))
}

// openStream opens one stream to a hub service with creds and returns how it ended.
func openStream(t *testing.T, addr string, creds credentials.TransportCredentials, sink bool) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if sink {
		st, err := mcppb.NewResourceSourceClient(conn).EstablishResourceStream(ctx)
		if err == nil {
			_, err = st.Recv()
		}
		return err
	}
	st, err := mcppb.NewResourceSinkClient(conn).EstablishResourceStream(ctx)
	if err == nil {
		// A refused stream's reason comes with Recv (Send may see only io.EOF).
		if err = st.Send(&mcppb.Resources{Collection: vs, Nonce: "1"}); err == nil || errors.Is(err, io.EOF) {
			_, err = st.Recv()
		}
	}
	return err
}

func tlsMinion(t *testing.T, p *pki, cluster, root, ingest string) func() {
	t.Helper()
	c, k, _ := p.ca.Issue(t, p.dir, "minion-"+cluster, hub.ClusterIdentity(td, cluster))
	cfg := minionConfig(cluster, "fs://"+root, ingest)
	cfg.TLS, cfg.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: c, Key: k, CA: p.bundle}}, false
	_, stop := startMinion(t, cfg)
	return stop
}

// TestTLSRefusals: the refusal matrix over real mutual TLS. Each refusal has a clear error
// and a metric and leaves the store as it was.
func TestTLSRefusals(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Routing = routing.Config{Rules: []routing.Rule{{Name: "prod", Identities: []string{hub.SinkIdentity(td, "prod-*")}, Collections: []string{vs}}}}
	h := runHub(t, cfg)
	ingest, serve, admin := h.Addrs()

	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, east, "shop/hijack.yaml", vsYAML("hijack", "shop", "", "api.pay.example.com"))
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready over mutual TLS", h.Ready)

	sink := &sinkClient{state: map[string]map[string]*mcpapi.Resource{}}
	sinkCreds := p.creds(t, "sink-prod-1", hub.SinkIdentity(td, "prod-1"))
	s, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Applier: sink, Logger: logger(t),
		Node: &mcppb.SinkNode{Id: "someone-else"}}) // disagrees with the certificate: routed by the certificate
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(serve, grpc.WithTransportCredentials(sinkCreds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan struct{})
	go func() {
		defer close(sdone)
		for sctx.Err() == nil {
			_ = s.PullFrom(sctx, conn)
			select {
			case <-sctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() { scancel(); <-sdone }()
	waitFor(t, 10*time.Second, "the sink's subset", func() bool { return sink.view(vs) == "pay/api@west,shop/cart@east" })
	// A collection its rules do not give: answered, empty.
	if got := sink.view(dr); got != "" {
		t.Errorf("destinationrules = %q, want the empty state", got)
	}

	counts := func() string {
		var cl []api.ClusterStatus
		getJSON(t, "http://"+admin+"/api/clusters", &cl)
		return fmt.Sprint(cl[0].Resources, cl[1].Resources)
	}
	before := counts()
	rejected := func(reason string) float64 {
		mfs, err := h.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "meshfed_hub_tls_rejections_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}

	// Handshake refusals.
	pool := x509.NewCertPool()
	pool.AddCert(p.ca.Cert)
	noCert := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	other := tlstest.NewCA(t, "other-ca")
	oc, ok, _ := other.Issue(t, p.dir, "intruder", hub.ClusterIdentity(td, "east"))
	ec, ek, _ := p.ca.IssueValid(t, p.dir, "expired", time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour), hub.ClusterIdentity(td, "east"))
	fc, fk, _ := p.ca.IssueValid(t, p.dir, "future", time.Now().Add(24*time.Hour), time.Now().Add(48*time.Hour), hub.ClusterIdentity(td, "east"))
	for _, tc := range []struct {
		name, reason string
		creds        credentials.TransportCredentials
	}{
		{"no client certificate", meshtls.RejectNoCertificate, noCert},
		{"certificate from another CA", meshtls.RejectUnknownAuthority, credsFrom(t, oc, ok, p.bundle)},
		{"expired certificate", meshtls.RejectExpired, credsFrom(t, ec, ek, p.bundle)},
		{"certificate not yet valid", meshtls.RejectNotYetValid, credsFrom(t, fc, fk, p.bundle)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := rejected(tc.reason)
			err := openStream(t, ingest, tc.creds, false)
			if status.Code(err) != codes.Unavailable {
				t.Errorf("err = %v, want the handshake refused (Unavailable)", err)
			}
			waitFor(t, 5*time.Second, "metric "+tc.reason, func() bool { return rejected(tc.reason) > n })
		})
	}

	// The wrong kind of identity, on each listener.
	if err := openStream(t, ingest, p.creds(t, "sink-as-cluster", hub.SinkIdentity(td, "prod-2")), false); status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "is not a cluster identity") {
		t.Errorf("a sink certificate pushing: %v", err)
	}
	if err := openStream(t, serve, p.creds(t, "cluster-as-sink", hub.ClusterIdentity(td, "east")), true); status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "is not a sink identity") {
		t.Errorf("a cluster certificate subscribing: %v", err)
	}
	// A known cluster publishing a host it does not own: refused, not stored.
	var cl []api.ClusterStatus
	getJSON(t, "http://"+admin+"/api/clusters", &cl)
	if !strings.Contains(cl[0].Rejections[vs]["shop/hijack"], `host "api.pay.example.com" is not owned by cluster "east"`) {
		t.Errorf("east's rejections: %v", cl[0].Rejections)
	}
	if after := counts(); after != before {
		t.Errorf("refusals changed the store: %s -> %s", before, after)
	}

	// Revoked: west removed from the configuration while connected. Its stream is closed
	// and its reconnects are refused; its resources stay served, held, until an operator
	// confirms the removal (issue 25, finding 6).
	next := *cfg
	next.Clusters = cfg.Clusters[:1]
	res, err := h.Reload(&next)
	// West's stream closes, and east's: east has a refused object, which its minion does
	// not resend unchanged, and the new ownership may allow it.
	if err != nil || res.ClosedIngest != 2 {
		t.Fatalf("revoking west: %+v, %v", res, err)
	}
	digest := departedDigest(t, h, "west")
	if v := sink.view(vs); !strings.Contains(v, "@west") {
		t.Errorf("west's objects withdrawn before anyone confirmed its removal: %q", v)
	}
	if _, err := h.ReleaseBreaker("west", "spiffe://"+td+"/operator/ann", digest); err != nil {
		t.Fatalf("confirming west's removal: %v", err)
	}
	waitFor(t, 10*time.Second, "west withdrawn from the sink", func() bool { return sink.view(vs) == "shop/cart@east" })
	waitFor(t, 10*time.Second, "west disconnected", func() bool {
		getJSON(t, "http://"+admin+"/api/clusters", &cl)
		for _, c := range cl {
			if c.Name == "west" {
				return !c.Connected
			}
		}
		return true
	})
}

// TestDevCA: a hub configured with devCA creates its CA and serving certificate on first
// start and reuses them after; `hub certs issue` gives a minion and a sink certificates that
// the hub accepts.
func TestDevCA(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	newCfg := func() *hub.Config {
		c := hub.Defaults()
		c.DevCA, c.StateDir = true, state
		c.Clusters = []hub.ClusterConfig{{Name: "east", Namespaces: []string{"shop"}, Hosts: []string{"*"}}}
		c.Collections, c.WarmUp = []string{vs, dr}, hub.Duration{Duration: time.Minute}
		c.Routing = routing.Config{Default: &routing.Rule{Name: "all"}}
		return c
	}
	h := runHub(t, newCfg())
	ingest, serve, _ := h.Addrs()
	caPEM, err := os.ReadFile(filepath.Join(state, "ca", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir()
	var out bytes.Buffer
	for _, args := range [][]string{{"-cluster", "east"}, {"-sink", "s1"}} {
		if err := admincli.Run(context.Background(), append([]string{"certs", "issue", "-out", certs, "-state-dir", state}, args...), &out); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(out.String(), "spiffe://meshfed.local/cluster/east") {
		t.Errorf("certs issue said: %s", out.String())
	}
	root := t.TempDir()
	writeFile(t, root, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	mcfg := minionConfig("east", "fs://"+root, ingest)
	mcfg.Insecure = false
	mcfg.TLS = &meshtls.Config{Files: meshtls.Files{Cert: filepath.Join(certs, "east.crt"), Key: filepath.Join(certs, "east.key"), CA: filepath.Join(certs, "ca.crt")}}
	startMinion(t, mcfg)
	waitFor(t, 20*time.Second, "ready with the development CA", h.Ready)

	sink := &sinkClient{state: map[string]map[string]*mcpapi.Resource{}}
	s, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Applier: sink, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, serve, credsFrom(t, filepath.Join(certs, "s1.crt"), filepath.Join(certs, "s1.key"), filepath.Join(certs, "ca.crt")), s)
	waitFor(t, 10*time.Second, "the sink's view", func() bool { return sink.view(vs) == "shop/cart@east" })

	// A second hub on the same state directory reuses the CA.
	if _, err := hub.New(newCfg(), logger(t), hub.Options{}); err != nil {
		t.Fatal(err)
	}
	again, err := os.ReadFile(filepath.Join(state, "ca", "ca.crt"))
	if err != nil || !bytes.Equal(again, caPEM) {
		t.Fatalf("the development CA changed on restart (%v)", err)
	}
	if fi, err := os.Stat(filepath.Join(state, "ca", "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key mode: %v %v", fi.Mode().Perm(), err)
	}
}

// A sink whose certificate is spiffe://<td>/sink/prod-1 and which sends no SinkNode id is
// routed by the name in its certificate (a rule on nodeIds [prod-*]) when it subscribes; a
// reload that does not change its routing keeps its stream, and the sink list and `hub why`
// show it with that rule.
func TestSinkRoutedByCertificateName(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Clusters = cfg.Clusters[:1] // east
	cfg.Routing = routing.Config{Rules: []routing.Rule{{Name: "prod", NodeIDs: []string{"prod-*"}}}}
	h := runHub(t, cfg)
	ingest, serve, admin := h.Addrs()
	east := t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	tlsMinion(t, p, "east", east, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	sink := &sinkClient{state: map[string]map[string]*mcpapi.Resource{}}
	var opened atomic.Int32
	s, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Applier: sink, Logger: logger(t), // no SinkNode
		Hooks: mcp.Hooks{StreamOpened: func(*mcp.StreamInfo) { opened.Add(1) }}})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, serve, p.creds(t, "sink-prod-1", hub.SinkIdentity(td, "prod-1")), s)
	waitFor(t, 10*time.Second, "routed by its certificate's name", func() bool { return sink.view(vs) == "shop/cart@east" })

	next := *cfg
	next.Staleness = hub.StalenessConfig{Default: "1h"}
	res, err := h.Reload(&next)
	if err != nil || res.ClosedSinks != 0 {
		t.Errorf("a reload that changes no routing: %+v, %v; want no sink stream closed", res, err)
	}
	var sinks []api.SinkStatus
	getJSON(t, "http://"+admin+"/api/sinks", &sinks)
	if len(sinks) != 1 || strings.Join(sinks[0].Rules, ",") != "prod" || opened.Load() != 1 {
		t.Errorf("/api/sinks = %+v (streams opened: %d), want the one stream with rules [prod]", sinks, opened.Load())
	}
	if out := hubCLI(t, admin)("why", vs, "shop/cart"); !strings.Contains(out, "rules prod): up to date") {
		t.Errorf("hub why:\n%s", out)
	}
}

// departedDigest is the digest of what a cluster that left the configuration holds (its
// breaker's), once the hub shows it departed.
func departedDigest(t *testing.T, h *hub.Hub, cluster string) string {
	t.Helper()
	var digest string
	waitFor(t, 10*time.Second, cluster+" departed, held", func() bool {
		for _, c := range h.Clusters() {
			if c.Name == cluster && c.Departed != nil && c.Breaker != nil {
				digest = c.Breaker.Digest
				return true
			}
		}
		return false
	})
	return digest
}
