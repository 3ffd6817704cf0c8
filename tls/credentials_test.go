package tls

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/meshfed/meshfed/tls/tlstest"
)

type refusal struct {
	peer   net.Addr
	reason string
}

// grpcServer serves gRPC health over creds on loopback until the test ends.
func grpcServer(t *testing.T, creds credentials.TransportCredentials, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(opts, grpc.Creds(creds))...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// check makes one health call to addr with creds and returns its error.
func check(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// ServerCredentials report, by reason and with the peer's address, a plaintext client on
// the TLS listener (which gRPC drops without a trace) and a certificate with two URI SANs
// (two SPIFFE IDs: no one identity); a good client is served and not reported.
func TestServerCredentialsReportRefusals(t *testing.T) {
	dir := t.TempDir()
	root := tlstest.NewCA(t, "root")
	caFile := filepath.Join(dir, "ca.crt")
	tlstest.WriteAtomic(t, caFile, root.PEM)
	sc, sk, _ := root.Issue(t, dir, "server", "127.0.0.1")
	srv, err := NewSource(Files{Cert: sc, Key: sk, CA: caFile}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	client := func(names ...string) credentials.TransportCredentials {
		cc, ck, _ := root.Issue(t, dir, names[0][strings.LastIndex(names[0], "/")+1:], names...)
		s, err := NewSource(Files{Cert: cc, Key: ck, CA: caFile}, quiet())
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(s.ClientConfig(""))
	}
	refused := make(chan refusal, 100)
	var identities []string
	addr := grpcServer(t, ServerCredentials(srv.ServerConfig(), func(p net.Addr, reason string, _ error) {
		refused <- refusal{p, reason}
	}), grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		p, _ := peer.FromContext(ctx)
		id, err := PeerIdentity(p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0])
		if err != nil {
			return nil, err
		}
		identities = append(identities, id) // one call at a time
		return h(ctx, req)
	}))
	next := func(what string) refusal {
		t.Helper()
		select {
		case r := <-refused:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not reported", what)
			return refusal{}
		}
	}

	if err := check(t, addr, client("spiffe://mesh.test/sink/good")); err != nil {
		t.Fatalf("a good client: %v", err)
	}
	if len(identities) != 1 || identities[0] != "spiffe://mesh.test/sink/good" {
		t.Errorf("identities %v", identities)
	}

	if err := check(t, addr, insecure.NewCredentials()); err == nil {
		t.Fatal("a plaintext client was served")
	}
	if r := next("plaintext"); r.reason != RejectPlaintext || r.peer == nil || !strings.HasPrefix(r.peer.String(), "127.0.0.1:") {
		t.Errorf("plaintext client reported as %+v", r)
	}
	drain(refused) // the plaintext client may have retried before it was closed

	if err := check(t, addr, client("spiffe://mesh.test/sink/a", "spiffe://mesh.test/cluster/b")); err == nil {
		t.Fatal("a certificate with two SPIFFE IDs was served")
	}
	if r := next("two URI SANs"); r.reason != RejectMultipleIdentities {
		t.Errorf("two URI SANs reported as %+v", r)
	}
	if len(identities) != 1 {
		t.Errorf("identities %v after refused clients", identities)
	}
}

func drain(c chan refusal) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// One rule names a peer by its certificate: its only URI SAN, else its common name.
func TestPeerIdentity(t *testing.T) {
	dir := t.TempDir()
	root := tlstest.NewCA(t, "root")
	leaf := func(prefix string, names ...string) *x509.Certificate {
		cf, _, _ := root.Issue(t, dir, prefix, names...)
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
	noCN := leaf("x", "spiffe://mesh.test/sink/x")
	noCN.URIs, noCN.Subject.CommonName = nil, ""
	parse := func(cf string) *x509.Certificate {
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
	cn := func(prefix, cn string, names ...string) *x509.Certificate {
		cf, _, _ := root.IssueCN(t, dir, prefix, cn, names...)
		return parse(cf)
	}
	raw := func(prefix, uri string) *x509.Certificate {
		cf, _, _ := root.IssueRawURI(t, dir, prefix, uri)
		return parse(cf)
	}
	for _, tc := range []struct {
		name    string
		cert    *x509.Certificate
		want    string
		wantErr string
	}{
		{"a SPIFFE ID", leaf("one", "spiffe://mesh.test/sink/one", "one.example.com"), "spiffe://mesh.test/sink/one", ""},
		{"no URI SAN: the common name", leaf("cn-only", "cn.example.com"), "cn-only", ""},
		{"two SPIFFE IDs", leaf("two", "spiffe://mesh.test/sink/a", "spiffe://mesh.test/hub/b"), "", "has 2 URI SANs"},
		{"neither", noCN, "", "neither a URI SAN nor a common name"},
		// A common name is never a SPIFFE ID (issue 25, finding 9: this one was an operator).
		{"a common name that looks like a SPIFFE ID", cn("mallory", "spiffe://mesh.test/operator/mallory"), "", "looks like a SPIFFE ID"},
		{"the same, in upper case", cn("mallory2", " SPIFFE:mesh.test/operator/mallory", "mallory.example.com"), "", "looks like a SPIFFE ID"},
		{"a URI SAN beside such a common name: the URI SAN", cn("both", "spiffe://mesh.test/operator/mallory", "spiffe://mesh.test/sink/both"), "spiffe://mesh.test/sink/both", ""},
		{"a common name with a colon", cn("colon", "istiod:primary"), "istiod:primary", ""},
		// The URI SAN as the CA signed it, not as net/url re-spells it, for CheckID to judge.
		{"an empty fragment kept", raw("frag", "spiffe://mesh.test/operator/alice#"), "spiffe://mesh.test/operator/alice#", ""},
		{"an empty query kept", raw("query", "spiffe://mesh.test/operator/alice?"), "spiffe://mesh.test/operator/alice?", ""},
		{"the scheme's case kept", raw("upper", "SPIFFE://mesh.test/operator/alice"), "SPIFFE://mesh.test/operator/alice", ""},
		{"percent-encoding kept", raw("pct", "spiffe://mesh.test/operator/%61lice"), "spiffe://mesh.test/operator/%61lice", ""},
		{"a canonical one", raw("canon", "spiffe://mesh.test/operator/alice"), "spiffe://mesh.test/operator/alice", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PeerIdentity(tc.cert)
			if got != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("PeerIdentity = %q, %v; want %q, error %q", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
