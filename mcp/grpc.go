package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshfed/meshfed/internal/lograte"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// DevIdentityHeader is the gRPC metadata key in which a peer states its identity when there
// is no TLS to prove it: a minion sends its cluster name, and a hub in insecure mode takes
// it on trust. With TLS it is ignored: the identity is the certificate's.
const DevIdentityHeader = "x-meshfed-dev-identity"

// ServerConfig configures the admission of new streams on SourceServer, SinkServer and
// XDSServer. A stream is admitted in this order: Authenticate, the per-peer rate limit,
// Ready, the per-peer cap on open streams, its group's limits (Groups); once admitted, it
// is closed if its peer says nothing within IdleTimeout. Every refusal is counted by its
// reason (meshfed_mcp_streams_rejected_total) and logged at most once per peer (or group)
// and reason per minute, with the number of refusals not logged since.
type ServerConfig struct {
	// Authenticate returns the authenticated identity of the peer of a new stream, e.g. from
	// its verified client certificate. An error refuses the stream with that error's status
	// (use codes.Unauthenticated or codes.PermissionDenied). Nil admits every peer with an
	// empty identity. It decides who the peer is, not whether the server is ready: that is
	// Ready's.
	Authenticate func(ctx context.Context) (identity string, err error)
	// StreamRate is the number of new streams per second allowed per peer (identity, or IP
	// address without one); excess streams are refused with ResourceExhausted. Istio's sink
	// redials in a tight loop: this keeps such a peer from burning the server. Default 5.
	StreamRate float64
	// StreamBurst is the number of streams a peer may open at once before StreamRate applies.
	// Default 20.
	StreamBurst int
	// Ready, if set, is asked for each stream that passed Authenticate and the rate limit
	// (so a peer retrying in a tight loop is rate limited, not answered each time): while it
	// says not ok, streams are refused with Unavailable, a message saying why and to retry
	// in wait, and a google.rpc.RetryInfo detail of wait, counted as warming_up. For a
	// server that has nothing whole to serve yet (a hub warming up), or not yet for this
	// peer (info: who it is; its Node is not known yet).
	Ready func(info *StreamInfo) (wait time.Duration, why string, ok bool)
	// MaxStreamsPerPeer caps the streams one peer (identity, else IP address) keeps open at
	// once on this service; one more is refused with ResourceExhausted. Default
	// DefaultMaxStreamsPerPeer; negative: no cap.
	MaxStreamsPerPeer int
	// MaxStreamsPerPeerSetting names where the server's operator sets MaxStreamsPerPeer
	// (e.g. "limits.maxStreamsPerPeer"), for the refusal's log line and the refused peer's
	// message: a fleet of peers sharing one identity meets the cap in normal operation, and
	// whoever reads either must learn what to raise. Empty: no setting is named.
	MaxStreamsPerPeerSetting string
	// IdleTimeout is how long a new stream's peer has to send its first message before the
	// stream is closed (DeadlineExceeded, counted as idle). Every meshfed and Istio peer
	// speaks at once (a sink subscribes, a source sends a trigger or its first push), and a
	// subscribed sink may then be quiet for as long as nothing changes: so only the first
	// message is awaited. Default DefaultIdleTimeout; negative: none.
	IdleTimeout time.Duration
	// RefusalDelay is how long a stream refused for exceeding a limit (ResourceExhausted: a
	// peer's or a group's rate or cap) waits for its answer. A peer that opens streams in
	// a tight loop, as Istio's sinks do on failure, or as a flood does, then waits instead
	// of spinning, and neither it nor the server burns CPU on refusals that the limits
	// were meant to spare: the caps, not the rate of refusals, bound what it costs.
	// Default DefaultRefusalDelay; negative: answered at once.
	RefusalDelay time.Duration
	// MaxHeldRefusals bounds the refused streams waiting out RefusalDelay at once (each
	// holds a goroutine); beyond it, refusals are answered at once. Default
	// DefaultMaxHeldRefusals.
	MaxHeldRefusals int
	// Unauthenticated marks every stream this server admits as unauthenticated
	// (StreamInfo.Unauthenticated), for a listener that asks peers for no credentials;
	// Authenticate still runs (it may refuse) and its identity is ignored.
	Unauthenticated bool
	// Listener names the server's listener in StreamInfo.Listener, for a store that serves
	// several kinds of peers (the hub: sinks, and minions' relays on its ingest listener).
	Listener string
	// Groups, if set, bounds groups of peers, each group all together and across every
	// server that shares the Groups: how many streams its peers keep open and how fast they
	// open new ones (see PeerGroups). It is asked last, after the per-peer cap: a peer in a
	// tight loop spends its own budget before its group's, and a server that is not ready
	// spends nobody's.
	Groups *PeerGroups
	// Logger for refusals. Default slog.Default().
	Logger *slog.Logger
	// Metrics, or nil for none.
	Metrics *Metrics
}

const (
	// DefaultMaxStreamsPerPeer is ServerConfig.MaxStreamsPerPeer's default. It is sized for
	// the most a legitimate peer opens on one identity: a hub replica follows every cluster
	// a peer holds, one stream each. A server whose peers need fewer (a hub's sinks) sets
	// its own.
	DefaultMaxStreamsPerPeer = 1024
	// DefaultIdleTimeout is ServerConfig.IdleTimeout's default: a peer that has not spoken
	// within it is not going to.
	DefaultIdleTimeout = 30 * time.Second
	// DefaultRefusalDelay is ServerConfig.RefusalDelay's default: a looping peer makes at
	// most one attempt a second per stream it keeps trying, and a well-behaved one, told
	// by a RetryInfo when to come back, waits at least that anyway.
	DefaultRefusalDelay = time.Second
	// DefaultMaxHeldRefusals is ServerConfig.MaxHeldRefusals's default: a few MB of
	// goroutine stacks.
	DefaultMaxHeldRefusals = 1024
)

// Reasons a stream is refused or closed by admission (meshfed_mcp_streams_rejected_total).
const (
	rejectUnauthenticated  = "unauthenticated"
	rejectPermissionDenied = "permission_denied"
	rejectUnavailable      = "unavailable" // Authenticate said Unavailable
	rejectRateLimited      = "rate_limited"
	rejectWarmingUp        = "warming_up"
	rejectTooManyStreams   = "too_many_streams"
	rejectIdle             = "idle"
	rejectRefused          = "refused" // SinkServer's newSink refused the stream
)

// admission authenticates, rate-limits, caps and times out new streams.
type admission struct {
	cfg      ServerConfig
	now      func() time.Time
	logs     *lograte.Limiter // one refusal line per peer and reason per interval
	limiters *lru.Cache[string, *rate.Limiter]

	mu   sync.Mutex     // guards open and serializes limiter creation
	open map[string]int // open streams per peer key; a key is removed at 0
	held chan struct{}  // a place per refused stream waiting out RefusalDelay
}

func newAdmission(cfg ServerConfig) *admission {
	if cfg.StreamRate <= 0 {
		cfg.StreamRate = 5
	}
	if cfg.StreamBurst <= 0 {
		cfg.StreamBurst = 20
	}
	if cfg.MaxStreamsPerPeer == 0 {
		cfg.MaxStreamsPerPeer = DefaultMaxStreamsPerPeer
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.RefusalDelay == 0 {
		cfg.RefusalDelay = DefaultRefusalDelay
	}
	if cfg.MaxHeldRefusals <= 0 {
		cfg.MaxHeldRefusals = DefaultMaxHeldRefusals
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	limiters, _ := lru.New[string, *rate.Limiter](65536) // only fails for a size <= 0
	a := &admission{cfg: cfg, now: time.Now, limiters: limiters, open: map[string]int{}, held: make(chan struct{}, cfg.MaxHeldRefusals)}
	a.logs = lograte.New(lograte.DefaultInterval, func() time.Time { return a.now() })
	return a
}

// admit decides on a new stream in the given role. An admitted stream must be ended with
// its end method when its handler returns. A stream refused for exceeding a limit gets its
// answer after RefusalDelay (see hold).
func (a *admission) admit(st grpc.ServerStream, role string) (*admittedStream, error) {
	s, err := a.decide(st, role)
	if err != nil && status.Code(err) == codes.ResourceExhausted {
		a.hold(st.Context())
	}
	return s, err
}

// hold waits out RefusalDelay, unless the peer goes away first or MaxHeldRefusals are
// already waiting.
func (a *admission) hold(ctx context.Context) {
	if a.cfg.RefusalDelay <= 0 {
		return
	}
	select {
	case a.held <- struct{}{}:
	default:
		return
	}
	defer func() { <-a.held }()
	t := time.NewTimer(a.cfg.RefusalDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// decide authenticates, rate-limits, caps and admits a new stream, or refuses it.
func (a *admission) decide(st grpc.ServerStream, role string) (*admittedStream, error) {
	ctx := st.Context()
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	identity := ""
	if a.cfg.Authenticate != nil {
		id, err := a.cfg.Authenticate(ctx)
		if err != nil {
			s, ok := status.FromError(err)
			if !ok {
				s = status.New(codes.Unauthenticated, err.Error())
			}
			reason, level := rejectUnauthenticated, slog.LevelWarn
			switch s.Code() {
			case codes.PermissionDenied:
				reason = rejectPermissionDenied
			case codes.Unavailable:
				reason, level = rejectUnavailable, slog.LevelInfo
			}
			a.refused(level, reason, host, "refusing stream: authentication failed", logPeer, addr, logRole, role, logError, err)
			return nil, s.Err()
		}
		identity = id
	}
	key := identity
	if key == "" {
		key = host
	}
	if !a.limiter(key).AllowN(a.now(), 1) {
		a.refused(slog.LevelWarn, rejectRateLimited, key, "refusing stream: peer opens streams too fast",
			logPeer, addr, logIdentity, identity, logRole, role, "limit_per_s", a.cfg.StreamRate, "burst", a.cfg.StreamBurst)
		return nil, WithRetry(status.Newf(codes.ResourceExhausted, "%v (%s): at most %g per second, burst %d",
			ErrRateLimited, key, a.cfg.StreamRate, a.cfg.StreamBurst), time.Duration(float64(time.Second)/a.cfg.StreamRate))
	}
	infoIdentity := identity
	if a.cfg.Unauthenticated {
		infoIdentity = ""
	}
	info := newStreamInfo(role, "server", addr, infoIdentity)
	info.Unauthenticated = a.cfg.Unauthenticated
	info.Listener = a.cfg.Listener
	if a.cfg.Ready != nil {
		if wait, why, ok := a.cfg.Ready(info); !ok {
			if why == "" {
				why = ErrNotReady.Error()
			}
			a.refused(slog.LevelInfo, rejectWarmingUp, key, "refusing stream: not ready to serve",
				logPeer, addr, logIdentity, identity, logRole, role, "why", why, "retry_in", wait)
			msg := why
			if wait > 0 {
				msg = fmt.Sprintf("%s; retry in %v", why, wait)
			}
			return nil, WithRetry(status.New(codes.Unavailable, msg), wait)
		}
	}
	if n, ok := a.acquire(key); !ok {
		attrs := []any{logPeer, addr, logIdentity, identity, logRole, role, "open", n, "max_per_peer", a.cfg.MaxStreamsPerPeer,
			"metric", `meshfed_mcp_streams_rejected_total{reason="` + rejectTooManyStreams + `"}`}
		setting := ""
		if s := a.cfg.MaxStreamsPerPeerSetting; s != "" {
			attrs = append(attrs, "raise", s)
			setting = " (" + s + ")"
		}
		a.refused(slog.LevelWarn, rejectTooManyStreams, key, "refusing stream: peer has too many streams open", attrs...)
		return nil, status.Errorf(codes.ResourceExhausted, "%v (%s): %d open, at most %d per peer%s",
			ErrTooManyStreams, key, n, a.cfg.MaxStreamsPerPeer, setting)
	}
	var leave func()
	if a.cfg.Groups != nil {
		var err error
		if leave, err = a.cfg.Groups.admit(info, a.cfg.Metrics); err != nil {
			a.release(key)
			return nil, err
		}
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && mdResumes(md) {
		info.setResumes()
	}
	s := &admittedStream{ServerStream: st, info: info, a: a, key: key, leave: leave}
	s.ctx, s.cancel = context.WithCancel(ctx)
	if a.cfg.IdleTimeout > 0 {
		s.timer = time.AfterFunc(a.cfg.IdleTimeout, s.idle)
	} else {
		s.state.Store(streamSpoke)
	}
	return s, nil
}

// refused counts a refusal under reason and logs it unless a line for the same peer key
// and reason went out less than an interval ago.
func (a *admission) refused(level slog.Level, reason, key, msg string, attrs ...any) {
	a.cfg.Metrics.streamRejected(reason)
	ok, suppressed := a.logs.Allow(reason + "\x00" + key)
	if !ok {
		return
	}
	a.cfg.Logger.Log(context.Background(), level, msg, append(attrs, "reason", reason, "suppressed", suppressed)...)
}

// WithRetry returns s as an error with a google.rpc.RetryInfo of wait, if wait is positive:
// a refusal that tells the peer when to come back.
func WithRetry(s *status.Status, wait time.Duration) error {
	if wait <= 0 {
		return s.Err()
	}
	if d, err := s.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		return d.Err()
	}
	return s.Err()
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

// acquire takes a place for one more stream of key under the cap; when there is none it
// returns false and how many key has open.
func (a *admission) acquire(key string) (open int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.open[key]
	if a.cfg.MaxStreamsPerPeer > 0 && n >= a.cfg.MaxStreamsPerPeer {
		return n, false
	}
	a.open[key] = n + 1
	return n + 1, true
}

func (a *admission) release(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.open[key]--; a.open[key] <= 0 {
		delete(a.open, key)
	}
}

// States of an admitted stream as to its idle timeout.
const (
	streamWaiting int32 = iota // no message yet
	streamSpoke                // its peer sent a message (or there is no timeout)
	streamIdled                // the timeout passed first: the stream is being closed
)

// admittedStream is a stream admission let through: its context is cancelled if the peer
// sends nothing within the idle timeout, and it holds one of its peer's places under the
// cap until end.
type admittedStream struct {
	grpc.ServerStream
	info   *StreamInfo
	ctx    context.Context
	cancel context.CancelFunc
	a      *admission
	key    string
	leave  func()       // gives the stream's place in its group back; nil without Groups
	timer  *time.Timer  // nil without an idle timeout
	state  atomic.Int32 // streamWaiting, streamSpoke or streamIdled
}

// Context is the stream's context, ended early if the stream idles.
func (s *admittedStream) Context() context.Context { return s.ctx }

// RecvMsg receives as the gRPC stream does; the first message stops the idle timeout,
// unless the timeout passed first: then the message is dropped, as the stream is closing.
func (s *admittedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err != nil || s.state.Load() == streamSpoke {
		return err
	}
	if !s.state.CompareAndSwap(streamWaiting, streamSpoke) {
		return s.idleError()
	}
	s.timer.Stop()
	return nil
}

func (s *admittedStream) idleError() error {
	return status.Errorf(codes.DeadlineExceeded, "%v: the peer sent no message within %v of opening the stream",
		ErrIdle, s.a.cfg.IdleTimeout)
}

// idle runs when the idle timeout passes: unless a message came first, the stream ends.
func (s *admittedStream) idle() {
	if !s.state.CompareAndSwap(streamWaiting, streamIdled) {
		return
	}
	s.a.refused(slog.LevelWarn, rejectIdle, s.key, "closing stream: peer sent nothing within the idle timeout",
		logStream, s.info.ID, logPeer, s.info.Peer, logIdentity, s.info.Identity, logRole, s.info.Role, "idle_timeout", s.a.cfg.IdleTimeout)
	s.cancel()
}

// end releases the stream's place and returns what its handler returns: err, or, if the
// idle timeout ended the stream, a status saying so.
func (s *admittedStream) end(err error) error {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.cancel()
	s.a.release(s.key)
	if s.leave != nil {
		s.leave()
	}
	if s.state.Load() == streamIdled {
		return s.idleError()
	}
	return err
}

// PeerGroups bounds groups of peers, each group all together, across the servers that
// share it (ServerConfig.Groups): a hub gives every listener the same PeerGroups, keyed by
// tenant, so that one tenant's peers, however many and wherever they connect, hold at most
// its share of the hub's streams, and its storm of new streams is refused before it is
// felt by another tenant's. The engine knows a group only by the name Of gives it and its
// limits: what a group is (a tenant, a team, a tier) is the server owner's business, so the
// engine, which minions and plain MCP servers use too, stays free of it; Kind names it in
// refusals. It is safe for concurrent use.
type PeerGroups struct {
	cfg  PeerGroupsConfig
	now  func() time.Time
	logs *lograte.Limiter // one refusal line per group and reason per interval

	mu     sync.Mutex // guards groups; Opened is called under it, in order
	groups map[string]*peerGroup
}

// PeerGroupsConfig configures PeerGroups.
type PeerGroupsConfig struct {
	// Kind says what a group is, in the reasons refusals are counted under
	// (meshfed_mcp_streams_rejected_total: <Kind>_rate_limited, <Kind>_too_many_streams), in
	// their messages and in the log. Default "group".
	Kind string
	// Of returns the group of a new stream's peer (its identity, role and listener; the
	// stream has no node yet) and the group's limits. It is asked for every new stream, so
	// groups and limits follow a change of the server owner's configuration. Required.
	Of func(info *StreamInfo) (group string, limits GroupLimits)
	// Opened, if set, is told how many streams a group's peers have open after each change
	// (a stream admitted, or ended), in order for each group: for a gauge.
	Opened func(group string, open int)
	// Refused, if set, is told each stream a group's limit refused, with the reason.
	Refused func(group, reason string)
	// Logger for refusals, a line per group and reason per interval. Default slog.Default().
	Logger *slog.Logger
}

// GroupLimits bound one group's peers, all together. A zero field bounds nothing.
type GroupLimits struct {
	// MaxStreams is how many streams the group's peers may keep open at once; one more is
	// refused with ResourceExhausted.
	MaxStreams int
	// StreamsPerSecond and StreamBurst bound how fast the group's peers open streams;
	// faster ones are refused with ResourceExhausted and a RetryInfo.
	StreamsPerSecond float64
	StreamBurst      int
}

// peerGroup is one group's open streams and new-stream limiter (nil without a rate).
type peerGroup struct {
	open  int
	lim   *rate.Limiter
	rate  float64
	burst int
}

// NewPeerGroups returns PeerGroups for cfg.
func NewPeerGroups(cfg PeerGroupsConfig) *PeerGroups {
	if cfg.Kind == "" {
		cfg.Kind = "group"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &PeerGroups{cfg: cfg, now: time.Now, groups: map[string]*peerGroup{}}
	g.logs = lograte.New(lograte.DefaultInterval, func() time.Time { return g.now() })
	return g
}

// Open returns how many streams group's peers have open.
func (g *PeerGroups) Open(group string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if pg := g.groups[group]; pg != nil {
		return pg.open
	}
	return 0
}

// admit takes a place for info's stream in its group, or refuses it (counted in m). The
// stream gives its place back with leave, once.
func (g *PeerGroups) admit(info *StreamInfo, m *Metrics) (leave func(), err error) {
	group, lim := g.cfg.Of(info)
	now := g.now()
	g.mu.Lock()
	pg := g.groups[group]
	if pg == nil {
		pg = &peerGroup{}
		g.groups[group] = pg
	}
	if lim.StreamsPerSecond > 0 {
		burst := max(lim.StreamBurst, 1)
		if pg.lim == nil || pg.rate != lim.StreamsPerSecond || pg.burst != burst {
			pg.lim, pg.rate, pg.burst = rate.NewLimiter(rate.Limit(lim.StreamsPerSecond), burst), lim.StreamsPerSecond, burst
		}
		if !pg.lim.AllowN(now, 1) {
			g.mu.Unlock()
			g.refused(m, group, "rate_limited", info, "limit_per_s", lim.StreamsPerSecond, "burst", burst)
			return nil, WithRetry(status.Newf(codes.ResourceExhausted, "too many new streams from the peers of %s %q: at most %g per second, burst %d, all of them together",
				g.cfg.Kind, group, lim.StreamsPerSecond, burst), time.Duration(float64(time.Second)/lim.StreamsPerSecond))
		}
	} else {
		pg.lim = nil
	}
	if n := pg.open; lim.MaxStreams > 0 && n >= lim.MaxStreams {
		g.mu.Unlock()
		g.refused(m, group, "too_many_streams", info, "open", n, "max_streams", lim.MaxStreams)
		return nil, status.Errorf(codes.ResourceExhausted, "too many open streams from the peers of %s %q: %d open, at most %d, all of them together",
			g.cfg.Kind, group, n, lim.MaxStreams)
	}
	pg.open++
	if g.cfg.Opened != nil {
		g.cfg.Opened(group, pg.open)
	}
	g.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { g.leave(group) }) }, nil
}

// leave gives back a place in group. A group with nothing open and a full limiter is
// forgotten: a fresh one is the same.
func (g *PeerGroups) leave(group string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	pg := g.groups[group]
	pg.open--
	if g.cfg.Opened != nil {
		g.cfg.Opened(group, pg.open)
	}
	if pg.open == 0 && (pg.lim == nil || pg.lim.TokensAt(g.now()) >= float64(pg.burst)) {
		delete(g.groups, group)
	}
}

// refused counts a group's refusal and logs it unless a line for the same group and reason
// went out less than an interval ago (whichever server refused).
func (g *PeerGroups) refused(m *Metrics, group, what string, info *StreamInfo, attrs ...any) {
	reason := g.cfg.Kind + "_" + what
	m.streamRejected(reason)
	if g.cfg.Refused != nil {
		g.cfg.Refused(group, reason)
	}
	ok, suppressed := g.logs.Allow(reason + "\x00" + group)
	if !ok {
		return
	}
	msg := "refusing stream: the peers of its " + g.cfg.Kind + " open streams too fast"
	if what == "too_many_streams" {
		msg = "refusing stream: the peers of its " + g.cfg.Kind + " have too many streams open"
	}
	g.cfg.Logger.Warn(msg, append(attrs, g.cfg.Kind, group, logPeer, info.Peer, logIdentity, info.Identity, logRole, info.Role,
		"listener", info.Listener, "reason", reason, "suppressed", suppressed)...)
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
	st, err := s.adm.admit(stream, "source")
	if err != nil {
		return err
	}
	if err := stream.SendHeader(resumesMD); err != nil {
		return st.end(err)
	}
	return st.end(serverError(st.ctx, s.src.Serve(st.ctx, st, st.info)))
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
	st, err := s.adm.admit(stream, "sink")
	if err != nil {
		return err
	}
	info := st.info
	sink, err := s.newSink(st.ctx, info)
	if err != nil {
		s.adm.refused(slog.LevelWarn, rejectRefused, st.key, "refusing stream", logPeer, info.Peer, logIdentity, info.Identity, logError, err)
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.PermissionDenied, err.Error())
		}
		return st.end(err)
	}
	return st.end(serverError(st.ctx, sink.Serve(st.ctx, st, info)))
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
