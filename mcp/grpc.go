package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// DevIdentityHeader is the gRPC metadata key in which a peer states its identity when there
// is no TLS to prove it: a minion sends its cluster name, and a hub in insecure mode takes
// it on trust. With TLS it is ignored: the identity is the certificate's.
const DevIdentityHeader = "x-meshfed-dev-identity"

// ServerConfig configures the admission of new streams on SourceServer and SinkServer.
type ServerConfig struct {
	// Authenticate returns the authenticated identity of the peer of a new stream, e.g. from
	// its verified client certificate. An error refuses the stream with that error's status
	// (use codes.Unauthenticated or codes.PermissionDenied). Nil admits every peer with an
	// empty identity.
	Authenticate func(ctx context.Context) (identity string, err error)
	// StreamRate is the number of new streams per second allowed per peer (identity, or IP
	// address without one); excess streams are refused with ResourceExhausted. Istio's sink
	// redials in a tight loop: this keeps such a peer from burning the server. Default 5.
	StreamRate float64
	// StreamBurst is the number of streams a peer may open at once before StreamRate applies.
	// Default 20.
	StreamBurst int
	// Unauthenticated marks every stream this server admits as unauthenticated
	// (StreamInfo.Unauthenticated), for a listener that asks peers for no credentials;
	// Authenticate still runs (it may refuse) and its identity is ignored.
	Unauthenticated bool
	// Listener names the server's listener in StreamInfo.Listener, for a store that serves
	// several kinds of peers (the hub: sinks, and minions' relays on its ingest listener).
	Listener string
	// Logger for refusals. Default slog.Default().
	Logger *slog.Logger
	// Metrics, or nil for none.
	Metrics *Metrics
}

// admission authenticates and rate-limits new streams.
type admission struct {
	cfg      ServerConfig
	limiters *lru.Cache[string, *rate.Limiter]
	mu       sync.Mutex // serializes limiter creation
}

func newAdmission(cfg ServerConfig) *admission {
	if cfg.StreamRate <= 0 {
		cfg.StreamRate = 5
	}
	if cfg.StreamBurst <= 0 {
		cfg.StreamBurst = 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	limiters, _ := lru.New[string, *rate.Limiter](65536) // only fails for a size <= 0
	return &admission{cfg: cfg, limiters: limiters}
}

func (a *admission) admit(ctx context.Context, role string) (*StreamInfo, error) {
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	identity := ""
	if a.cfg.Authenticate != nil {
		id, err := a.cfg.Authenticate(ctx)
		if err != nil {
			a.cfg.Metrics.streamRejected("unauthenticated")
			a.cfg.Logger.Warn("refusing stream: authentication failed", logPeer, addr, logRole, role, logError, err)
			if _, ok := status.FromError(err); ok {
				return nil, err
			}
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		identity = id
	}
	key := identity
	if key == "" {
		key = addr
		if host, _, err := net.SplitHostPort(addr); err == nil {
			key = host
		}
	}
	if !a.limiter(key).Allow() {
		a.cfg.Metrics.streamRejected("rate_limited")
		a.cfg.Logger.Warn("refusing stream: peer opens streams too fast", logPeer, addr, logIdentity, identity, "limit_per_s", a.cfg.StreamRate)
		return nil, status.Errorf(codes.ResourceExhausted, "%v (%s): at most %g per second, burst %d",
			ErrRateLimited, key, a.cfg.StreamRate, a.cfg.StreamBurst)
	}
	if a.cfg.Unauthenticated {
		identity = ""
	}
	info := newStreamInfo(role, "server", addr, identity)
	info.Unauthenticated = a.cfg.Unauthenticated
	info.Listener = a.cfg.Listener
	if md, ok := metadata.FromIncomingContext(ctx); ok && mdResumes(md) {
		info.setResumes()
	}
	return info, nil
}

func (a *admission) limiter(key string) *rate.Limiter {
	if l, ok := a.limiters.Get(key); ok {
		return l
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.limiters.Get(key); ok {
		return l
	}
	l := rate.NewLimiter(rate.Limit(a.cfg.StreamRate), a.cfg.StreamBurst)
	a.limiters.Add(key, l)
	return l
}

// serverError turns the end of a served stream into what the gRPC handler returns.
func serverError(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(StatusCode(err), err.Error())
}

// SourceServer serves the ResourceSource service: sinks dial in and the Source pushes to them.
type SourceServer struct {
	mcppb.UnimplementedResourceSourceServer
	src *Source
	adm *admission
}

// NewSourceServer returns a ResourceSource service backed by src. Register it on a
// grpc.Server created with ServerOptions.
func NewSourceServer(src *Source, cfg ServerConfig) *SourceServer {
	return &SourceServer{src: src, adm: newAdmission(cfg)}
}

// Register registers the service on s.
func (s *SourceServer) Register(r grpc.ServiceRegistrar) { mcppb.RegisterResourceSourceServer(r, s) }

// EstablishResourceStream implements mcppb.ResourceSourceServer.
func (s *SourceServer) EstablishResourceStream(stream grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]) error {
	ctx := stream.Context()
	info, err := s.adm.admit(ctx, "source")
	if err != nil {
		return err
	}
	if err := stream.SendHeader(resumesMD); err != nil {
		return err
	}
	return serverError(ctx, s.src.Serve(ctx, stream, info))
}

// SinkServer serves the ResourceSink service: sources dial in and push to a Sink.
type SinkServer struct {
	mcppb.UnimplementedResourceSinkServer
	newSink func(ctx context.Context, info *StreamInfo) (*Sink, error)
	adm     *admission
}

// NewSinkServer returns a ResourceSink service. For each admitted stream newSink returns the
// Sink to run it with (for example, one per authenticated cluster, so resume state is kept per
// peer); an error refuses the stream with that error's status.
func NewSinkServer(newSink func(ctx context.Context, info *StreamInfo) (*Sink, error), cfg ServerConfig) *SinkServer {
	return &SinkServer{newSink: newSink, adm: newAdmission(cfg)}
}

// Register registers the service on s.
func (s *SinkServer) Register(r grpc.ServiceRegistrar) { mcppb.RegisterResourceSinkServer(r, s) }

// EstablishResourceStream implements mcppb.ResourceSinkServer.
func (s *SinkServer) EstablishResourceStream(stream grpc.BidiStreamingServer[mcppb.Resources, mcppb.RequestResources]) error {
	ctx := stream.Context()
	info, err := s.adm.admit(ctx, "sink")
	if err != nil {
		return err
	}
	sink, err := s.newSink(ctx, info)
	if err != nil {
		s.adm.cfg.Metrics.streamRejected("refused")
		s.adm.cfg.Logger.Warn("refusing stream", logPeer, info.Peer, logIdentity, info.Identity, logError, err)
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return serverError(ctx, sink.Serve(ctx, stream, info))
}

func target(conn grpc.ClientConnInterface) string {
	if cc, ok := conn.(interface{ Target() string }); ok {
		return cc.Target()
	}
	return ""
}

// PushTo opens a stream to the ResourceSink service on conn and runs the source role on it
// until the stream fails or ctx is done. It returns nil only when the sink closed the stream
// cleanly. Callers redial (with backoff) as they see fit.
func (s *Source) PushTo(parent context.Context, conn grpc.ClientConnInterface) error {
	return s.PushToAs(parent, conn, "", nil)
}

// PushToAs is PushTo for a sink the caller has identified: the stream's StreamInfo carries
// identity and node, so the Watcher routes it as it would that sink dialing in (a hub dialing
// out to a sink that only listens uses this with the sink's configured identity).
func (s *Source) PushToAs(parent context.Context, conn grpc.ClientConnInterface, identity string, node *mcppb.SinkNode) error {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(parent, ResumesHeader, "1"))
	defer cancel()
	st, err := conn.NewStream(ctx, &mcppb.ResourceSink_ServiceDesc.Streams[0], mcppb.ResourceSink_EstablishResourceStream_FullMethodName, callOptions()...)
	if err != nil {
		return clientError(parent, fmt.Errorf("open ResourceSink stream to %s: %w", target(conn), err))
	}
	// Like Istio's source, speak first: some proxies only forward a stream once the client
	// has sent a message. Sinks ignore it (Istio's NACKs it, and Serve ignores that NACK).
	if err := st.SendMsg(&mcppb.Resources{Collection: TriggerCollection}); err != nil {
		return clientError(parent, fmt.Errorf("send trigger to %s: %w", target(conn), sendError(st, err)))
	}
	info := newStreamInfo("source", "client", target(conn), identity)
	info.setNodeOnce(node)
	return clientError(parent, s.Serve(ctx, st, info))
}

// PullFrom opens a stream to the ResourceSource service on conn and runs the sink role on it
// until the stream fails or ctx is done. It returns nil only when the source closed the
// stream cleanly. A stream the source ends because it does not serve a collection is
// followed at once by one without that collection (see Negotiation).
func (k *Sink) PullFrom(parent context.Context, conn grpc.ClientConnInterface) error {
	opts := callOptions()
	if k.opts.MaxMessageSize > 0 {
		opts = append(opts, grpc.MaxCallRecvMsgSize(k.opts.MaxMessageSize))
	}
	for {
		before := len(k.Refused())
		err := k.pullOnce(parent, conn, opts)
		if _, ok := refusedCollection(err); !ok || len(k.Refused()) == before || parent.Err() != nil {
			return clientError(parent, err)
		}
	}
}

func (k *Sink) pullOnce(parent context.Context, conn grpc.ClientConnInterface, opts []grpc.CallOption) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	st, err := conn.NewStream(ctx, &mcppb.ResourceSource_ServiceDesc.Streams[0], mcppb.ResourceSource_EstablishResourceStream_FullMethodName, opts...)
	if err != nil {
		return fmt.Errorf("open ResourceSource stream to %s: %w", target(conn), err)
	}
	return k.Serve(ctx, st, newStreamInfo("sink", "client", target(conn), ""))
}

// clientError reports the caller's own cancellation as its context error rather than as the
// gRPC status the stream ended with.
func clientError(parent context.Context, err error) error {
	if err != nil && parent.Err() != nil {
		return parent.Err()
	}
	return err
}

// sendError returns the real reason a send failed on a stream that no goroutine is reading
// (see streamEnd for streams being served).
func sendError(st MsgStream, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	var discard rawFrame
	for {
		if rerr := st.RecvMsg(&discard); rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return err
			}
			return rerr
		}
	}
}
