package acl

import (
	"fmt"
	"testing"
)

// benchPolicy is 100 clusters, each with 10 namespace and 10 host patterns.
func benchPolicy(b *testing.B) *Policy {
	var cs []Cluster
	for i := range 100 {
		c := Cluster{Name: fmt.Sprintf("cluster-%03d", i)}
		for j := range 9 {
			c.Namespaces = append(c.Namespaces, fmt.Sprintf("ns-%d-%d", i, j))
		}
		c.Namespaces = append(c.Namespaces, fmt.Sprintf("team-%d-*", i))
		for j := range 6 {
			c.Hosts = append(c.Hosts, fmt.Sprintf("svc-%d.c-%d.example.com", j, i))
		}
		c.Hosts = append(c.Hosts,
			fmt.Sprintf("*.c-%d.example.com", i),
			fmt.Sprintf("*.c-%d.example.org", i),
			fmt.Sprintf("*.ns-%d-0.svc.cluster.local", i),
			fmt.Sprintf("*.ns-%d-1.svc.cluster.local", i))
		cs = append(cs, c)
	}
	return mustNew(b, cs, Options{})
}

// BenchmarkCheck: a VirtualService with 3 hosts (an exact name, a name under a wildcard, a
// short name) against 100 clusters × 10 patterns.
func BenchmarkCheck(b *testing.B) {
	p := benchPolicy(b)
	o := Object{Collection: vsColl, Name: "ns-42-1/reviews", Hosts: []string{"svc-3.c-42.example.com", "a.b.c-42.example.org", "reviews"}}
	if err := p.Check("cluster-042", o); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Check("cluster-042", o); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckRejected: the same object's last host belongs to another cluster; the
// reason names it.
func BenchmarkCheckRejected(b *testing.B) {
	p := benchPolicy(b)
	o := Object{Collection: vsColl, Name: "ns-42-1/reviews", Hosts: []string{"svc-3.c-42.example.com", "a.b.c-42.example.org", "svc-1.c-7.example.com"}}
	if err := p.Check("cluster-042", o); err == nil {
		b.Fatal("accepted")
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Check("cluster-042", o); err == nil {
			b.Fatal("accepted")
		}
	}
}
