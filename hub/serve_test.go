package hub

import (
	"log/slog"
	"testing"
	"time"
)

// A sink whose SinkNode id disagrees with its certificate is routed by the certificate,
// and that is logged at most once per sink identity per interval, with the count held back
// (issue 25, finding 9.3): it was a WARN line per collection per stream, 3,000 lines for
// 200 sinks of one fleet reconnecting.
func TestSinkNodeDisagreementLoggedOncePerIdentity(t *testing.T) {
	p := newPKI(t)
	cfg, err := ParseConfig([]byte(`
tls: {certFile: ` + p.hubCert + `, keyFile: ` + p.hubKy + `, caFile: ` + p.bundle + `}
trustDomain: mesh.test
collections: [istio/networking/v1alpha3/virtualservices, istio/networking/v1alpha3/destinationrules]
clusters: [{name: east, namespaces: [shop], hosts: ["*"]}]
routing: {rules: [{name: istiod, nodeIds: [istiod]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	log := &records{}
	h, err := New(cfg, slog.New(log), Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := withClock(h)
	mustApply(t, h, "east", vsPush(t, "shop/a"))

	const msg = "SinkNode id disagrees with the sink's certificate; routing by the certificate"
	const fleet = 50 // streams of one identity, each watching both collections
	var sinks []*fakeSink
	for range fleet {
		sinks = append(sinks, watchAs(t, h, SinkIdentity("mesh.test", "istiod"), "istiod-7d9f-abcde"))
	}
	watchAs(t, h, SinkIdentity("mesh.test", "other"), "istiod")  // another identity: its own line
	watchAs(t, h, SinkIdentity("mesh.test", "istiod"), "istiod") // no disagreement: no line
	if all, warn := log.count(msg); all != 2 || warn != 2 {
		t.Errorf("%d disagreeing streams of one identity (%d watches) and one of another: %d lines (%d at WARN), want 2 at WARN",
			fleet, 2*fleet, all, warn)
	}
	// Routing is the certificate's, as before: every stream of istiod's fleet has shop/a.
	for i, s := range sinks {
		if got := s.names(vsColl); got != "shop/a" {
			t.Fatalf("stream %d of istiod's fleet is served %q, want shop/a (routed by its certificate's name)", i, got)
		}
	}

	// An interval later, the next disagreement is logged again, with how many were not.
	c.advance(time.Minute)
	watchAs(t, h, SinkIdentity("mesh.test", "istiod"), "istiod-7d9f-abcde")
	if all, _ := log.count(msg); all != 3 {
		t.Fatalf("after the interval: %d lines, want 3", all)
	}
	last := log.last(msg)
	want := map[string]string{"identity": SinkIdentity("mesh.test", "istiod"), "node_id": "istiod-7d9f-abcde", "routed_as": "istiod", "suppressed": "99"}
	for k, v := range want {
		if got := last[k]; got != v {
			t.Errorf("the line after the interval: %s=%q, want %q (all: %v)", k, got, v, last)
		}
	}
}

// last returns the attributes, as text, of the last record whose message is msg.
func (r *records) last(msg string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for i := len(r.recs) - 1; i >= 0; i-- {
		if r.recs[i].Message == msg {
			r.recs[i].Attrs(func(a slog.Attr) bool {
				out[a.Key] = a.Value.String()
				return true
			})
			break
		}
	}
	return out
}
