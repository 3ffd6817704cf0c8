package replicatest

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Sink is an MCP sink (in this process) subscribed to the replicas over mutual TLS as
// spiffe://mesh.test/sink/<name>; it fails over along its replicas and keeps what it
// applied, every deletion it was sent and how many streams it opened.
type Sink struct {
	Name string

	mu       sync.Mutex
	state    map[string]*mcpapi.Resource // name -> resource
	encoded  map[string][]byte           // name -> the resource's bytes as served
	sent     map[string]int              // name -> how many times a push carried it
	removed  []string
	pushes   int
	received int          // resources received, all pushes
	firstSet string       // the view after the first push of each stream, in order
	target   atomic.Value // string: the serve address of the current (or last) stream
	streams  atomic.Int64
	open     atomic.Int64
	done     chan struct{}
}

// StartSink subscribes sink name (its node id and routing name, e.g. global-00) to the
// replicas in the order given.
func (w *World) StartSink(name string, incremental bool, prefer ...*Hub) *Sink {
	w.tb.Helper()
	var addrs []string
	for _, h := range prefer {
		addrs = append(addrs, h.Serve)
	}
	src := w.SinkCert(name)
	s := &Sink{Name: name, state: map[string]*mcpapi.Resource{}, encoded: map[string][]byte{}, sent: map[string]int{}, done: make(chan struct{})}
	var first atomic.Bool
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{Collection}, Node: &mcppb.SinkNode{Id: name}, FullStateOnly: !incremental,
		Logger: slog.New(slog.DiscardHandler),
		Applier: mcp.ApplierFunc(func(_ context.Context, c *mcp.Change) error {
			s.apply(c, first.Swap(false))
			return nil
		}),
		Hooks: mcp.Hooks{
			StreamOpened: func(*mcp.StreamInfo) { s.streams.Add(1); s.open.Add(1); first.Store(true) },
			StreamClosed: func(*mcp.StreamInfo, error) { s.open.Add(-1) },
		}})
	if err != nil {
		w.tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	creds := credentials.NewTLS(src.ClientConfig(""))
	go func() {
		defer close(s.done)
		mcp.Redial(ctx, addrs, creds, mcp.Backoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}, slog.New(slog.DiscardHandler), nil,
			func(ctx context.Context, conn *grpc.ClientConn) error {
				s.target.Store(conn.Target())
				return sink.PullFrom(ctx, conn)
			})
	}()
	w.tb.Cleanup(func() { cancel(); <-s.done })
	return s
}

// SinkCert issues (once) sink name's certificate and returns its TLS source: a benchmark
// issues them all before it times the sinks' subscriptions.
func (w *World) SinkCert(name string) *meshtls.Source {
	w.tb.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if src := w.sinkCerts[name]; src != nil {
		return src
	}
	c, k, _ := w.ca.Issue(w.tb, w.Dir, "sink-"+name, "spiffe://"+TrustDomain+"/sink/"+name)
	src, err := meshtls.NewSource(meshtls.Files{Cert: c, Key: k, CA: w.bundle}, slog.New(slog.DiscardHandler))
	if err != nil {
		w.tb.Fatal(err)
	}
	w.sinkCerts[name] = src
	return src
}

func (s *Sink) apply(c *mcp.Change, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pushes++
	s.received += len(c.Resources)
	if !c.Incremental {
		listed := map[string]bool{}
		for _, r := range c.Resources {
			listed[r.GetMetadata().GetName()] = true
		}
		for n := range s.state {
			if !listed[n] {
				s.removed = append(s.removed, n)
				delete(s.state, n)
				delete(s.encoded, n)
			}
		}
	}
	for _, n := range c.Removed {
		if _, ok := s.state[n]; ok {
			s.removed = append(s.removed, n)
		}
		delete(s.state, n)
		delete(s.encoded, n)
	}
	for i, r := range c.Resources {
		n := r.GetMetadata().GetName()
		s.state[n] = r
		s.encoded[n] = c.Entries[i].Encoded // the bytes as the hub served them
		s.sent[n]++
	}
	if first {
		s.firstSet += s.viewLocked() + "\n"
	}
}

func (s *Sink) viewLocked() string {
	out := make([]string, 0, len(s.state))
	for n, r := range s.state {
		out = append(out, fmt.Sprintf("%s@%s", n, r.GetMetadata().GetVersion()))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// View is the sink's state: "namespace/name@cluster/version ..." sorted.
func (s *Sink) View() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewLocked()
}

// Names is the sink's state without versions, and the origin cluster of each.
func (s *Sink) Names() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.state))
	for n, r := range s.state {
		out = append(out, n+"@"+r.GetMetadata().GetAnnotations()[api.OriginAnnotation])
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// Removed returns every deletion the sink was sent, in order.
func (s *Sink) Removed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.removed...)
}

// Encoded returns the bytes of each resource the sink holds, as the hub served them.
func (s *Sink) Encoded() map[string][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]byte, len(s.encoded))
	for n, b := range s.encoded {
		out[n] = b
	}
	return out
}

// Sent returns how many times a push carried resource name (resent, updated or added
// again after a deletion: each counts).
func (s *Sink) Sent(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent[name]
}

// FirstViews returns the view right after the first push of each stream, one per line.
func (s *Sink) FirstViews() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstSet
}

// Streams returns how many streams the sink opened, and whether one is open now.
func (s *Sink) Streams() (opened int64, connected bool) { return s.streams.Load(), s.open.Load() > 0 }

// Received returns how many resources the sink was sent, over all pushes.
func (s *Sink) Received() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received
}

// Pushes returns how many pushes the sink applied.
func (s *Sink) Pushes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pushes
}

// Contains reports whether the sink holds resource name and its body contains text (a
// marker written into the spec, like the "g2" of World.Write's generation).
func (s *Sink) Contains(name, text string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.state[name]
	return r != nil && strings.Contains(string(r.GetBody().GetValue()), text)
}

// Target returns the serve address the sink's current (or last) stream went to.
func (s *Sink) Target() string {
	t, _ := s.target.Load().(string)
	return t
}

// Publisher is an MCP source in the test process pushing one cluster's resources to a
// replica as that cluster (its certificate), like a minion without files in between.
type Publisher struct {
	Cache   *mcp.Cache
	cluster string
}

// Publish starts pushing cluster's resources to h until the test ends.
func (w *World) Publish(cluster string, h *Hub) *Publisher {
	w.tb.Helper()
	c, k, _ := w.ca.Issue(w.tb, w.Dir, "publisher-"+cluster, "spiffe://"+TrustDomain+"/cluster/"+cluster)
	src, err := meshtls.NewSource(meshtls.Files{Cert: c, Key: k, CA: w.bundle}, slog.New(slog.DiscardHandler))
	if err != nil {
		w.tb.Fatal(err)
	}
	p := &Publisher{Cache: mcp.NewCache(Collection), cluster: cluster}
	source, err := mcp.NewSource(mcp.SourceOptions{Watcher: p.Cache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		w.tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		mcp.Redial(ctx, []string{h.Ingest}, credentials.NewTLS(src.ClientConfig("")), mcp.Backoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond},
			slog.New(slog.DiscardHandler), nil, func(ctx context.Context, conn *grpc.ClientConn) error { return source.PushTo(ctx, conn) })
	}()
	w.tb.Cleanup(func() { cancel(); <-done })
	return p
}

// Put publishes VirtualService name of the cluster with marker in its spec (see
// Sink.Contains).
func (p *Publisher) Put(name, marker string) error {
	ns := "ns-" + p.cluster
	vs := &networking.VirtualService{Hosts: []string{name + "." + p.cluster + ".example.com"},
		Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: name + "." + ns + ".svc.cluster.local", Subset: marker}}}}}}
	body, err := anypb.New(vs)
	if err != nil {
		return err
	}
	_, err = p.Cache.PutResources(Collection, &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: ns + "/" + name, Version: marker}, Body: body})
	return err
}
