package mcp

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/mcp/kinds"
)

const vsTypeURL = "networking.istio.io/v1/VirtualService"

// xdsClient is an ADS client behaving like istiod's config-source client.
type xdsClient struct {
	t      *testing.T
	stream discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	resps  chan *discoverypb.DiscoveryResponse
	cancel func() // ends the stream
}

func startXDS(t *testing.T, w Watcher, node *corepb.Node) (*xdsClient, *StreamInfo) {
	t.Helper()
	return startXDSHooked(t, w, node, Hooks{})
}

// startXDSHooked is startXDS with hooks on the server.
func startXDSHooked(t *testing.T, w Watcher, node *corepb.Node, hooks Hooks) (*xdsClient, *StreamInfo) {
	t.Helper()
	var seen *StreamInfo
	infos := make(chan *StreamInfo, 1)
	srvW := watcherFunc(func(info *StreamInfo, coll string, notify func()) (Collection, func(), bool) {
		select {
		case infos <- info:
		default:
		}
		return w.Watch(info, coll, notify)
	})
	xs, err := NewXDSServer(srvW, XDSOptions{
		Resolve: func(url string) (string, bool) {
			k, ok := kinds.ForTypeURL(url)
			return k.Collection, ok
		},
		Server: ServerConfig{Logger: testLogger(t)},
		Hooks:  hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions()...)
	xs.Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &xdsClient{t: t, stream: st, resps: make(chan *discoverypb.DiscoveryResponse, 100), cancel: cancel}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			c.resps <- r
		}
	}()
	t.Cleanup(func() { cancel(); <-recvDone; conn.Close(); srv.Stop(); <-done })
	// The first request carries the node, a non-empty nonce (as istiod's may) and the type.
	c.send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: vsTypeURL, ResponseNonce: "from-an-earlier-life"})
	select {
	case seen = <-infos:
	case <-time.After(10 * time.Second):
		t.Fatal("no watch")
	}
	return c, seen
}

type watcherFunc func(*StreamInfo, string, func()) (Collection, func(), bool)

func (f watcherFunc) Watch(i *StreamInfo, c string, n func()) (Collection, func(), bool) {
	return f(i, c, n)
}

func (c *xdsClient) send(r *discoverypb.DiscoveryRequest) {
	c.t.Helper()
	if err := c.stream.Send(r); err != nil {
		c.t.Fatal(err)
	}
}

func (c *xdsClient) recv() *discoverypb.DiscoveryResponse {
	c.t.Helper()
	select {
	case r := <-c.resps:
		return r
	case <-time.After(10 * time.Second):
		c.t.Fatal("no response")
		return nil
	}
}

// xdsNames decodes a response's resources: name@version, sorted.
func xdsNames(t *testing.T, r *discoverypb.DiscoveryResponse) string {
	t.Helper()
	var out []string
	for _, a := range r.GetResources() {
		if a.GetTypeUrl() != ResourceTypeURL {
			t.Fatalf("resource type %s", a.GetTypeUrl())
		}
		var res mcpapi.Resource
		if err := proto.Unmarshal(a.GetValue(), &res); err != nil {
			t.Fatal(err)
		}
		out = append(out, res.GetMetadata().GetName()+"@"+res.GetMetadata().GetVersion())
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func (c *xdsClient) ack(r *discoverypb.DiscoveryResponse) {
	c.send(&discoverypb.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
}

func TestXDSServesFullStatePerType(t *testing.T) {
	vsColl, _ := kinds.ForTypeURL(vsTypeURL)
	c := NewCache(vsColl.Collection)
	c.Put(vsColl.Collection, entry(t, "ns/a", "1"), entry(t, "ns/b", "1"))
	md, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": "east", "n": 1.0})
	cl, info := startXDS(t, c, &corepb.Node{Id: "sidecar~10.0.0.1~istiod-1.istio-system~cluster.local", Metadata: md})

	r := cl.recv()
	if r.GetTypeUrl() != vsTypeURL || xdsNames(t, r) != "ns/a@1,ns/b@1" || r.GetNonce() == "" {
		t.Fatalf("first response %s %q nonce %q", r.GetTypeUrl(), xdsNames(t, r), r.GetNonce())
	}
	if n := info.Node(); n.GetId() != "sidecar~10.0.0.1~istiod-1.istio-system~cluster.local" || n.GetAnnotations()["CLUSTER_ID"] != "east" {
		t.Errorf("node = %v", n)
	}
	cl.ack(r)

	// istiod also subscribes to MeshConfig, which no collection serves: an empty state.
	cl.send(&discoverypb.DiscoveryRequest{TypeUrl: "core/v1alpha1/MeshConfig"})
	mc := cl.recv()
	if mc.GetTypeUrl() != "core/v1alpha1/MeshConfig" || len(mc.GetResources()) != 0 {
		t.Fatalf("MeshConfig response %v", mc)
	}
	cl.ack(mc)

	// Update and deletion: every response is the full state.
	c.Update(vsColl.Collection, []*Entry{entry(t, "ns/a", "2")}, []string{"ns/b"})
	r2 := cl.recv()
	if xdsNames(t, r2) != "ns/a@2" || r2.GetVersionInfo() == r.GetVersionInfo() {
		t.Fatalf("after update: %q version %s", xdsNames(t, r2), r2.GetVersionInfo())
	}

	// While a response is outstanding, changes coalesce: one response with the latest.
	for i := 3; i <= 12; i++ {
		c.Put(vsColl.Collection, entry(t, "ns/a", strings.Repeat("x", i)))
	}
	cl.send(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL, ResponseNonce: "stale"}) // ignored
	cl.ack(r2)
	r3 := cl.recv()
	if xdsNames(t, r3) != "ns/a@"+strings.Repeat("x", 12) {
		t.Fatalf("coalesced response %q", xdsNames(t, r3))
	}

	// A NACKed version is not resent; the next change is.
	cl.send(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL, ResponseNonce: r3.GetNonce(), ErrorDetail: &rpcstatus.Status{Code: 3, Message: "bad"}})
	c.Put(vsColl.Collection, entry(t, "ns/c", "1"))
	r4 := cl.recv()
	if xdsNames(t, r4) != "ns/a@"+strings.Repeat("x", 12)+",ns/c@1" {
		t.Fatalf("after NACK, the next response is %q (want the new version, not a resend)", xdsNames(t, r4))
	}
}

func TestXDSUnservedCollection(t *testing.T) {
	// A watcher that serves nothing to this client: every type gets an empty state.
	w := watcherFunc(func(*StreamInfo, string, func()) (Collection, func(), bool) { return nil, func() {}, false })
	cl, _ := startXDS(t, w, &corepb.Node{Id: "istiod"})
	if r := cl.recv(); len(r.GetResources()) != 0 || r.GetTypeUrl() != vsTypeURL {
		t.Fatalf("response %v", r)
	}
}

// FuzzXDSRequests: any sequence of requests (as wire bytes) is handled without a panic, and
// every type the client named is tracked.
func FuzzXDSRequests(f *testing.F) {
	seed := func(rs ...*discoverypb.DiscoveryRequest) []byte {
		var b []byte
		for _, r := range rs {
			m, _ := proto.Marshal(r)
			b = append(b, byte(len(m)))
			b = append(b, m...)
		}
		return b
	}
	f.Add(seed(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL, ResponseNonce: "x"}, &discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL, ResponseNonce: "1"}))
	f.Add(seed(&discoverypb.DiscoveryRequest{TypeUrl: "a/b/C", ErrorDetail: &rpcstatus.Status{Code: 2}}, &discoverypb.DiscoveryRequest{}))
	vsColl, _ := kinds.ForTypeURL(vsTypeURL)
	c := NewCache(vsColl.Collection)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := NewXDSServer(c, XDSOptions{Resolve: func(url string) (string, bool) {
			k, ok := kinds.ForTypeURL(url)
			return k.Collection, ok
		}, Server: ServerConfig{Logger: testLogger(t)}})
		if err != nil {
			t.Fatal(err)
		}
		info := newStreamInfo("source", "server", "fuzz", "")
		info.Protocol = "xds"
		types := map[string]*xdsType{}
		defer func() {
			for _, ty := range types {
				ty.cancel()
			}
		}()
		for len(data) > 0 {
			n := int(data[0])
			data = data[1:]
			if n > len(data) {
				n = len(data)
			}
			req := &discoverypb.DiscoveryRequest{}
			if proto.Unmarshal(data[:n], req) == nil {
				s.handle(info, testLogger(t), types, req, func() {})
				if types[req.GetTypeUrl()] == nil {
					t.Fatalf("type %q not tracked", req.GetTypeUrl())
				}
			}
			data = data[n:]
		}
	})
}

// TestXDSEncodesEachResponseOnce: streams of the same type share one encoded response body
// per version (only the nonce is per stream).
func TestXDSEncodesEachResponseOnce(t *testing.T) {
	vsColl, _ := kinds.ForTypeURL(vsTypeURL)
	c := NewCache(vsColl.Collection)
	c.Put(vsColl.Collection, entry(t, "ns/a", "1"))
	xs, err := NewXDSServer(c, XDSOptions{Resolve: func(url string) (string, bool) {
		k, ok := kinds.ForTypeURL(url)
		return k.Collection, ok
	}, Server: ServerConfig{Logger: testLogger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, func(s *grpc.Server) { xs.Register(s) })
	conn := dial(t, addr)
	var streams []discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL}); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL, ResponseNonce: r.GetNonce()}); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	b0 := BodyEncodes()
	c.Put(vsColl.Collection, entry(t, "ns/a", "2"))
	for _, st := range streams {
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got := xdsNames(t, r); got != "ns/a@2" {
			t.Fatalf("response %q", got)
		}
	}
	if n := BodyEncodes() - b0; n != 1 {
		t.Fatalf("%d response bodies encoded for one change to 5 streams, want 1", n)
	}
}

// xdsEvents records an XDSServer's hook calls as lines, for a test to read in order.
type xdsEvents chan string

func (ev xdsEvents) hooks() Hooks {
	return Hooks{
		StreamOpened: func(i *StreamInfo) {
			ev <- fmt.Sprintf("opened %d %s/%s/%s", i.ID, i.Role, i.Transport, i.Protocol)
		},
		StreamClosed: func(i *StreamInfo, _ error) { ev <- fmt.Sprintf("closed %d", i.ID) },
		Pushed: func(_ *StreamInfo, e PushEvent) {
			if e.Bytes <= 0 || e.Nonce == "" || e.Incremental || e.Removed != 0 {
				ev <- fmt.Sprintf("bad push %+v", e)
			}
			ev <- fmt.Sprintf("pushed %s (%s) v%d nonce %s: %d resources", e.Collection, e.TypeURL, e.Version, e.Nonce, e.Resources)
		},
		Acked: func(_ *StreamInfo, e AckEvent) {
			if (e.Code == codes.OK) != (e.Detail == nil) || e.Latency < 0 {
				ev <- fmt.Sprintf("bad ack %+v", e)
			}
			ev <- fmt.Sprintf("acked %s (%s) v%d nonce %s: %s %s", e.Collection, e.TypeURL, e.Version, e.Nonce, e.Code, e.Message)
		},
	}
}

func (ev xdsEvents) next(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-ev:
		if got != want {
			t.Fatalf("hook event\n got %s\nwant %s", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no hook event; want %s", want)
	}
}

// TestXDSFiresHooks: an xDS stream is observed as MCP streams are: opened (a source, served,
// speaking xds), each response pushed by its collection (by its type URL when it resolves to
// none) with version and resource count, each ACK and NACK (code, message, detail) of it, and
// closed.
func TestXDSFiresHooks(t *testing.T) {
	vsColl, _ := kinds.ForTypeURL(vsTypeURL)
	vs := vsColl.Collection
	c := NewCache(vs)
	v := c.Put(vs, entry(t, "ns/a", "1"), entry(t, "ns/b", "1"))
	ev := make(xdsEvents, 100)
	cl, info := startXDSHooked(t, c, &corepb.Node{Id: "istiod-1"}, ev.hooks())

	ev.next(t, fmt.Sprintf("opened %d source/server/xds", info.ID))
	r := cl.recv()
	ev.next(t, fmt.Sprintf("pushed %s (%s) v%d nonce %s: 2 resources", vs, vsTypeURL, v, r.GetNonce()))
	cl.send(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL, ResponseNonce: "stale"}) // no event
	cl.ack(r)
	ev.next(t, fmt.Sprintf("acked %s (%s) v%d nonce %s: OK ", vs, vsTypeURL, v, r.GetNonce()))

	// MeshConfig resolves to no collection: reported by its type URL.
	const mc = "core/v1alpha1/MeshConfig"
	cl.send(&discoverypb.DiscoveryRequest{TypeUrl: mc})
	rmc := cl.recv()
	ev.next(t, fmt.Sprintf("pushed %s (%s) v0 nonce %s: 0 resources", mc, mc, rmc.GetNonce()))
	cl.ack(rmc)
	ev.next(t, fmt.Sprintf("acked %s (%s) v0 nonce %s: OK ", mc, mc, rmc.GetNonce()))

	// A NACK: its code and message.
	v2 := c.Update(vs, []*Entry{entry(t, "ns/a", "2")}, []string{"ns/b"})
	r2 := cl.recv()
	ev.next(t, fmt.Sprintf("pushed %s (%s) v%d nonce %s: 1 resources", vs, vsTypeURL, v2, r2.GetNonce()))
	cl.send(&discoverypb.DiscoveryRequest{TypeUrl: vsTypeURL, ResponseNonce: r2.GetNonce(), ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "bad ns/a"}})
	ev.next(t, fmt.Sprintf("acked %s (%s) v%d nonce %s: InvalidArgument bad ns/a", vs, vsTypeURL, v2, r2.GetNonce()))

	cl.cancel()
	ev.next(t, fmt.Sprintf("closed %d", info.ID))
	select {
	case e := <-ev:
		t.Errorf("unexpected hook event %s", e)
	default:
	}
}
