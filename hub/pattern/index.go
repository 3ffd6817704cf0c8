package pattern

import (
	"math"
	"sort"
	"strings"
)

// Overlap between many patterns. The configuration refuses two clusters (or two tenants)
// claiming a common namespace or host; comparing every pattern with every other is
// O(n²), which a configuration of a few thousand patterns already makes seconds of CPU, on
// every load, reload and dry run. Index answers the same question in O(n log n) plus the
// patterns' length: every pattern here matches either one string or every string that
// starts with a given key (a namespace prefix; a host suffix, read backwards), and the
// strings starting with a key are a contiguous range of the sorted keys.

// Term is a pattern as overlap sees it: Prefix terms match every string starting with Key
// ("*" is the Prefix term of ""), the others Key alone. Two terms overlap when one is a
// Prefix term whose Key starts the other's Key, or their Keys are equal.
type Term struct {
	Key    string
	Prefix bool
}

// Overlaps reports whether some string matches both t and o.
func (t Term) Overlaps(o Term) bool {
	switch {
	case t.Prefix && strings.HasPrefix(o.Key, t.Key):
		return true
	case o.Prefix && strings.HasPrefix(t.Key, o.Key):
		return true
	}
	return t.Key == o.Key
}

// Term is n as overlap sees it: a namespace, or every namespace starting with a prefix.
func (n Namespace) Term() Term {
	switch n.kind {
	case Any:
		return Term{Prefix: true}
	case Prefix:
		return Term{Key: n.body, Prefix: true}
	}
	return Term{Key: n.body}
}

// Term is h as overlap sees it: the host, or the suffix, read backwards, so that every
// host ending in ".example.com" is every string starting with "moc.elpmaxe.". Terms of
// hosts overlap exactly when the hosts do (Host.Overlap): "*.a.com" is the Prefix term
// "moc.a.", which "moc.a" (a.com) does not start with.
func (h Host) Term() Term {
	switch h.kind {
	case Any:
		return Term{Prefix: true}
	case Suffix:
		return Term{Key: reverse(h.body), Prefix: true}
	}
	return Term{Key: reverse(h.body)}
}

func reverse(s string) string {
	b := make([]byte, len(s))
	for i := range len(s) {
		b[len(s)-1-i] = s[i]
	}
	return string(b)
}

// none is the tree's and the maps' "no active term".
const none = math.MaxInt

// Index holds terms, numbered by their position in NewIndex's slice, and answers which
// active term (see Add) with the lowest number overlaps a given one. Callers number terms
// in the order their first-error-wins check visits them, so the answer is the error the
// pairwise comparison would have found first. Not safe for concurrent use.
//
// The distinct keys are sorted into nodes. A node's Prefix ancestors are found by walking
// parent links (each links to the longest proper prefix of its key that is some Prefix
// term's key), its descendants are the range of nodes up to end, and a segment tree keeps
// the lowest active number over ranges of nodes.
type Index struct {
	node      []int // term -> node
	prefix    []bool
	parent    []int // node -> the nearest proper-prefix node with a Prefix term, or -1
	end       []int // node -> one past the last node whose key starts with this node's key
	minPrefix []int // node -> the lowest active Prefix term with this key
	minExact  []int // node -> the lowest active other term with this key
	tree      []int // segment tree over nodes (leaves at len(parent)+i): min of both
}

// NewIndex indexes terms, none active. O(n log n) comparisons of keys.
func NewIndex(terms []Term) *Index {
	order := make([]int, len(terms))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return terms[order[a]].Key < terms[order[b]].Key })
	x := &Index{node: make([]int, len(terms)), prefix: make([]bool, len(terms))}
	var keys []string
	var hasPrefix []bool
	for _, t := range order {
		if len(keys) == 0 || keys[len(keys)-1] != terms[t].Key {
			keys = append(keys, terms[t].Key)
			hasPrefix = append(hasPrefix, false)
		}
		n := len(keys) - 1
		x.node[t], x.prefix[t] = n, terms[t].Prefix
		hasPrefix[n] = hasPrefix[n] || terms[t].Prefix
	}
	n := len(keys)
	x.parent, x.end = make([]int, n), make([]int, n)
	x.minPrefix, x.minExact = make([]int, n), make([]int, n)
	x.tree = make([]int, 2*n)
	for i := range x.tree {
		x.tree[i] = none
	}
	// One sweep in key order: the stack holds the Prefix nodes whose keys start the current
	// key, shortest at the bottom (the strings starting with a key follow it in sorted
	// order, so a node leaves the stack at the first key it does not start, which is its
	// end). Each node is pushed and popped once; each comparison reads at most the shorter
	// key, so the sweep costs the keys' total length.
	var stack []int
	for i, k := range keys {
		for len(stack) > 0 && !strings.HasPrefix(k, keys[stack[len(stack)-1]]) {
			x.end[stack[len(stack)-1]] = i
			stack = stack[:len(stack)-1]
		}
		x.parent[i] = -1
		if len(stack) > 0 {
			x.parent[i] = stack[len(stack)-1]
		}
		x.minPrefix[i], x.minExact[i] = none, none
		x.end[i] = i + 1 // a node without a Prefix term has no descendants to ask for
		if hasPrefix[i] {
			stack = append(stack, i)
		}
	}
	for _, s := range stack {
		x.end[s] = n
	}
	return x
}

// Add makes term id active: First answers it from now on.
func (x *Index) Add(id int) {
	n := x.node[id]
	if x.prefix[id] {
		x.minPrefix[n] = min(x.minPrefix[n], id)
	} else {
		x.minExact[n] = min(x.minExact[n], id)
	}
	for i := n + len(x.parent); i > 0; i /= 2 {
		if x.tree[i] <= id {
			break
		}
		x.tree[i] = id
	}
}

// First returns the lowest-numbered active term that overlaps term id, and whether there
// is one (term id itself counts if it is active). Its cost is the number of Prefix terms'
// keys that start term id's key, which are of distinct lengths up to its own, plus
// O(log n): over every term, the terms' total length plus O(n log n).
func (x *Index) First(id int) (int, bool) {
	n := x.node[id]
	best := x.minPrefix[n] // a Prefix term of the same key overlaps every term of it
	for p := x.parent[n]; p >= 0; p = x.parent[p] {
		best = min(best, x.minPrefix[p])
	}
	if x.prefix[id] {
		best = min(best, x.rangeMin(n, x.end[n])) // every term whose key starts with its own
	} else {
		best = min(best, x.minExact[n])
	}
	return best, best != none
}

// rangeMin is the lowest active term in nodes [lo, hi).
func (x *Index) rangeMin(lo, hi int) int {
	best := none
	for lo, hi = lo+len(x.parent), hi+len(x.parent); lo < hi; lo, hi = lo/2, hi/2 {
		if lo&1 == 1 {
			best = min(best, x.tree[lo])
			lo++
		}
		if hi&1 == 1 {
			hi--
			best = min(best, x.tree[hi])
		}
	}
	return best
}
