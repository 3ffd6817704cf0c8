// Package tlstest issues throwaway certificates for tests: a CA and leaves for DNS names, IP
// addresses or URI SANs, written as PEM files. Test infrastructure only: nothing in the
// product imports it, and nothing it issues should be trusted.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// TB is the part of testing.TB used here.
type TB interface {
	Helper()
	Fatal(args ...any)
}

var serial atomic.Int64

// CA is a test certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA certificate, for a trust bundle.
	PEM []byte
}

// NewCA creates a self-signed CA valid for a day.
func NewCA(t TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: c, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// WriteBundle writes the PEM of the given CAs to path.
func WriteBundle(t TB, path string, cas ...*CA) {
	t.Helper()
	var b []byte
	for _, c := range cas {
		b = append(b, c.PEM...)
	}
	WriteAtomic(t, path, b)
}

// Issue writes a leaf certificate and key for names into dir as prefix.crt and prefix.key
// (replacing them atomically) and returns the two paths and the certificate's serial
// number. Each name is an IP address, a URI (spiffe://...) or a DNS name. The leaf is good
// for both server and client authentication.
func (c *CA) Issue(t TB, dir, prefix string, names ...string) (certFile, keyFile string, serialNo int64) {
	t.Helper()
	return c.IssueValid(t, dir, prefix, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), names...)
}

// IssueValid is Issue with an explicit validity period (for expired and not-yet-valid
// certificates).
func (c *CA) IssueValid(t TB, dir, prefix string, notBefore, notAfter time.Time, names ...string) (certFile, keyFile string, serialNo int64) {
	t.Helper()
	return c.issue(t, dir, prefix, notBefore, notAfter, nil, names...)
}

// IssueCN is Issue with the subject common name cn rather than prefix: e.g. one that looks
// like a SPIFFE ID, on a certificate without a URI SAN (names may be none).
func (c *CA) IssueCN(t TB, dir, prefix, cn string, names ...string) (certFile, keyFile string, serialNo int64) {
	t.Helper()
	return c.issue(t, dir, prefix, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour),
		func(tmpl *x509.Certificate) { tmpl.Subject.CommonName = cn }, names...)
}

// IssueRawURI is Issue for a certificate whose only SAN is the URI uri, encoded exactly as
// written: Go's URL type, which Issue goes through, would re-spell some (drop an empty
// query or fragment, lower-case the scheme).
func (c *CA) IssueRawURI(t TB, dir, prefix, uri string) (certFile, keyFile string, serialNo int64) {
	t.Helper()
	name, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(uri)}) // uniformResourceIdentifier
	if err != nil {
		t.Fatal(err)
	}
	san, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: name})
	if err != nil {
		t.Fatal(err)
	}
	return c.issue(t, dir, prefix, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), func(tmpl *x509.Certificate) {
		tmpl.ExtraExtensions = append(tmpl.ExtraExtensions, pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: san})
	})
}

// issue writes a leaf for names, its template changed by edit (if not nil) before signing.
func (c *CA) issue(t TB, dir, prefix string, notBefore, notAfter time.Time, edit func(*x509.Certificate), names ...string) (certFile, keyFile string, serialNo int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serialNo = serial.Add(1)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serialNo), Subject: pkix.Name{CommonName: prefix},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if u, err := url.Parse(n); err == nil && u.Scheme != "" {
			tmpl.URIs = append(tmpl.URIs, u)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, &key.PublicKey, c.Key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, prefix+".crt"), filepath.Join(dir, prefix+".key")
	WriteAtomic(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	WriteAtomic(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return certFile, keyFile, serialNo
}

// WriteAtomic writes data to path through a temporary file and a rename.
func WriteAtomic(t TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}
