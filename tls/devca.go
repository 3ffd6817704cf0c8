package tls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DevCA is a development certificate authority kept in a state directory: the hub creates
// it on first start when configured to (never silently) and issues its own serving
// certificate and the clusters' and sinks' certificates from it. Its key is a file with
// mode 0600; it is for a laptop or a test bed, not for production, where certificates come
// from the user's PKI.
type DevCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// DevTrustDomain is the trust domain of the development CA's identities.
const DevTrustDomain = "meshfed.local"

// Validity of what the development CA issues.
const (
	devCAValidity   = 10 * 365 * 24 * time.Hour
	devLeafValidity = 90 * 24 * time.Hour
)

// CAFile returns the path of the CA certificate (the trust bundle to give peers).
func (ca *DevCA) CAFile() string { return filepath.Join(ca.dir, "ca.crt") }

// EnsureDevCA loads the development CA from dir, creating it (and dir, mode 0700) on first
// use. created reports whether it was made now.
func EnsureDevCA(dir, trustDomain string) (ca *DevCA, created bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("state directory %s: %w", dir, err)
	}
	ca = &DevCA{dir: dir}
	certPEM, err := os.ReadFile(ca.CAFile())
	switch {
	case err == nil:
		keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
		if err != nil {
			return nil, false, fmt.Errorf("development CA in %s: %w", dir, err)
		}
		if err := ca.parse(certPEM, keyPEM); err != nil {
			return nil, false, fmt.Errorf("development CA in %s: %w", dir, err)
		}
		return ca, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("development CA in %s: %w", dir, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, false, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{CommonName: "meshfed development CA (" + trustDomain + ")", Organization: []string{"meshfed"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(devCAValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, false, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, false, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	if err := writeFile(filepath.Join(dir, "ca.key"), keyPEM, 0o600); err != nil {
		return nil, false, err
	}
	if err := writeFile(ca.CAFile(), certPEM, 0o644); err != nil {
		return nil, false, err
	}
	if err := ca.parse(certPEM, keyPEM); err != nil {
		return nil, false, err
	}
	return ca, true, nil
}

// LoadDevCA loads an existing development CA from dir (for issuing from the command line).
func LoadDevCA(dir string) (*DevCA, error) {
	if _, err := os.Stat(filepath.Join(dir, "ca.crt")); err != nil {
		return nil, fmt.Errorf("no development CA in %s (a hub with devCA creates it on its first start): %w", dir, err)
	}
	ca, _, err := EnsureDevCA(dir, "")
	return ca, err
}

func (ca *DevCA) parse(certPEM, keyPEM []byte) error {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return errors.New("ca.crt or ca.key is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return fmt.Errorf("ca.crt: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return fmt.Errorf("ca.key: %w", err)
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return errors.New("ca.crt is not a CA certificate for ca.key")
	}
	ca.cert, ca.key, ca.pem = cert, key, certPEM
	return nil
}

// Issue writes a certificate for identity (a SPIFFE ID; it is the certificate's URI SAN)
// and hosts (DNS names or IP addresses it may serve on), its key (mode 0600) and the CA
// certificate into outDir as <prefix>.crt, <prefix>.key and ca.crt, and returns the files.
func (ca *DevCA) Issue(identity string, hosts []string, outDir, prefix string) (Files, error) {
	u, err := url.Parse(identity)
	if err != nil || u.Scheme != "spiffe" || u.Host == "" || !strings.HasPrefix(u.Path, "/") {
		return Files{}, fmt.Errorf("identity %q is not a SPIFFE ID (spiffe://TRUST-DOMAIN/PATH)", identity)
	}
	if err := os.MkdirAll(outDir, 0o700); err != nil {
		return Files{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(),
		Subject:      pkix.Name{CommonName: identity},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(devLeafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Files{}, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Files{}, err
	}
	f := Files{Cert: filepath.Join(outDir, prefix+".crt"), Key: filepath.Join(outDir, prefix+".key"), CA: filepath.Join(outDir, "ca.crt")}
	if err := writeFile(f.Key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return Files{}, err
	}
	if err := writeFile(f.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return Files{}, err
	}
	if f.CA != ca.CAFile() {
		if err := writeFile(f.CA, ca.pem, 0o644); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// writeFile writes through a temporary file and a rename, so a reader (a Source watching
// the file) never sees it half written.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func serialNumber() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}
