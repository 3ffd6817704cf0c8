// Package tls loads meshfed's transport credentials — a certificate, its key and a trust
// bundle — from files, and keeps them current: every TLS handshake uses the files' newest
// valid content, so certificates rotate without a restart and without dropping established
// streams (they keep the session they negotiated). A bundle may hold several roots, as it
// does during a CA rotation.
//
// Servers verify client certificates themselves, against the bundle of each handshake, so
// every refusal is classified (ServerConfigWith); ServerOnlyConfig serves the certificate
// and asks for none (for istiod, which presents none); ServerCredentials makes either gRPC
// credentials that also report a peer speaking plaintext to a TLS listener. PeerIdentity is
// the one rule naming a peer by its certificate (a certificate with two URI SANs names no
// one, and its handshake is refused; a common name is never a SPIFFE ID). ID formats the
// mesh's SPIFFE identities (spiffe://<trust-domain>/<kind>/<name>), and ParseID and CheckID
// accept exactly that spelling, nothing a URI parser would read otherwise. DevCA is a development certificate authority
// kept in a state directory, used only when a configuration asks for it.
//
// Import it as meshtls; it wraps crypto/tls. It does not decide who may do what: that is
// built on the verified identity by its callers (the hub's ownership and routing).
package tls

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Files names the PEM files of one identity.
type Files struct {
	// Cert is the certificate chain (leaf first).
	Cert string `json:"certFile"`
	// Key is the leaf's private key.
	Key string `json:"keyFile"`
	// CA is the trust bundle that peers' certificates must chain to (one or more roots).
	CA string `json:"caFile"`
}

// Config is the tls section of the hub's and the minion's configuration files: the
// identity's files and, for the connections it dials, the name the peer's certificate must
// carry.
type Config struct {
	Files
	// ServerName, if set, is the name a dialed peer's certificate must carry, instead of the
	// host of the address dialed (an address behind a load balancer, an IP).
	ServerName string `json:"serverName,omitempty"`
}

// Validate reports a missing field by name.
func (f Files) Validate() error {
	switch {
	case f.Cert == "":
		return errors.New("certFile is required")
	case f.Key == "":
		return errors.New("keyFile is required")
	case f.CA == "":
		return errors.New("caFile is required")
	}
	return nil
}

// recheck is how often the files are looked at again (their size and modification time).
const recheck = time.Second

// Source serves the current credentials of one identity. It is safe for concurrent use.
type Source struct {
	files Files
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex // guards the following fields
	cur     loaded
	checked time.Time
	lastErr string
}

// loaded is one valid read of the files.
type loaded struct {
	cert *tls.Certificate
	pool *x509.CertPool
	// bundleNotAfter is when the bundle's first certificate to expire does: from then on,
	// peers whose chains end there are refused.
	bundleNotAfter time.Time
	stamp          string // size and mtime of the three files
}

// NewSource loads the files once; an error names the file and what is wrong with it.
func NewSource(files Files, log *slog.Logger) (*Source, error) {
	if err := files.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Source{files: files, log: log, now: time.Now}
	cur, err := load(files)
	if err != nil {
		return nil, err
	}
	s.cur, s.checked = cur, s.now()
	return s, nil
}

// current returns the newest valid credentials, reloading the files if they changed. A
// change that does not load (a half-written file, a key that does not match) is logged and
// the previous credentials stay in use.
func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	cur := s.latest()
	return cur.cert, cur.pool
}

// latest is the files as last loaded, re-read first when they changed (at most every
// recheck): the certificate, the bundle and its dates from one reading.
func (s *Source) latest() loaded {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := s.now(); now.Sub(s.checked) >= recheck {
		s.checked = now
		if stamp := fileStamp(s.files); stamp != s.cur.stamp {
			next, err := load(s.files)
			switch {
			case err != nil:
				if err.Error() != s.lastErr {
					s.log.Error("new TLS files do not load; keeping the previous ones", "err", err)
					s.lastErr = err.Error()
				}
			default:
				s.cur, s.lastErr = next, ""
				s.log.Info("TLS files reloaded", "cert", s.files.Cert, "not_after", next.cert.Leaf.NotAfter)
			}
		}
	}
	return s.cur
}

// NotAfter returns when the current certificate expires, and when the first certificate of
// the current bundle does (for metrics: a rotation that did not happen shows here first).
func (s *Source) NotAfter() (cert, bundle time.Time) {
	cur := s.latest() // both dates from one reading of the files
	return cur.cert.Leaf.NotAfter, cur.bundleNotAfter
}

// ValidFor reports whether the current certificate is valid now and for at least d more.
func (s *Source) ValidFor(d time.Duration) bool {
	cert, _ := s.current()
	now := s.now()
	return !now.Before(cert.Leaf.NotBefore) && now.Add(d).Before(cert.Leaf.NotAfter)
}

// ClientConfig returns a configuration for dialing: it presents the current certificate and
// verifies the server's chain against the current bundle. serverName, when not empty,
// replaces the dialed host name in the check (for a hub reached through an address its
// certificate does not name).
func (s *Source) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _ := s.current()
			return c, nil
		},
		// Verification is done below against the bundle current at handshake time: the
		// standard check would pin the bundle of the moment the config was built.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool := s.current()
			name := serverName
			if name == "" {
				name = cs.ServerName
			}
			return verify(cs.PeerCertificates, pool, name, x509.ExtKeyUsageServerAuth)
		},
	}
}

// ServerConfig returns a configuration for serving: it presents the current certificate and
// requires a client certificate that chains to the current bundle.
func (s *Source) ServerConfig() *tls.Config { return s.ServerConfigWith(nil) }

// ServerOnlyConfig is a server configuration that authenticates the server only: it serves
// the current certificate and asks for no client certificate (for istiod's config source
// client, which presents none: TLS mode SIMPLE). Whoever connects is not authenticated.
func (s *Source) ServerOnlyConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, _ := s.current()
			return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}, ClientAuth: tls.NoClientCert}, nil
		},
	}
}

// Rejection reasons a server reports for handshakes it refuses: client certificates, and
// (ServerCredentials) peers that do not speak TLS.
const (
	RejectNoCertificate    = "no_certificate"
	RejectUnknownAuthority = "unknown_authority"
	RejectExpired          = "expired"
	RejectNotYetValid      = "not_yet_valid"
	RejectInvalid          = "invalid"
	// RejectMultipleIdentities: the certificate has more than one URI SAN, so no one
	// identity (see PeerIdentity).
	RejectMultipleIdentities = "multiple_identities"
	// RejectPlaintext: the peer sent something that is not TLS, e.g. a plaintext gRPC
	// client's HTTP/2 preface.
	RejectPlaintext = "plaintext"
)

// rejection is the error a refused client certificate fails the handshake with, so that
// ServerCredentials, which sees only the handshake's error, reads its reason.
type rejection struct {
	reason string
	err    error
}

func (r *rejection) Error() string { return r.err.Error() }
func (r *rejection) Unwrap() error { return r.err }

// ServerConfigWith is ServerConfig that tells onReject (if not nil) why each refused client
// certificate was refused (one of the Reject* reasons) and the error the handshake fails
// with, for metrics and logs.
func (s *Source) ServerConfigWith(onReject func(reason string, err error)) *tls.Config {
	reject := func(reason string, err error) error {
		if onReject != nil {
			onReject(reason, err)
		}
		return &rejection{reason: reason, err: err}
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := s.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*cert},
				// Verified below, against the bundle of this handshake, so that each refusal
				// is classified: a missing certificate too.
				ClientAuth: tls.RequestClientCert,
				VerifyConnection: func(cs tls.ConnectionState) error {
					if len(cs.PeerCertificates) == 0 {
						return reject(RejectNoCertificate, errors.New("tls: a client certificate is required"))
					}
					if err := verify(cs.PeerCertificates, pool, "", x509.ExtKeyUsageClientAuth); err != nil {
						return reject(classify(cs.PeerCertificates[0], s.now(), err), err)
					}
					if err := oneURI(cs.PeerCertificates[0]); err != nil {
						return reject(RejectMultipleIdentities, err)
					}
					return nil
				},
			}, nil
		},
	}
}

// classify names why leaf did not verify.
func classify(leaf *x509.Certificate, now time.Time, err error) string {
	var ua x509.UnknownAuthorityError
	switch {
	case now.After(leaf.NotAfter):
		return RejectExpired
	case now.Before(leaf.NotBefore):
		return RejectNotYetValid
	case errors.As(err, &ua):
		return RejectUnknownAuthority
	}
	return RejectInvalid
}

func verify(chain []*x509.Certificate, pool *x509.CertPool, name string, usage x509.ExtKeyUsage) error {
	if len(chain) == 0 {
		return errors.New("tls: the peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return fmt.Errorf("tls: peer certificate (subject %q) not trusted: %w", chain[0].Subject.String(), err)
	}
	return nil
}

func load(f Files) (loaded, error) {
	stamp := fileStamp(f)
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return loaded{}, fmt.Errorf("certFile %s / keyFile %s: %w", f.Cert, f.Key, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return loaded{}, fmt.Errorf("certFile %s: %w", f.Cert, err)
		}
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return loaded{}, fmt.Errorf("caFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return loaded{}, fmt.Errorf("caFile %s: no PEM certificate in it", f.CA)
	}
	return loaded{cert: &cert, pool: pool, bundleNotAfter: firstExpiry(caPEM), stamp: stamp}, nil
}

// firstExpiry is the soonest NotAfter of the certificates in a PEM bundle, read as the pool
// reads it: blocks that are not certificates, or do not parse, are skipped.
func firstExpiry(bundle []byte) time.Time {
	var first time.Time
	for len(bundle) > 0 {
		var b *pem.Block
		if b, bundle = pem.Decode(bundle); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" || len(b.Headers) != 0 {
			continue
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && (first.IsZero() || c.NotAfter.Before(first)) {
			first = c.NotAfter
		}
	}
	return first
}

func fileStamp(f Files) string {
	var out string
	for _, p := range []string{f.Cert, f.Key, f.CA} {
		fi, err := os.Stat(p)
		if err != nil {
			out += p + ":missing;"
			continue
		}
		out += fmt.Sprintf("%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return out
}
