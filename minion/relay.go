package minion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// The relay: the minion subscribes, over its connection to the hub's ingest listener and
// with its cluster's identity, to what the hub's routing gives its cluster, and re-serves it
// inside the cluster to that cluster's istiod, over MCP-over-xDS (what istiod speaks) and
// MCP ResourceSource. istiod exits at start when its config source is unreachable, so the
// relay keeps the last state it received in a file (relayfile.go) and serves it while the
// hub is unreachable and after its own restart, until the hub answers. It serves nothing
// before it has a whole state (from the file or the hub): an empty answer would make istiod
// delete what its proxies run. It runs beside the minion's publishing and never holds it up:
// its file's problems are its own.

// RelayConfig enables the relay.
type RelayConfig struct {
	// Listen is where the cluster's istiod connects (meshConfig.configSources:
	// xds://ADDR). Required.
	Listen string `json:"listen"`
	// TLS, if set, serves with this certificate and asks for no client certificate, for
	// istiod's tlsSettings mode SIMPLE (caCertificates: the bundle that signed it).
	// Without it the listener is plaintext: for a pod-local or cluster-internal address.
	TLS *meshtls.Files `json:"tls,omitempty"`
	// StateFile keeps the last state received from the hub (a bbolt file). Without it, a
	// restarted relay serves nothing until the hub answers. A damaged file is moved aside
	// (<file>.corrupt-<UTC time>) and the relay starts without it.
	StateFile string `json:"stateFile,omitempty"`
	// Collections relayed, typed as anywhere. Default: every kind of the minion's table
	// (what istiod asks for).
	Collections []string `json:"collections,omitempty"`
}

// relayMaxMessageSize is the largest push the relay takes from the hub (the hub's own ingest
// limit: a hub configured with a maxMessageSize above gRPC's default 4 MiB must not make
// every push fail).
const relayMaxMessageSize = 64 << 20

// Relay is a running relay.
type Relay struct {
	cfg   RelayConfig
	log   *slog.Logger
	table *kinds.Table
	cache *mcp.Cache
	sink  *mcp.Sink
	file  *relayFile // nil without a state file
	creds credentials.TransportCredentials
	cert  *meshtls.Source // what creds serve (nil: plaintext), for its expiry metric
	addr  atomic.Pointer[string]
	mm    *mcp.Metrics

	upstream atomic.Int64 // open streams to the hub

	// fileRetry is how often the relay tries again to take a state file it does not hold.
	fileRetry time.Duration
	// keepMu orders what changes the served state with the state file: the hub's pushes
	// (apply) and taking the file (takeFile). The file's methods run under it.
	keepMu  sync.Mutex
	applied bool // guarded by keepMu: the relay has served a push of the hub's since it started
	// superseded, guarded by keepMu, is a stream to the hub that opened before the relay
	// took what its state file holds: its pushes follow what the relay declared then.
	superseded *mcp.StreamInfo

	downMu sync.Mutex                           // guards down and its RelayedSinks
	down   map[*mcp.StreamInfo]*api.RelayedSink // the sinks it serves, by stream

	mu         sync.Mutex      // guards the following fields
	hubStream  *mcp.StreamInfo // the stream to the hub, while one is open
	kept       bool            // the state file held a whole state at the start
	got        map[string]bool // collections received whole from the hub on its current stream
	lastSynced time.Time       // when got last became complete (zero: not since the start)
}

// newRelay builds the relay: its cache, its listener's credentials and its sink of the hub's
// pushes. Its state file is opened when it runs.
func newRelay(cfg RelayConfig, cluster string, table *kinds.Table, log *slog.Logger, mm *mcp.Metrics, metrics *Metrics) (*Relay, error) {
	colls := cfg.Collections
	if len(colls) == 0 {
		colls = table.Collections()
	}
	r := &Relay{cfg: cfg, log: log.With("component", "relay"), table: table, cache: mcp.NewCache(colls...), mm: mm,
		down: map[*mcp.StreamInfo]*api.RelayedSink{}, got: map[string]bool{}, fileRetry: relayFileRetry}
	if cfg.StateFile != "" {
		r.file = newRelayFile(cfg.StateFile, r.cache.Collections(), r.log, metrics)
	}
	if cfg.TLS != nil {
		ts, err := meshtls.NewSource(*cfg.TLS, r.log)
		if err != nil {
			return nil, fmt.Errorf("relay.tls: %w", err)
		}
		r.creds, r.cert = credentials.NewTLS(ts.ServerOnlyConfig()), ts
	}
	var err error
	r.sink, err = mcp.NewSink(mcp.SinkOptions{
		Collections:     colls,
		Node:            &mcppb.SinkNode{Id: cluster}, // the name in its certificate, which the hub routes by
		Applier:         mcp.ApplierFunc(r.apply),
		InitialVersions: r.versions,
		// The hub's pushes are its whole subset for the cluster: take what it may send.
		MaxMessageSize: relayMaxMessageSize,
		Logger:         r.log,
		Metrics:        mm,
		Hooks:          mcp.Hooks{StreamOpened: r.upstreamOpened, StreamClosed: r.upstreamClosed},
		Annotations:    r.reported,
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// run runs the relay until ctx ends: its listener, its state file and, through follow, its
// stream to the hub. Only a listener that cannot be opened is an error: the state file's
// problems are reported (log, metrics, status), never a reason to stop the minion.
func (r *Relay) run(ctx context.Context, m *Minion) error {
	follow := m.followHub
	lis, err := r.listen(m)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	if r.file != nil {
		r.takeFile() // before serving: istiod's first stream is served the kept state
		defer r.closeFile()
		g.Go(func() error { r.retryFile(ctx); return nil })
	}
	g.Go(func() error { return r.serve(ctx, lis, m) })
	g.Go(func() error { follow(ctx); return nil })
	return g.Wait()
}

// takeFile opens the state file if the relay does not hold it: when it starts, and every
// fileRetry after that while it could not open or write it. A relay that has served nothing
// from the hub yet serves what the file holds, when it is whole, as after a restart (and
// subscribes again, declaring it); one that has makes the file hold what it serves, marked
// whole when it is.
func (r *Relay) takeFile() {
	r.keepMu.Lock()
	defer r.keepMu.Unlock()
	if r.file.holds() {
		return
	}
	state, whole, ok := r.file.open()
	if !ok {
		return
	}
	if r.applied {
		if !r.file.rewrite(r.served(), r.Ready()) {
			return
		}
	} else {
		r.serveKept(state, whole)
		r.resubscribe()
	}
	r.file.kept()
}

// resubscribe ends the stream to the hub, if one is open, once the relay holds what its
// state file held: the hub's pushes on that stream follow the versions the relay declared
// when it opened, so they are refused (apply), and the next stream declares what the relay
// holds now (versions waits for keepMu, so a stream never declares half of it).
func (r *Relay) resubscribe() {
	r.mu.Lock()
	s := r.hubStream
	r.mu.Unlock()
	if s != nil {
		r.superseded = s
		s.Close()
	}
}

func (r *Relay) retryFile(ctx context.Context) {
	t := time.NewTicker(r.fileRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.takeFile()
		}
	}
}

func (r *Relay) closeFile() {
	r.keepMu.Lock()
	defer r.keepMu.Unlock()
	r.file.close()
}

// serveKept serves a state read from the file before the hub has pushed anything: all of
// it, so that the relay declares it to the hub and resumes, and to istiod only if it is
// whole.
func (r *Relay) serveKept(state map[string][]*mcp.Entry, whole bool) {
	n := 0
	for c, entries := range state {
		r.cache.Replace(c, entries)
		n += len(entries)
	}
	if !whole {
		return
	}
	r.mu.Lock()
	r.kept = true
	r.mu.Unlock()
	r.log.Info("serving the last state received from the hub until it answers", "file", r.cfg.StateFile, "resources", n)
}

// served is what the relay serves, by collection.
func (r *Relay) served() map[string][]*mcp.Entry {
	out := map[string][]*mcp.Entry{}
	for _, c := range r.cache.Collections() {
		out[c] = r.cache.Entries(c)
	}
	return out
}

// Ready reports whether the relay serves: it has a whole state, from its file or the hub.
func (r *Relay) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kept || !r.lastSynced.IsZero()
}

// Addr is the relay listener's bound address ("" until it listens).
func (r *Relay) Addr() string {
	if p := r.addr.Load(); p != nil {
		return *p
	}
	return ""
}

// The relay reports the sinks it serves (its istiods) to the hub, in its stream's SinkNode
// (api.RelayedSinksAnnotation), so the hub's tools show them under the relay. At most
// maxReported are listed: a report is a handful of lines, not a fleet's inventory.
const maxReported = 64

func (r *Relay) downOpened(i *mcp.StreamInfo) {
	r.downMu.Lock()
	r.down[i] = &api.RelayedSink{Protocol: i.Protocol, Collections: map[string]*api.RelayedCollection{}}
	r.downMu.Unlock()
}

func (r *Relay) downClosed(i *mcp.StreamInfo, _ error) {
	r.downMu.Lock()
	delete(r.down, i)
	r.downMu.Unlock()
	r.sink.Report()
}

// downUpdate changes what the relay knows of a downstream sink.
func (r *Relay) downUpdate(i *mcp.StreamInfo, coll string, f func(*api.RelayedCollection)) {
	r.downMu.Lock()
	defer r.downMu.Unlock()
	rs := r.down[i]
	if rs == nil {
		return
	}
	rs.NodeID = i.Node().GetId()
	c := rs.Collections[coll]
	if c == nil {
		c = &api.RelayedCollection{}
		rs.Collections[coll] = c
	}
	f(c)
}

func (r *Relay) downPushed(i *mcp.StreamInfo, ev mcp.PushEvent) {
	r.downUpdate(i, ev.Collection, func(c *api.RelayedCollection) { c.Pushed = ev.Version })
}

func (r *Relay) downAcked(i *mcp.StreamInfo, ev mcp.AckEvent) {
	r.downUpdate(i, ev.Collection, func(c *api.RelayedCollection) {
		if ev.Code == codes.OK {
			c.Acked, c.NACK = ev.Version, ""
		} else {
			c.NACK = ev.Code.String() + ": " + ev.Message
		}
	})
	r.sink.Report()
}

// reported is the annotation of the relay's stream to the hub: its downstream sinks.
func (r *Relay) reported() map[string]string {
	var out []api.RelayedSink
	r.downMu.Lock()
	for _, rs := range r.down {
		if len(out) == maxReported {
			break
		}
		c := api.RelayedSink{NodeID: rs.NodeID, Protocol: rs.Protocol, Collections: map[string]*api.RelayedCollection{}}
		for k, v := range rs.Collections {
			vv := *v
			c.Collections[k] = &vv
		}
		out = append(out, c)
	}
	r.downMu.Unlock()
	sort.Slice(out, func(a, b int) bool { return out[a].NodeID < out[b].NodeID })
	b, err := json.Marshal(out)
	if err != nil {
		return nil
	}
	return map[string]string{api.RelayedSinksAnnotation: string(b)}
}

// RelayStatus is the relay as /status reports it.
type RelayStatus struct {
	// Addr is the listener's bound address.
	Addr string `json:"addr"`
	// Serving: it has a whole state (from its file or the hub) and answers istiod.
	Serving bool `json:"serving"`
	// FromHub: every collection has arrived whole from the hub since the minion started
	// (LastSynced is set; otherwise what is served is the kept state, or nothing).
	FromHub bool `json:"fromHub"`
	// Objects served, by collection.
	Objects map[string]int `json:"objects"`
	// Streams: istiods (and other sinks) connected now.
	Streams int `json:"streams"`
	// HubConnected: the relay's stream to the hub is open; LastSynced is when every
	// collection last arrived whole from the hub (unset since the start: the relay serves its
	// kept state, or nothing).
	HubConnected bool       `json:"hubConnected"`
	LastSynced   *time.Time `json:"lastSynced,omitempty"`
	// StateFile is the state file's, when there is one.
	StateFile *RelayStateFile `json:"stateFile,omitempty"`
}

// Status returns the relay's state.
func (r *Relay) Status() RelayStatus {
	st := RelayStatus{Addr: r.Addr(), Objects: map[string]int{}, HubConnected: r.upstream.Load() > 0}
	r.downMu.Lock()
	st.Streams = len(r.down)
	r.downMu.Unlock()
	r.mu.Lock()
	if st.FromHub = !r.lastSynced.IsZero(); st.FromHub {
		t := r.lastSynced
		st.LastSynced = &t
	}
	st.Serving = r.kept || st.FromHub
	r.mu.Unlock()
	for _, c := range r.cache.Collections() {
		st.Objects[c] = r.cache.Len(c)
	}
	if r.file != nil {
		fs := r.file.status()
		st.StateFile = &fs
	}
	return st
}

// Cache is what the relay serves.
func (r *Relay) Cache() *mcp.Cache { return r.cache }

// versions are what the relay holds of a collection, declared to the hub on a new stream.
func (r *Relay) versions(collection string) map[string]string {
	r.keepMu.Lock()
	defer r.keepMu.Unlock()
	out := map[string]string{}
	for _, e := range r.cache.Entries(collection) {
		out[e.Name] = e.Version
	}
	return out
}

// apply serves a push from the hub, kept in the state file first (keep). One that keep
// refuses is not served, and the stream ends: on the next one the relay declares what it
// holds, and the hub resends.
func (r *Relay) apply(_ context.Context, c *mcp.Change) error {
	r.keepMu.Lock()
	defer r.keepMu.Unlock()
	if c.Stream != nil && c.Stream == r.superseded {
		return errors.New("a push of a stream that opened before the relay took its state file")
	}
	if err := r.keep(c); err != nil {
		r.log.Warn("refusing the hub's push: a restart would serve the state file's older state", "collection", c.Collection, "file", r.cfg.StateFile, "err", err)
		c.Stream.Close()
		return fmt.Errorf("relay state file: %w", err)
	}
	r.applied = true
	if c.Incremental {
		r.cache.Update(c.Collection, c.Entries, c.Removed)
	} else {
		r.cache.Replace(c.Collection, c.Entries)
	}
	if !c.More && r.delivered(c.Collection) {
		r.markWhole()
	}
	return nil
}

// delivered records that collection arrived whole from the hub on the current stream. It
// reports whether that gave the relay its first whole state to serve: every collection has
// now arrived on this stream, and the relay had served neither the hub's state nor a kept one.
func (r *Relay) delivered(collection string) (first bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[collection] = true
	for _, c := range r.sink.Collections() {
		if !r.got[c] {
			return false
		}
	}
	first = !r.kept && r.lastSynced.IsZero()
	r.lastSynced = time.Now()
	return first
}

// upstreamOpened and upstreamClosed follow the relay's stream to the hub: a new stream
// delivers every collection again before the relay counts as synced from it.
func (r *Relay) upstreamOpened(i *mcp.StreamInfo) {
	r.upstream.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hubStream = i
	clear(r.got)
}

func (r *Relay) upstreamClosed(i *mcp.StreamInfo, _ error) {
	r.upstream.Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hubStream == i {
		r.hubStream = nil
	}
}

// keep decides whether a push may be served, and keeps it in the state file when it can. A
// restarted relay serves the file until the hub answers, and that must never be a state
// older than one istiod has seen: so the push is written before it is served, and if it
// cannot be, the file is withdrawn (removed) and the push served from memory alone; takeFile
// writes a new file from what is served once it can. It is an error only when the file can
// be neither written nor withdrawn: the push must then not be served, and istiod keeps what
// it has.
func (r *Relay) keep(c *mcp.Change) error {
	if r.file == nil || r.file.write(c) {
		return nil
	}
	return r.file.withdraw()
}

// markWhole records in the state file that every collection has been received whole (the
// relay serves from then on): a restart before the hub answers serves it too, as long as it
// relays the same collections.
func (r *Relay) markWhole() {
	if r.file != nil {
		r.file.markWhole()
	}
	r.log.Info("relaying the hub's state for this cluster")
}

// listen opens the relay's listener, its connections admitted by m's bounds.
func (r *Relay) listen(m *Minion) (net.Listener, error) {
	lis, err := m.conns.Listen("relay", r.cfg.Listen, grpcListener(r.creds != nil))
	if err != nil {
		return nil, fmt.Errorf("relay.listen: %w", err)
	}
	addr := lis.Addr().String()
	r.addr.Store(&addr)
	return lis, nil
}

// serve serves lis until ctx ends: MCP ResourceSource and MCP-over-xDS over what the relay
// holds, refused (Unavailable, so istiod retries) until it has a whole state.
func (r *Relay) serve(ctx context.Context, lis net.Listener, m *Minion) error {
	addr := lis.Addr().String()
	tlsOn := r.creds != nil
	opts := append(mcp.SourceServerOptions(), m.grpcConnOptions(r.creds, tlsOn)...)
	if !tlsOn {
		r.log.Warn("relay listener is plaintext: keep it pod-local or cluster-internal", "addr", addr)
	}
	srv := grpc.NewServer(opts...)
	sc := mcp.ServerConfig{Ready: r.serving, Logger: r.log, Metrics: r.mm, Unauthenticated: true}
	hooks := mcp.Hooks{StreamOpened: r.downOpened, StreamClosed: r.downClosed, Pushed: r.downPushed, Acked: r.downAcked}
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: r.cache, Logger: r.log, Metrics: r.mm, Hooks: hooks})
	if err != nil {
		_ = lis.Close()
		return err
	}
	mcp.NewSourceServer(src, sc).Register(srv)
	xds, err := mcp.NewXDSServer(r.cache, mcp.XDSOptions{Resolve: r.resolve, Server: sc, Hooks: hooks})
	if err != nil {
		_ = lis.Close()
		return err
	}
	xds.Register(srv)
	r.log.Info("relay listening", "addr", addr, "tls", r.creds != nil)
	go func() { <-ctx.Done(); srv.Stop() }()
	if err := srv.Serve(lis); err != nil && ctx.Err() == nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// serving refuses istiod (Unavailable, retry in a second) until the relay has a whole
// state: istiod exits when its config source refuses it, but an empty answer would make it
// delete what its proxies run. It is the admission's readiness step, after the per-peer
// rate limit, so an istiod retrying in a loop is limited and logged once a minute.
func (r *Relay) serving(*mcp.StreamInfo) (time.Duration, string, bool) {
	if !r.Ready() {
		return time.Second, "the relay has no state yet: waiting for the hub", false
	}
	return 0, "", true
}

// resolve maps istiod's type URLs to the relayed collections.
func (r *Relay) resolve(typeURL string) (string, bool) {
	k, ok := r.table.ForTypeURL(typeURL)
	if !ok || !slices.Contains(r.cache.Collections(), k.Collection) {
		return "", false
	}
	return k.Collection, true
}
