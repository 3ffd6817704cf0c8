package tls

import "strings"

// Kinds of identity in a trust domain: the path's first element of a SPIFFE ID.
const (
	KindCluster = "cluster" // a minion publishing a cluster's configuration
	KindSink    = "sink"    // a consumer of the federated configuration
	KindHub     = "hub"     // a hub replica
	// KindOperator is a person or tool that changes a running hub through its admin API
	// (an action, such as releasing a cluster's breaker); reading the API needs none.
	KindOperator = "operator"
)

// ID returns the SPIFFE ID spiffe://<trustDomain>/<kind>/<name>.
func ID(trustDomain, kind, name string) string {
	return "spiffe://" + trustDomain + "/" + kind + "/" + name
}

// ParseID returns the kind and name of id if it is a SPIFFE ID of trustDomain of the form
// spiffe://<trustDomain>/<kind>/<name>.
func ParseID(trustDomain, id string) (kind, name string, ok bool) {
	rest, ok := strings.CutPrefix(id, "spiffe://"+trustDomain+"/")
	if !ok {
		return "", "", false
	}
	kind, name, ok = strings.Cut(rest, "/")
	if !ok || kind == "" || name == "" {
		return "", "", false
	}
	return kind, name, true
}
