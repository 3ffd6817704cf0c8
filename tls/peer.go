package tls

import (
	"crypto/x509"
	"errors"
	"fmt"
)

// PeerIdentity is the identity a verified client certificate names: its URI SAN (a SPIFFE
// ID), else its subject common name. A certificate with more than one URI SAN names no one
// identity and is refused, here and at the handshake (RejectMultipleIdentities): taking one
// of them would let whoever ordered the SANs choose who the peer is.
func PeerIdentity(leaf *x509.Certificate) (string, error) {
	if err := oneURI(leaf); err != nil {
		return "", err
	}
	if len(leaf.URIs) == 1 {
		return leaf.URIs[0].String(), nil
	}
	if leaf.Subject.CommonName != "" {
		return leaf.Subject.CommonName, nil
	}
	return "", errors.New("client certificate has neither a URI SAN nor a common name")
}

// oneURI refuses a certificate with more than one URI SAN.
func oneURI(leaf *x509.Certificate) error {
	if len(leaf.URIs) > 1 {
		return fmt.Errorf("client certificate (subject %q) has %d URI SANs %v: an identity (a SPIFFE ID) must be its only one",
			leaf.Subject.String(), len(leaf.URIs), leaf.URIs)
	}
	return nil
}
