package tls

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/tls/tlstest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// handshake runs one TLS connection between server and client configs over loopback and
// returns the serial number of the certificate each side saw, or the error.
func handshake(t *testing.T, server, client *tls.Config) (clientSaw, serverSaw int64, err error) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type seen struct {
		serial int64
		ok     bool
	}
	got := make(chan seen, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- seen{}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if tc.Handshake() != nil || len(tc.ConnectionState().PeerCertificates) == 0 {
			got <- seen{}
			return
		}
		got <- seen{serial: tc.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), ok: true}
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), client)
	if err != nil {
		<-got
		return 0, 0, err
	}
	defer conn.Close()
	clientSaw = conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	// With TLS 1.3 the client finishes before the server has checked its certificate.
	s := <-got
	if !s.ok {
		return clientSaw, 0, errors.New("the server refused the handshake")
	}
	return clientSaw, s.serial, nil
}

func TestMutualTLSAndRotation(t *testing.T) {
	dir := t.TempDir()
	root := tlstest.NewCA(t, "root-1")
	caFile := filepath.Join(dir, "ca.crt")
	tlstest.WriteAtomic(t, caFile, root.PEM)
	sc, sk, s1 := root.Issue(t, dir, "server", "127.0.0.1")
	cc, ck, c1 := root.Issue(t, dir, "client", "minion.east")
	srv, err := NewSource(Files{Cert: sc, Key: sk, CA: caFile}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewSource(Files{Cert: cc, Key: ck, CA: caFile}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	srv.now = func() time.Time { return clock }
	cli.now = func() time.Time { return clock }

	cs, ss, err := handshake(t, srv.ServerConfig(), cli.ClientConfig(""))
	if err != nil || cs != s1 || ss != c1 {
		t.Fatalf("handshake: client saw %d (want %d), server saw %d (want %d), err %v", cs, s1, ss, c1, err)
	}

	// Rotation: new leaves on disk are used by the next handshake once rechecked.
	_, _, c2 := root.Issue(t, dir, "client", "minion.east")
	if _, ss, _ := handshake(t, srv.ServerConfig(), cli.ClientConfig("")); ss != c1 {
		t.Errorf("reloaded before the recheck interval: server saw %d", ss)
	}
	clock = clock.Add(recheck)
	if _, ss, err := handshake(t, srv.ServerConfig(), cli.ClientConfig("")); err != nil || ss != c2 {
		t.Fatalf("after rotation the server saw %d, want %d (err %v)", ss, c2, err)
	}

	// A broken write keeps the previous credentials.
	tlstest.WriteAtomic(t, ck, []byte("not a key"))
	clock = clock.Add(recheck)
	if _, ss, err := handshake(t, srv.ServerConfig(), cli.ClientConfig("")); err != nil || ss != c2 {
		t.Fatalf("broken key file: server saw %d, err %v; want the previous cert %d", ss, err, c2)
	}

	// CA rotation: a bundle with old and new roots accepts leaves of both.
	root2 := tlstest.NewCA(t, "root-2")
	tlstest.WriteAtomic(t, caFile, append(append([]byte{}, root.PEM...), root2.PEM...))
	_, _, c3 := root2.Issue(t, dir, "client", "minion.east")
	clock = clock.Add(recheck)
	if _, ss, err := handshake(t, srv.ServerConfig(), cli.ClientConfig("")); err != nil || ss != c3 {
		t.Fatalf("leaf of the new root: server saw %d, err %v", ss, err)
	}
}

func TestUntrustedPeersAreRefused(t *testing.T) {
	dir := t.TempDir()
	root, other := tlstest.NewCA(t, "root"), tlstest.NewCA(t, "other")
	caFile := filepath.Join(dir, "ca.crt")
	tlstest.WriteAtomic(t, caFile, root.PEM)
	sc, sk, _ := root.Issue(t, dir, "server", "127.0.0.1")
	cc, ck, _ := other.Issue(t, dir, "client", "intruder")
	srv, _ := NewSource(Files{Cert: sc, Key: sk, CA: caFile}, quiet())
	cli, _ := NewSource(Files{Cert: cc, Key: ck, CA: caFile}, quiet())
	if _, _, err := handshake(t, srv.ServerConfig(), cli.ClientConfig("")); err == nil {
		t.Fatal("a client with a certificate from another CA was accepted")
	}
	// The server's name must match.
	good, gk, _ := root.Issue(t, dir, "client2", "minion")
	cli2, _ := NewSource(Files{Cert: good, Key: gk, CA: caFile}, quiet())
	_, _, err := handshake(t, srv.ServerConfig(), cli2.ClientConfig("hub.example.com"))
	if err == nil || !strings.Contains(err.Error(), "not trusted") {
		t.Fatalf("wrong server name: err = %v", err)
	}
}

func TestNewSourceErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	root := tlstest.NewCA(t, "root")
	caFile := filepath.Join(dir, "ca.crt")
	tlstest.WriteAtomic(t, caFile, root.PEM)
	cert, key, _ := root.Issue(t, dir, "leaf", "x")
	empty := filepath.Join(dir, "empty.pem")
	tlstest.WriteAtomic(t, empty, []byte("hello"))
	for _, tc := range []struct {
		files Files
		want  string
	}{
		{Files{Key: key, CA: caFile}, "certFile is required"},
		{Files{Cert: cert, Key: filepath.Join(dir, "nope"), CA: caFile}, "keyFile " + filepath.Join(dir, "nope")},
		{Files{Cert: cert, Key: caFile, CA: caFile}, "keyFile"},
		{Files{Cert: cert, Key: key, CA: empty}, "caFile " + empty + ": no PEM certificate"},
	} {
		if _, err := NewSource(tc.files, quiet()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want it to mention %q", tc.files, err, tc.want)
		}
	}
}

// FuzzNewSource: whatever the files hold, loading never panics; it is an error or a usable
// identity.
func FuzzNewSource(f *testing.F) {
	root := tlstest.NewCA(f, "root")
	dir := f.TempDir()
	cert, key, _ := root.Issue(f, dir, "leaf", "x")
	cb, _ := os.ReadFile(cert)
	kb, _ := os.ReadFile(key)
	f.Add(cb, kb, root.PEM)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), kb, cb)
	f.Fuzz(func(t *testing.T, c, k, a []byte) {
		d := t.TempDir()
		files := Files{Cert: filepath.Join(d, "c"), Key: filepath.Join(d, "k"), CA: filepath.Join(d, "a")}
		for p, b := range map[string][]byte{files.Cert: c, files.Key: k, files.CA: a} {
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		s, err := NewSource(files, quiet())
		if err == nil && (s.cur.cert == nil || s.cur.pool == nil) {
			t.Fatal("loaded without a certificate or a bundle")
		}
	})
}

// NotAfter follows the files: the certificate's expiry, and the soonest of the bundle's
// (a bundle with an old and a new root during a rotation expires with the old one); a
// rotated certificate shows once it is reloaded.
func TestNotAfter(t *testing.T) {
	dir := t.TempDir()
	older, newer := tlstest.NewCA(t, "older"), tlstest.NewCA(t, "newer")
	bundle := filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, bundle, newer, older)
	first := older.Cert.NotAfter
	if newer.Cert.NotAfter.Before(first) {
		first = newer.Cert.NotAfter
	}
	until := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	cert, key, _ := newer.IssueValid(t, dir, "leaf", time.Now().Add(-time.Hour), until, "spiffe://mesh.test/hub/h")
	s, err := NewSource(Files{Cert: cert, Key: key, CA: bundle}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if c, b := s.NotAfter(); !c.Equal(until) || !b.Equal(first) {
		t.Errorf("NotAfter = %v, %v; want %v, %v", c, b, until, first)
	}
	later := until.Add(5 * time.Hour)
	newer.IssueValid(t, dir, "leaf", time.Now().Add(-time.Hour), later, "spiffe://mesh.test/hub/h")
	clock := time.Now().Add(recheck)
	s.now = func() time.Time { return clock }
	if c, _ := s.NotAfter(); !c.Equal(later) {
		t.Errorf("NotAfter after the rotation = %v; want %v", c, later)
	}
}
