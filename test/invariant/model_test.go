package invariant

import (
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
)

// The reference model: what each minion's source holds and has delivered, the
// configuration, and the clusters removed from it whose objects the hub must keep until an
// operator confirms. From it, protected says which objects no sink may lose.

// key names an object: its collection's short name (vs, dr) and namespace/name.
type key struct{ coll, name string }

func (k key) String() string { return k.coll + " " + k.name }

func (k key) namespace() string { ns, _, _ := strings.Cut(k.name, "/"); return ns }

// entry is one cluster of the configuration: its name, the identity its minion presents,
// and the namespace it owns.
type entry struct{ name, identity, ns string }

// removal is what a cluster left the configuration with: the objects protected as its, and
// its minion's identity.
type removal struct {
	identity string
	keys     map[key]bool
}

type model struct {
	src     map[string]map[key]int // minion -> what its source holds: object -> version number
	saved   map[string]map[key]int // what `empty` put aside
	pub     map[string]map[key]int // what the minion last published (its source, while it ran)
	acc     map[string]map[key]int // what of it the hub could take: delivered while its cluster owned it
	running map[string]bool
	src2    map[string]map[key]int  // the identity's second minion's source (a copied Secret)
	second  map[string]bool         // it runs
	either  map[string]map[key]bool // while two minions of an identity run: what either publishes (the hub may serve it)
	// stale are deletions the hub's breaker held when it stopped: it does not keep them
	// held across a restart (the objects come back as the cluster's, until its minion
	// sends the deletions again), so they may be served until the cluster's writer
	// publishes again.
	stale map[key]bool
	// loose are namespaces whose objects the hub may serve, or not, whatever the writer
	// publishes, until it publishes again: an operator accepted what the hub read of the
	// cluster when its last state was unknown (an operator's decision); or the hub restarted
	// after a run whose state file was read-only from its start, which leaves no trace (a
	// documented limit: the file is older than what that run served, and nothing says so;
	// in the replica world, from the end of a replica's such run: its epochs are lost too).
	// A removed cluster's objects in a loose namespace are not protected either.
	loose   map[string]bool
	cfg     []entry
	removed map[string]removal // cluster name -> its objects, until an operator confirms
	version int
}

func baseConfig() []entry {
	out := make([]entry, len(minionNames))
	for i, m := range minionNames {
		out[i] = entry{name: m, identity: m, ns: homeNS[m]}
	}
	return out
}

func newModel() *model {
	m := &model{src: map[string]map[key]int{}, saved: map[string]map[key]int{}, pub: map[string]map[key]int{}, acc: map[string]map[key]int{},
		running: map[string]bool{}, cfg: baseConfig(), removed: map[string]removal{}, src2: map[string]map[key]int{}, second: map[string]bool{}, either: map[string]map[key]bool{}, stale: map[key]bool{}, loose: map[string]bool{}}
	for _, n := range minionNames {
		m.src[n], m.pub[n], m.acc[n] = map[key]int{}, map[key]int{}, map[key]int{}
	}
	return m
}

func (m *model) clusterOf(identity string) *entry {
	for i := range m.cfg {
		if m.cfg[i].identity == identity {
			return &m.cfg[i]
		}
	}
	return nil
}

func (m *model) configured(name string) bool {
	for _, e := range m.cfg {
		if e.name == name {
			return true
		}
	}
	return false
}

// prot is what protects an object: the cluster whose writer publishes it and the version;
// lenient: protected as a removed cluster's, whose writer the hub no longer hears, so any
// version it had is right.
type prot struct {
	cluster string
	version int
	lenient bool
}

// published records what a running minion publishes once the hub has answered it: all of
// it, and, if its cluster is configured, what of it the hub took: what the cluster owns, and
// of the rest the version it took before (a refused update keeps it); what it never took it
// will take only when the minion sends it again under an ownership that allows it.
func (m *model) published(id string, src map[key]int) {
	delete(m.either, id)
	m.pub[id] = maps.Clone(src)
	c := m.clusterOf(id)
	if c == nil {
		return // refused: the hub keeps what it had
	}
	for k := range m.stale {
		if k.namespace() == c.ns {
			delete(m.stale, k) // its deletions are held again, or applied
		}
	}
	delete(m.loose, c.ns)
	acc := map[key]int{}
	for k, v := range src {
		switch last, ok := m.acc[id][k]; {
		case k.namespace() == c.ns:
			acc[k] = v
		case ok:
			acc[k] = last // refused now (not owned): the hub keeps the version it took
		}
	}
	m.acc[id] = acc
}

// publishedByTwo records what an identity's two live minions publish, as the hub may take
// either's (the one that took over last writes; a reconfiguration may let the other take
// over once more): of what the cluster owns, only what both publish is sure to stay, at
// either's version (-1: any).
func (m *model) publishedByTwo(id string) {
	m.pub[id] = maps.Clone(m.src[id])
	c := m.clusterOf(id)
	if c == nil {
		return
	}
	acc := map[key]int{}
	for k := range m.src[id] {
		if _, both := m.src2[id][k]; both && k.namespace() == c.ns {
			acc[k] = -1
		}
	}
	m.acc[id] = acc
	m.either[id] = map[key]bool{}
	for _, src := range []map[key]int{m.src[id], m.src2[id]} {
		for k := range src {
			if k.namespace() == c.ns {
				m.either[id][k] = true
			}
		}
	}
}

// protected returns the objects no sink may lose: those a configured cluster's writer
// published in the namespace it owns (and owns now), and those a removed cluster had
// whose writer still publishes them (the hub cannot hear it: unknown, kept).
func (m *model) protected() map[key]prot {
	out := map[key]prot{}
	for id, acc := range m.acc {
		c := m.clusterOf(id)
		if c == nil {
			continue
		}
		for k, v := range acc {
			if k.namespace() == c.ns && !m.loose[c.ns] {
				out[k] = prot{cluster: c.name, version: v, lenient: v < 0}
			}
		}
	}
	for name, r := range m.removed {
		for k := range r.keys {
			if m.loose[k.namespace()] {
				continue
			}
			if v, ok := m.pub[r.identity][k]; ok {
				if _, ok := out[k]; !ok {
					out[k] = prot{cluster: name, version: v, lenient: true}
				}
			}
		}
	}
	return out
}

// next is the configuration after a reload event (nil: it names a cluster that is not
// configured).
func (m *model) next(e event) []entry {
	switch e.args[0] {
	case "base":
		return baseConfig()
	}
	c := e.args[1]
	if !m.configured(c) {
		return nil
	}
	var out []entry
	for _, x := range m.cfg {
		switch {
		case x.name != c:
		case e.args[0] == "remove":
			continue
		case e.args[0] == "rename":
			x.name = e.args[2]
		case e.args[0] == "reown":
			x.ns = e.args[2]
		}
		out = append(out, x)
	}
	return out
}

// reconfigure makes cfg the configuration: a cluster that leaves it takes what was
// protected as its into removed; one that (re)enters it is no longer removed.
func (m *model) reconfigure(cfg []entry) {
	prot := m.protected()
	old := m.cfg
	m.cfg = cfg
	known := func(name string) bool {
		for _, x := range old {
			if x.name == name {
				return true
			}
		}
		return false
	}
	for _, o := range old {
		if m.configured(o.name) {
			continue
		}
		if n := m.clusterOf(o.identity); n != nil && !known(n.name) {
			continue // renamed: the hub moves what it had to the new name
		}
		r := removal{identity: o.identity, keys: map[key]bool{}}
		for k, p := range prot {
			if p.cluster == o.name {
				r.keys[k] = true
			}
		}
		if prev, ok := m.removed[o.name]; ok { // removed before, added back, removed again
			maps.Copy(r.keys, prev.keys)
		}
		m.removed[o.name] = r
	}
	for _, c := range cfg {
		delete(m.removed, c.name)
	}
}

// withdrawn forgets what the hub took of a writer and no longer has: objects its cluster
// no longer owns after a reload and the breaker does not hold (the reload's withdrawal was
// within the breaker's limits: the operator's decision).
func (m *model) withdrawn(held map[key]string) {
	for id, acc := range m.acc {
		c := m.clusterOf(id)
		if c == nil {
			continue
		}
		for k := range acc {
			if _, ok := held[k]; k.namespace() != c.ns && !ok {
				delete(acc, k)
			}
		}
	}
}

// sinkState is one sink's collections: object -> served version ("cluster/vN").
type sinkState map[key]string

// versionOf returns the N of a served version "cluster/vN" (-1 if it is not one).
func versionOf(served string) int {
	_, v, _ := strings.Cut(served, "/")
	n, err := strconv.Atoi(strings.TrimPrefix(v, "v"))
	if err != nil {
		return -1
	}
	return n
}

// mismatch says how a sink's state differs from what it must hold now: every protected
// object at its version (any version if lenient), and nothing but those and what allowed
// says the hub may still serve (deletions its breaker holds, removed clusters' objects).
// "" when it holds exactly that.
func mismatch(s sinkState, prot map[key]prot, allowed map[key]bool, loose map[string]bool) string {
	var out []string
	for k, p := range prot {
		got, ok := s[k]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("missing %s (published by %s at v%d)", k, p.cluster, p.version))
		case !p.lenient && versionOf(got) != p.version:
			// The version's cluster part may be another's: a renamed cluster's objects are
			// served from the copies its old name left until its minion sends them.
			out = append(out, fmt.Sprintf("%s at %s, want v%d (published by %s)", k, got, p.version, p.cluster))
		}
	}
	for k, v := range s {
		if _, ok := prot[k]; !ok && !allowed[k] && !loose[k.namespace()] {
			out = append(out, fmt.Sprintf("extra %s@%s (no writer publishes it, the hub holds no deletion of it)", k, v))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// secondStarts records that a second minion of identity id starts, its source the objects
// of id's namespace that seed's bits choose, each at a new version, and returns it.
func (m *model) secondStarts(id string, seed int) map[key]int {
	src := map[key]int{}
	for i := range objectNames {
		if (seed>>i)&1 == 1 {
			m.version++
			src[key{collNames[i%2], fmt.Sprintf("%s/o%d", homeNS[id], i)}] = m.version
		}
	}
	m.src2[id], m.second[id] = src, true
	return src
}
