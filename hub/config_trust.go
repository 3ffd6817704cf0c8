package hub

import (
	"fmt"
	"strings"
)

// noTrustDomain begins the refusal of a configuration with TLS and no trust domain that
// does not name every sink exactly.
const noTrustDomain = "trustDomain: required with tls unless every sink is named by its exact identity " +
	"(without a trust domain a certificate's identity says nothing of its kind, so any certificate the CA issued, a minion's too, may subscribe as a sink)"

// checkSinkTrust refuses a configuration under which a certificate could receive what its
// identity is not given (compile calls it once the clusters' identities and the routing
// table are built; routing.New has refused rules that select by claims alone).
//
// With TLS and a trust domain, the serve listener admits only sink identities of the trust
// domain (requireKind) and a sink's node id is the name in its certificate (sink), so rules
// selecting by identity patterns or node ids select by what is proven. With TLS and no trust
// domain nothing tells a sink's certificate from a minion's: the configuration must then be
// an explicit identity list, every rule for sinks naming its sinks' exact identities, none
// of them a cluster's, and no default (it would serve any certificate, a minion's too);
// dialed sinks need the identity the rules name. Insecure development mode proves nothing
// at all (an identity is a header anyone sets; every start and connection says so) and is
// not checked here.
//
// In every mode, a rule for sinks naming a cluster's identity exactly is refused: a cluster
// subscribes as a relay, which only relays rules select, and a minion's certificate must not
// read as a sink's.
func (c *Config) checkSinkTrust(comp *compiled, g tenantGroup) error {
	for i, r := range g.Routing.Rules {
		if r.Relays || r.Unauthenticated {
			continue
		}
		for j, id := range r.Identities {
			if cluster, ok := comp.identity[id]; ok {
				return fmt.Errorf("%srouting.rules[%d] (%q).identities[%d]: %q is cluster %q's identity: a cluster subscribes only as a relay, which only rules with relays: true select",
					g.field, i, r.Name, j, id, cluster)
			}
		}
	}
	if c.Insecure || comp.trustDomain != "" {
		return nil
	}
	if g.Routing.Default != nil {
		return fmt.Errorf("%s: %srouting.default would serve any of them; set trustDomain, or replace the default with rules naming exact identities", noTrustDomain, g.field)
	}
	for i, r := range g.Routing.Rules {
		if r.Relays || r.Unauthenticated {
			// Relays are admitted only for configured clusters' identities (authenticateRelay);
			// unauthenticated sinks only on their own listener.
			continue
		}
		if len(r.Identities) == 0 {
			return fmt.Errorf("%s: %srouting.rules[%d] (%q) names no identities, so it would serve any of them; set trustDomain, or list its sinks' identities",
				noTrustDomain, g.field, i, r.Name)
		}
		for j, id := range r.Identities {
			if strings.Contains(id, "*") {
				return fmt.Errorf("%s: %srouting.rules[%d] (%q).identities[%d] %q is a pattern, which may match any of them; set trustDomain, or list exact identities",
					noTrustDomain, g.field, i, r.Name, j, id)
			}
		}
	}
	return nil
}

// checkDialSinkTrust refuses, with TLS and no trust domain, a dialed sink without the
// identity a rule names (see checkSinkTrust).
func (c *Config) checkDialSinkTrust(comp *compiled) error {
	if c.Insecure || comp.trustDomain != "" {
		return nil
	}
	for i, d := range c.DialSinks {
		if d.Identity == "" {
			return fmt.Errorf("%s: dialSinks[%d] (%q).identity is empty, so no rule can select it; set trustDomain, or give it an identity a rule names",
				noTrustDomain, i, d.Name)
		}
	}
	return nil
}
