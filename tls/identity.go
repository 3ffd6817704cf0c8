package tls

import (
	"errors"
	"fmt"
	"strings"
)

// Kinds of identity in a trust domain: the path's first element of a SPIFFE ID.
const (
	KindCluster = "cluster" // a minion publishing a cluster's configuration
	KindSink    = "sink"    // a consumer of the federated configuration
	KindHub     = "hub"     // a hub replica
	// KindOperator is a person or tool that changes a running hub through its admin API
	// (an action, such as releasing a cluster's breaker); reading the API needs none.
	KindOperator = "operator"
)

// ID returns the SPIFFE ID spiffe://<trustDomain>/<kind>/<name>. It formats; CheckID says
// whether the result is one (a name with a "/" is not).
func ID(trustDomain, kind, name string) string {
	return "spiffe://" + trustDomain + "/" + kind + "/" + name
}

// ParseID returns the kind and name of id if it is a canonical SPIFFE ID of trustDomain,
// spiffe://<trustDomain>/<kind>/<name> exactly (see CheckID).
func ParseID(trustDomain, id string) (kind, name string, ok bool) {
	kind, name, err := CheckID(trustDomain, id)
	return kind, name, err == nil
}

// CheckID is ParseID that says what is wrong with id. An identity decides what a peer may
// do (push as a cluster, subscribe as a sink, follow as a replica, act as an operator), so
// only one spelling of each is accepted: ID(trustDomain, kind, name) is id, byte for byte.
// That is the scheme spiffe in lower case, trustDomain as the host, no user, port, query or
// fragment, and a path of exactly two segments, each a name (CheckName). Anything a URI
// parser or a person might read as the same ID, or as another (a "..", a percent-encoded
// byte, an empty segment, a trailing slash, "SPIFFE://"), is refused rather than
// normalized: two spellings of one identity would be two identities to every exact
// comparison (configured identities, routing patterns, the log), and a normalized path
// (operator/alice/../../cluster/west) would be another kind's. The error says what is
// wrong, not which ID: its callers name it.
func CheckID(trustDomain, id string) (kind, name string, err error) {
	if err := CheckTrustDomain(trustDomain); err != nil {
		return "", "", err
	}
	rest, ok := strings.CutPrefix(id, "spiffe://")
	if !ok {
		return "", "", errors.New("it does not begin with spiffe://")
	}
	td, path, ok := strings.Cut(rest, "/")
	if td != trustDomain {
		return "", "", fmt.Errorf("it names %q, not the trust domain %q (spiffe://%s/KIND/NAME, no user or port)", td, trustDomain, trustDomain)
	}
	if !ok {
		return "", "", fmt.Errorf("it has no path: want spiffe://%s/KIND/NAME", trustDomain)
	}
	segs := strings.Split(path, "/")
	if len(segs) != 2 {
		return "", "", fmt.Errorf("its path %q is not /KIND/NAME (two segments, no trailing slash)", "/"+path)
	}
	for _, s := range segs {
		if err := CheckName(s); err != nil {
			return "", "", fmt.Errorf("its path %q: %w", "/"+path, err)
		}
	}
	return segs[0], segs[1], nil
}

// CheckName reports whether name may be a segment of a SPIFFE ID's path (a kind, or the
// name of a cluster, sink, replica or operator): not empty, not "." or "..", and only
// ASCII letters, digits, '.', '-' and '_' (the SPIFFE ID specification's path characters).
// Everything else, '%', '?', '#', '/' and ':' first, would make the ID mean something else
// to a URI parser than to an exact comparison.
func CheckName(name string) error {
	switch name {
	case "":
		return errors.New("the name is empty")
	case ".", "..":
		return fmt.Errorf("%q is not a name", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isLetterOrDigit(c) && c != '.' && c != '-' && c != '_' {
			return fmt.Errorf("%q has %q: a name is ASCII letters, digits, '.', '-' and '_'", name, string([]byte{c}))
		}
	}
	return nil
}

// CheckTrustDomain reports whether td is a SPIFFE trust domain name: not empty, lower case
// ASCII letters, digits, '.', '-' and '_' (the specification's; no scheme, user, port or
// path).
func CheckTrustDomain(td string) error {
	if td == "" {
		return errors.New("the trust domain is empty")
	}
	for i := 0; i < len(td); i++ {
		if c := td[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '-' && c != '_' {
			return fmt.Errorf("%q is not allowed in a trust domain: lower case letters, digits, '.', '-' and '_' only (no scheme, user, port or path)", string([]byte{c}))
		}
	}
	return nil
}

func isLetterOrDigit(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
