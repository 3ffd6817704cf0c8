// Package tenancy decides who belongs to which tenant of the hub and what each tenant may
// see.
//
// A tenant is one customer of a vendor-run hub: its clusters (the hub's configuration names
// each cluster in exactly one tenant), its sinks (identity patterns: a sink's authenticated
// identity matches the patterns of at most one tenant, which New checks), its operators
// (names of spiffe://<trustDomain>/operator/NAME identities; OfOperator answers "" for any
// other, whom the hub takes for the vendor's only if its configuration lists them), and its
// exports: what of its clusters' objects it
// shares with which other tenants. A tenant sees its own clusters' objects and what other
// tenants export to it, nothing else; the hub serves a sink the intersection of that and its
// routing subset.
//
// A Set built by Single has one tenant that every cluster, sink and operator belongs to: a
// configuration without tenants.
//
// It is pure: values in, decisions out, no I/O. It does not check ownership (each tenant
// has its own acl.Policy, so that a refusal names only the tenant's own clusters) nor route
// (each tenant has its own routing.Table); the hub refuses overlapping claims across tenants
// when it compiles its configuration.
package tenancy

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshfed/meshfed/hub/pattern"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Tenant is one tenant's membership and exports.
type Tenant struct {
	// Name is the tenant's name: lower case letters, digits and "-" (it labels metrics).
	Name string
	// Clusters are the names of its clusters.
	Clusters []string
	// Sinks are patterns on its sinks' authenticated identities: exact, or ending in one
	// "*" that matches any run of characters ("spiffe://mesh.example.com/sink/acme-*").
	Sinks []string
	// Operators are the names of the operators bound to it.
	Operators []string
	// Exports share some of its clusters' objects with other tenants.
	Exports []Export
}

// Export shares the objects of a tenant's clusters that every non-empty condition selects
// with the tenants named in To.
type Export struct {
	// Name identifies the export (unique within its tenant).
	Name string `json:"name"`
	// To are the names of the tenants that see what it selects.
	To []string `json:"to"`
	// Clusters are names of the exporting tenant's clusters ("*" ends a prefix); empty:
	// every one of them.
	Clusters []string `json:"clusters,omitempty"`
	// Collections are collection names, or prefixes ending in "*"; empty: every one.
	Collections []string `json:"collections,omitempty"`
	// Namespaces are namespace patterns (package hub/pattern); empty: every namespace and
	// the cluster-scoped objects; only "*" includes cluster-scoped ones otherwise.
	Namespaces []string `json:"namespaces,omitempty"`
	// Labels is a Kubernetes label selector on the objects' labels.
	Labels string `json:"labels,omitempty"`
}

// Set is a compiled tenancy: immutable and safe for concurrent use.
type Set struct {
	tenants   []*tenant // sorted by name
	byName    map[string]*tenant
	ofCluster map[string]*tenant
	operators map[string]*tenant
	single    bool
}

type tenant struct {
	spec      Tenant
	sinks     []prefixPattern
	incoming  []*export // exports to this tenant
	receivers []string  // the tenants its exports go to, sorted, once each
}

type export struct {
	spec        Export
	from        *tenant
	clusters    []prefixPattern
	collections []prefixPattern
	namespaces  []pattern.Namespace
	selector    labels.Selector // nil: every object
}

// prefixPattern is exact, or a prefix when it ended in "*".
type prefixPattern struct {
	body   string
	prefix bool
}

func (p prefixPattern) match(s string) bool {
	if p.prefix {
		return strings.HasPrefix(s, p.body)
	}
	return s == p.body
}

func (p prefixPattern) String() string {
	if p.prefix {
		return p.body + "*"
	}
	return p.body
}

func parsePatterns(field string, ps []string) ([]prefixPattern, error) {
	out := make([]prefixPattern, 0, len(ps))
	for i, p := range ps {
		body, prefix := strings.CutSuffix(p, "*")
		if p == "" || strings.Contains(body, "*") {
			return nil, fmt.Errorf("%s[%d]: %q: want an exact value, or a prefix ending in one \"*\"", field, i, p)
		}
		out = append(out, prefixPattern{body: body, prefix: prefix})
	}
	return out, nil
}

// Single is the Set of a configuration without tenants: one tenant, name, owning every one
// of clusters, whose sinks are every identity and whose operators are everyone's.
func Single(name string, clusters []string) *Set {
	t := &tenant{spec: Tenant{Name: name, Clusters: slices.Clone(clusters)}, sinks: []prefixPattern{{prefix: true}}}
	s := &Set{tenants: []*tenant{t}, byName: map[string]*tenant{name: t}, ofCluster: map[string]*tenant{}, operators: map[string]*tenant{}, single: true}
	for _, c := range clusters {
		s.ofCluster[c] = t
	}
	return s
}

// ValidName reports why name cannot be a tenant's, or nil.
func ValidName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("%q: a tenant's name is 1 to 63 characters", name)
	}
	for i := 0; i < len(name); i++ {
		if ch := name[i]; !('a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '-') {
			return fmt.Errorf("%q: a tenant's name uses a-z, 0-9 and \"-\"", name)
		}
	}
	return nil
}

// New compiles tenants; field names the configuration's list ("tenants") in errors. It
// refuses a name used twice, a cluster or an operator in two tenants, sink patterns of two
// tenants that one identity could match, and exports to unknown tenants or of clusters the
// tenant does not have.
func New(field string, tenants []Tenant) (*Set, error) {
	s := &Set{byName: map[string]*tenant{}, ofCluster: map[string]*tenant{}, operators: map[string]*tenant{}}
	// Sink patterns of two tenants may not overlap. Rather than compare each tenant's with
	// every earlier tenant's (O(patterns²): seconds at a few thousand tenants), an index of
	// every tenant's patterns, numbered in order, answers the first earlier pattern each
	// overlaps (pattern.Index). A tenant whose patterns do not parse stops New before its
	// own are looked up or added.
	sinks := make([][]prefixPattern, len(tenants))
	first := make([]int, len(tenants)+1) // tenant -> the number of its first pattern
	var terms []pattern.Term
	var owner []int // pattern -> tenant
	for i, spec := range tenants {
		first[i] = len(terms)
		sinks[i], _ = parsePatterns("", spec.Sinks)
		for _, p := range sinks[i] {
			terms, owner = append(terms, pattern.Term{Key: p.body, Prefix: p.prefix}), append(owner, i)
		}
	}
	first[len(tenants)] = len(terms)
	earlier := pattern.NewIndex(terms)
	for i, spec := range tenants {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := ValidName(spec.Name); err != nil {
			return nil, fmt.Errorf("%s.name: %v", f, err)
		}
		if _, dup := s.byName[spec.Name]; dup {
			return nil, fmt.Errorf("%s.name: %q is used twice", f, spec.Name)
		}
		f = fmt.Sprintf("%s (%q)", f, spec.Name)
		t := &tenant{spec: spec}
		var err error
		if len(spec.Sinks) == 0 {
			return nil, fmt.Errorf("%s.sinks: required: the identities of the tenant's sinks (exact, or a prefix ending in \"*\")", f)
		}
		if _, err = parsePatterns(f+".sinks", spec.Sinks); err != nil {
			return nil, err
		}
		t.sinks = sinks[i]
		for j, c := range spec.Clusters {
			switch other := s.ofCluster[c]; {
			case other == t:
				return nil, fmt.Errorf("%s.clusters[%d]: cluster %q is listed twice", f, j, c)
			case other != nil:
				return nil, fmt.Errorf("%s.clusters[%d]: cluster %q is also tenant %q's", f, j, c, other.spec.Name)
			}
			s.ofCluster[c] = t
		}
		for j, op := range spec.Operators {
			if err := meshtls.CheckName(op); err != nil {
				return nil, fmt.Errorf("%s.operators[%d]: %q is not an operator's name (spiffe://<trustDomain>/operator/NAME): %v", f, j, op, err)
			}
			if other := s.operators[op]; other != nil {
				return nil, fmt.Errorf("%s.operators[%d]: operator %q is also tenant %q's", f, j, op, other.spec.Name)
			}
			s.operators[op] = t
		}
		// The first overlap in the order of comparing each earlier tenant's patterns with
		// each of this one's: the earliest tenant, then this tenant's pattern, then its.
		ja, jb := -1, -1
		for a := first[i]; a < first[i+1]; a++ {
			if b, ok := earlier.First(a); ok && (ja < 0 || owner[b] < owner[jb]) {
				ja, jb = a, b
			}
		}
		if ja >= 0 {
			o := s.tenants[owner[jb]]
			return nil, fmt.Errorf("%s.sinks[%d]: %q and tenant %q's %q could both match one identity: a sink belongs to one tenant", f, ja-first[i], sinks[i][ja-first[i]], o.spec.Name, sinks[owner[jb]][jb-first[owner[jb]]])
		}
		for a := first[i]; a < first[i+1]; a++ {
			earlier.Add(a)
		}
		s.tenants = append(s.tenants, t)
		s.byName[spec.Name] = t
	}
	for i, t := range s.tenants {
		seen, receives := map[string]bool{}, map[string]bool{}
		for j, e := range t.spec.Exports {
			f := fmt.Sprintf("%s[%d] (%q).exports[%d]", field, i, t.spec.Name, j)
			if e.Name == "" || seen[e.Name] {
				return nil, fmt.Errorf("%s.name: %q is empty or used twice", f, e.Name)
			}
			seen[e.Name] = true
			f = fmt.Sprintf("%s (%q)", f, e.Name)
			x, err := compileExport(f, e, t)
			if err != nil {
				return nil, err
			}
			if len(e.To) == 0 {
				return nil, fmt.Errorf("%s.to: required: the tenants it shares with", f)
			}
			for k, to := range e.To {
				dst := s.byName[to]
				switch {
				case dst == nil:
					return nil, fmt.Errorf("%s.to[%d]: %q is not a tenant", f, k, to)
				case dst == t:
					return nil, fmt.Errorf("%s.to[%d]: %q is the exporting tenant itself", f, k, to)
				}
				dst.incoming = append(dst.incoming, x)
				if !receives[to] {
					receives[to] = true
					t.receivers = append(t.receivers, to)
				}
			}
		}
	}
	sort.Slice(s.tenants, func(i, j int) bool { return s.tenants[i].spec.Name < s.tenants[j].spec.Name })
	for _, t := range s.tenants {
		sort.Strings(t.receivers)
	}
	return s, nil
}

func compileExport(f string, e Export, from *tenant) (*export, error) {
	x := &export{spec: e, from: from}
	var err error
	if x.clusters, err = parsePatterns(f+".clusters", e.Clusters); err != nil {
		return nil, err
	}
	// Whether a pattern matches one of the tenant's clusters, by binary search in their
	// sorted names (the names a prefix matches follow it), not by trying each.
	names := slices.Sorted(slices.Values(from.spec.Clusters))
	for k, p := range x.clusters {
		i := sort.SearchStrings(names, p.body)
		if i == len(names) || !p.match(names[i]) {
			return nil, fmt.Errorf("%s.clusters[%d]: %q matches none of tenant %q's clusters", f, k, p, from.spec.Name)
		}
	}
	if x.collections, err = parsePatterns(f+".collections", e.Collections); err != nil {
		return nil, err
	}
	if x.namespaces, err = pattern.ParseNamespaces(f+".namespaces", e.Namespaces); err != nil {
		return nil, err
	}
	if e.Labels != "" {
		if x.selector, err = labels.Parse(e.Labels); err != nil {
			return nil, fmt.Errorf("%s.labels: %v", f, err)
		}
	}
	return x, nil
}

// Single reports whether the Set is a configuration without tenants.
func (s *Set) Single() bool { return s.single }

// Names returns the tenants' names, sorted.
func (s *Set) Names() []string {
	out := make([]string, len(s.tenants))
	for i, t := range s.tenants {
		out[i] = t.spec.Name
	}
	return out
}

// Has reports whether name is a tenant.
func (s *Set) Has(name string) bool { return s.byName[name] != nil }

// OfCluster returns the tenant a cluster belongs to ("" if none).
func (s *Set) OfCluster(cluster string) string {
	if t := s.ofCluster[cluster]; t != nil {
		return t.spec.Name
	}
	return ""
}

// OfSink returns the tenant whose sink patterns match identity ("" if none).
func (s *Set) OfSink(identity string) string {
	for _, t := range s.tenants {
		for _, p := range t.sinks {
			if p.match(identity) {
				return t.spec.Name
			}
		}
	}
	return ""
}

// OfOperator returns the tenant an operator is bound to, or "" for one no tenant names (the
// hub decides whether that one is the vendor's).
func (s *Set) OfOperator(name string) string {
	if t := s.operators[name]; t != nil {
		return t.spec.Name
	}
	return ""
}

// Receivers returns the tenants tenant exports to (they may see some of its clusters'
// objects), sorted.
func (s *Set) Receivers(tenant string) []string {
	if t := s.byName[tenant]; t != nil {
		return t.receivers
	}
	return nil
}

// Sees reports whether tenant may see an object of cluster: one of its own clusters', or
// one an export of the cluster's tenant shares with it. namespace is "" for a
// cluster-scoped object.
func (s *Set) Sees(tenant, cluster, collection, namespace string, lbls map[string]string) bool {
	own := s.ofCluster[cluster]
	if own == nil {
		return false
	}
	if own.spec.Name == tenant {
		return true
	}
	t := s.byName[tenant]
	if t == nil {
		return false
	}
	for _, x := range t.incoming {
		if x.from == own && x.includes(cluster, collection, namespace, lbls) {
			return true
		}
	}
	return false
}

// SeesCluster reports whether tenant may see some object of cluster: its own, or one an
// export could share with it.
func (s *Set) SeesCluster(tenant, cluster string) bool {
	own := s.ofCluster[cluster]
	if own == nil {
		return false
	}
	if own.spec.Name == tenant {
		return true
	}
	if t := s.byName[tenant]; t != nil {
		for _, x := range t.incoming {
			if x.from == own && anyPattern(x.clusters, cluster) {
				return true
			}
		}
	}
	return false
}

func (x *export) includes(cluster, collection, namespace string, lbls map[string]string) bool {
	if !anyPattern(x.clusters, cluster) || !anyPattern(x.collections, collection) {
		return false
	}
	if len(x.namespaces) > 0 {
		ok := false
		for _, p := range x.namespaces {
			ok = ok || p.Match(namespace)
		}
		if !ok {
			return false
		}
	}
	return x.selector == nil || x.selector.Matches(labels.Set(lbls))
}

func anyPattern(ps []prefixPattern, s string) bool {
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		if p.match(s) {
			return true
		}
	}
	return false
}

// Shared is one export as the admin API shows it: who shares what with whom.
type Shared struct {
	From string `json:"from"`
	Export
}

// Exports returns the exports that concern tenant (from it, or to it), or every export
// when tenant is "".
func (s *Set) Exports(tenant string) []Shared {
	var out []Shared
	for _, t := range s.tenants {
		for _, e := range t.spec.Exports {
			if tenant == "" || t.spec.Name == tenant || slices.Contains(e.To, tenant) {
				sh := Shared{From: t.spec.Name, Export: e}
				if tenant != "" && t.spec.Name != tenant {
					sh.To = []string{tenant} // the other tenants it is shared with are not this one's business
				}
				out = append(out, sh)
			}
		}
	}
	return out
}

// Clusters returns tenant's clusters, sorted.
func (s *Set) Clusters(tenant string) []string {
	t := s.byName[tenant]
	if t == nil {
		return nil
	}
	out := slices.Clone(t.spec.Clusters)
	sort.Strings(out)
	return out
}

// Sinks returns the patterns of tenant's sinks' identities ("*" alone: every identity, the
// implicit tenant of a Set without tenants).
func (s *Set) Sinks(tenant string) []string {
	t := s.byName[tenant]
	if t == nil {
		return nil
	}
	out := make([]string, len(t.sinks))
	for i, p := range t.sinks {
		out[i] = p.String()
	}
	return out
}
