// Package routing decides which part of the federated configuration each sink receives.
//
// Rules select sinks by their authenticated identity and by their SinkNode id and
// annotations, and give them collections, clusters, namespaces (patterns of package
// hub/pattern, the ownership's grammar) and a label selector. A SinkNode's annotations, and
// its id unless the caller proves it (Options.NodeIDsProven), are what the sink says about
// itself: a rule may select by them only together with what is proven (identities, or proven
// node ids), so that they narrow what the identity is given and never grant more, and New
// refuses a rule that selects by claims alone. A sink receives the union of the rules that
// select it; a sink no rule selects receives nothing unless the configuration names a default
// rule. Two kinds of sink are selected only by rules marked for them, never by other rules
// nor by the default: sinks without an authenticated identity (rules marked unauthenticated,
// by what the sink claims: the one place claims alone select) and minions' relays (rules
// marked relays). Sinks selected by the same rules share one Subset (the same pointer), so
// the hub computes, encodes and sends one view for all of them.
//
// It is pure: values in, decisions out, no I/O. It does not authenticate sinks (the identity
// it is given is already verified) and does not check who may publish what (that is the
// ownership ACL).
package routing

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshfed/meshfed/hub/pattern"
)

// Rule gives the sinks it selects a part of the configuration. Within a rule, every non-empty
// condition must hold; an empty condition holds for everything.
type Rule struct {
	// Name identifies the rule (unique, without ","); the admin API and logs use it.
	Name string `json:"name"`

	// Identities are patterns on the sink's authenticated identity, e.g.
	// "spiffe://mesh.example.com/sink/prod-*". "*" matches any run of characters.
	Identities []string `json:"identities,omitempty"`
	// NodeIDs are patterns on the SinkNode id. The id is what the sink claims unless the
	// caller proves it (Options.NodeIDsProven: the hub, under a trust domain, makes it the
	// name in the sink's certificate); a rule selecting by claimed ids must also name
	// identities, which the ids then only narrow.
	NodeIDs []string `json:"nodeIds,omitempty"`
	// Annotations the SinkNode must carry, with value patterns. Annotations are always what
	// the sink says about itself: a rule selecting by them must also name identities (or
	// proven node ids), which they then only narrow.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Unauthenticated: the rule selects only sinks that have no authenticated identity (the
	// hub's serveUnauthenticated listener, for istiod, which presents no client
	// certificate), by the node id and annotations they claim (the only rules that select by
	// claims alone); no other rule, and not the default, selects such sinks. It cannot name
	// identities.
	Unauthenticated bool `json:"unauthenticated,omitempty"`
	// Relays: the rule selects only minions' relays (a cluster subscribing, with its
	// identity, for its own istiod), e.g. identities: [spiffe://<td>/cluster/east]; no
	// other rule, and not the default, selects a relay.
	Relays bool `json:"relays,omitempty"`

	// Collections are patterns on collection names ("istio/networking/*").
	Collections []string `json:"collections,omitempty"`
	// Clusters are patterns on the origin cluster's name.
	Clusters []string `json:"clusters,omitempty"`
	// Namespaces are namespace patterns (package hub/pattern: "shop", "team-*", "*", the same
	// grammar as the clusters' ownership); only "*" includes cluster-scoped resources.
	Namespaces []string `json:"namespaces,omitempty"`
	// Labels is a Kubernetes label selector on the resource's labels ("mesh=shared").
	Labels string `json:"labels,omitempty"`
}

// Config is the routing part of the hub configuration.
type Config struct {
	// Rules, in any order (the union is taken).
	Rules []Rule `json:"rules,omitempty"`
	// Default, if set, is what a sink no rule selects receives. It selects by nothing: it may
	// not name identities, nodeIds or annotations (a condition there would read as a
	// restriction that does not hold). Unset: such a sink receives nothing (every collection
	// it asks for is answered with an empty state).
	Default *Rule `json:"default,omitempty"`
}

// Sink is what the hub knows about a sink when it subscribes.
type Sink struct {
	// Identity is the authenticated transport identity (a SPIFFE ID, or "" in development
	// mode without one).
	Identity string
	// NodeID and Annotations are from the SinkNode the sink sent.
	NodeID      string
	Annotations map[string]string
	// Unauthenticated: the sink has no authenticated identity; only Unauthenticated rules
	// select it.
	Unauthenticated bool
	// Relay: the sink is a minion's relay, subscribing with its cluster's identity; only
	// Relays rules select it (a rule written for sinks, even one matching every identity,
	// must not give a cluster what it gives them), never the default.
	Relay bool
}

// rule is a compiled Rule.
type rule struct {
	name                  string
	unauthenticated       bool
	relays                bool
	identities, nodeIDs   []glob
	annotations           map[string]glob
	collections, clusters []glob
	namespaces            []pattern.Namespace
	selector              labels.Selector // nil: everything
}

// Table is a compiled routing configuration. It is safe for concurrent use.
type Table struct {
	rules []*rule // sorted by name
	def   *rule

	mu      sync.Mutex // guards subsets
	subsets map[string]*Subset
}

// Options is what the caller vouches for about the sinks it will ask about.
type Options struct {
	// NodeIDsProven: the node id of every sink the caller asks about (but unauthenticated
	// ones) is not the sink's claim but a name its authenticated identity proves (the hub,
	// under a trust domain over TLS, replaces the SinkNode id with the name in the sink's
	// certificate). A rule may then select by nodeIds alone, and node ids may stand for
	// identities beside annotations. Unset, a rule selecting by nodeIds must name identities.
	// (The hub also sets it in insecure development mode, where nothing is proven: an
	// identity there is a header anyone sets, no better than a node id.)
	NodeIDsProven bool
}

// New compiles and validates cfg. Errors name the field.
func New(cfg Config, opts Options) (*Table, error) {
	t := &Table{subsets: map[string]*Subset{}}
	seen := map[string]bool{}
	for i, r := range cfg.Rules {
		field := fmt.Sprintf("rules[%d]", i)
		if r.Name == "" {
			return nil, fmt.Errorf("%s.name: required", field)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("%s.name: %q is used twice", field, r.Name)
		}
		seen[r.Name] = true
		cr, err := compile(field, r)
		if err != nil {
			return nil, err
		}
		if err := checkClaims(field, r, opts); err != nil {
			return nil, err
		}
		t.rules = append(t.rules, cr)
	}
	sort.Slice(t.rules, func(i, j int) bool { return t.rules[i].name < t.rules[j].name })
	if cfg.Default != nil {
		d := *cfg.Default
		if d.Name == "" {
			d.Name = "default"
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("default.name: %q is also a rule's name", d.Name)
		}
		if d.Unauthenticated || d.Relays {
			return nil, fmt.Errorf("default: the default never serves sinks without an identity nor relays; give them rules of their own")
		}
		// The default selects every sink no rule selects: a condition written on it would
		// read as a restriction (only these identities, only a sink claiming team=pay) and
		// silently not be one.
		for _, c := range []struct {
			name string
			set  bool
		}{{"identities", len(d.Identities) > 0}, {"nodeIds", len(d.NodeIDs) > 0}, {"annotations", len(d.Annotations) > 0}} {
			if c.set {
				return nil, fmt.Errorf("default.%s: the default selects every sink no rule selects, by nothing: write a rule selecting by %s instead", c.name, c.name)
			}
		}
		cr, err := compile("default", d)
		if err != nil {
			return nil, err
		}
		t.def = cr
	}
	return t, nil
}

func compile(field string, r Rule) (*rule, error) {
	cr := &rule{name: r.Name, unauthenticated: r.Unauthenticated, relays: r.Relays}
	if strings.Contains(r.Name, ",") {
		return nil, fmt.Errorf("%s.name: %q contains \",\", which joins rule names in a subset's key", field, r.Name)
	}
	if r.Unauthenticated && len(r.Identities) > 0 {
		return nil, fmt.Errorf("%s.identities: an unauthenticated rule selects sinks that have no identity", field)
	}
	if r.Unauthenticated && r.Relays {
		return nil, fmt.Errorf("%s: relays subscribe with their cluster's identity: a rule cannot be both unauthenticated and for relays", field)
	}
	var err error
	if cr.identities, err = globs(field+".identities", r.Identities); err != nil {
		return nil, err
	}
	if cr.nodeIDs, err = globs(field+".nodeIds", r.NodeIDs); err != nil {
		return nil, err
	}
	if cr.collections, err = globs(field+".collections", r.Collections); err != nil {
		return nil, err
	}
	if cr.clusters, err = globs(field+".clusters", r.Clusters); err != nil {
		return nil, err
	}
	if cr.namespaces, err = pattern.ParseNamespaces(field+".namespaces", r.Namespaces); err != nil {
		return nil, err
	}
	if len(r.Annotations) > 0 {
		cr.annotations = map[string]glob{}
		for k, v := range r.Annotations {
			if k == "" {
				return nil, fmt.Errorf("%s.annotations: empty key", field)
			}
			cr.annotations[k] = newGlob(v)
		}
	}
	if r.Labels != "" {
		sel, err := labels.Parse(r.Labels)
		if err != nil {
			return nil, fmt.Errorf("%s.labels: %v", field, err)
		}
		cr.selector = sel
	}
	return cr, nil
}

// checkClaims refuses a rule that would give a sink something for what it says about itself:
// a rule (not unauthenticated) that selects by annotations, or by node ids the caller does
// not prove, must also select by something proven (identities, or proven node ids), so that
// the claims only narrow what that grants. Otherwise a sink whose certificate is given three
// objects gets six by claiming team=pay, or another cluster's data by claiming a node id.
func checkClaims(field string, r Rule, opts Options) error {
	if r.Unauthenticated || len(r.Identities) > 0 {
		return nil
	}
	if len(r.NodeIDs) > 0 && !opts.NodeIDsProven {
		return fmt.Errorf("%s.nodeIds: a SinkNode id is what the sink claims here, nothing proves it: "+
			"name identities too (the node ids then narrow what they give), or set the hub's trustDomain (a sink's node id is then the name in its certificate)", field)
	}
	if len(r.Annotations) > 0 && len(r.NodeIDs) == 0 {
		return fmt.Errorf("%s.annotations: annotations are what the sink claims, and select nothing by themselves: "+
			"name identities too (the annotations then narrow what they give), or mark the rule unauthenticated for serveUnauthenticated's sinks", field)
	}
	return nil
}

func globs(field string, patterns []string) ([]glob, error) {
	out := make([]glob, 0, len(patterns))
	for i, p := range patterns {
		if p == "" {
			return nil, fmt.Errorf("%s[%d]: empty pattern", field, i)
		}
		out = append(out, newGlob(p))
	}
	return out, nil
}

// Select returns the Subset for sink s: the union of the rules that select it (or the
// default rule, or nothing). Sinks selected by the same rules get the same *Subset.
func (t *Table) Select(s Sink) *Subset {
	var chosen []*rule
	for _, r := range t.rules {
		if r.selects(s) {
			chosen = append(chosen, r)
		}
	}
	if len(chosen) == 0 && t.def != nil && !s.Unauthenticated && !s.Relay {
		chosen = []*rule{t.def}
	}
	names := make([]string, len(chosen))
	for i, r := range chosen {
		names[i] = r.name
	}
	key := strings.Join(names, ",")
	t.mu.Lock()
	defer t.mu.Unlock()
	if sub := t.subsets[key]; sub != nil {
		return sub
	}
	sub := &Subset{key: key, rules: chosen}
	t.subsets[key] = sub
	return sub
}

// SubsetByKey returns the Subset of the rules named by key (as Subset.Key writes it), if
// every one of them is in the table. A reload uses it to keep a view of the same rules
// with their new definitions.
func (t *Table) SubsetByKey(key string) (*Subset, bool) {
	t.mu.Lock()
	if sub := t.subsets[key]; sub != nil {
		t.mu.Unlock()
		return sub, true
	}
	t.mu.Unlock()
	var chosen []*rule
	if key != "" {
		for _, name := range strings.Split(key, ",") {
			var found *rule
			for _, r := range t.rules {
				if r.name == name {
					found = r
				}
			}
			if found == nil && t.def != nil && t.def.name == name {
				found = t.def
			}
			if found == nil {
				return nil, false
			}
			chosen = append(chosen, found)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if sub := t.subsets[key]; sub != nil {
		return sub, true
	}
	sub := &Subset{key: key, rules: chosen}
	t.subsets[key] = sub
	return sub, true
}

func (r *rule) selects(s Sink) bool {
	if r.unauthenticated != s.Unauthenticated || r.relays != s.Relay {
		return false
	}
	if !anyMatch(r.identities, s.Identity) || !anyMatch(r.nodeIDs, s.NodeID) {
		return false
	}
	for k, g := range r.annotations {
		v, ok := s.Annotations[k]
		if !ok || !g.match(v) {
			return false
		}
	}
	return true
}

// anyMatch reports whether s matches one of gs; an empty list matches everything.
func anyMatch(gs []glob, s string) bool {
	if len(gs) == 0 {
		return true
	}
	for _, g := range gs {
		if g.match(s) {
			return true
		}
	}
	return false
}

// anyNamespace reports whether ns matches one of ps; an empty list matches everything.
func anyNamespace(ps []pattern.Namespace, ns string) bool {
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		if p.Match(ns) {
			return true
		}
	}
	return false
}

// Subset is what a set of rules gives a sink. Subsets are immutable.
type Subset struct {
	key   string
	rules []*rule
}

// Key identifies the subset: the names of its rules, sorted and joined by ","; "" for
// nothing.
func (s *Subset) Key() string { return s.key }

// Rules returns the names of the subset's rules.
func (s *Subset) Rules() []string {
	out := make([]string, len(s.rules))
	for i, r := range s.rules {
		out[i] = r.name
	}
	return out
}

// Empty reports whether the subset includes nothing at all.
func (s *Subset) Empty() bool { return len(s.rules) == 0 }

// WantsCollection reports whether any resource of collection can be in the subset.
func (s *Subset) WantsCollection(collection string) bool {
	for _, r := range s.rules {
		if anyMatch(r.collections, collection) {
			return true
		}
	}
	return false
}

// Includes reports whether a resource is in the subset: some rule includes its collection,
// origin cluster, namespace ("" for cluster-scoped) and labels.
func (s *Subset) Includes(collection, cluster, namespace string, lbls map[string]string) bool {
	for _, r := range s.rules {
		if anyMatch(r.collections, collection) && anyMatch(r.clusters, cluster) && anyNamespace(r.namespaces, namespace) &&
			(r.selector == nil || r.selector.Matches(labels.Set(lbls))) {
			return true
		}
	}
	return false
}

// Match reports whether the routing pattern p matches s: "*" matches any run of characters
// (including "/" and ""), the rest is literal. It is the grammar of a rule's identities,
// node ids, collections and clusters, for a tool that checks a rule against names.
func Match(p, s string) bool { return newGlob(p).match(s) }

// glob is a pattern where "*" matches any run of characters (including "/" and "").
type glob struct {
	exact string   // set when the pattern has no "*"
	parts []string // the pattern split at "*", when it has one
}

func newGlob(p string) glob {
	if !strings.Contains(p, "*") {
		return glob{exact: p}
	}
	return glob{parts: strings.Split(p, "*")}
}

func (g glob) match(s string) bool {
	if g.parts == nil {
		return s == g.exact
	}
	first, last := g.parts[0], g.parts[len(g.parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, mid := range g.parts[1 : len(g.parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return true
}
