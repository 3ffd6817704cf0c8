package minion

import (
	"context"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/mcp"

	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// hubSim is the hub side of a minion's push stream for tests: a real gRPC ResourceSink
// server on 127.0.0.1:0 whose Sink applies every push to an in-memory state and records
// every change. reject, when set, decides per resource whether to refuse it (the push is
// then NACKed with the rejections, as the hub's ACL does).
type hubSim struct {
	Addr        string
	collections []string

	mu      sync.Mutex // guards the following fields
	state   map[string]map[string]*mcpapi.Resource
	changes []*mcp.Change
	removed map[string][]string // collection -> names removed, in order
	streams int
	reject  func(collection string, r *mcpapi.Resource) string
	// hold, when set, decides per removal whether to hold it (the hub's breaker: the
	// resource stays, and the push is NACKed with the held deletions marked).
	hold  func(collection, name string) string
	stop  func()
	creds credentials.TransportCredentials // nil: plaintext
	peers []string                         // client certificate common names, when TLS
	// register, when set, registers more services on the server (the relay's source).
	register func(t testing.TB, srv *grpc.Server)
}

func startHubSim(t testing.TB, collections ...string) *hubSim {
	t.Helper()
	return startHubSimWith(t, nil, collections...)
}

// startHubSimWith serves with creds (mutual TLS), recording each client certificate's name.
func startHubSimWith(t testing.TB, creds credentials.TransportCredentials, collections ...string) *hubSim {
	t.Helper()
	h := newHubSim(creds, collections...)
	h.listen(t)
	return h
}

func newHubSim(creds credentials.TransportCredentials, collections ...string) *hubSim {
	return &hubSim{collections: collections, state: map[string]map[string]*mcpapi.Resource{}, removed: map[string][]string{}, creds: creds}
}

// listen serves on a new loopback address.
func (h *hubSim) listen(t testing.TB) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.Addr = lis.Addr().String()
	h.stop = h.serve(t, lis)
}

// Stop stops serving (streams end); the state is kept, as a hub's would be.
func (h *hubSim) Stop() { h.stop() }

// Restart serves again on the same address after Stop.
func (h *hubSim) Restart(t testing.TB) {
	t.Helper()
	var lis net.Listener
	var err error
	for range 50 { // the old listener's port can take a moment to be free again
		if lis, err = net.Listen("tcp", h.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	h.stop = h.serve(t, lis)
}

// changesSince returns the changes recorded after the first n.
func (h *hubSim) changesSince(n int) []*mcp.Change {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*mcp.Change(nil), h.changes[n:]...)
}

func (h *hubSim) serve(t testing.TB, lis net.Listener) func() {
	opts := mcp.ServerOptions()
	if h.creds != nil {
		opts = append(opts, grpc.Creds(h.creds))
	}
	srv := grpc.NewServer(opts...)
	log := testLog(t)
	mcp.NewSinkServer(func(ctx context.Context, info *mcp.StreamInfo) (*mcp.Sink, error) {
		h.mu.Lock()
		h.streams++
		h.mu.Unlock()
		return mcp.NewSink(mcp.SinkOptions{Collections: h.collections, Applier: h, Logger: log,
			InitialVersions: h.versions})
	}, mcp.ServerConfig{Logger: log, StreamRate: 1000, StreamBurst: 1000, Authenticate: h.authenticate}).Register(srv)
	if h.register != nil {
		h.register(t, srv)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	var once sync.Once
	stop := func() { once.Do(func() { srv.Stop(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func (h *hubSim) authenticate(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return "", nil
	}
	name := ti.State.PeerCertificates[0].Subject.CommonName
	h.mu.Lock()
	h.peers = append(h.peers, name)
	h.mu.Unlock()
	return name, nil
}

func (h *hubSim) peerNames() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.peers...)
}

func (h *hubSim) versions(collection string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]string{}
	for n, r := range h.state[collection] {
		out[n] = r.GetMetadata().GetVersion()
	}
	return out
}

// Apply implements mcp.Applier.
func (h *hubSim) Apply(_ context.Context, c *mcp.Change) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.changes = append(h.changes, c)
	coll := h.state[c.Collection]
	if coll == nil || !c.Incremental {
		old := coll
		coll = map[string]*mcpapi.Resource{}
		keep := map[string]bool{}
		for _, r := range c.Resources {
			keep[r.GetMetadata().GetName()] = true
		}
		for n := range old {
			if !keep[n] {
				h.removed[c.Collection] = append(h.removed[c.Collection], n)
			}
		}
		h.state[c.Collection] = coll
	}
	var rejected []mcp.Rejection
	for _, n := range c.Removed {
		if h.hold != nil {
			if why := h.hold(c.Collection, n); why != "" {
				rejected = append(rejected, mcp.Rejection{Resource: n, Reason: why, Held: true})
				continue
			}
		}
		if _, ok := coll[n]; ok {
			h.removed[c.Collection] = append(h.removed[c.Collection], n)
		}
		delete(coll, n)
	}
	for _, r := range c.Resources {
		if h.reject != nil {
			if why := h.reject(c.Collection, r); why != "" {
				rejected = append(rejected, mcp.Rejection{Resource: r.GetMetadata().GetName(), Reason: why})
				continue
			}
		}
		coll[r.GetMetadata().GetName()] = r
	}
	if len(rejected) > 0 {
		return mcp.RejectionError(codes.PermissionDenied, c.Collection, rejected)
	}
	return nil
}

// get returns a resource the hub holds.
func (h *hubSim) get(collection, name string) *mcpapi.Resource {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state[collection][name]
}

// names returns the names the hub holds in collection, sorted and joined.
func (h *hubSim) names(collection string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for n := range h.state[collection] {
		out = append(out, n)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func (h *hubSim) pushes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.changes)
}

func (h *hubSim) removals(collection string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.removed[collection]...)
}

func (h *hubSim) streamCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.streams
}

// body decodes a resource's body.
func body[T proto.Message](t testing.TB, r *mcpapi.Resource, msg T) T {
	t.Helper()
	if err := anypb.UnmarshalTo(r.GetBody(), msg, proto.UnmarshalOptions{}); err != nil {
		t.Fatalf("body of %s: %v", r.GetMetadata().GetName(), err)
	}
	return msg
}

// waitFor polls cond for up to d (testwait.For).
var waitFor = testwait.For
