package istiod

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/istiodtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
)

// BenchmarkChangeToIstiod measures, for the same changes in one run, the time from a change
// of an object in a cluster's kube-apiserver to (1) an MCP sink of the hub (the minion → hub
// → sink baseline), (2) a real istiod behind a cluster's relay, (3) a real istiod at the
// hub's serveUnauthenticated listener; p50 and p99 over `changes` changes, one at a time.
// Run with -benchtime 1x (make bench does): each run makes all the changes.
func BenchmarkChangeToIstiod(b *testing.B) {
	const changes = 25
	w := startSecureWorld(b, []routing.Rule{
		{Name: "east-relay", Relays: true, Identities: []string{hub.ClusterIdentity(td, "east")}, Clusters: []string{"west"}},
		{Name: "direct-istiod", Unauthenticated: true, NodeIDs: []string{"*"}, Clusters: []string{"west"}},
		{Name: "bench-sink", Identities: []string{hub.SinkIdentity(td, "bench")}, Clusters: []string{"west"}},
	})
	relayed, direct := w.istiods(b)

	// The MCP sink: it notes when each version of pay/api arrives.
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vsColl}, Node: &mcppb.SinkNode{Id: "bench"},
		Applier: mcp.ApplierFunc(func(_ context.Context, c *mcp.Change) error {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			for _, e := range c.Entries {
				if e.Name == "pay/api" {
					arrived[e.Version] = now
				}
			}
			return nil
		})})
	if err != nil {
		b.Fatal(err)
	}
	src, err := meshtls.NewSource(w.files("sink-bench", hub.SinkIdentity(td, "bench")), nil)
	if err != nil {
		b.Fatal(err)
	}
	pull(b, w.hub.Addr(b, "serve", 30*time.Second), credentials.NewTLS(src.ClientConfig("")), sink)

	rv := func(i *istiodtest.Istiod) string {
		c, err := i.FetchConfigz()
		if err != nil {
			return ""
		}
		o, _ := c.Get(vsType, "pay/api")
		return o.Metadata.ResourceVersion
	}
	var toSink, toRelayed, toDirect []time.Duration
	for range b.N {
		for n := range changes {
			prevRelayed, prevDirect := rv(relayed), rv(direct)
			t0 := time.Now()
			w.env.Apply(vsObject("api", "pay", fmt.Sprintf("api%d.pay.example.com", n)))
			var dRelayed, dDirect time.Duration
			for deadline := t0.Add(time.Minute); dRelayed == 0 || dDirect == 0; time.Sleep(2 * time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatalf("change %d did not reach both istiods", n)
				}
				if dRelayed == 0 && rv(relayed) != prevRelayed {
					dRelayed = time.Since(t0)
				}
				if dDirect == 0 && rv(direct) != prevDirect {
					dDirect = time.Since(t0)
				}
			}
			mu.Lock()
			var last time.Time
			for _, at := range arrived {
				if at.After(last) {
					last = at
				}
			}
			mu.Unlock()
			if last.After(t0) {
				toSink = append(toSink, last.Sub(t0))
			}
			toRelayed, toDirect = append(toRelayed, dRelayed), append(toDirect, dDirect)
		}
	}
	b.StopTimer()
	for _, r := range []struct {
		name string
		d    []time.Duration
	}{{"mcp-sink", toSink}, {"istiod-relay", toRelayed}, {"istiod-direct", toDirect}} {
		p50, p99 := percentiles(r.d)
		b.ReportMetric(float64(p50.Microseconds())/1000, r.name+"-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, r.name+"-p99-ms")
		b.Logf("%-14s changes %3d  p50 %8v  p99 %8v", r.name, len(r.d), p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond))
	}
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], s[len(s)*99/100]
}

// pull runs one stream of sink from addr until the test ends.
func pull(tb testing.TB, addr string, creds credentials.TransportCredentials, sink *mcp.Sink) {
	tb.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	testrun.Start(tb, "sink PullFrom", func(ctx context.Context) error {
		if err := sink.PullFrom(ctx, conn); ctx.Err() == nil {
			return err
		}
		return nil
	})
}
