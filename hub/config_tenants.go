package hub

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/pattern"
	"github.com/meshfed/meshfed/hub/tenancy"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp/kinds"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Tenants: a vendor's hub serves many customers. Each tenant groups its clusters (their
// identities and what they own) and its sink fleets (its sinks' identities and its routing
// rules); package hub/tenancy decides who belongs to which and what each sees. Isolation
// of what is seen: a tenant's sinks receive only its clusters' objects and what other
// tenants export to it (a route's visibility, below); ownership is checked per tenant (one
// acl.Policy each), so a refusal names only the tenant's own clusters; claims of two tenants
// never overlap (checkTenantClaims), so no name is ever a conflict between tenants.

// DefaultTenant is the tenant of a configuration without tenants: its clusters, routing and
// sharedNamespaces are the top-level ones, every sink is its, and every operator sees it.
const DefaultTenant = api.DefaultTenant

// TenantConfig is one tenant.
type TenantConfig struct {
	// Name labels the tenant in the admin API and metrics: a-z, 0-9 and "-".
	Name string `json:"name"`
	// Sinks are the authenticated identities of its sinks: exact, or a prefix ending in "*"
	// (spiffe://mesh.example.com/sink/acme-*). An identity matches one tenant's at most
	// (overlapping patterns are refused); a sink matching none receives nothing. A minion's
	// relay is its cluster's tenant's.
	Sinks []string `json:"sinks"`
	// Clusters are its clusters, as the top-level clusters of a hub without tenants. What
	// they own may not overlap what another tenant's clusters own (namespaces, hosts, and
	// the collections granted in clusterScoped).
	Clusters []ClusterConfig `json:"clusters,omitempty"`
	// SharedNamespaces are namespace patterns several of its clusters may own.
	SharedNamespaces []string `json:"sharedNamespaces,omitempty"`
	// Routing gives each of its sinks its subset of what the tenant sees. Rules may not be
	// unauthenticated: a sink without an identity is no tenant's.
	Routing routing.Config `json:"routing"`
	// Exports share some of its clusters' objects with other tenants (see tenancy.Export):
	// the only way one tenant's objects reach another's sinks.
	Exports []tenancy.Export `json:"exports,omitempty"`
	// Operators are the names of its operators (spiffe://<trustDomain>/operator/NAME): over
	// adminTLS they see and act on this tenant only. The vendor's are the top-level
	// operators; with tenants, an operator listed nowhere reads nothing.
	Operators []string `json:"operators,omitempty"`
	// Limits overrides the fields of the hub's tenantLimits it sets.
	Limits *TenantLimits `json:"limits,omitempty"`
}

// tenantGroups returns the configuration's tenants: c.Tenants, or the one implicit tenant of
// a configuration without them. Each comes with the prefix of its fields in errors.
func (c *Config) tenantGroups() []tenantGroup {
	if len(c.Tenants) == 0 {
		return []tenantGroup{{TenantConfig: &TenantConfig{Name: DefaultTenant, Clusters: c.Clusters, SharedNamespaces: c.SharedNamespaces, Routing: c.Routing}}}
	}
	out := make([]tenantGroup, len(c.Tenants))
	for i := range c.Tenants {
		out[i] = tenantGroup{TenantConfig: &c.Tenants[i], field: fmt.Sprintf("tenants[%d] (%q).", i, c.Tenants[i].Name)}
	}
	return out
}

// tenantGroup is a tenant and the prefix of its fields in errors ("" for the implicit one).
type tenantGroup struct {
	*TenantConfig
	field string
}

// allClusters returns every tenant's clusters, in the configuration's order.
func (c *Config) allClusters() []ClusterConfig {
	if len(c.Tenants) == 0 {
		return c.Clusters
	}
	var out []ClusterConfig
	for _, t := range c.Tenants {
		out = append(out, t.Clusters...)
	}
	return out
}

// checkTenantsShape refuses top-level clusters, routing or sharedNamespaces beside tenants:
// with tenants, each is a tenant's.
func (c *Config) checkTenantsShape() error {
	if len(c.Tenants) == 0 {
		return nil
	}
	switch {
	case len(c.Clusters) > 0:
		return fmt.Errorf("clusters: with tenants, each cluster is listed under its tenant (tenants[].clusters)")
	case len(c.Routing.Rules) > 0 || c.Routing.Default != nil:
		return fmt.Errorf("routing: with tenants, each tenant has its own routing (tenants[].routing)")
	case len(c.SharedNamespaces) > 0:
		return fmt.Errorf("sharedNamespaces: with tenants, each tenant has its own (tenants[].sharedNamespaces)")
	}
	for i, t := range c.Tenants {
		for j, r := range t.Routing.Rules {
			if r.Unauthenticated {
				return fmt.Errorf("tenants[%d] (%q).routing.rules[%d] (%q).unauthenticated: a sink without an identity cannot be told to be any tenant's", i, t.Name, j, r.Name)
			}
		}
	}
	return nil
}

// tenantComp is one tenant, compiled.
type tenantComp struct {
	name    string
	policy  *acl.Policy
	routes  *routing.Table
	limits  TenantLimits
	routing routing.Config // as configured: part of its sight
}

// sight is what decides which objects a tenant's views hold: its routing, its clusters and
// sinks, the exports that concern it and the clusters of the tenants exporting to it. A
// reload recomputes the views of a tenant whose sight changed, and only those.
type sight struct {
	Routing   routing.Config
	Clusters  []string
	Sinks     []string
	Exports   []tenancy.Shared
	Exporters map[string][]string
}

// sight returns tenant's sight under c (nil for a tenant c does not have).
func (c *compiled) sight(tenant string) *sight {
	t := c.tenant[tenant]
	if t == nil {
		return nil
	}
	s := &sight{Routing: t.routing, Clusters: c.tenants.Clusters(tenant), Sinks: c.tenants.Sinks(tenant), Exports: c.tenants.Exports(tenant), Exporters: map[string][]string{}}
	for _, x := range s.Exports {
		s.Exporters[x.From] = c.tenants.Clusters(x.From)
	}
	return s
}

// compileTenants builds each tenant's ownership policy and routing table, and the tenancy
// set; out.clusters and out.identity are complete.
func (c *Config) compileTenants(ctx context.Context, out *compiled, groups []tenantGroup) error {
	out.tenant = map[string]*tenantComp{}
	specs := make([]tenancy.Tenant, 0, len(groups))
	table, err := kinds.NewTable(c.Kinds) // valid: compile has built it
	if err != nil {
		return err
	}
	for _, g := range groups {
		if err := ctx.Err(); err != nil {
			return err
		}
		tc := &tenantComp{name: g.Name, limits: c.TenantLimits.over(g.Limits), routing: g.Routing}
		if err := g.Limits.check(g.field + "limits"); err != nil {
			return err
		}
		owners := ownersOf(g.Clusters)
		var err error
		if tc.policy, err = acl.New(owners, acl.Options{DomainSuffix: c.DomainSuffix}); err != nil {
			return err
		}
		shared, err := pattern.ParseNamespaces(g.field+"sharedNamespaces", g.SharedNamespaces)
		if err != nil {
			return err
		}
		if err := checkNamespaceOverlap(ctx, g.Clusters, shared); err != nil {
			return err
		}
		// Rules may select by node ids alone where sink makes them the certificates' names,
		// and in insecure development mode, where identities are a header anyone sets, so
		// requiring one beside a node id would prove nothing (a rule tried there keeps its
		// meaning under a trust domain). Annotations only narrow, everywhere.
		if tc.routes, err = routing.New(g.Routing, routing.Options{NodeIDsProven: out.nodeIDsProven() || c.Insecure}); err != nil {
			return fmt.Errorf("%srouting.%w", g.field, err)
		}
		if err := c.checkSinkTrust(out, g); err != nil {
			return err
		}
		if err := checkExportCollections(g, table); err != nil {
			return err
		}
		out.tenant[g.Name] = tc
		out.ownership.owners[g.Name] = owners
		spec := tenancy.Tenant{Name: g.Name, Sinks: g.Sinks, Operators: g.Operators, Exports: g.Exports}
		for _, cl := range g.Clusters {
			spec.Clusters = append(spec.Clusters, cl.Name)
		}
		specs = append(specs, spec)
	}
	if len(c.Operators) > 0 || len(c.Tenants) > 0 {
		out.vendorOps = map[string]bool{}
	}
	for i, op := range c.Operators {
		if err := meshtls.CheckName(op); err != nil {
			return fmt.Errorf("operators[%d]: %q is not an operator's name (spiffe://<trustDomain>/operator/NAME): %v", i, op, err)
		}
		for _, t := range c.Tenants {
			if slices.Contains(t.Operators, op) {
				return fmt.Errorf("operators[%d]: operator %q is also tenant %q's: the vendor's operators see every tenant", i, op, t.Name)
			}
		}
		out.vendorOps[op] = true
	}
	if len(c.Tenants) == 0 {
		out.tenants = tenancy.Single(DefaultTenant, specs[0].Clusters)
		return nil
	}
	if out.tenants, err = tenancy.New("tenants", specs); err != nil {
		return err
	}
	return checkTenantClaims(ctx, groups)
}

// checkExportCollections refuses an export's collection (one without "*") that is not a
// collection name of the built-in and configured kinds: tenancy compares them with the
// objects' collections as they are, so any other spelling ("gw", "Gateway") would share
// nothing, silently. A file's are resolved to collection names when it is parsed
// (canonicalCollections); this catches a configuration built otherwise.
func checkExportCollections(g tenantGroup, table *kinds.Table) error {
	for i, e := range g.Exports {
		for j, coll := range e.Collections {
			if strings.Contains(coll, "*") {
				continue
			}
			field := fmt.Sprintf("%sexports[%d] (%q).collections[%d]", g.field, i, e.Name, j)
			k, err := table.Resolve(coll)
			if err != nil {
				return fmt.Errorf("%s: %w", field, err)
			}
			if k.Collection != coll {
				return fmt.Errorf("%s: %q: want the collection name, %s", field, coll, k.Collection)
			}
		}
	}
	return nil
}

func ownersOf(clusters []ClusterConfig) []acl.Cluster {
	owners := make([]acl.Cluster, 0, len(clusters))
	for _, cl := range clusters {
		owners = append(owners, acl.Cluster{Name: cl.Name, Namespaces: cl.Namespaces, Hosts: cl.Hosts, ClusterScoped: cl.ClusterScoped})
	}
	return owners
}

// checkTenantClaims refuses claims of two tenants that overlap: a namespace, a host, or the
// cluster-scoped objects of a collection both could own. Within a tenant, overlaps are its
// own business (sharedNamespaces, conflicts); across tenants one could publish what the
// other's sinks serve, or win a conflict over it. The patterns are valid (each tenant's
// acl.New has checked them). An error names both fields, each as a path into the
// configuration, and what they both match: of several overlaps, the first in configuration
// order (tenants a < b, a's cluster, b's cluster, namespaces before hosts before
// clusterScoped, a's pattern, b's), as comparing every pair in that order would.
//
// Comparing every pair is O(claims²); a pattern.Index per kind of claim finds, for each
// claim of a tenant, the first claim of a later tenant overlapping it, in O(n log n) plus
// the patterns' length (a cluster-scoped grant is an exact term, "*" the term matching
// everything).
func checkTenantClaims(ctx context.Context, groups []tenantGroup) error {
	const (
		namespaces = iota
		hosts
		scoped
		claimKinds
	)
	type claim struct {
		tenant, cluster, index int // groups[tenant].Clusters[cluster]'s claim [index]
		ns                     pattern.Namespace
		host                   pattern.Host
		coll                   string
	}
	var claims [claimKinds][]claim
	var terms [claimKinds][]pattern.Term
	for t, g := range groups {
		for j, cl := range g.Clusters {
			ns, _ := pattern.ParseNamespaces("", cl.Namespaces)
			for k, p := range ns {
				claims[namespaces] = append(claims[namespaces], claim{tenant: t, cluster: j, index: k, ns: p})
				terms[namespaces] = append(terms[namespaces], p.Term())
			}
			for k, h := range cl.Hosts {
				p, _ := pattern.ParseHost(h)
				claims[hosts] = append(claims[hosts], claim{tenant: t, cluster: j, index: k, host: p})
				terms[hosts] = append(terms[hosts], p.Term())
			}
			for k, coll := range cl.ClusterScoped {
				claims[scoped] = append(claims[scoped], claim{tenant: t, cluster: j, index: k, coll: coll})
				term := pattern.Term{Key: coll}
				if coll == "*" {
					term = pattern.Term{Prefix: true} // every collection
				}
				terms[scoped] = append(terms[scoped], term)
			}
		}
	}
	var index [claimKinds]*pattern.Index
	var next [claimKinds]int // per kind: the first claim of the tenants not yet indexed
	for kind := range claimKinds {
		index[kind], next[kind] = pattern.NewIndex(terms[kind]), len(claims[kind])
	}
	// A pair found, as the order that decides which is reported: the other tenant, this
	// tenant's cluster, the other's, the kind, this claim, the other's.
	type pair struct{ kind, a, b int }
	before := func(p, q pair) bool {
		ca, cb, qa, qb := claims[p.kind][p.a], claims[p.kind][p.b], claims[q.kind][q.a], claims[q.kind][q.b]
		pk := []int{cb.tenant, ca.cluster, cb.cluster, p.kind, ca.index, cb.index}
		qk := []int{qb.tenant, qa.cluster, qb.cluster, q.kind, qa.index, qb.index}
		for i := range pk {
			if pk[i] != qk[i] {
				return pk[i] < qk[i]
			}
		}
		return false
	}
	var found *pair // the pair of the earliest tenant so far
	for t := len(groups) - 1; t >= 0; t-- {
		var best *pair
		for kind := range claimKinds {
			first := next[kind]
			for first > 0 && claims[kind][first-1].tenant == t {
				first--
			}
			for a := first; a < next[kind]; a++ {
				if err := checkEvery(ctx, a); err != nil {
					return err
				}
				if b, ok := index[kind].First(a); ok {
					if p := (pair{kind, a, b}); best == nil || before(p, *best) {
						best = &p
					}
				}
			}
			for a := first; a < next[kind]; a++ {
				index[kind].Add(a)
			}
			next[kind] = first
		}
		if best != nil {
			found = best
		}
	}
	if found == nil {
		return nil
	}
	x, y := claims[found.kind][found.a], claims[found.kind][found.b]
	field := func(c claim) string {
		g := groups[c.tenant]
		return fmt.Sprintf("%sclusters[%d] (%q)", g.field, c.cluster, g.Clusters[c.cluster].Name)
	}
	switch found.kind {
	case namespaces:
		ov, _ := x.ns.Overlap(y.ns)
		return fmt.Errorf("%s.namespaces[%d] (%q) and %s.namespaces[%d] (%q) both match namespaces %q: tenants may not share a namespace; export objects instead",
			field(x), x.index, x.ns, field(y), y.index, y.ns, ov)
	case hosts:
		ov, _ := x.host.Overlap(y.host)
		return fmt.Errorf("%s.hosts[%d] (%q) and %s.hosts[%d] (%q) both match hosts %q: tenants may not share a host",
			field(x), x.index, x.host, field(y), y.index, y.host, ov)
	}
	both := x.coll
	if both == "*" {
		both = y.coll
	}
	return fmt.Errorf("%s.clusterScoped[%d] (%q) and %s.clusterScoped[%d] (%q) both grant cluster-scoped %s: tenants may not publish the same cluster-scoped names",
		field(x), x.index, x.coll, field(y), y.index, y.coll, both)
}

// TenantLimits bound what one tenant's peers may take from the hub, all of them together, so
// that one tenant's load does not slow another's (the clusters' quotas bound each cluster;
// tenant_limits.go enforces these). The hub's tenantLimits also bound the peers of no
// tenant, all together. In a configuration without tenants they do not apply: there is no
// other tenant to keep apart from. A field at 0 bounds nothing.
type TenantLimits struct {
	// MaxStreams is how many streams its peers (its minions' pushes, their relays, its
	// sinks, on every listener) may keep open at once; one more is refused with
	// ResourceExhausted (tenant_too_many_streams).
	MaxStreams int `json:"maxStreams,omitempty"`
	// StreamsPerSecond and StreamBurst bound how fast its peers open streams, all together;
	// faster ones are refused with ResourceExhausted (tenant_rate_limited) and told when to
	// retry.
	StreamsPerSecond float64 `json:"streamsPerSecond,omitempty"`
	StreamBurst      int     `json:"streamBurst,omitempty"`
	// PushesPerSecond and PushBurst bound how fast its clusters' pushes are applied, all
	// together; faster pushes wait on their stream, like a cluster's own quota
	// (meshfed_tenant_pushes_delayed_total).
	PushesPerSecond float64 `json:"pushesPerSecond,omitempty"`
	PushBurst       int     `json:"pushBurst,omitempty"`
	// MaxObjects and MaxBytes bound what its clusters hold, all together (as served); an
	// object over either is refused at ingest, naming the tenant's bound.
	MaxObjects int   `json:"maxObjects,omitempty"`
	MaxBytes   int64 `json:"maxBytes,omitempty"`
}

// over returns l with the fields o sets.
func (l TenantLimits) over(o *TenantLimits) TenantLimits { return ops.Overlay(l, o) }

// check refuses negative limits (0 is no limit for each).
func (l *TenantLimits) check(field string) error {
	if l == nil {
		return nil
	}
	switch {
	case l.MaxStreams < 0, l.StreamsPerSecond < 0, l.StreamBurst < 0, l.PushesPerSecond < 0, l.PushBurst < 0, l.MaxObjects < 0, l.MaxBytes < 0:
		return fmt.Errorf("%s: limits may not be negative (0: none)", field)
	}
	return nil
}
