package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub"
	admincli "github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

// tlsSink is a real MCP sink with sink name's certificate subscribed to serve until the
// test ends.
func tlsSink(t *testing.T, p *pki, serve, name string) *sinkClient {
	t.Helper()
	sc := &sinkClient{state: map[string]map[string]*mcpapi.Resource{}}
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Applier: sc, Logger: logger(t).With("side", "sink-"+name)})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, serve, p.creds(t, "sink-"+name, hub.SinkIdentity(td, name)), sink)
	return sc
}

// A minion's directory emptied (a bad rollout of its ConfigMap, a wrong mount): the hub's
// breaker opens, the sink keeps every object, status shows the pending diff; a release by
// any identity but an operator's is refused; restoring the files closes the breaker with no
// deletion ever served. Emptied again, an operator's release applies the deletions.
// Everything over mutual TLS: a real minion on real files, the hub, a real MCP sink.
func TestBreakerHoldsAnEmptiedDirectory(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.AdminTLS = "127.0.0.1:0"
	cfg.Routing = routing.Config{Rules: []routing.Rule{{Name: "sinks", Identities: []string{hub.SinkIdentity(td, "*")}}}}
	h := runHub(t, cfg)
	ingest, serve, admin := h.Addrs()

	east, west := t.TempDir(), t.TempDir()
	files := map[string]string{}
	for i := range 12 {
		name := fmt.Sprintf("vs%02d", i)
		files["shop/"+name+".yaml"] = vsYAML(name, "shop", "", name+".shop.example.com")
	}
	restore := func() {
		for rel, content := range files {
			writeFile(t, east, rel, content)
		}
	}
	empty := func() {
		for rel := range files {
			if err := os.Remove(filepath.Join(east, rel)); err != nil {
				t.Fatal(err)
			}
		}
	}
	restore()
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	sc := tlsSink(t, p, serve, "prod-1")
	served := func() int { return strings.Count(sc.view(vs), "@") }
	waitFor(t, 10*time.Second, "the sink has all 13", func() bool { return served() == 13 })

	breaker := func() *api.Breaker {
		var cl []api.ClusterStatus
		getJSON(t, "http://"+admin+"/api/clusters", &cl)
		for _, c := range cl {
			if c.Name == "east" {
				return c.Breaker
			}
		}
		return nil
	}
	empty()
	waitFor(t, 10*time.Second, "east's breaker open with 12 held", func() bool { b := breaker(); return b != nil && b.Open && b.Held == 12 })
	if b := breaker(); len(b.Pending[vs]) != 12 || !strings.Contains(b.Reason, "12 of the 12") {
		t.Errorf("pending diff: %+v", b)
	}

	release := func(certName, identity string) (string, error) {
		c, k, _ := p.ca.Issue(t, p.dir, certName, identity)
		var out bytes.Buffer
		err := admincli.Run(context.Background(), []string{"breaker", "release", "-admin", h.AdminTLSAddr(), "-cert", c, "-key", k, "-ca", p.bundle, "east"}, &out)
		return out.String(), err
	}
	if _, err := release("sink-for-release", hub.SinkIdentity(td, "prod-1")); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("a release with a sink's certificate: %v", err)
	}
	if _, err := release("minion-for-release", hub.ClusterIdentity(td, "east")); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("a release with the cluster's own certificate: %v", err)
	}
	if b := breaker(); b == nil || !b.Open || served() != 13 {
		t.Fatalf("after refused releases: breaker %+v, served %d", b, served())
	}

	restore()
	waitFor(t, 10*time.Second, "the breaker closed by the restored files", func() bool { return breaker() == nil })
	if n := served(); n != 13 || len(sc.removals()) != 0 {
		t.Fatalf("after the restore: %d served, removals %v", n, sc.removals())
	}

	empty()
	waitFor(t, 10*time.Second, "the breaker open again", func() bool { b := breaker(); return b != nil && b.Open })
	out, err := release("operator-ann", "spiffe://"+td+"/operator/ann")
	if err != nil || !strings.Contains(out, "12 held deletion(s) applied") {
		t.Fatalf("the operator's release: %v\n%s", err, out)
	}
	waitFor(t, 10*time.Second, "the sink has west's object only", func() bool { return sc.view(vs) == "pay/api@west" })
	if got := len(sc.removals()); got != 12 {
		t.Errorf("removals at the sink: %d, want the 12 released", got)
	}
}

// A reload with an ownership typo would withdraw every object of a cluster: the breaker
// opens instead, the sinks keep them, and the corrected configuration closes it.
func TestBreakerGuardsAReloadTypo(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	for i := range 12 {
		name := fmt.Sprintf("vs%02d", i)
		writeFile(t, east, "shop/"+name+".yaml", vsYAML(name, "shop", "", name+".shop.example.com"))
	}
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	cfg := twoClusterConfig()
	h := runHub(t, cfg)
	ingest, serve, _ := h.Addrs()
	sink := runSink(t, serve, "", "global-istiod", true)
	runMinion(t, "east", east, ingest)
	runMinion(t, "west", west, ingest)
	served := func() int { return strings.Count(sink.view(vs), "@") }
	waitFor(t, 20*time.Second, "converged", func() bool { return served() == 13 })

	next := func(mut func(c *hub.Config)) *hub.Config {
		c := twoClusterConfig()
		c.Ingest, c.Serve, c.HTTP, c.StateDir = cfg.Ingest, cfg.Serve, cfg.HTTP, cfg.StateDir
		mut(c)
		return c
	}
	reloaded := time.Now()
	res, err := h.Reload(next(func(c *hub.Config) { c.Clusters[0].Namespaces = []string{"shoop", "shared"} }))
	if err != nil || res.Held != 12 || res.Refused != 0 || res.ClosedIngest != 1 {
		t.Fatalf("the typo: %+v, %v", res, err)
	}
	waitFor(t, 10*time.Second, "east's minion reconnected (its cluster's entry changed) and resumed", func() bool {
		for _, c := range h.Clusters() {
			if c.Name == "east" {
				return c.Connected && c.LastContact != nil && c.LastContact.After(reloaded) && c.Breaker != nil && c.Breaker.Open
			}
		}
		return false
	})
	if n := served(); n != 13 || len(sink.removals()) != 0 {
		t.Fatalf("after the typo: %d served, removals %v", n, sink.removals())
	}
	if _, err := h.Reload(next(func(*hub.Config) {})); err != nil {
		t.Fatal(err)
	}
	for _, c := range h.Clusters() {
		if c.Breaker != nil {
			t.Errorf("%s's breaker after the fix: %+v", c.Name, c.Breaker)
		}
	}
	if n := served(); n != 13 || len(sink.removals()) != 0 {
		t.Errorf("after the fix: %d served, removals %v", n, sink.removals())
	}
}

// Two minions presenting east's certificate (a cloned deployment, a copied Secret): the
// second takes over once; from then on the first is refused while the second's stream is
// open (the hub alerts on competing writers), so the cluster's state changes hands once
// instead of each minion replacing it in turn (issue 25, finding 2), and every state a
// sink sees is exactly one minion's.
func TestTwoWritersForOneClusterNeverInterleave(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Routing = routing.Config{Rules: []routing.Rule{{Name: "sinks", Identities: []string{hub.SinkIdentity(td, "*")}}}}
	h := runHub(t, cfg)
	ingest, serve, _ := h.Addrs()
	one, other, west := t.TempDir(), t.TempDir(), t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, one, "shop/"+n+".yaml", vsYAML(n, "shop", "", n+".shop.example.com"))
	}
	writeFile(t, other, "shop/x.yaml", vsYAML("x", "shop", "", "x.shop.example.com"))
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "west", west, ingest)
	tlsMinion(t, p, "east", one, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	sc := tlsSink(t, p, serve, "prod-1")
	const ofOne, ofOther = "pay/api@west,shop/a@east,shop/b@east,shop/c@east", "pay/api@west,shop/x@east"
	waitFor(t, 10*time.Second, "the first minion's state", func() bool { return sc.view(vs) == ofOne })

	// The sink's Applier records every state it is pushed; check each against the two.
	seen := map[string]int{}
	var bad []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			v := sc.view(vs)
			seen[v]++
			if v != ofOne && v != ofOther {
				bad = append(bad, v)
			}
		}
	}()
	tlsMinion(t, p, "east", other, ingest)
	waitFor(t, 20*time.Second, "the competing writers alerted on", func() bool {
		return metric(t, h, "meshfed_hub_cluster_competing_writers") == 1
	})
	close(stop)
	<-done
	if len(bad) > 0 {
		t.Errorf("states that are neither minion's: %q", bad)
	}
	if n := metric(t, h, "meshfed_hub_cluster_takeovers_total"); n != 1 {
		t.Errorf("takeovers: %v, want the second minion's one", n)
	}
	if v := sc.view(vs); v != ofOther {
		t.Errorf("served: %q, want the writer's (the second minion's) state", v)
	}
}
