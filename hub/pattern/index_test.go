package pattern

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomNamespace is a valid namespace pattern over a small alphabet, so that random sets
// overlap often: exact, prefix or "*".
func randomNamespace(r *rand.Rand) string {
	if r.IntN(20) == 0 {
		return "*"
	}
	var b strings.Builder
	for range 1 + r.IntN(4) {
		b.WriteByte("ab-"[r.IntN(3)])
	}
	if r.IntN(2) == 0 {
		b.WriteByte('*')
	}
	return b.String()
}

// randomHost is a valid host pattern over a small alphabet: exact, "*." or "*".
func randomHost(r *rand.Rand) string {
	if r.IntN(20) == 0 {
		return "*"
	}
	labels := make([]string, 1+r.IntN(3))
	for i := range labels {
		labels[i] = []string{"a", "b", "ab", "ba"}[r.IntN(4)]
	}
	h := strings.Join(labels, ".")
	if r.IntN(2) == 0 {
		return "*." + h
	}
	return h
}

// check compares the index with the pairwise answer (overlaps(i, j)) for terms: after each
// of a random order of Adds, First of every term is the lowest active term overlapping it.
func check(t *testing.T, r *rand.Rand, what []string, terms []Term, overlaps func(i, j int) bool) {
	t.Helper()
	x := NewIndex(terms)
	active := make([]bool, len(terms))
	for _, a := range r.Perm(len(terms)) {
		x.Add(a)
		active[a] = true
		for q := range terms {
			want, wantOK := -1, false
			for j := range terms {
				if active[j] && overlaps(q, j) {
					want, wantOK = j, true
					break
				}
			}
			got, ok := x.First(q)
			if ok != wantOK || (ok && got != want) {
				t.Fatalf("patterns %q, active %v: First(%d: %q) = %d, %v; want %d, %v", what, active, q, what[q], got, ok, want, wantOK)
			}
		}
	}
}

// The index answers what comparing every pair with Namespace.Overlap and Host.Overlap
// answers, on random sets of patterns (property test); a Term overlaps another exactly when
// its pattern does.
func TestIndexAgreesWithPairwiseOverlap(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 1))
	for round := range 400 {
		n := 1 + r.IntN(24)
		ns, hs := make([]Namespace, n), make([]Host, n)
		nsText, hsText := make([]string, n), make([]string, n)
		nsTerms, hsTerms := make([]Term, n), make([]Term, n)
		for i := range n {
			var err error
			nsText[i], hsText[i] = randomNamespace(r), randomHost(r)
			if ns[i], err = ParseNamespace(nsText[i]); err != nil {
				t.Fatal(err)
			}
			if hs[i], err = ParseHost(hsText[i]); err != nil {
				t.Fatal(err)
			}
			nsTerms[i], hsTerms[i] = ns[i].Term(), hs[i].Term()
		}
		for i := range n {
			for j := range n {
				if _, ok := ns[i].Overlap(ns[j]); ok != nsTerms[i].Overlaps(nsTerms[j]) {
					t.Fatalf("round %d: namespaces %q, %q overlap %v, their terms %v", round, nsText[i], nsText[j], ok, !ok)
				}
				if _, ok := hs[i].Overlap(hs[j]); ok != hsTerms[i].Overlaps(hsTerms[j]) {
					t.Fatalf("round %d: hosts %q, %q overlap %v, their terms %v", round, hsText[i], hsText[j], ok, !ok)
				}
			}
		}
		check(t, r, nsText, nsTerms, func(i, j int) bool { _, ok := ns[i].Overlap(ns[j]); return ok })
		check(t, r, hsText, hsTerms, func(i, j int) bool { _, ok := hs[i].Overlap(hs[j]); return ok })
	}
}

func TestIndexCases(t *testing.T) {
	for _, tc := range []struct {
		ns    []string
		first []int // First of each term with every term active (-1: none but itself)
	}{
		{[]string{"team-*", "team-a", "team", "ops"}, []int{0, 0, 2, 3}},
		{[]string{"a", "b", "*"}, []int{0, 1, 0}},
		{[]string{"ab*", "a*", "abc", "b*"}, []int{0, 0, 0, 3}},
		{[]string{"x", "x*", "x"}, []int{0, 0, 0}},
	} {
		terms := make([]Term, len(tc.ns))
		for i, p := range tc.ns {
			n, err := ParseNamespace(p)
			if err != nil {
				t.Fatal(err)
			}
			terms[i] = n.Term()
		}
		x := NewIndex(terms)
		for i := range terms {
			x.Add(i)
		}
		for i, want := range tc.first {
			if got, ok := x.First(i); !ok || got != want {
				t.Errorf("%q: First(%q) = %d, %v; want %d", tc.ns, tc.ns[i], got, ok, want)
			}
		}
	}
	if _, ok := NewIndex([]Term{{Key: "a"}}).First(0); ok {
		t.Error("First with nothing active found a term")
	}
}

// FuzzIndex: patterns separated by spaces (each namespace pattern, then as a host pattern,
// those that parse) give the index the pairwise answer.
func FuzzIndex(f *testing.F) {
	for _, s := range []string{"team-* team-a ops *", "*.a.com a.com b.a.com *", "a ab* a* b", "x x x*"} {
		f.Add(s, uint64(1))
	}
	f.Fuzz(func(t *testing.T, in string, seed uint64) {
		fields := strings.Fields(in)
		if len(fields) > 64 {
			fields = fields[:64]
		}
		var nsText, hsText []string
		var ns []Namespace
		var hs []Host
		for _, p := range fields {
			if n, err := ParseNamespace(p); err == nil {
				ns, nsText = append(ns, n), append(nsText, p)
			}
			if h, err := ParseHost(p); err == nil {
				hs, hsText = append(hs, h), append(hsText, p)
			}
		}
		r := rand.New(rand.NewPCG(seed, 25))
		nsTerms := make([]Term, len(ns))
		for i, n := range ns {
			nsTerms[i] = n.Term()
		}
		hsTerms := make([]Term, len(hs))
		for i, h := range hs {
			hsTerms[i] = h.Term()
		}
		check(t, r, nsText, nsTerms, func(i, j int) bool { _, ok := ns[i].Overlap(ns[j]); return ok })
		check(t, r, hsText, hsTerms, func(i, j int) bool { _, ok := hs[i].Overlap(hs[j]); return ok })
	})
}

// BenchmarkIndex: n patterns none of which overlaps another (the valid configuration's
// case, where pairwise comparison does all n² comparisons): build, then Add and First each.
func BenchmarkIndex(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		terms := make([]Term, n)
		for i := range terms {
			p := fmt.Sprintf("c%06d-n", i)
			if i%2 == 1 {
				p += "*"
			}
			ns, err := ParseNamespace(p)
			if err != nil {
				b.Fatal(err)
			}
			terms[i] = ns.Term()
		}
		b.Run(fmt.Sprintf("patterns=%d", n), func(b *testing.B) {
			for b.Loop() {
				x := NewIndex(terms)
				for i := len(terms) - 1; i >= 0; i-- {
					if _, ok := x.First(i); ok {
						b.Fatal("an overlap")
					}
					x.Add(i)
				}
			}
		})
	}
}
