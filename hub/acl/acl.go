// Package acl is the hub's ownership ACL: given the hub's list of clusters and what each one
// owns (namespace patterns, host patterns, grants for cluster-scoped collections), it decides
// whether one resource pushed by one cluster may be accepted, and if not, says why in one
// human sentence that can go back to the minion as NACK detail.
//
// A resource from cluster C is accepted only if
//   - C is in the configuration;
//   - its namespace (the part of metadata.name before "/") matches one of C's namespace
//     patterns, or, for a cluster-scoped resource (a name without "/"), its collection is
//     granted to C in ClusterScoped;
//   - every host it claims is owned by C (see Policy.Check for the exact rules, including
//     short names and Gateway/Sidecar "namespace/host" entries).
//
// Hosts extracts the claimed hosts from the serialized body of the Istio kinds that claim
// any (VirtualService, ServiceEntry, DestinationRule, Gateway, Sidecar).
//
// The package is pure: no I/O, no goroutines, no logging, no mutable globals. A Policy is
// immutable once built by New and safe for concurrent use; a configuration change builds a
// new Policy. Check is on the hot path of ingest: everything it needs is precomputed by New,
// it uses no regular expressions and it does not allocate when it accepts.
//
// What it is not: it does not merge clusters' collections, resolve conflicts between clusters
// publishing the same resource, route resources to sinks, or know about tenants (a caller
// that keeps tenants apart builds one Policy per tenant, or checks cross-tenant claims
// itself). Overlapping ownership is allowed here: two clusters may own the same namespace or
// host, and both are accepted; what happens when both publish the same name is the merge
// layer's decision.
package acl

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/meshfed/meshfed/hub/pattern"
)

// Cluster is what one cluster owns.
type Cluster struct {
	// Name is the cluster's name, its authenticated identity in the hub's configuration.
	// Unique and non-empty.
	Name string
	// Namespaces are namespace patterns: "shop" (exact), "team-*" (prefix glob: a single
	// trailing "*"), "*" (every namespace).
	Namespaces []string
	// Hosts are host patterns: "api.example.com" (exact), "*.example.com" (any name ending
	// in ".example.com", at any depth; not "example.com" itself), "*" (every host).
	Hosts []string
	// ClusterScoped lists the collections whose cluster-scoped resources (names without
	// "/") this cluster may publish; "*" grants every collection.
	ClusterScoped []string
}

// Options tune how claims are interpreted.
type Options struct {
	// DomainSuffix completes short host names: "reviews" claimed in namespace "shop"
	// means "reviews.shop.svc.<DomainSuffix>". Default "cluster.local".
	DomainSuffix string
}

// DefaultDomainSuffix is the DomainSuffix used when Options leaves it empty.
const DefaultDomainSuffix = "cluster.local"

// Object is what Check needs to know about one resource.
type Object struct {
	// Collection is the MCP collection, e.g. "istio/networking/v1alpha3/virtualservices".
	Collection string
	// Name is the MCP metadata.name: "namespace/name", or "name" for a cluster-scoped
	// resource.
	Name string
	// Hosts are the hosts the resource claims, as written in it (see the Hosts function).
	Hosts []string
}

// Rejection is Check's answer for an object that is not accepted.
type Rejection struct {
	// Reason is one human sentence saying why.
	Reason string
	// Invalid: the object is refused for what it is, not for who published it (a host that
	// is no host name, or that cannot be resolved), whichever cluster sent it.
	Invalid bool
}

func (r *Rejection) Error() string { return r.Reason }

// Policy is a validated, precomputed ownership configuration. It is immutable and safe
// for concurrent use.
type Policy struct {
	suffix   string
	byName   map[string]*clusterACL
	clusters []*clusterACL // sorted by name; owner indexes below refer to positions here

	nsExact   map[string][]int
	nsPrefix  []prefixOwner
	nsAll     []int
	hostExact map[string][]int
	hostWild  map[string][]int // key: a wildcard pattern without its "*", e.g. ".example.com"
	hostAll   []int
}

type prefixOwner struct {
	prefix  string
	cluster int
}

// clusterACL is one cluster's patterns, precomputed for Check.
type clusterACL struct {
	spec       Cluster // a private copy
	namespaces []pattern.Namespace
	hosts      []pattern.Host

	nsAll    bool
	nsExact  map[string]struct{}
	nsPrefix []string

	hostAll   bool
	hostExact map[string]struct{}
	hostWild  map[string]struct{} // ".example.com" for "*.example.com"

	scopedAll bool
	scoped    map[string]struct{}
}

// New validates clusters and opts and precomputes the policy. The error names every
// problem found, each with its field path, e.g.
//
//	clusters[1] ("west").hosts[0]: "*foo.com": a wildcard must be "*" or start with "*."
//
// New copies what it keeps: the caller may reuse clusters afterwards.
func New(clusters []Cluster, opts Options) (*Policy, error) {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	suffix := opts.DomainSuffix
	if suffix == "" {
		suffix = DefaultDomainSuffix
	} else if _, err := pattern.ParseHost(suffix); err != nil {
		add("options.DomainSuffix: %q: %v", suffix, err)
	} else if strings.HasPrefix(suffix, "*") {
		add("options.DomainSuffix: %q: must not be a wildcard", suffix)
	}

	seen := make(map[string]int, len(clusters))
	parsed := make([]*clusterACL, 0, len(clusters))
	for i, c := range clusters {
		path := fmt.Sprintf("clusters[%d]", i)
		if c.Name == "" {
			add("%s.name: must not be empty", path)
		} else {
			path = fmt.Sprintf("clusters[%d] (%q)", i, c.Name)
			if j, dup := seen[c.Name]; dup {
				add("%s.name: duplicate of clusters[%d]", path, j)
			} else {
				seen[c.Name] = i
			}
		}
		a := &clusterACL{spec: Cluster{
			Name:          c.Name,
			Namespaces:    slices.Clone(c.Namespaces),
			Hosts:         slices.Clone(c.Hosts),
			ClusterScoped: slices.Clone(c.ClusterScoped),
		}}
		for j, p := range c.Namespaces {
			n, err := pattern.ParseNamespace(p)
			if err != nil {
				add("%s.namespaces[%d]: %q: %v", path, j, p, err)
				continue
			}
			a.addNamespace(n)
		}
		for j, p := range c.Hosts {
			h, err := pattern.ParseHost(p)
			if err != nil {
				add("%s.hosts[%d]: %q: %v", path, j, p, err)
				continue
			}
			a.addHost(h)
		}
		for j, p := range c.ClusterScoped {
			switch {
			case p == "":
				add("%s.clusterScoped[%d]: must not be empty", path, j)
			case p == "*":
				a.scopedAll = true
			case strings.Contains(p, "*"):
				add("%s.clusterScoped[%d]: %q: a collection name, or \"*\" alone for every collection", path, j, p)
			default:
				if a.scoped == nil {
					a.scoped = map[string]struct{}{}
				}
				a.scoped[p] = struct{}{}
			}
		}
		parsed = append(parsed, a)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("acl: invalid configuration: %s", strings.Join(problems, "; "))
	}

	p := &Policy{
		suffix:    suffix,
		clusters:  parsed,
		byName:    make(map[string]*clusterACL, len(clusters)),
		nsExact:   map[string][]int{},
		hostExact: map[string][]int{},
		hostWild:  map[string][]int{},
	}
	slices.SortFunc(p.clusters, func(a, b *clusterACL) int { return strings.Compare(a.spec.Name, b.spec.Name) })
	for i, c := range p.clusters {
		p.byName[c.spec.Name] = c
		for _, n := range c.namespaces {
			switch n.Kind() {
			case pattern.Any:
				p.nsAll = append(p.nsAll, i)
			case pattern.Prefix:
				p.nsPrefix = append(p.nsPrefix, prefixOwner{prefix: n.Body(), cluster: i})
			default:
				p.nsExact[n.Body()] = append(p.nsExact[n.Body()], i)
			}
		}
		for _, h := range c.hosts {
			switch h.Kind() {
			case pattern.Any:
				p.hostAll = append(p.hostAll, i)
			case pattern.Suffix:
				p.hostWild[h.Body()] = append(p.hostWild[h.Body()], i)
			default:
				p.hostExact[h.Body()] = append(p.hostExact[h.Body()], i)
			}
		}
	}
	return p, nil
}

// addNamespace adds an owned namespace pattern to the cluster's lookup sets.
func (a *clusterACL) addNamespace(n pattern.Namespace) {
	a.namespaces = append(a.namespaces, n)
	switch n.Kind() {
	case pattern.Any:
		a.nsAll = true
	case pattern.Prefix:
		a.nsPrefix = append(a.nsPrefix, n.Body())
	default:
		if a.nsExact == nil {
			a.nsExact = map[string]struct{}{}
		}
		a.nsExact[n.Body()] = struct{}{}
	}
}

// addHost adds an owned host pattern to the cluster's lookup sets.
func (a *clusterACL) addHost(h pattern.Host) {
	a.hosts = append(a.hosts, h)
	switch h.Kind() {
	case pattern.Any:
		a.hostAll = true
	case pattern.Suffix:
		if a.hostWild == nil {
			a.hostWild = map[string]struct{}{}
		}
		a.hostWild[h.Body()] = struct{}{}
	default:
		if a.hostExact == nil {
			a.hostExact = map[string]struct{}{}
		}
		a.hostExact[h.Body()] = struct{}{}
	}
}

// Cluster returns a copy of the named cluster's configuration.
func (p *Policy) Cluster(name string) (Cluster, bool) {
	c, ok := p.byName[name]
	if !ok {
		return Cluster{}, false
	}
	return Cluster{
		Name:          c.spec.Name,
		Namespaces:    slices.Clone(c.spec.Namespaces),
		Hosts:         slices.Clone(c.spec.Hosts),
		ClusterScoped: slices.Clone(c.spec.ClusterScoped),
	}, true
}

// Check decides whether cluster may publish o: nil if accepted, a *Rejection otherwise.
//
// The rules, applied in this order (the first problem found is reported):
//
//  1. cluster must be in the configuration.
//  2. A namespaced resource (Name "ns/name") must be in a namespace the cluster owns.
//     A cluster-scoped resource (Name without "/") needs its collection, or "*", in the
//     cluster's ClusterScoped.
//  3. Every claimed host, in the order given, must be owned. A host is normalized first:
//     ASCII lowercase, one trailing "." removed; a name without "." (other than "*") is a
//     short name and becomes "<name>.<namespace>.svc.<DomainSuffix>". An exact host is owned
//     by an equal pattern, a wildcard "*.x" when the host ends in ".x", or "*". A wildcard
//     claim "*.a.com" is owned only by "*.a.com", a wider wildcard ("*.com") or "*"; a "*"
//     claim only by "*". An empty host, or one with "*" anywhere but as a leading "*." label
//     or alone, is rejected as malformed, as is one longer than a DNS name (253 characters,
//     also after a short name is completed); so is a short name in a cluster-scoped resource
//     (it has no namespace to resolve against).
//
// Gateway (servers[].hosts) and Sidecar (egress[].hosts) entries are "namespace/host"
// (split at the first "/"; an entry without "/" means "*/host"). An entry whose namespace
// part is "." (the resource's own namespace) or a namespace the cluster owns is accepted
// whatever its host part: it only selects configuration from a namespace the cluster owns.
// An entry whose namespace part starts with "~" (Istio's "no namespace" and Sidecar
// exclusions) narrows what the resource selects and claims nothing, so it is accepted.
// Otherwise ("*", or a namespace the cluster does not own) the host part must be owned as
// above, a short name resolving against the namespace part ("*": the resource's own).
func (p *Policy) Check(cluster string, o Object) error {
	c := p.byName[cluster]
	if c == nil {
		return &Rejection{Reason: fmt.Sprintf("cluster %q is not in the hub's configuration", clip(cluster))}
	}
	ns, _, namespaced := strings.Cut(o.Name, "/")
	if namespaced {
		if !c.ownsNamespace(ns) {
			return &Rejection{Reason: fmt.Sprintf("namespace %q is not owned by cluster %q%s",
				clip(ns), cluster, ownedBy(p.OwnersOfNamespace(ns), cluster))}
		}
	} else {
		ns = ""
		if !c.scopedAll {
			if _, ok := c.scoped[o.Collection]; !ok {
				return &Rejection{Reason: fmt.Sprintf("cluster-scoped %s %q needs an explicit grant for cluster %q",
					clip(o.Collection), clip(o.Name), cluster)}
			}
		}
	}
	if len(o.Hosts) == 0 {
		return nil
	}
	nsForm := kindOf(o.Collection).nsHosts()
	var buf [256]byte
	for _, written := range o.Hosts {
		host, resolveNS := written, ns
		if nsForm {
			hns, hh, ok := strings.Cut(written, "/")
			if !ok {
				hns, hh = "*", written
			}
			switch {
			case hns == ".":
				if namespaced {
					continue
				}
			case strings.HasPrefix(hns, "~"):
				continue
			case hns != "*":
				if c.ownsNamespace(hns) {
					continue
				}
				resolveNS = hns
			}
			host = hh
		}
		b, st := normHost(buf[:0], host, resolveNS, p.suffix)
		switch st {
		case hostInvalid:
			return &Rejection{Reason: fmt.Sprintf("host %q is not a valid host name (cluster %q)", clip(written), cluster), Invalid: true}
		case hostTooLong:
			return &Rejection{Reason: fmt.Sprintf("host %q is longer than %d characters (cluster %q)", clip(written), pattern.MaxName, cluster), Invalid: true}
		case hostUnresolvable:
			return &Rejection{Reason: fmt.Sprintf("short host name %q cannot be resolved: cluster-scoped %s %q has no namespace",
				clip(written), clip(o.Collection), clip(o.Name)), Invalid: true}
		}
		if c.ownsHost(b) {
			continue
		}
		norm := string(b)
		shown := fmt.Sprintf("%q", norm) // at most pattern.MaxName bytes
		if norm != written {
			shown += fmt.Sprintf(" (written %q)", clip(written))
		}
		return &Rejection{Reason: fmt.Sprintf("host %s is not owned by cluster %q%s",
			shown, cluster, ownedBy(p.ownersOfNormHost(norm), cluster))}
	}
	return nil
}

// maxOwnersShown bounds the owner list in a rejection reason.
const maxOwnersShown = 5

// maxShown bounds each pushed value quoted in a rejection reason.
const maxShown = 128

// clip shortens s for a reason: pushed names are not bounded, reasons should be.
func clip(s string) string {
	if len(s) <= maxShown {
		return s
	}
	n := maxShown
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// ownedBy formats ` (owned by "a", "b")`, leaving self out; "" when nobody else owns it.
func ownedBy(owners []string, self string) string {
	owners = slices.DeleteFunc(owners, func(s string) bool { return s == self })
	if len(owners) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString(" (owned by ")
	for i, o := range owners {
		if i == maxOwnersShown {
			fmt.Fprintf(&sb, " and %d more", len(owners)-i)
			break
		}
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%q", o)
	}
	sb.WriteString(")")
	return sb.String()
}

func (c *clusterACL) ownsNamespace(ns string) bool {
	if ns == "" {
		return false
	}
	if c.nsAll {
		return true
	}
	if _, ok := c.nsExact[ns]; ok {
		return true
	}
	for _, pre := range c.nsPrefix {
		if strings.HasPrefix(ns, pre) {
			return true
		}
	}
	return false
}

// ownsHost reports whether c owns b, a normalized claim (see normHost).
func (c *clusterACL) ownsHost(b []byte) bool {
	if c.hostAll {
		return true
	}
	if len(b) == 1 && b[0] == '*' {
		return false
	}
	s := b
	if b[0] == '*' {
		s = b[1:] // ".a.com": owned by the wildcard itself or a wider one
	} else if _, ok := c.hostExact[string(b)]; ok {
		return true
	}
	if len(c.hostWild) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			if _, ok := c.hostWild[string(s[i:])]; ok {
				return true
			}
		}
	}
	return false
}

// OwnersOfNamespace returns the names of the clusters whose namespace patterns match ns,
// sorted.
func (p *Policy) OwnersOfNamespace(ns string) []string {
	if ns == "" {
		return nil
	}
	var idx []int
	idx = append(idx, p.nsAll...)
	idx = append(idx, p.nsExact[ns]...)
	for _, po := range p.nsPrefix {
		if strings.HasPrefix(ns, po.prefix) {
			idx = append(idx, po.cluster)
		}
	}
	return p.names(idx)
}

// OwnersOfHost returns the names of the clusters whose host patterns cover host, sorted.
// host is an exact name or a wildcard claim ("*.a.com", "*"), normalized as in Check (ASCII
// lowercase, one trailing "." removed; short names are taken literally, since there is no
// namespace to resolve them against). A malformed host has no owners.
func (p *Policy) OwnersOfHost(host string) []string {
	var buf [256]byte
	b, st := normHost(buf[:0], host, "", "")
	if st != hostOK {
		return nil
	}
	return p.ownersOfNormHost(string(b))
}

func (p *Policy) ownersOfNormHost(h string) []string {
	var idx []int
	idx = append(idx, p.hostAll...)
	if h == "*" {
		return p.names(idx)
	}
	s := h
	if h[0] == '*' {
		s = h[1:]
	} else {
		idx = append(idx, p.hostExact[h]...)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			idx = append(idx, p.hostWild[s[i:]]...)
		}
	}
	return p.names(idx)
}

// names maps cluster positions to names, sorted and without duplicates.
func (p *Policy) names(idx []int) []string {
	if len(idx) == 0 {
		return nil
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = p.clusters[j].spec.Name
	}
	return out
}

// Results of normHost.
const (
	hostOK = iota
	hostInvalid
	hostUnresolvable // a short name with no namespace to resolve against
	hostTooLong      // longer than a DNS name may be, before or after resolution
)

// normHost appends the normalized form of the claim h to dst: ASCII lowercase, one trailing
// "." removed, a short name completed as "<h>.<ns>.svc.<suffix>" (with ns == "" it is
// unresolvable, or kept as it is when suffix is also "").
//
// A result longer than a DNS name (253) is refused: that keeps the cost of matching, one map
// lookup per "." of the name, bounded whatever a cluster pushes, and the result within the
// caller's stack buffer.
func normHost(dst []byte, h, ns, suffix string) ([]byte, int) {
	if n := len(h); n > 0 && h[n-1] == '.' {
		h = h[:n-1]
	}
	if h == "" {
		return dst, hostInvalid
	}
	if len(h) > pattern.MaxName {
		return dst, hostTooLong
	}
	if h != "*" {
		if i := strings.IndexByte(h, '*'); i > 0 || (i == 0 && (len(h) < 3 || h[1] != '.' || strings.IndexByte(h[1:], '*') >= 0)) {
			return dst, hostInvalid
		}
	}
	for i := 0; i < len(h); i++ {
		ch := h[i]
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		dst = append(dst, ch)
	}
	if h == "*" || strings.IndexByte(h, '.') >= 0 {
		return dst, hostOK
	}
	if ns == "" {
		if suffix == "" {
			return dst, hostOK
		}
		return dst, hostUnresolvable
	}
	if len(h)+len(ns)+len(suffix)+len("..svc.") > pattern.MaxName {
		return dst, hostTooLong
	}
	dst = append(dst, '.')
	dst = append(dst, ns...)
	dst = append(dst, ".svc."...)
	dst = append(dst, suffix...)
	return dst, hostOK
}
