package tenancy

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Sink patterns of two tenants may not overlap. New compared each tenant's patterns with
// every earlier tenant's, O(patterns²) (thousands of tenants in a candidate: seconds of the
// hub's CPU); it now asks a pattern.Index. overlaps and sinksApartPairwise are the code it
// replaced, kept only as the reference New must agree with.

// overlaps reports whether some string matches both.
func (p prefixPattern) overlaps(o prefixPattern) bool {
	switch {
	case p.prefix && o.prefix:
		return strings.HasPrefix(p.body, o.body) || strings.HasPrefix(o.body, p.body)
	case p.prefix:
		return strings.HasPrefix(o.body, p.body)
	case o.prefix:
		return strings.HasPrefix(p.body, o.body)
	}
	return p.body == o.body
}

// sinksApartPairwise is New's sink check as it was, for tenants that pass every other check.
func sinksApartPairwise(field string, tenants []Tenant) error {
	var done []Tenant
	var parsed [][]prefixPattern
	for i, spec := range tenants {
		f := fmt.Sprintf("%s[%d] (%q)", field, i, spec.Name)
		sinks, err := parsePatterns(f+".sinks", spec.Sinks)
		if err != nil {
			return err
		}
		for k, o := range done {
			for j, a := range sinks {
				for _, b := range parsed[k] {
					if a.overlaps(b) {
						return fmt.Errorf("%s.sinks[%d]: %q and tenant %q's %q could both match one identity: a sink belongs to one tenant", f, j, a, o.Name, b)
					}
				}
			}
		}
		done, parsed = append(done, spec), append(parsed, sinks)
	}
	return nil
}

// New refuses the same overlapping sink patterns, with the same first error, as comparing
// every pair did: random tenants' patterns over a small alphabet, so that overlaps are
// frequent and several at once (a property test).
func TestNewSinksAgreeWithPairwise(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 9))
	refused := 0
	for round := range 3000 {
		tenants := make([]Tenant, 1+r.IntN(6))
		for i := range tenants {
			tenants[i] = Tenant{Name: fmt.Sprintf("t%d", i)}
			for range 1 + r.IntN(3) {
				var b strings.Builder
				for range r.IntN(4) {
					b.WriteByte("ab"[r.IntN(2)])
				}
				if b.Len() == 0 || r.IntN(2) == 0 {
					b.WriteByte('*')
				}
				tenants[i].Sinks = append(tenants[i].Sinks, b.String())
			}
		}
		want := sinksApartPairwise("tenants", tenants)
		_, got := New("tenants", tenants)
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("round %d: %+v:\n got %v\nwant %v", round, tenants, got, want)
		}
		if want != nil {
			refused++
		}
	}
	if refused < 500 || refused > 2500 {
		t.Errorf("%d of 3000 random tenant sets overlap: the property test should see plenty of both", refused)
	}
}

// BenchmarkNewSinks: tenants with twenty sink patterns each, none overlapping.
func BenchmarkNewSinks(b *testing.B) {
	for _, n := range []int{250, 500, 1000} {
		tenants := make([]Tenant, n)
		for i := range tenants {
			tenants[i] = Tenant{Name: fmt.Sprintf("t%04d", i)}
			for s := range 20 {
				tenants[i].Sinks = append(tenants[i].Sinks, fmt.Sprintf("spiffe://x/sink/t%04d-s%03d-*", i, s))
			}
		}
		b.Run(fmt.Sprintf("pairwise/tenants=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := sinksApartPairwise("tenants", tenants); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("index/tenants=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := New("tenants", tenants); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
