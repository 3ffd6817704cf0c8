package tls

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"strings"
)

// PeerIdentity is the identity a verified client certificate names: its URI SAN (a SPIFFE
// ID), else its subject common name. A certificate with more than one URI SAN names no one
// identity and is refused, here and at the handshake (RejectMultipleIdentities): taking one
// of them would let whoever ordered the SANs choose who the peer is.
//
// The URI SAN is returned as the certificate spells it, not as Go's URL parser re-spells it
// (which would drop an empty fragment or query, and lower-case the scheme), so that
// CheckID judges the very text the CA signed.
//
// A common name is only a name: it is never a SPIFFE ID (an X.509-SVID carries its ID in
// the URI SAN, and a CA that checks what it signs checks that, not the subject). So a
// certificate without a URI SAN whose common name looks like one (scheme spiffe, in any
// case) is refused: taken as it is, CN=spiffe://<td>/operator/mallory would read as an
// operator under the trust domain, and as that ID in every configured list and log line.
// Any other common name remains an identity (matched exactly, for a hub without a trust
// domain, whose configuration must then name its peers by it), but it can never be of a
// kind: every kind (cluster, sink, hub replica, operator) is a SPIFFE ID (CheckID).
func PeerIdentity(leaf *x509.Certificate) (string, error) {
	if err := oneURI(leaf); err != nil {
		return "", err
	}
	if len(leaf.URIs) == 1 {
		return uriSAN(leaf), nil
	}
	if cn := leaf.Subject.CommonName; cn != "" {
		if scheme, _, ok := strings.Cut(cn, ":"); ok && strings.EqualFold(strings.TrimSpace(scheme), "spiffe") {
			return "", fmt.Errorf("client certificate has no URI SAN and its common name %q looks like a SPIFFE ID: a SPIFFE ID is a certificate's URI SAN, never its common name", cn)
		}
		return cn, nil
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

// oidSAN is the subject alternative name extension's (RFC 5280, 4.2.1.6).
var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

// uriSAN returns the text of leaf's one URI SAN as encoded (an IA5String, [6] of the
// GeneralNames), which crypto/x509 has already parsed into leaf.URIs; if it cannot be read
// again (it can: x509 refused the certificate otherwise), the parsed one's spelling.
func uriSAN(leaf *x509.Certificate) string {
	for _, ext := range leaf.Extensions {
		if !ext.Id.Equal(oidSAN) {
			continue
		}
		var seq asn1.RawValue
		if rest, err := asn1.Unmarshal(ext.Value, &seq); err != nil || len(rest) > 0 || !seq.IsCompound {
			break
		}
		for names := seq.Bytes; len(names) > 0; {
			var v asn1.RawValue
			var err error
			if names, err = asn1.Unmarshal(names, &v); err != nil {
				break
			}
			if v.Class == asn1.ClassContextSpecific && v.Tag == 6 {
				return string(v.Bytes)
			}
		}
		break
	}
	return leaf.URIs[0].String()
}
