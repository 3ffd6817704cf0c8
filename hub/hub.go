package hub

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub/replicas"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/routing"
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
	now        func() time.Time
	maxRecv    int

	store    *store
	sinks    *sinkRegistry
	watchers *watchRegistry

	clustersMu sync.RWMutex // guards clusters
	clusters   map[string]*clusterState
	source     *mcp.Source
	creds      credentials.TransportCredentials // server side; nil in development mode
	dialCred   credentials.TransportCredentials // client side
	health     *health.Server

	started time.Time

	// Replicas (nil for a single hub): the membership, the source serving peers the
	// clusters this replica holds, and the streams it serves them on.
	members     atomic.Pointer[replicas.Members] // set once by Run, before any stream
	peerSrc     *mcp.Source
	peerStreams peerStreams

	mu         sync.Mutex // guards the following fields
	ready      bool
	readyCh    chan struct{}
	ingestAddr string
	serveAddr  string
	httpAddr   string
	runs       map[string]bool   // dial-out tasks this replica runs (replicas)
	following  map[string]string // cluster -> what this replica follows it from (replicas)
}

// New builds a hub for cfg. reg receives the hub's and the engine's metrics (nil: a new
// registry).
func New(cfg *Config, log *slog.Logger, reg *prometheus.Registry) (*Hub, error) {
	comp, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	h := &Hub{cfg: cfg, log: log, watchers: newWatchRegistry(), reg: reg, metrics: NewMetrics(reg), mcpMetrics: mcp.NewMetrics(reg),
		now: time.Now, maxRecv: 64 << 20, clusters: map[string]*clusterState{}, readyCh: make(chan struct{}),
		health: health.NewServer()}
	h.live.Store(&live{cfg: cfg, comp: comp})
	h.store = newStore(cfg.Collections, ConflictPolicy{Priority: cfg.Conflicts.Priority}, log, h.metrics)
	for _, c := range cfg.Clusters {
		h.clusters[c.Name] = &clusterState{name: c.Name, log: log.With("cluster", c.Name)}
	}
	if cfg.DevCA {
		files, err := devCertificates(cfg, log)
		if err != nil {
			return nil, err
		}
		cfg.TLS = &TLSConfig{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA}
		defer func() { cfg.TLS = nil }() // the file keeps saying devCA: reloads compare like with like
	}
	if cfg.TLS != nil {
		ts, err := meshtls.NewSource(cfg.TLS.files(), log)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		h.creds = credentials.NewTLS(ts.ServerConfigWith(func(reason string, err error) {
			h.metrics.tlsRejected(reason)
			h.log.Warn("TLS handshake refused", "reason", reason, "err", err)
		}))
		h.dialCred = credentials.NewTLS(ts.ClientConfig(""))
	} else {
		h.dialCred = insecure.NewCredentials()
	}
	h.sinks = newSinkRegistry(h)
	h.source, err = mcp.NewSource(mcp.SourceOptions{Watcher: router{h}, MaxMessageSize: cfg.MaxMessageSize, Logger: log, Metrics: h.mcpMetrics,
		Hooks: h.sinks.hooks()})
	if err != nil {
		return nil, err
	}
	if cfg.Replicas != nil {
		h.store.feeds = map[string]*mcp.Cache{}
		// A cluster's first push to a peer is its whole store: allow what ingest allows.
		h.peerSrc, err = mcp.NewSource(mcp.SourceOptions{Watcher: feedRouter{h}, MaxMessageSize: h.maxRecv, Logger: log.With("role", "replica"),
			Metrics: h.mcpMetrics})
		if err != nil {
			return nil, err
		}
	}
	return h, nil
}

// live is the part of the configuration a reload replaces.
type live struct {
	cfg  *Config
	comp *compiled
}

func (h *Hub) current() *live { return h.live.Load() }

func (h *Hub) cluster(name string) *clusterState {
	h.clustersMu.RLock()
	defer h.clustersMu.RUnlock()
	return h.clusters[name]
}

// clusterList returns the configured clusters' states, by name.
func (h *Hub) clusterList() []*clusterState {
	h.clustersMu.RLock()
	out := make([]*clusterState, 0, len(h.clusters))
	for _, cs := range h.clusters {
		out = append(out, cs)
	}
	h.clustersMu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// Registry returns the metrics registry.
func (h *Hub) Registry() *prometheus.Registry { return h.reg }

// Addrs returns the bound ingest, serve and HTTP addresses ("" until Run has opened them).
func (h *Hub) Addrs() (ingest, serve, httpAddr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ingestAddr, h.serveAddr, h.httpAddr
}

// Ready reports whether the hub serves sinks: every configured cluster has synced since the
// start, or the warm-up has passed.
func (h *Hub) Ready() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ready
}

func (h *Hub) pendingClusters() []string {
	var out []string
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		if !cs.everSynced {
			out = append(out, cs.name)
		}
		cs.mu.Unlock()
	}
	sort.Strings(out)
	return out
}

// checkReady turns the hub ready when no cluster is pending.
func (h *Hub) checkReady() {
	if len(h.pendingClusters()) == 0 {
		h.setReady("every configured cluster has synced")
	}
}

func (h *Hub) setReady(why string) {
	h.mu.Lock()
	if h.ready {
		h.mu.Unlock()
		return
	}
	h.ready = true
	close(h.readyCh)
	h.mu.Unlock()
	h.metrics.ready.Set(1)
	h.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.log.Info("serving sinks", "why", why, "after", h.now().Sub(h.started).Round(time.Millisecond))
}

// authenticateSink admits a sink's stream once the hub is ready; before, it is refused
// with Unavailable so the sink retries instead of receiving a partial state.
func (h *Hub) authenticateSink(ctx context.Context) (string, error) {
	if !h.Ready() {
		pending := h.pendingClusters()
		left := h.cfg.WarmUp.Duration - h.now().Sub(h.started)
		return "", status.Errorf(codes.Unavailable, "%v: waiting for clusters %v to sync (at most %v more)", errNotReady, pending, left.Round(time.Second))
	}
	id, err := peerIdentity(ctx, h.cfg.Insecure)
	if err != nil {
		return "", err
	}
	if h.cfg.Insecure {
		h.log.Warn("insecure: admitting a sink without TLS, by the identity it claims", "identity", id)
	}
	if err := h.requireKind(id, meshtls.KindSink, "sinks may subscribe"); err != nil {
		return "", err
	}
	return id, nil
}

// requireKind refuses id, with PermissionDenied, unless it is an identity of kind in the
// configured trust domain (when one is configured and TLS is on). what says who may.
func (h *Hub) requireKind(id, kind, what string) error {
	td := h.current().cfg.TrustDomain
	if td == "" || h.cfg.Insecure {
		return nil
	}
	if k, _, _ := meshtls.ParseID(td, id); k != kind {
		return status.Errorf(codes.PermissionDenied, "identity %q is not a %s identity (%s): only %s", id, kind, meshtls.ID(td, kind, "NAME"), what)
	}
	return nil
}

// resolveTypeURL maps istiod's MCP-over-xDS type URLs (group/version/Kind) to the served
// collection of that kind.
func (h *Hub) resolveTypeURL(typeURL string) (string, bool) {
	k, ok := kinds.ForTypeURL(typeURL)
	if !ok {
		return "", false
	}
	for _, c := range h.cfg.Collections {
		if c == k.Collection {
			return c, true
		}
	}
	return "", false
}

// router is the Watcher sinks are served from: it routes each stream to the view of its
// subset.
type router struct{ h *Hub }

// Watch implements mcp.Watcher.
func (r router) Watch(info *mcp.StreamInfo, collection string, notify func()) (mcp.Collection, func(), bool) {
	node := info.Node()
	cur := r.h.current()
	nodeID := node.GetId()
	if cur.cfg.TrustDomain != "" && !r.h.cfg.Insecure {
		// The certificate names the sink; a SinkNode id that says otherwise is not believed.
		if _, name, _ := meshtls.ParseID(cur.cfg.TrustDomain, info.Identity); name != nodeID {
			if nodeID != "" {
				r.h.log.Warn("SinkNode id disagrees with the sink's certificate; routing by the certificate",
					"identity", info.Identity, "node_id", nodeID, "collection", collection)
			}
			nodeID = name
		}
	}
	sub := cur.comp.routes.Select(routing.Sink{Identity: info.Identity, NodeID: nodeID, Annotations: node.GetAnnotations()})
	cache, release := r.h.store.watch(sub)
	coll, cancel, ok := cache.Watch(info, collection, notify)
	untrack := r.h.watchers.track(info, sub.Key())
	return coll, func() { cancel(); release(); untrack() }, ok
}

// Run serves until ctx ends.
func (h *Hub) Run(ctx context.Context) error {
	h.started = h.now()
	if h.cfg.Insecure {
		h.log.Warn("DEVELOPMENT MODE: plaintext gRPC, peers identified by the identity they claim; never use this in production")
	}
	h.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	g, ctx := errgroup.WithContext(ctx)

	serverOpts := append(mcp.ServerOptions(),
		grpc.MaxRecvMsgSize(h.maxRecv),
		// istiod pings every 30 s; allow that and more without closing the connection.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
	if h.creds != nil {
		serverOpts = append(serverOpts, grpc.Creds(h.creds))
	}
	ingest := grpc.NewServer(serverOpts...)
	mcp.NewSinkServer(h.newClusterSink, h.serverConfig(h.authenticateCluster)).Register(ingest)
	healthpb.RegisterHealthServer(ingest, h.health)
	serve := grpc.NewServer(serverOpts...)
	mcp.NewSourceServer(h.source, h.serverConfig(h.authenticateSink)).Register(serve)
	xds, err := mcp.NewXDSServer(router{h}, mcp.XDSOptions{Resolve: h.resolveTypeURL, MaxMessageSize: h.cfg.MaxMessageSize,
		Server: h.serverConfig(h.authenticateSink)})
	if err != nil {
		return err
	}
	xds.Register(serve)
	healthpb.RegisterHealthServer(serve, h.health)

	if h.peerSrc != nil {
		// Peers follow the clusters this replica holds on the ingest listener; a replica
		// opens one stream per cluster at once, so the per-peer limit is far higher.
		pc := h.serverConfig(h.authenticatePeer)
		pc.StreamRate, pc.StreamBurst = 1000, 10000
		mcp.NewSourceServer(h.peerSrc, pc).Register(ingest)
	}

	listeners := map[*grpc.Server]net.Listener{}
	for _, l := range []struct {
		name string
		addr string
		srv  *grpc.Server
		set  *string
	}{{"ingest", h.cfg.Ingest, ingest, &h.ingestAddr}, {"serve", h.cfg.Serve, serve, &h.serveAddr}} {
		lis, err := net.Listen("tcp", l.addr)
		if err != nil {
			for _, o := range listeners {
				_ = o.Close()
			}
			return fmt.Errorf("%s: %w", l.name, err)
		}
		h.mu.Lock()
		*l.set = lis.Addr().String()
		h.mu.Unlock()
		h.log.Info("listening", "listener", l.name, "addr", lis.Addr().String())
		listeners[l.srv] = lis
	}
	if h.cfg.Replicas != nil {
		// Before any stream is served: sessions are held in the membership from the first.
		if err := h.startReplicas(h.ingestAddr); err != nil {
			for _, o := range listeners {
				_ = o.Close()
			}
			return err
		}
		g.Go(func() error { h.followPeers(ctx); return nil })
		g.Go(func() error {
			<-ctx.Done()
			if err := h.mem().Close(); err != nil {
				h.log.Warn("leaving the replicas", "err", err)
			}
			return nil
		})
	}
	for srv, lis := range listeners {
		g.Go(func() error { return srv.Serve(lis) })
		g.Go(func() error { <-ctx.Done(); srv.Stop(); return nil })
	}
	if h.cfg.HTTP != "" {
		addr, err := ops.ServeHTTP(ctx, g, h.cfg.HTTP, h.httpHandler())
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		h.mu.Lock()
		h.httpAddr = addr
		h.mu.Unlock()
		h.log.Info("listening", "listener", "http", "addr", addr)
	}
	g.Go(func() error { h.housekeeping(ctx); return nil })
	h.runDialers(ctx, g)
	return g.Wait()
}

// housekeeping ends the warm-up when it times out and drops the resources of clusters
// disconnected for longer than their collections' staleness TTL.
func (h *Hub) housekeeping(ctx context.Context) {
	warm := time.NewTimer(h.cfg.WarmUp.Duration)
	defer warm.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	h.checkReady()
	for {
		select {
		case <-ctx.Done():
			return
		case <-warm.C:
			if p := h.pendingClusters(); len(p) > 0 {
				h.log.Warn("warm-up timed out; serving without clusters that have not synced", "pending", p)
			}
			h.setReady("warm-up timeout")
		case <-tick.C:
			h.expireStale()
		}
	}
}

func (h *Hub) expireStale() {
	now := h.now()
	staleness := h.current().cfg.Staleness
	for _, cs := range h.clusterList() {
		cs.mu.Lock()
		since := cs.disconnectedAt
		var due []string
		if !since.IsZero() {
			for _, coll := range h.cfg.Collections {
				if ttl := staleness.ttl(coll); ttl > 0 && now.Sub(since) >= ttl && !cs.dropped[coll] {
					due = append(due, coll)
					if cs.dropped == nil {
						cs.dropped = map[string]bool{}
					}
					cs.dropped[coll] = true
				}
			}
		}
		cs.mu.Unlock()
		if len(due) > 0 {
			n := h.store.dropCluster(cs.name, due)
			cs.log.Warn("cluster disconnected for longer than its staleness TTL; its resources are no longer served",
				"collections", due, "resources", n, "disconnected_at", since)
			for _, coll := range due {
				h.metrics.resources(cs.name, coll, 0)
			}
		}
	}
}

// runDialers starts the streams the hub opens itself: pushes to sinks that only listen (once
// the hub is ready) and polls of minions that only listen. With replicas, each runs on one
// replica at a time (runAssigned).
func (h *Hub) runDialers(ctx context.Context, g *errgroup.Group) {
	b := mcp.Backoff{Initial: h.cfg.Backoff.Initial.Duration, Max: h.cfg.Backoff.Max.Duration}
	for _, d := range h.cfg.DialSinks {
		log := h.log.With("sink", d.Name, "addr", d.Addr)
		node := &mcppb.SinkNode{Id: d.NodeID, Annotations: d.Annotations}
		g.Go(func() error {
			select {
			case <-ctx.Done():
				return nil
			case <-h.readyCh:
			}
			h.runAssigned(ctx, "dialSink/"+d.Name, log, func(ctx context.Context) {
				log.Info("pushing to a sink that only listens")
				mcp.Redial(ctx, []string{d.Addr}, h.dialCred, b, log, nil, func(ctx context.Context, conn *grpc.ClientConn) error {
					return h.source.PushToAs(ctx, conn, d.Identity, node)
				})
			})
			return nil
		})
	}
	for _, p := range h.cfg.Poll {
		cs := h.cluster(p.Cluster)
		g.Go(func() error {
			h.runAssigned(ctx, "poll/"+p.Cluster, cs.log, func(ctx context.Context) {
				cs.log.Info("polling the cluster's minion", "addr", p.Addr)
				mcp.Redial(ctx, []string{p.Addr}, h.dialCred, b, cs.log, nil, func(ctx context.Context, conn *grpc.ClientConn) error {
					sink, err := h.clusterSink(cs)
					if err != nil {
						return err
					}
					return sink.PullFrom(ctx, conn)
				})
			})
			return nil
		})
	}
}

func (h *Hub) serverConfig(auth func(context.Context) (string, error)) mcp.ServerConfig {
	return mcp.ServerConfig{Authenticate: auth, Logger: h.log, Metrics: h.mcpMetrics,
		StreamRate: h.cfg.Limits.StreamsPerSecond, StreamBurst: h.cfg.Limits.StreamBurst}
}

// Apply applies a change to the store as if cluster had pushed it on a stream: the ACL, the
// merge and the views, exactly as for a pushed change. For embedding and benchmarks; the
// error is the NACK a stream would have sent.
func (h *Hub) Apply(cluster string, c *mcp.Change) error {
	cs := h.cluster(cluster)
	if cs == nil {
		return fmt.Errorf("cluster %q is not configured", cluster)
	}
	return h.applyCluster(cs, nil, c)
}

// devCertificates makes sure the development CA and the hub's serving certificate exist in
// the state directory and returns the serving certificate's files. The certificate names
// the hub (spiffe://<td>/hub/<host>) and the listeners' hosts, and is reissued when it has
// less than 30 days left.
func devCertificates(cfg *Config, log *slog.Logger) (meshtls.Files, error) {
	caDir := filepath.Join(cfg.StateDir, "ca")
	ca, created, err := meshtls.EnsureDevCA(caDir, cfg.TrustDomain)
	if err != nil {
		return meshtls.Files{}, fmt.Errorf("devCA: %w", err)
	}
	if created {
		log.Warn("DEVELOPMENT CA created; never use it in production", "dir", caDir, "trust_domain", cfg.TrustDomain)
	}
	tlsDir := filepath.Join(cfg.StateDir, "tls")
	files := meshtls.Files{Cert: filepath.Join(tlsDir, "hub.crt"), Key: filepath.Join(tlsDir, "hub.key"), CA: filepath.Join(tlsDir, "ca.crt")}
	if src, err := meshtls.NewSource(files, log); err == nil && src.ValidFor(30*24*time.Hour) {
		return files, nil
	}
	hosts := []string{"127.0.0.1", "localhost", "::1"}
	for _, a := range []string{cfg.Ingest, cfg.Serve} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
			hosts = append(hosts, h)
		}
	}
	name, _ := os.Hostname()
	if cfg.Replicas != nil {
		name = cfg.Replicas.Name // its peers know it by it
	}
	if name == "" {
		name = "hub"
	}
	files, err = ca.Issue(meshtls.ID(cfg.TrustDomain, meshtls.KindHub, name), hosts, tlsDir, "hub")
	if err != nil {
		return meshtls.Files{}, fmt.Errorf("devCA: %w", err)
	}
	log.Warn("development CA: issued the hub's serving certificate", "cert", files.Cert)
	return files, nil
}
