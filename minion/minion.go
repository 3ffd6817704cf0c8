package minion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/meshfed/meshfed/internal/connlimit"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/procmetrics"
	"github.com/meshfed/meshfed/mcp"
	meshtls "github.com/meshfed/meshfed/tls"
)

// source is one input of the minion.
type source interface {
	Name() string
	Synced() bool
	Run(ctx context.Context) error
}

// Minion runs one configuration: its sources, the store they feed, and the destinations
// it publishes to. Use RunWithReload to follow a configuration file.
type Minion struct {
	cfg        *Config
	log        *slog.Logger
	reg        *prometheus.Registry
	metrics    *Metrics
	mcpMetrics *mcp.Metrics

	cache   *mcp.Cache
	store   *Store
	src     *mcp.Source
	sources []source
	kube    []*KubeSource
	relay   *Relay // nil without relay
	// clientCreds and serverCreds secure the dialed streams and the listener.
	clientCreds credentials.TransportCredentials
	serverCreds credentials.TransportCredentials
	tlsOn       bool
	// conns bounds its listeners' connections before their handshake (limits).
	conns *connlimit.Guard

	mu    sync.Mutex      // guards the following fields
	dests map[string]bool // push destination address -> stream up (the hub has requested)
	// established: the current attempt to a destination got as far as a push.
	established map[string]bool

	// httpAddr and listenAddr are the bound addresses of the HTTP endpoints and of the
	// local ResourceSource once Run has opened them.
	httpAddr, listenAddr string
}

// Telemetry is what outlives configuration reloads: the metrics registry and metrics.
type Telemetry struct {
	Registry *prometheus.Registry
	Metrics  *Metrics
	MCP      *mcp.Metrics
}

// NewTelemetry creates a registry with the minion's and the engine's metrics and the Go
// and process collectors.
func NewTelemetry() *Telemetry {
	reg := procmetrics.NewRegistry()
	return &Telemetry{Registry: reg, Metrics: NewMetrics(reg), MCP: mcp.NewMetrics(reg)}
}

// New builds a Minion for cfg; a configuration that does not validate is an error.
func New(cfg *Config, log *slog.Logger, tel *Telemetry) (*Minion, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kinds, err := cfg.ResolveKinds()
	if err != nil {
		return nil, err
	}
	m := &Minion{cfg: cfg, log: log.With("cluster", cfg.Cluster), reg: tel.Registry, metrics: tel.Metrics, mcpMetrics: tel.MCP,
		dests: map[string]bool{}, established: map[string]bool{}}
	colls := make([]string, 0, len(kinds))
	for _, k := range kinds {
		colls = append(colls, k.Collection)
	}
	m.clientCreds, m.serverCreds = insecure.NewCredentials(), insecure.NewCredentials()
	tlsFiles := meshtls.Files{}
	if cfg.TLS != nil {
		tlsFiles = cfg.TLS.Files
	}
	if cfg.DevCA != "" {
		ca, err := meshtls.LoadDevCA(filepath.Join(cfg.DevCA, "ca"))
		if err != nil {
			return nil, fmt.Errorf("devCA: %w (start the hub with devCA first)", err)
		}
		id := meshtls.ID(meshtls.DevTrustDomain, meshtls.KindCluster, cfg.Cluster)
		if tlsFiles, err = ca.Issue(id, nil, filepath.Join(cfg.DevCA, "minion-"+cfg.Cluster), cfg.Cluster); err != nil {
			return nil, fmt.Errorf("devCA: %w", err)
		}
		m.log.Warn("DEVELOPMENT CA: issued this minion's certificate from the hub's development CA; never in production", "identity", id)
	}
	var identity *meshtls.Source
	if tlsFiles.Cert != "" {
		ts, err := meshtls.NewSource(tlsFiles, m.log)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		serverName := ""
		if cfg.TLS != nil {
			serverName = cfg.TLS.ServerName
		}
		m.clientCreds = credentials.NewTLS(ts.ClientConfig(serverName))
		m.serverCreds = credentials.NewTLS(ts.ServerConfig())
		m.tlsOn, identity = true, ts
	}
	if m.conns, err = cfg.Limits.Connections.Guard(m.log, m.metrics.connRefused); err != nil {
		return nil, err
	}
	m.cache = mcp.NewCache(colls...)
	names := make([]string, 0, len(cfg.Sources))
	for _, s := range cfg.Sources {
		names = append(names, s.URL)
	}
	m.store = NewStore(m.cache, names, m.log)
	for _, sc := range cfg.Sources {
		u, _ := parseSourceURL(sc.URL)
		switch u.scheme {
		case "fs":
			dir := u.path
			if !filepath.IsAbs(dir) {
				dir, _ = filepath.Abs(dir)
			}
			m.sources = append(m.sources, NewFileSource(sc.URL, dir, sc.sourceKinds(kinds), m.store, m.log, m.metrics))
		case "k8s":
			ks, err := NewKubeSource(sc, sc.sourceKinds(kinds), m.store, m.log, m.metrics)
			if err != nil {
				return nil, err
			}
			m.sources = append(m.sources, ks)
			m.kube = append(m.kube, ks)
		case "mcp":
			us, err := NewUpstreamSource(sc, cfg.Cluster, sc.sourceKinds(kinds), m.store, m.clientCreds, cfg.Destinations.Backoff, m.log, m.mcpMetrics)
			if err != nil {
				return nil, err
			}
			m.sources = append(m.sources, us)
		}
	}
	if cfg.Relay != nil {
		table, err := cfg.kindTable()
		if err != nil {
			return nil, err
		}
		if m.relay, err = newRelay(*cfg.Relay, cfg.Cluster, table, m.log, m.mcpMetrics, m.metrics); err != nil {
			return nil, err
		}
	}
	m.src, err = mcp.NewSource(mcp.SourceOptions{
		Watcher:        m.cache,
		MaxMessageSize: cfg.MaxMessageSize,
		Logger:         m.log,
		Metrics:        m.mcpMetrics,
		Hooks:          mcp.Hooks{Acked: m.onAck, Pushed: m.onPushed, StreamClosed: m.onStreamClosed},
	})
	if err != nil {
		return nil, err
	}
	var relayCert *meshtls.Source
	if m.relay != nil {
		relayCert = m.relay.cert
	}
	m.metrics.certificates(identity, relayCert) // once nothing can refuse the configuration
	return m, nil
}

// claim adds, in development mode (no TLS to prove it), the identity this minion claims to
// the hub.
func (m *Minion) claim(ctx context.Context) context.Context {
	if m.tlsOn {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, mcp.DevIdentityHeader, m.cfg.Cluster)
}

// Relay returns the relay, or nil without one.
func (m *Minion) Relay() *Relay { return m.relay }

// Cache returns the published cache (for tests and status).
func (m *Minion) Cache() *mcp.Cache { return m.cache }

// HTTPAddr returns the bound address of the HTTP endpoints ("" until Run has opened it).
func (m *Minion) HTTPAddr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.httpAddr
}

// ListenAddr returns the bound address of the local ResourceSource ("" until it is open;
// it opens once every source has synced).
func (m *Minion) ListenAddr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.listenAddr
}

// Ready reports whether every source has synced.
func (m *Minion) Ready() bool {
	for _, s := range m.sources {
		if !s.Synced() {
			return false
		}
	}
	return true
}

// onAck records the hub's NACKs: a log line, a metric per rejected resource, and a Warning
// Event on each rejected Kubernetes object.
func (m *Minion) onAck(_ *mcp.StreamInfo, ev mcp.AckEvent) {
	if ev.Code == codes.OK {
		return
	}
	rejected := mcp.Rejections(ev.Detail)
	if len(rejected) == 0 {
		m.log.Warn("hub rejected a push", "collection", ev.Collection, "code", ev.Code.String(), "message", ev.Message)
		return
	}
	for _, r := range rejected {
		if m.metrics != nil {
			m.metrics.rejections.WithLabelValues(ev.Collection).Inc()
		}
		if r.Held {
			m.log.Warn("hub holds a deletion: its mass-deletion breaker is open; the object is still served", "collection", ev.Collection, "resource", r.Resource, "reason", r.Reason)
		} else {
			m.log.Warn("hub rejected a resource", "collection", ev.Collection, "resource", r.Resource, "reason", r.Reason)
		}
		for _, k := range m.kube {
			report := k.ReportRejection
			if r.Held {
				report = k.ReportHeldDeletion
			}
			if report(ev.Collection, r.Resource, r.Reason) {
				break
			}
		}
	}
}

// onPushed marks a push destination connected at the first push of a stream: the hub has
// accepted the stream and asked for collections.
func (m *Minion) onPushed(info *mcp.StreamInfo, _ mcp.PushEvent) {
	if info.Transport != "client" {
		return // a polling hub on the local listener
	}
	m.mu.Lock()
	first := !m.dests[info.Peer]
	m.dests[info.Peer] = true
	m.established[info.Peer] = true
	m.mu.Unlock()
	if first {
		m.log.Info("publishing to the hub", "addr", info.Peer)
		m.metrics.destination(info.Peer, true)
		m.metrics.connect(info.Peer, "established")
	}
}

func (m *Minion) onStreamClosed(info *mcp.StreamInfo, _ error) {
	if info.Transport != "client" {
		return
	}
	m.mu.Lock()
	m.dests[info.Peer] = false
	m.mu.Unlock()
	m.metrics.destination(info.Peer, false)
}

// onAttemptEnd counts an attempt that never got as far as a push as failed.
func (m *Minion) onAttemptEnd(addr string, _ error) {
	m.mu.Lock()
	ok := m.established[addr]
	delete(m.established, addr)
	if _, known := m.dests[addr]; !known {
		m.dests[addr] = false
	}
	m.mu.Unlock()
	if !ok {
		m.metrics.connect(addr, "failed")
	}
}

// Run runs the sources, then — once every source has synced, so a restart never publishes
// an empty state — the destinations, until ctx ends. The relay runs beside them.
func (m *Minion) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	if m.cfg.HTTP != "" {
		// Probes and Prometheus get through a flood of the other listeners.
		lis, err := m.conns.Listen("http", m.cfg.HTTP, connlimit.ListenerOptions{Reserve: connlimit.HTTPReserve})
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		addr := ops.ServeHTTP(ctx, g, lis, m.httpHandler())
		m.mu.Lock()
		m.httpAddr = addr
		m.mu.Unlock()
	}
	for _, s := range m.sources {
		g.Go(func() error { return s.Run(ctx) })
	}
	if m.relay != nil {
		// The relay serves and follows the hub from the start, whether or not this minion's
		// own sources have synced: istiod depends on it, not on them. Publishing does not
		// depend on the relay either: whatever becomes of its state file, it goes on.
		g.Go(func() error { return m.relay.run(ctx, m) })
	}
	g.Go(func() error {
		if !m.waitSynced(ctx) {
			return nil
		}
		m.log.Info("all sources synced; publishing", "sources", len(m.sources))
		return m.runDestinations(ctx)
	})
	return g.Wait()
}

// followHub is the relay's stream to the hub: a subscription on the ingest listener of the
// first push destination, with this minion's identity, redialled with its backoff.
func (m *Minion) followHub(ctx context.Context) {
	addrs, _ := parsePushURL(m.cfg.Destinations.Push[0])
	mcp.Redial(ctx, addrs, m.clientCreds, backoff(m.cfg.Destinations.Backoff), m.relay.log, nil, func(ctx context.Context, conn *grpc.ClientConn) error {
		return m.relay.sink.PullFrom(m.claim(ctx), conn)
	})
}

func (m *Minion) waitSynced(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	for !m.Ready() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			if time.Since(last) > 30*time.Second {
				last = time.Now()
				m.log.Warn("still waiting for sources to sync before publishing", "pending", m.pendingSources())
			}
		}
	}
	return true
}

func (m *Minion) pendingSources() []string {
	var out []string
	for _, s := range m.sources {
		if !s.Synced() {
			out = append(out, s.Name())
		}
	}
	return out
}

func (m *Minion) runDestinations(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	if l := m.cfg.Destinations.Listen; l != "" {
		lis, err := m.conns.Listen("listen", l, grpcListener(m.tlsOn))
		if err != nil {
			return fmt.Errorf("destinations.listen: %w", err)
		}
		m.mu.Lock()
		m.listenAddr = lis.Addr().String()
		m.mu.Unlock()
		srv := grpc.NewServer(append(mcp.SourceServerOptions(), m.grpcConnOptions(m.serverCreds, m.tlsOn)...)...)
		mcp.NewSourceServer(m.src, mcp.ServerConfig{Logger: m.log, Metrics: m.mcpMetrics}).Register(srv)
		if !m.tlsOn {
			m.log.Warn("serving ResourceSource without TLS (development mode)", "addr", lis.Addr().String())
		}
		g.Go(func() error {
			// A stop that comes before Serve starts (a minion stopped as it starts) is a
			// stop, not an error.
			if err := srv.Serve(lis); !errors.Is(err, grpc.ErrServerStopped) {
				return err
			}
			return nil
		})
		g.Go(func() error { <-ctx.Done(); srv.Stop(); return nil })
	}
	for _, p := range m.cfg.Destinations.Push {
		addrs, _ := parsePushURL(p)
		if !m.tlsOn {
			m.log.Warn("pushing to the hub without TLS (development mode)", "addrs", addrs)
		}
		g.Go(func() error {
			mcp.Redial(ctx, addrs, m.clientCreds, backoff(m.cfg.Destinations.Backoff), m.log, m.onAttemptEnd, func(ctx context.Context, conn *grpc.ClientConn) error {
				if !m.tlsOn {
					m.log.Warn("insecure: connecting to the hub without TLS", "addr", conn.Target())
				}
				return m.src.PushTo(m.claim(ctx), conn)
			})
			return nil
		})
	}
	return g.Wait()
}

// grpcDefaultKeepaliveTimeout is gRPC's default keepalive timeout, which it sets as
// TCP_USER_TIMEOUT on the connections of a server that sets none (the minion's).
const grpcDefaultKeepaliveTimeout = 20 * time.Second

// grpcListener is how a gRPC listener's connections are admitted: a plaintext one
// (tlsOn false) has no handshake, and its connections are established at their first
// bytes; gRPC cannot set TCP_USER_TIMEOUT on a guarded connection, so the listener does.
func grpcListener(tlsOn bool) connlimit.ListenerOptions {
	return connlimit.ListenerOptions{FirstBytes: !tlsOn, TCPUserTimeout: grpcDefaultKeepaliveTimeout}
}

// grpcConnOptions are a gRPC listener's server options for its connections: creds (TLS if
// tlsOn), marking a connection established once its handshake is done, and gRPC's
// connection timeout, which bounds the HTTP/2 preface after the handshake.
func (m *Minion) grpcConnOptions(creds credentials.TransportCredentials, tlsOn bool) []grpc.ServerOption {
	var opts []grpc.ServerOption
	if d := m.cfg.Limits.HandshakeTimeout.Duration; d > 0 {
		opts = append(opts, grpc.ConnectionTimeout(connlimit.GRPCConnectionTimeout(d)))
	}
	if tlsOn {
		creds = connlimit.ServerCredentials(creds)
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return opts
}

// Status is the minion's state as /status reports it.
type Status struct {
	Cluster      string          `json:"cluster"`
	Ready        bool            `json:"ready"`
	Sources      []SourceStatus  `json:"sources"`
	Destinations map[string]bool `json:"destinations"`
	Objects      map[string]int  `json:"objects"`
	Relay        *RelayStatus    `json:"relay,omitempty"`
}

// SourceStatus is one source's state.
type SourceStatus struct {
	Name     string    `json:"name"`
	Synced   bool      `json:"synced"`
	Problems []Problem `json:"problems,omitempty"`
	// RefusedCollections: an mcp:// upstream said it does not serve these (with how); the
	// source follows the rest and asks again on a later stream.
	RefusedCollections map[string]string `json:"refusedCollections,omitempty"`
}

// Status returns the minion's current state.
func (m *Minion) Status() Status {
	st := Status{Cluster: m.cfg.Cluster, Ready: m.Ready(), Destinations: map[string]bool{}, Objects: map[string]int{}}
	for _, s := range m.sources {
		ss := SourceStatus{Name: s.Name(), Synced: s.Synced()}
		if fs, ok := s.(*FileSource); ok {
			ss.Problems = fs.Problems()
		}
		if us, ok := s.(*UpstreamSource); ok {
			if r := us.Refused(); len(r) > 0 {
				ss.RefusedCollections = r
			}
		}
		st.Sources = append(st.Sources, ss)
	}
	m.mu.Lock()
	for k, v := range m.dests {
		st.Destinations[k] = v
	}
	m.mu.Unlock()
	for _, c := range m.cache.Collections() {
		st.Objects[c] = m.cache.Len(c)
	}
	if m.relay != nil {
		rs := m.relay.Status()
		st.Relay = &rs
	}
	return st
}

func (m *Minion) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if pending := m.pendingSources(); len(pending) > 0 {
			sort.Strings(pending)
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "waiting for sources to sync: %v\n", pending)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(m.Status())
	})
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	// The root says what there is: the fleet's dashboard is the hub's, which sees every
	// cluster; a minion knows only its own.
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "meshfed minion of cluster %q\n\n", m.cfg.Cluster)
		fmt.Fprintln(w, "/status        what it watches, pushes and relays (JSON)")
		fmt.Fprintln(w, "/healthz       alive")
		fmt.Fprintln(w, "/readyz        every source synced (503 names those that are not)")
		fmt.Fprintln(w, "/metrics       Prometheus")
		fmt.Fprintln(w, "/debug/pprof/  profiles")
		fmt.Fprintln(w, "\nThe fleet's dashboard is the hub's: its admin listener's / (hub status from a terminal).")
	})
	ops.AddPprof(mux)
	return mux
}

// RunWithReload runs the configuration in path (or DefaultConfig when path is empty) and
// follows the file: a valid change restarts the minion's components in-process with the new
// configuration; an invalid one is logged and the running configuration stays.
func RunWithReload(ctx context.Context, path string, log *slog.Logger, tel *Telemetry) error {
	cfg := DefaultConfig()
	if path != "" {
		var err error
		if cfg, err = LoadConfig(path); err != nil {
			return err
		}
	}
	changes := make(chan *Config, 1)
	var live atomic.Pointer[Config] // what runs: a change that failed to start is not it
	live.Store(cfg)
	g, ctx := errgroup.WithContext(ctx)
	if path != "" {
		g.Go(func() error { return watchConfig(ctx, path, &live, DefaultDebounce, log, tel, changes) })
	}
	g.Go(func() error {
		m, err := New(cfg, log, tel)
		if err != nil {
			return err
		}
		var last *Config // the configuration that ran before a reload, to go back to
		for {
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- m.Run(runCtx) }()
			running := true
			for running {
				select {
				case err := <-done:
					cancel()
					if err == nil || ctx.Err() != nil || last == nil {
						return err
					}
					// The new configuration could not run (a listen address in use, say):
					// go back to the one that did.
					log.Error("configuration refused: it failed to start; going back to the previous one", "err", err)
					tel.Metrics.reloaded().FailedToStart()
					if m, err = New(last, log, tel); err != nil {
						return err
					}
					live.Store(last)
					cfg, last, running = last, nil, false
				case next := <-changes:
					nm, err := New(next, log, tel)
					if err != nil {
						log.Error("configuration refused; keeping the running one", "err", err)
						tel.Metrics.reloaded().Record(procmetrics.ReloadRefused)
						continue
					}
					log.Info("configuration changed; restarting components in-process")
					tel.Metrics.reloaded().Record(procmetrics.ReloadApplied)
					cancel()
					if err := <-done; err != nil {
						log.Error("components stopped with an error", "err", err)
					}
					live.Store(next)
					m, cfg, last, running = nm, next, cfg, false
				}
			}
		}
	})
	return g.Wait()
}

// watchConfig sends each valid new content of the file on changes. Each content is judged
// once: an invalid one is logged and counted once, however often the file or its directory
// is touched after.
func watchConfig(ctx context.Context, path string, live *atomic.Pointer[Config], debounce time.Duration, log *slog.Logger, tel *Telemetry, changes chan<- *Config) error {
	sent := live.Load() // the last content sent on changes
	return ops.WatchFile(ctx, path, debounce, log, func(data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			log.Error("configuration refused; keeping the running one", "path", path, "err", err)
			tel.Metrics.reloaded().Record(procmetrics.ReloadRefused)
			return
		}
		if reflect.DeepEqual(cfg, live.Load()) {
			tel.Metrics.reloaded().Current() // put back after a refused change: nothing is amiss
			sent = cfg
			return
		}
		if reflect.DeepEqual(cfg, sent) {
			return // judged once already (applied, or it failed to start)
		}
		sent = cfg
		select {
		case changes <- cfg:
		case <-ctx.Done():
		}
	})
}
