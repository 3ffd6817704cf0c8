package kinds

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Table is a set of kinds, the built-in ones and those a configuration adds, and the one
// resolver of the names users type for them. A name resolves, case aside, when it is:
//
//   - a collection: istio/networking/v1alpha3/virtualservices
//   - group/version/Kind or group/version/plural, in any version (every served version of
//     a kind shares one schema): networking.istio.io/v1/VirtualService
//   - the kind, its plural, its singular (the kind in lower case) or a short name of its
//     CRD: VirtualService, virtualservices, virtualservice, vs
//   - any of those four followed by "." and the group, as kubectl takes them:
//     virtualservices.networking.istio.io
//
// A name two kinds answer to is ambiguous, an error naming both; a name none answers to is
// an error listing the known ones. A Table never changes once built.
type Table struct {
	kinds  []Kind                   // sorted by collection
	byColl map[string]int           // exact collection
	byName map[string][]int         // lower-case names but group/version/NAME -> kinds
	byGN   map[string][]int         // lower-case "group/name", for group/version/name
	byGK   map[schema.GroupKind]int // type URLs
	bodies []bodyType               // per kind, what Check expects of its bodies
}

// NewTable returns the built-in kinds and extra, a configuration's kinds. An extra kind with
// a built-in collection replaces the built-in one. Errors name the extra kind as kinds[i]:
// an invalid kind, a collection listed twice, a group and kind that is already another
// collection's (istiod's type URLs name a group and kind, so each must be one collection),
// a collection that is another kind's name.
func NewTable(extra []Kind) (*Table, error) {
	t := &Table{byColl: map[string]int{}, byName: map[string][]int{}, byGN: map[string][]int{}, byGK: map[schema.GroupKind]int{}}
	field := map[string]string{} // collection -> kinds[i], for errors
	all := append([]Kind(nil), builtinKinds...)
	for i, k := range all {
		t.byColl[k.Collection] = i
	}
	for i, k := range extra {
		f := fmt.Sprintf("kinds[%d]", i)
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if prev, dup := field[k.Collection]; dup {
			return nil, fmt.Errorf("%s: collection %q is also %s's", f, k.Collection, prev)
		}
		field[k.Collection] = f
		if j, ok := t.byColl[k.Collection]; ok {
			all[j] = k
			continue
		}
		t.byColl[k.Collection] = len(all)
		all = append(all, k)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Collection < all[j].Collection })
	t.kinds = all
	t.bodies = make([]bodyType, len(all))
	for i, k := range all {
		t.byColl[k.Collection] = i
		// Resolved once here, not per resource: Check runs for every resource of every push.
		bt, err := newBodyType(k)
		if err != nil {
			return nil, err
		}
		t.bodies[i] = bt
		gk := schema.GroupKind{Group: k.Group, Kind: k.Kind}
		if j, dup := t.byGK[gk]; dup {
			f := field[k.Collection]
			if f == "" {
				f = field[all[j].Collection]
			}
			return nil, fmt.Errorf("%s: %s is both collection %s and %s: a group and kind must be one collection (istiod requests it by group/version/Kind)",
				f, kindGroup(k), all[j].Collection, k.Collection)
		}
		t.byGK[gk] = i
		group := strings.ToLower(k.Group)
		add := func(m map[string][]int, key string) {
			if n := len(m[key]); n == 0 || m[key][n-1] != i {
				m[key] = append(m[key], i)
			}
		}
		add(t.byName, strings.ToLower(k.Collection))
		for _, n := range k.names() {
			add(t.byName, n)
			if group != "" {
				add(t.byName, n+"."+group)
			}
		}
		add(t.byGN, strings.ToLower(typeURLGroup(k.Group))+"/"+strings.ToLower(k.Kind))
		add(t.byGN, strings.ToLower(typeURLGroup(k.Group))+"/"+strings.ToLower(k.Resource))
	}
	// A collection must name its own kind and nothing else: otherwise a kind's collection
	// would shadow another kind's name, or two collections differ only in case.
	for i, k := range all {
		if c := t.named(strings.ToLower(k.Collection)); len(c) != 1 || c[0] != i {
			f := field[k.Collection]
			if f == "" {
				f = field[all[otherThan(c, i)].Collection]
			}
			return nil, fmt.Errorf("%s: collection %q is also a name of %s", f, k.Collection, t.list(without(c, i)))
		}
	}
	return t, nil
}

// names are the lower-case names of k a user may type alone: the kind, its singular (the
// kind in lower case, as in every Istio CRD), its plural and its short names.
func (k Kind) names() []string {
	return append([]string{strings.ToLower(k.Kind), strings.ToLower(k.Resource)}, k.ShortNames...)
}

// kindGroup is Kind.group, the kind's unambiguous name ("Kind" for the core group).
func kindGroup(k Kind) string {
	if k.Group == "" {
		return k.Kind
	}
	return k.Kind + "." + k.Group
}

// Kinds returns the table's kinds, sorted by collection.
func (t *Table) Kinds() []Kind { return append([]Kind(nil), t.kinds...) }

// Collections returns the table's collection names, sorted.
func (t *Table) Collections() []string {
	out := make([]string, len(t.kinds))
	for i, k := range t.kinds {
		out[i] = k.Collection
	}
	return out
}

// Lookup returns the kind of a collection name, exactly as written.
func (t *Table) Lookup(collection string) (Kind, bool) {
	i, ok := t.byColl[collection]
	if !ok {
		return Kind{}, false
	}
	return t.kinds[i], true
}

// Resolve returns the kind a user means by name (see Table). A collection name resolves to
// itself.
func (t *Table) Resolve(name string) (Kind, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return Kind{}, fmt.Errorf("empty collection name: known: %s", t.known())
	}
	c := t.candidates(name)
	switch len(c) {
	case 0:
		return Kind{}, fmt.Errorf("unknown collection %q: known: %s", name, t.known())
	case 1:
		return t.kinds[c[0]], nil
	}
	return Kind{}, fmt.Errorf("%q is ambiguous: it names %s; type the collection or Kind.group", name, t.list(c))
}

// candidates are the kinds name may mean.
func (t *Table) candidates(name string) []int {
	if i, ok := t.byColl[name]; ok {
		return []int{i}
	}
	return t.named(strings.ToLower(name))
}

// named are the kinds a lower-case name may mean.
func (t *Table) named(lower string) []int {
	c := t.byName[lower]
	g, v, n, ok := splitGVN(lower)
	if !ok || v == "" {
		return c
	}
	out := append([]int(nil), c...)
	for _, i := range t.byGN[g+"/"+n] {
		if !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	return out
}

// splitGVN splits group/version/name.
func splitGVN(s string) (group, version, name string, ok bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// ResolveAll resolves a list of typed names, field in a configuration (or a flag), to their
// collection names, in order. Errors name the entry, field[i]; a collection named twice,
// under any names, is an error.
func (t *Table) ResolveAll(field string, names []string) ([]string, error) {
	out := make([]string, len(names))
	at := map[string]int{}
	for i, n := range names {
		k, err := t.Resolve(n)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		if j, dup := at[k.Collection]; dup {
			return nil, fmt.Errorf("%s[%d]: %q is %s, already listed as %s[%d] (%q)", field, i, n, k.Collection, field, j, names[j])
		}
		at[k.Collection] = i
		out[i] = k.Collection
	}
	return out, nil
}

// CheckCanonical checks that names (field in a configuration) are collection names of the
// table, each listed once: what ResolveAll returns. A configuration stores collections so
// after it is parsed; a program building one must write them so.
func (t *Table) CheckCanonical(field string, names []string) error {
	canon, err := t.ResolveAll(field, names)
	if err != nil {
		return err
	}
	for i, c := range canon {
		if c != names[i] {
			return fmt.Errorf("%s[%d]: %q: want the collection name, %s", field, i, names[i], c)
		}
	}
	return nil
}

// ForTypeURL resolves an MCP-over-xDS type URL as istiod names them, "group/version/Kind"
// (networking.istio.io/v1/VirtualService; "core" for the core group), to the kind of that
// group and kind: every served version of a kind shares one schema, so the version does not
// matter. Unlike Resolve it takes nothing else: the name comes from istiod, not a user.
func (t *Table) ForTypeURL(typeURL string) (Kind, bool) {
	g, v, kind, ok := splitGVN(typeURL)
	if !ok || v == "" {
		return Kind{}, false
	}
	if g == "core" {
		g = ""
	}
	i, ok := t.byGK[schema.GroupKind{Group: g, Kind: kind}]
	if !ok {
		return Kind{}, false
	}
	return t.kinds[i], true
}

// known lists every kind: its collection, kind and short names.
func (t *Table) known() string {
	out := make([]string, len(t.kinds))
	for i, k := range t.kinds {
		out[i] = k.Collection + " (" + strings.Join(append([]string{k.Kind}, k.ShortNames...), ", ") + ")"
	}
	return strings.Join(out, "; ")
}

// list names the kinds at c: collection (Kind.group).
func (t *Table) list(c []int) string {
	out := make([]string, len(c))
	for i, j := range c {
		out[i] = t.kinds[j].Collection + " (" + kindGroup(t.kinds[j]) + ")"
	}
	return strings.Join(out, ", ")
}

func without(c []int, i int) []int {
	var out []int
	for _, j := range c {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

func otherThan(c []int, i int) int {
	for _, j := range c {
		if j != i {
			return j
		}
	}
	return i
}
