package configcheck

import (
	"fmt"
	"strings"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/pattern"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
)

// group is one tenant's clusters and routing (the top-level ones without tenants), with the
// prefix of its fields.
type group struct {
	field    string
	clusters []hub.ClusterConfig
	routing  routing.Config
}

func groups(c *hub.Config) []group {
	if len(c.Tenants) == 0 {
		return []group{{clusters: c.Clusters, routing: c.Routing}}
	}
	out := make([]group, len(c.Tenants))
	for i, t := range c.Tenants {
		out[i] = group{field: fmt.Sprintf("tenants[%d] (%q).", i, t.Name), clusters: t.Clusters, routing: t.Routing}
	}
	return out
}

// warnings are what a valid configuration c says that is likely a mistake, each message
// starting with the field path it is about.
func warnings(c *hub.Config) []string {
	var out []string
	if c.HTTP == "" {
		out = append(out, "http: not set: a configuration file starts from the defaults, where the admin API (hub status, get, why, whatif), /metrics and the probes are off; set http (e.g. 127.0.0.1:9990) to have them")
	}
	td := c.SPIFFETrustDomain()
	for _, g := range groups(c) {
		out = append(out, hostOverlaps(g)...)
		out = append(out, idleRules(g, c.Collections, td)...)
		for i, cl := range g.clusters {
			for j, id := range cl.Identities {
				if msg := identityProblem(id, td, meshtls.KindCluster); msg != "" {
					out = append(out, fmt.Sprintf("%sclusters[%d] (%q).identities[%d]: %q %s", g.field, i, cl.Name, j, id, msg))
				}
			}
		}
	}
	for i, d := range c.DialSinks {
		if msg := identityProblem(d.Identity, td, meshtls.KindSink); d.Identity != "" && msg != "" {
			out = append(out, fmt.Sprintf("dialSinks[%d] (%q).identity: %q %s", i, d.Name, d.Identity, msg))
		}
	}
	return out
}

// hostOverlaps warns of hosts two clusters of a group both claim: the hub takes it (hosts
// are not namespaces, which must be shared explicitly) and serves one cluster's object of a
// name both publish by the conflict policy, but an overlap is often a typo.
func hostOverlaps(g group) []string {
	var out []string
	for i, a := range g.clusters {
		for j := i + 1; j < len(g.clusters); j++ {
			b := g.clusters[j]
			for k, ha := range a.Hosts {
				pa, err := pattern.ParseHost(ha)
				if err != nil {
					continue
				}
				for l, hb := range b.Hosts {
					pb, err := pattern.ParseHost(hb)
					if err != nil {
						continue
					}
					if both, ok := pa.Overlap(pb); ok {
						out = append(out, fmt.Sprintf("%sclusters[%d] (%q).hosts[%d]: %q overlaps clusters[%d] (%q).hosts[%d] %q: both may publish objects for %s, and where both publish one name the conflict policy picks which is served",
							g.field, i, a.Name, k, ha, j, b.Name, l, hb, both))
					}
				}
			}
		}
	}
	return out
}

// idleRules warns of routing rules that can select nothing: a collection pattern that
// matches none of the hub's collections, a cluster pattern that matches none of the
// group's clusters, an identity pattern outside the trust domain.
func idleRules(g group, collections []string, td string) []string {
	var out []string
	clusterNames := make([]string, len(g.clusters))
	for i, cl := range g.clusters {
		clusterNames[i] = cl.Name
	}
	rules := append([]routing.Rule(nil), g.routing.Rules...)
	for i, r := range rules {
		field := fmt.Sprintf("%srouting.rules[%d] (%q)", g.field, i, r.Name)
		for j, p := range r.Collections {
			if !matchesAny(p, collections) {
				out = append(out, fmt.Sprintf("%s.collections[%d]: %q matches none of the hub's collections: the rule gives nothing of it", field, j, p))
			}
		}
		for j, p := range r.Clusters {
			if !matchesAny(p, clusterNames) {
				out = append(out, fmt.Sprintf("%s.clusters[%d]: %q matches none of the configured clusters (%s): the rule gives nothing from it", field, j, p, strings.Join(clusterNames, ", ")))
			}
		}
		for j, p := range r.Identities {
			if msg := identityPatternProblem(p, td); msg != "" {
				out = append(out, fmt.Sprintf("%s.identities[%d]: %q %s: the rule selects no sink by it", field, j, p, msg))
			}
		}
	}
	return out
}

// matchesAny reports whether the routing pattern p ("*" any run of characters) matches one
// of names.
func matchesAny(p string, names []string) bool {
	for _, n := range names {
		if routing.Match(p, n) {
			return true
		}
	}
	return false
}

// identityProblem says what is wrong with an exact identity of kind (cluster, sink) under
// trust domain td, or "".
func identityProblem(id, td, kind string) string {
	if !strings.HasPrefix(id, "spiffe://") {
		if td == "" {
			return "is not a SPIFFE ID: it must equal the peer certificate's subject common name, which any CA you trust may issue"
		}
		return fmt.Sprintf("is not a SPIFFE ID (spiffe://%s/%s/NAME)", td, kind)
	}
	rest := strings.TrimPrefix(id, "spiffe://")
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "":
		return fmt.Sprintf("is not spiffe://TRUST-DOMAIN/%s/NAME", kind)
	case td != "" && parts[0] != td:
		return fmt.Sprintf("is of trust domain %q, not %q", parts[0], td)
	case parts[1] != kind:
		return fmt.Sprintf("is a %s's identity, not a %s's (spiffe://%s/%s/NAME)", parts[1], kind, parts[0], kind)
	}
	return ""
}

// identityPatternProblem says why a routing rule's identity pattern can match no sink
// under trust domain td, or "": a pattern whose literal start names another trust domain,
// or a kind no sink has.
func identityPatternProblem(p, td string) string {
	literal, _, _ := strings.Cut(p, "*")
	rest, ok := strings.CutPrefix(literal, "spiffe://")
	if !ok {
		return ""
	}
	domain, after, whole := strings.Cut(rest, "/")
	if !whole {
		return "" // the trust domain is a wildcard
	}
	if td != "" && domain != td {
		return fmt.Sprintf("is of trust domain %q, not %q", domain, td)
	}
	kind, _, whole := strings.Cut(after, "/")
	if whole && kind != meshtls.KindSink && kind != meshtls.KindCluster {
		return fmt.Sprintf("names kind %q: sinks are spiffe://%s/sink/NAME (a minion's relay spiffe://%s/cluster/NAME)", kind, domain, domain)
	}
	return ""
}
