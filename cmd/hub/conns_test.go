package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/connlimit"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/hubproc"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

const (
	vsCollection = "istio/networking/v1alpha3/virtualservices"
	floodTD      = "mesh.test"
	// floodNoFile is the hub process's limit of open files in the flood test: the issue's
	// hub had 20,000 and fell to 19,800 connections; at 512, 600 connections are as many.
	floodNoFile = 512
)

// clientHello6 is the first 6 bytes of a TLS ClientHello: a handshake record header (TLS
// 1.0 record version, 200 bytes to come) and the message type. A server reading it waits
// for the rest.
var clientHello6 = []byte{0x16, 0x03, 0x01, 0x00, 0xc8, 0x01}

// stalled are connections that sent clientHello6 and nothing more; each is read until the
// hub closes it.
type stalled struct {
	opened, failed int
	closed         atomic.Int64
	conns          []net.Conn
	wg             sync.WaitGroup
}

// flood opens perIP connections from each source address in from (loopback addresses other
// than 127.0.0.1, which the real peers use), to each of addrs in turn; the test's cleanup
// closes those still open.
func flood(t *testing.T, addrs []string, from []string, perIP int) *stalled {
	t.Helper()
	s := &stalled{}
	for _, ip := range from {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
		for i := range perIP {
			c, err := d.Dial("tcp", addrs[i%len(addrs)])
			if err == nil {
				_, err = c.Write(clientHello6)
			}
			if err != nil {
				s.failed++
				if c != nil {
					c.Close()
				}
				continue
			}
			s.opened++
			s.conns = append(s.conns, c)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				var b [64]byte
				for {
					if _, err := c.Read(b[:]); err != nil {
						s.closed.Add(1)
						return
					}
				}
			}()
		}
	}
	t.Cleanup(func() {
		for _, c := range s.conns {
			c.Close()
		}
		s.wg.Wait()
	})
	return s
}

// loopbacks returns n loopback addresses base+first, base+first+1, ...
func loopbacks(base string, first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", base, first+i)
	}
	return out
}

// sinkGets opens one sink stream to addr over creds and reports whether it received
// name of collection vsCollection within 5 s.
func sinkGets(addr string, creds credentials.TransportCredentials, name string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := mcppb.NewResourceSourceClient(conn).EstablishResourceStream(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&mcppb.RequestResources{Collection: vsCollection, SinkNode: &mcppb.SinkNode{Id: "s1"}}); err != nil {
		return err
	}
	for {
		res, err := st.Recv()
		if err != nil {
			return err
		}
		for _, r := range res.GetResources() {
			if r.GetMetadata().GetName() == name {
				return nil
			}
		}
		if err := st.Send(&mcppb.RequestResources{Collection: vsCollection, ResponseNonce: res.GetNonce()}); err != nil {
			return err
		}
	}
}

// healthz reports whether GET /healthz answers 200 within 2 s.
func healthz(addr string) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// refused reads meshfed_hub_connections_refused_total from the hub's /metrics, by reason
// (all listeners together).
func refused(t *testing.T, addr string) map[string]int {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "meshfed_hub_connections_refused_total{")
		if !ok {
			continue
		}
		_, r, _ := strings.Cut(line, `reason="`)
		reason, _, _ := strings.Cut(r, `"`)
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
			t.Fatalf("/metrics: %q: %v", sc.Text(), err)
		}
		out[reason] += int(v)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return out
}

// TestConnectionFlood (issue 25, finding 7): the hub as a process allowed 512 open files,
// with mutual TLS, under connections that each send the first 6 bytes of a TLS
// ClientHello and stall, from loopback addresses other than the real peers' 127.0.0.1.
//
// Before the bounds of package connlimit, 600 such connections from four addresses left
// the hub at 512 of 512 files: a new sink's stream and the minion's push timed out, /healthz
// did not answer, and after 70 s not one of the 600 had been closed.
//
// First, 600 from four addresses (the issue's flood, scaled to the limit): each address
// holds maxPendingPerIP (16) and the rest are refused at once; a new sink, a minion started
// into the flood and /healthz get through while they are held; every held one is closed at
// the handshake timeout. Then 480 from thirty addresses, more than the 416 connections the
// gRPC listeners may hold together (512 files less the reserve of 64, less the http
// listener's 32): the excess is refused, the hub keeps files free, /healthz and /metrics
// answer from the http listener's reserve; once the timeout has closed the flood, a new sink
// gets through again. Every connection is accounted for: refused at once, or held and
// closed at the timeout.
func TestConnectionFlood(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("the flood comes from loopback addresses other than 127.0.0.1, which this system does not route: %v", err)
	}
	l.Close()
	const (
		timeout = 4 * time.Second
		perIP   = 16
	)
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "mesh-ca")
	bundle := filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, bundle, ca)
	files := func(prefix string, names ...string) meshtls.Files {
		c, k, _ := ca.Issue(t, dir, prefix, names...)
		return meshtls.Files{Cert: c, Key: k, CA: bundle}
	}
	cfg := hub.Defaults()
	cfg.Ingest, cfg.Serve, cfg.HTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.TLS = &meshtls.Config{Files: files("hub", "127.0.0.1")}
	cfg.TrustDomain = floodTD
	cfg.Clusters = []hub.ClusterConfig{{Name: "east", Namespaces: []string{"shop"}, Hosts: []string{"*"}}}
	cfg.Collections = []string{vsCollection}
	cfg.Routing = routing.Config{Default: &routing.Rule{Name: "everything"}}
	// Sinks are served once east has synced: the minion's object at the sink is its push.
	cfg.WarmUp = hub.Duration{Duration: time.Hour}
	// maxConnections stays 0: derived from the 512 files.
	cfg.Limits.HandshakeTimeout, cfg.Limits.MaxPendingPerIP = ops.D(timeout), perIP
	h := hubproc.StartWith(t, cfg, dir, testlog.Writer(t, "hub: "), hubproc.Options{NoFile: floodNoFile})
	ingest, serve, httpAddr := h.Addr(t, "ingest", 30*time.Second), h.Addr(t, "serve", 30*time.Second), h.Addr(t, "http", 30*time.Second)
	if n, err := testproc.FDLimit(h.Pid()); err != nil || n != floodNoFile {
		t.Fatalf("the hub's open files limit is %d (%v), want %d", n, err, floodNoFile)
	}
	maxConns, reserve := connlimit.Derive(floodNoFile)
	grpcSlots := maxConns - connlimit.HTTPReserve

	// 1. Four addresses, 150 connections each.
	f1 := flood(t, []string{serve, ingest}, loopbacks("127.0.0.", 2, 4), 150)
	fds, _ := testproc.FDs(h.Pid())
	t.Logf("flood 1: %d connections open, %d failed to connect; the hub has %d files open of %d", f1.opened, f1.failed, fds, floodNoFile)
	if f1.failed > 0 {
		t.Fatalf("%d of the flood's connections failed to connect", f1.failed)
	}
	held1 := 4 * perIP
	testwait.For(t, 30*time.Second, "the hub refusing all but 16 per address", func() bool { return f1.closed.Load() == int64(f1.opened-held1) })

	// A minion started into the flood, publishing one VirtualService.
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "vs.yaml"), []byte("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews.shop.svc.cluster.local]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mc := minion.Defaults()
	mc.Cluster, mc.HTTP, mc.Collections = "east", "", []string{vsCollection}
	mc.Sources = []minion.SourceConfig{{URL: "fs://" + src}}
	mc.Destinations.Push = []string{"push://" + ingest}
	mc.Destinations.Backoff = ops.Backoff{Initial: ops.D(50 * time.Millisecond), Max: ops.D(500 * time.Millisecond)}
	mc.TLS = &meshtls.Config{Files: files("minion", hub.ClusterIdentity(floodTD, "east"))}
	m, err := minion.New(mc, testlog.New(t).With("side", "minion"), minion.NewTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "minion Run", m.Run)

	sf := files("sink", "spiffe://"+floodTD+"/sink/s1")
	ts, err := meshtls.NewSource(sf, testlog.New(t))
	if err != nil {
		t.Fatal(err)
	}
	sink := credentials.NewTLS(ts.ClientConfig(""))
	start := time.Now()
	testwait.For(t, 60*time.Second, "a new sink receiving the minion's VirtualService through the flood", func() bool {
		return sinkGets(serve, sink, "shop/reviews") == nil
	})
	testwait.For(t, 30*time.Second, "/healthz answering 200 through the flood", func() bool { return healthz(httpAddr) == nil })
	took := time.Since(start)
	got := refused(t, httpAddr)
	if got[connlimit.ReasonHandshakeTimeout] != 0 {
		t.Fatalf("the sink and /healthz took %v, longer than the handshake timeout (%v): the flood was closed before they got through, so this run shows nothing; a slower machine needs a longer timeout", took, timeout)
	}
	fds, _ = testproc.FDs(h.Pid())
	t.Logf("through flood 1: the sink, the minion and /healthz in %v; the hub has %d files open; refused: %v", took, fds, got)
	testwait.For(t, 60*time.Second, "every stalled connection closed by the hub", func() bool { return f1.closed.Load() == int64(f1.opened) })
	got = refused(t, httpAddr)
	if want := map[string]int{connlimit.ReasonPendingPerIP: f1.opened - held1, connlimit.ReasonHandshakeTimeout: held1}; !maps.Equal(got, want) {
		t.Errorf("after flood 1, refused %v; want %v (all but %d per address at once, those at the timeout)", got, want, perIP)
	}

	// 2. Thirty addresses, 16 connections each: more than the gRPC listeners' slots.
	before := got
	rss0, _ := testproc.RSSKiB(h.Pid())
	f2 := flood(t, []string{serve, ingest}, loopbacks("127.0.1.", 1, 30), perIP)
	if f2.failed > 0 {
		t.Fatalf("%d of the flood's connections failed to connect", f2.failed)
	}
	// The minion's push holds one slot; the rest are the flood's.
	held2 := grpcSlots - 1
	testwait.For(t, 30*time.Second, "the hub refusing the connections over its cap", func() bool { return f2.closed.Load() == int64(f2.opened-held2) })
	testwait.For(t, 30*time.Second, "/healthz answering 200 with the gRPC listeners full", func() bool { return healthz(httpAddr) == nil })
	got = refused(t, httpAddr)
	if got[connlimit.ReasonHandshakeTimeout] != before[connlimit.ReasonHandshakeTimeout] {
		t.Fatalf("/healthz took longer than the handshake timeout (%v): the flood was closed before it answered, so this run shows nothing", timeout)
	}
	fds, _ = testproc.FDs(h.Pid())
	rss, _ := testproc.RSSKiB(h.Pid())
	t.Logf("flood 2: %d connections, %d held (%d connections allowed, %d files kept, %d of them the http listener's); the hub has %d files open of %d, %d KiB resident (%+d KiB); refused: %v",
		f2.opened, held2, maxConns, reserve, connlimit.HTTPReserve, fds, floodNoFile, rss, rss-rss0, got)
	if fds >= floodNoFile-reserve/2 {
		t.Errorf("the hub has %d files open of %d at its cap: the reserve of %d is not kept", fds, floodNoFile, reserve)
	}
	testwait.For(t, 60*time.Second, "every stalled connection closed by the hub", func() bool { return f2.closed.Load() == int64(f2.opened) })
	got = refused(t, httpAddr)
	want := map[string]int{connlimit.ReasonPendingPerIP: before[connlimit.ReasonPendingPerIP], connlimit.ReasonMaxConnections: f2.opened - held2,
		connlimit.ReasonHandshakeTimeout: before[connlimit.ReasonHandshakeTimeout] + held2}
	if !maps.Equal(got, want) {
		t.Errorf("after flood 2, refused %v; want %v", got, want)
	}
	testwait.For(t, 60*time.Second, "a new sink getting through once the flood is closed", func() bool {
		return sinkGets(serve, sink, "shop/reviews") == nil
	})
	if d := m.Status().Destinations; !d[ingest] {
		t.Errorf("the minion's push is not up after the floods: %v", d)
	}
}
