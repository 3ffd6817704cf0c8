package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/meshfed/meshfed/hub/durable"
	"github.com/meshfed/meshfed/internal/connlimit"
	"github.com/meshfed/meshfed/internal/lograte"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Hub is one hub process: ingest from minions, the store, and serving to sinks.
type Hub struct {
	cfg        *Config // as started: the fields a reload may not change are read from it
	live       atomic.Pointer[live]
	log        *slog.Logger
	reg        *prometheus.Registry
	metrics    *Metrics
	mcpMetrics *mcp.Metrics
	layer      Layer
	// layerChanged is the layer's StateChanged (nil for a single hub).
	layerChanged func(cluster, collection string, put []*mcp.Entry, removed []string)
	// state is the state file (persist.go): nil until Run opens it, and when it is off.
	state    atomic.Pointer[durable.Store]
	stateErr atomic.Pointer[error] // why it could not be opened
	// lostState says why the state file may lack clusters this run did not start with (it
	// could not be read or opened, or its last writes were lost): one a reload adds may be
	// one it held, a departed cluster whose objects sinks still have (nil: it cannot).
	lostState atomic.Pointer[string]
	// stateFaults are Options.StateFaults (tests only).
	stateFaults *durable.Faults
	now         func() time.Time
	// nodeIDLogs keeps the line saying a sink's SinkNode id is not its certificate's name to
	// one per identity per interval (serve.go): a fleet sharing a certificate says it on
	// every stream and collection.
	nodeIDLogs *lograte.Limiter

	store    *store
	sinks    *sinkRegistry
	events   *journal
	watchers *watchRegistry
	source   *mcp.Source
	creds    credentials.TransportCredentials // server side; nil in development mode
	// conns bounds every listener's connections before their handshake (limits'
	// Connections): one for the process, as its open files are.
	conns    *connlimit.Guard
	dialCred credentials.TransportCredentials // client side
	health   *health.Server
	// serverOnlyCreds authenticate the hub only (serveUnauthenticated).
	serverOnlyCreds credentials.TransportCredentials
	// adminTLS is the adminTLS listener's configuration (nil when it is off): mutual TLS,
	// verified as the gRPC listeners verify, so that its requests carry a verified
	// certificate for operator to read the identity from.
	adminTLS *tls.Config
	// dryRuns holds a token per dry run of a candidate being evaluated, or cooling down
	// after it (dryRunSlots at most), each evaluated for at most dryRunTimeout (dryrun.go;
	// nanoseconds, atomic: a test shortens it on a running hub).
	dryRuns       chan struct{}
	dryRunTimeout atomic.Int64
	dryRunFreeAt  atomic.Int64 // when the pause after the last evaluation ends (unix ns; 0: while one is evaluated)

	clustersMu sync.RWMutex // guards clusters
	clusters   map[string]*clusterState

	// configMu orders the changes of the live configuration: a reload, and a departed
	// cluster leaving for good (forgetDeparted). Taken before clustersMu.
	configMu sync.Mutex

	started   time.Time    // set by Run before any stream
	rounds    atomic.Int64 // of Housekeep
	warmFrom  atomic.Int64 // when the warm-up started counting (UnixNano; 0: Run has not started housekeeping)
	overQuota atomic.Int64 // clusters refused objects for a store bound (resolicit)
	unknown   atomic.Int64 // clusters whose last state is unknown (unknown.go)

	mu         sync.Mutex // guards the following fields
	ready      bool
	readyCh    chan struct{}
	ingestAddr string
	serveAddr  string
	unauthAddr string
	httpAddr   string
	adminAddr  string // adminTLS's bound address
}

// Options plug optional parts into a Hub. The zero value is a single hub with a registry
// of its own.
type Options struct {
	// Registry receives the hub's and the engine's metrics (nil: a new registry).
	Registry *prometheus.Registry
	// Layer runs beside the core (package hub/replicas); nil: none.
	Layer Layer
	// Clock is the time every decision of the hub reads (the warm-up, staleness, the
	// breaker's settling, last contacts); nil: time.Now. A test that sets it advances it and
	// calls Housekeep, rather than waiting for Run's once-a-second round.
	Clock func() time.Time
	// StateFaults make the state file's disk fail, for tests; nil: none.
	StateFaults *durable.Faults
}

// live is the part of the configuration a reload replaces.
type live struct {
	cfg  *Config
	comp *compiled
}

func (h *Hub) current() *live { return h.live.Load() }

// New builds a hub for cfg.
func New(cfg *Config, log *slog.Logger, opts Options) (*Hub, error) {
	comp, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	if cfg.Replicas != nil && opts.Layer == nil {
		return nil, errors.New("replicas: a hub with a replicas section is built by package hub/replicas (replicas.New), which plugs in the replica layer")
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	layer := opts.Layer
	var layerChanged func(cluster, collection string, put []*mcp.Entry, removed []string)
	if layer == nil {
		layer = noLayer{}
	} else {
		layerChanged = layer.StateChanged
	}
	now := opts.Clock
	if now == nil {
		now = time.Now
	}
	h := &Hub{cfg: cfg, log: log, reg: reg, metrics: NewMetrics(reg), mcpMetrics: mcp.NewMetrics(reg), layer: layer, now: now,
		watchers: newWatchRegistry(), clusters: map[string]*clusterState{}, readyCh: make(chan struct{}), health: health.NewServer(),
		layerChanged: layerChanged, stateFaults: opts.StateFaults, dryRuns: make(chan struct{}, dryRunSlots)}
	h.dryRunTimeout.Store(int64(dryRunTimeout))
	h.nodeIDLogs = lograte.New(lograte.DefaultInterval, func() time.Time { return h.now() })
	h.live.Store(&live{cfg: cfg, comp: comp})
	var changed func(cluster, collection string, put []*mcp.Entry, removed []string)
	if cfg.Persist || layerChanged != nil {
		changed = h.stateChanged // otherwise nothing keeps what clusters sent beyond the store
	}
	h.store = newStore(cfg.Collections, ConflictPolicy{Priority: cfg.Conflicts.Priority}, comp.tenants, log, h.metrics, changed)
	h.store.movedAway = h.stateMovedAway
	for _, c := range cfg.allClusters() {
		h.addClusterLocked(c.Name)
	}
	if err := h.setupTLS(); err != nil {
		return nil, err
	}
	if h.conns, err = cfg.Limits.Connections.Guard(log, h.metrics.connRefused); err != nil {
		return nil, err
	}
	h.sinks = &sinkRegistry{now: h.now}
	reg.MustRegister(newStateCollector(h))
	h.events = newJournal()
	h.source, err = mcp.NewSource(mcp.SourceOptions{Watcher: router{h}, MaxMessageSize: cfg.MaxMessageSize, Logger: log, Metrics: h.mcpMetrics,
		Hooks: h.sinks.hooks()})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// setupTLS loads the listeners' and the dialers' credentials: the configured files, or the
// development CA's.
func (h *Hub) setupTLS() error {
	if h.cfg.Insecure {
		h.dialCred = insecure.NewCredentials()
		return nil
	}
	tc := h.cfg.TLS
	if h.cfg.DevCA {
		files, err := devCertificates(h.cfg, h.log)
		if err != nil {
			return err
		}
		tc = &meshtls.Config{Files: files}
	}
	ts, err := meshtls.NewSource(tc.Files, h.log)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	// Every refused handshake is counted; one line per peer and reason per interval is
	// logged, as a client in a redial loop would otherwise flood the log.
	logs := lograte.New(lograte.DefaultInterval, nil)
	onReject := func(peer net.Addr, reason string, err error) {
		h.metrics.tlsRejected(reason)
		addr, host := "", ""
		if peer != nil {
			addr, host = peer.String(), peer.String()
			if hst, _, err := net.SplitHostPort(host); err == nil {
				host = hst
			}
		}
		if ok, suppressed := logs.Allow(reason + "\x00" + host); ok {
			h.log.Warn("TLS handshake refused", "reason", reason, "peer", addr, "err", err, "suppressed", suppressed)
		}
	}
	h.metrics.certificates(ts)
	h.serverOnlyCreds = meshtls.ServerCredentials(ts.ServerOnlyConfig(), onReject)
	h.creds = meshtls.ServerCredentials(ts.ServerConfig(), onReject)
	if h.cfg.AdminTLS != "" {
		// Verified as the gRPC listeners verify, and, as ServerCredentials does for them,
		// each refused handshake is reported with the peer's address (counted, logged).
		h.adminTLS = &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			peer := hello.Conn.RemoteAddr()
			return ts.ServerConfigWith(func(reason string, err error) { onReject(peer, reason, err) }).GetConfigForClient(hello)
		}}
	}
	h.dialCred = credentials.NewTLS(ts.ClientConfig(tc.ServerName))
	return nil
}

// Config returns the configuration the hub started with (a reload does not change what
// it says about listeners, TLS and replicas).
func (h *Hub) Config() *Config { return h.cfg }

// Registry returns the metrics registry.
func (h *Hub) Registry() *prometheus.Registry { return h.reg }

// MCPMetrics returns the engine's metrics, registered in Registry, for a layer's own MCP
// streams.
func (h *Hub) MCPMetrics() *mcp.Metrics { return h.mcpMetrics }

// Redial keeps one stream the hub dials up until ctx ends (mcp.Redial with the hub's
// credentials and configured backoff).
func (h *Hub) Redial(ctx context.Context, addrs []string, log *slog.Logger, stream func(context.Context, *grpc.ClientConn) error) {
	b := mcp.Backoff{Initial: h.cfg.Backoff.Initial.Duration, Max: h.cfg.Backoff.Max.Duration}
	mcp.Redial(ctx, addrs, h.dialCred, b, log, nil, stream)
}

// UnauthenticatedAddr returns the bound serveUnauthenticated address ("" until Run has
// opened it, or when it is off).
func (h *Hub) UnauthenticatedAddr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.unauthAddr
}

// Addrs returns the bound ingest, serve and HTTP addresses ("" until Run has opened them).
func (h *Hub) Addrs() (ingest, serve, httpAddr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ingestAddr, h.serveAddr, h.httpAddr
}

// ErrNotStarted wraps what kept Run from starting: its state file, or a listener's address
// (in use, say). Anything else Run returns came after it started.
var ErrNotStarted = errors.New("hub not started")

// Run serves until ctx ends.
func (h *Hub) Run(ctx context.Context) (err error) {
	h.started = h.now()
	if h.cfg.Insecure {
		h.log.Warn("DEVELOPMENT MODE: plaintext gRPC, peers identified by the identity they claim; never use this in production")
	}
	h.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	// The clusters' last-known state is in the store before any stream: a minion that
	// reconnects resumes from it, and a sink is served it.
	if err := h.openState(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotStarted, err)
	}
	defer func() { err = errors.Join(err, h.closeState()) }()
	g, ctx := errgroup.WithContext(ctx)

	// serverOpts are a listener's options: base (mcp's, for a server of pushes or of sinks), then the hub's.
	serverOpts := func(base []grpc.ServerOption, creds credentials.TransportCredentials) []grpc.ServerOption {
		opts := append(base,
			grpc.MaxRecvMsgSize(MaxIngestMessageSize),
			// istiod pings every 30 s; allow that and more without closing the connection.
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: keepaliveTimeout}))
		if d := h.cfg.Limits.HandshakeTimeout.Duration; d > 0 {
			opts = append(opts, grpc.ConnectionTimeout(connlimit.GRPCConnectionTimeout(d)))
		}
		if creds != nil {
			// The handshake done, the connection is no longer pending at its listener.
			opts = append(opts, grpc.Creds(connlimit.ServerCredentials(creds)))
		}
		return opts
	}
	type server struct {
		name string
		addr string
		srv  *grpc.Server
		set  *string
	}
	ingest := grpc.NewServer(serverOpts(mcp.ServerOptions(), h.creds)...)
	minions := h.serverConfig(h.authenticateCluster)
	minions.Ready = nil // minions' pushes are what end the warm-up
	mcp.NewSinkServer(h.newMinionSink, minions).Register(ingest)
	rc := h.serverConfig(h.authenticateRelay)
	rc.Listener = relayListener
	relays := &ingestSource{h: h, relay: mcp.NewSourceServer(h.source, rc)}
	mcppb.RegisterResourceSourceServer(ingest, relays)
	healthpb.RegisterHealthServer(ingest, h.health)
	serve, err := h.serveServer(serverOpts(mcp.SourceServerOptions(), h.creds), h.serverConfig(h.authenticateSink))
	if err != nil {
		return err
	}
	servers := []server{{"ingest", h.cfg.Ingest, ingest, &h.ingestAddr}, {"serve", h.cfg.Serve, serve, &h.serveAddr}}
	if h.cfg.ServeUnauthenticated != "" {
		h.log.Warn("serveUnauthenticated is on: anyone who reaches it is served what the unauthenticated rules give the node id and annotations it claims (each admission is logged at debug and listed in /api/sinks)",
			"addr", h.cfg.ServeUnauthenticated)
		sc := h.serverConfig(h.authenticateUnauthenticatedSink)
		sc.Unauthenticated = true
		open, err := h.serveServer(serverOpts(mcp.SourceServerOptions(), h.serverOnlyCreds), sc)
		if err != nil {
			return err
		}
		servers = append(servers, server{"serveUnauthenticated", h.cfg.ServeUnauthenticated, open, &h.unauthAddr})
	}

	listeners := map[*grpc.Server]net.Listener{}
	closeAll := func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}
	// A plaintext listener (development mode) has no handshake: its connections are
	// established at their first bytes. gRPC cannot set TCP_USER_TIMEOUT on a guarded
	// connection, so the listener does, as gRPC would have.
	grpcConns := connlimit.ListenerOptions{FirstBytes: h.cfg.Insecure, TCPUserTimeout: keepaliveTimeout}
	for _, l := range servers {
		lis, err := h.conns.Listen(l.name, l.addr, grpcConns)
		if err != nil {
			closeAll()
			return fmt.Errorf("%w: %s: %w", ErrNotStarted, l.name, err)
		}
		h.mu.Lock()
		*l.set = lis.Addr().String()
		h.mu.Unlock()
		h.log.Info("listening", "listener", l.name, "addr", lis.Addr().String())
		listeners[l.srv] = lis
	}
	admin := h.httpHandler()
	peers := func(srv *mcp.SourceServer, accept func(string) bool) {
		relays.peers.Store(&layerPeers{srv: srv, accept: accept})
	}
	if err := h.layer.Start(ctx, g, Listeners{Ingest: ingest, IngestAddr: h.ingestAddr, PeerSource: peers, Admin: admin}); err != nil {
		closeAll()
		return errors.Join(err, h.stop(g))
	}
	for srv, lis := range listeners {
		g.Go(func() error {
			// Stopped before it served (a Run ended at once): not an error.
			if err := srv.Serve(lis); !errors.Is(err, grpc.ErrServerStopped) {
				return err
			}
			return nil
		})
		g.Go(func() error { <-ctx.Done(); srv.Stop(); return nil })
	}
	if h.cfg.HTTP != "" {
		// Probes and Prometheus get through a flood of the other listeners: some of the
		// process's connections are this listener's alone.
		lis, err := h.conns.Listen("http", h.cfg.HTTP, connlimit.ListenerOptions{Reserve: connlimit.HTTPReserve})
		if err != nil {
			return errors.Join(fmt.Errorf("%w: http: %w", ErrNotStarted, err), h.stop(g))
		}
		addr := ops.ServeHTTP(ctx, g, lis, admin)
		h.mu.Lock()
		h.httpAddr = addr
		h.mu.Unlock()
		h.log.Info("listening", "listener", "http", "addr", addr)
	}
	if h.adminTLS != nil {
		// The same endpoints as http, marked as having come through this listener: only
		// its requests carry a certificate the handshake verified (see operator).
		lis, err := h.conns.Listen("adminTLS", h.cfg.AdminTLS, connlimit.ListenerOptions{})
		if err != nil {
			return errors.Join(fmt.Errorf("%w: adminTLS: %w", ErrNotStarted, err), h.stop(g))
		}
		addr := ops.ServeHTTPS(ctx, g, lis, h.viaAdminTLS(admin), h.adminTLS, h.log.With("listener", "adminTLS"))
		h.mu.Lock()
		h.adminAddr = addr
		h.mu.Unlock()
		h.log.Info("listening", "listener", "adminTLS", "addr", addr)
	}
	g.Go(func() error { h.housekeeping(ctx); return nil })
	h.runDialers(ctx, g)
	return g.Wait()
}

// keepaliveTimeout is how long the gRPC listeners wait for a keepalive ping's answer before
// they close the connection.
const keepaliveTimeout = 10 * time.Second

// serveServer builds a gRPC server for sinks: ResourceSource and MCP over xDS over the same
// router, admitted by sc.
func (h *Hub) serveServer(opts []grpc.ServerOption, sc mcp.ServerConfig) (*grpc.Server, error) {
	srv := grpc.NewServer(opts...)
	mcp.NewSourceServer(h.source, sc).Register(srv)
	xds, err := mcp.NewXDSServer(router{h}, mcp.XDSOptions{Resolve: h.resolveTypeURL, MaxMessageSize: h.cfg.MaxMessageSize, Server: sc, Hooks: h.sinks.hooks()})
	if err != nil {
		return nil, err
	}
	xds.Register(srv)
	healthpb.RegisterHealthServer(srv, h.health)
	return srv, nil
}

// errStopped ends Run's group when one of its parts could not start.
var errStopped = errors.New("stopped")

// stop ends what Run has started in g and waits for it.
func (h *Hub) stop(g *errgroup.Group) error {
	g.Go(func() error { return errStopped })
	if err := g.Wait(); !errors.Is(err, errStopped) {
		return err
	}
	return nil
}

// housekeeping runs Housekeep every second until ctx ends.
func (h *Hub) housekeeping(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	h.warmFrom.Store(h.now().UnixNano()) // the warm-up counts once everything has started (the layer too)
	h.checkReady()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			h.Housekeep()
		}
	}
}

// Housekeep runs one round of the hub's periodic work now (Run does it every second): it
// ends the warm-up once it has passed, drops the resources of clusters disconnected for
// longer than their collections' staleness TTL, applies held deletions that have settled,
// and every tenth round refreshes the connected clusters' last contact in the state file.
// Every decision reads the hub's clock (Options.Clock).
func (h *Hub) Housekeep() {
	if from := h.warmFrom.Load(); from != 0 && h.now().Sub(time.Unix(0, from)) >= h.cfg.WarmUp.Duration && !h.Ready() {
		if p := h.pendingClusters(); len(p) > 0 {
			h.log.Warn("warm-up timed out; serving without clusters that have not synced", "pending", p)
		}
		h.unknownAtWarmUpEnd()
		h.setReady("warm-up timeout")
	}
	h.expireStale()
	if h.rounds.Add(1)%10 == 0 {
		h.saveContacts()
	}
	h.settleBreakers()
	h.clearCompeting()
	h.resolicit() // settled deletions and staleness drops free room
}

// runDialers starts the streams the hub opens itself: pushes to sinks that only listen (once
// the hub is ready) and polls of minions that only listen. The layer decides whether this
// hub runs each (with replicas, one replica at a time does).
func (h *Hub) runDialers(ctx context.Context, g *errgroup.Group) {
	for _, d := range h.cfg.DialSinks {
		log := h.log.With("sink", d.Name, "addr", d.Addr)
		node := &mcppb.SinkNode{Id: d.NodeID, Annotations: d.Annotations}
		g.Go(func() error {
			select {
			case <-ctx.Done():
				return nil
			case <-h.readyCh:
			}
			h.layer.RunTask(ctx, "dialSink/"+d.Name, func(ctx context.Context) {
				log.Info("pushing to a sink that only listens")
				h.Redial(ctx, []string{d.Addr}, log, func(ctx context.Context, conn *grpc.ClientConn) error {
					return h.source.PushToAs(ctx, conn, d.Identity, node)
				})
			})
			return nil
		})
	}
	for _, p := range h.cfg.Poll {
		log := h.log.With("cluster", p.Cluster, "addr", p.Addr)
		g.Go(func() error {
			h.layer.RunTask(ctx, "poll/"+p.Cluster, func(ctx context.Context) {
				log.Info("polling the cluster's minion")
				h.Redial(ctx, []string{p.Addr}, log, func(ctx context.Context, conn *grpc.ClientConn) error {
					cs := h.cluster(p.Cluster)
					if cs == nil {
						return fmt.Errorf("cluster %q is not configured", p.Cluster)
					}
					s, err := h.newSession(cs, SessionOptions{Node: minionNode}, &peerSource{fullState: p.FullState})
					if err != nil {
						return err
					}
					return s.sink.PullFrom(ctx, conn)
				})
			})
			return nil
		})
	}
}

// serverConfig admits a listener's streams: auth says who the peer is, the configured
// limits bound what it may open, and its tenant's what all of its tenant's peers may
// (streamTenant), and a stream is served only once the hub is ready (readyToServe; a
// listener whose streams end the warm-up unsets Ready).
func (h *Hub) serverConfig(auth func(context.Context) (string, error)) mcp.ServerConfig {
	l := h.cfg.Limits
	sc := mcp.ServerConfig{Authenticate: auth, Ready: h.readyToServe, Logger: h.log, Metrics: h.mcpMetrics,
		StreamRate: l.StreamsPerSecond, StreamBurst: l.StreamBurst, MaxStreamsPerPeer: l.MaxStreamsPerPeer, IdleTimeout: l.IdleTimeout.Duration,
		RefusalDelay: l.RefusalDelay.Duration, MaxStreamsPerPeerSetting: "limits.maxStreamsPerPeer"}
	if sc.MaxStreamsPerPeer == 0 {
		sc.MaxStreamsPerPeer = -1 // the configuration's 0 is no cap; the engine's is its default
	}
	if sc.IdleTimeout == 0 {
		sc.IdleTimeout = -1
	}
	if sc.RefusalDelay == 0 {
		sc.RefusalDelay = -1 // answered at once
	}
	sc.Groups = h.streamGroups() // one for every listener: a tenant's limits span them all
	return sc
}

// Now is the hub's clock (Options.Clock): a layer judges times by the core's.
func (h *Hub) Now() time.Time { return h.now() }
