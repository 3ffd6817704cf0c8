package minion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
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
// relay keeps the last state it received in a file and serves it while the hub is
// unreachable and after its own restart, until the hub answers. It serves nothing before it
// has a whole state (from the file or the hub): an empty answer would make istiod delete
// what its proxies run.

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
	// restarted relay serves nothing until the hub answers.
	StateFile string `json:"stateFile,omitempty"`
	// Collections relayed, typed as anywhere. Default: every kind of the minion's table
	// (what istiod asks for).
	Collections []string `json:"collections,omitempty"`
}

// relayMaxMessageSize is the largest push the relay takes from the hub (the hub's own ingest
// limit: a hub configured with a maxMessageSize above gRPC's default 4 MiB must not make
// every push fail).
const relayMaxMessageSize = 64 << 20

// relayStateOpenTimeout bounds the wait for the state file's lock (another minion holding it).
const relayStateOpenTimeout = 5 * time.Second

// Relay is a running relay.
type Relay struct {
	cfg   RelayConfig
	log   *slog.Logger
	table *kinds.Table
	cache *mcp.Cache
	sink  *mcp.Sink
	db    *bolt.DB // nil without a state file
	creds credentials.TransportCredentials
	cert  *meshtls.Source // what creds serve (nil: plaintext), for its expiry metric
	addr  atomic.Pointer[string]
	mm    *mcp.Metrics

	upstream atomic.Int64 // open streams to the hub

	downMu sync.Mutex                           // guards down and its RelayedSinks
	down   map[*mcp.StreamInfo]*api.RelayedSink // the sinks it serves, by stream

	mu         sync.Mutex      // guards the following fields
	kept       bool            // the state file held a whole state at the start
	got        map[string]bool // collections received whole from the hub on its current stream
	lastSynced time.Time       // when got last became complete (zero: not since the start)
}

// newRelay builds the relay: its cache, its listener's credentials and its sink of the hub's
// pushes. Its state file is opened by open, when the minion runs.
func newRelay(cfg RelayConfig, cluster string, table *kinds.Table, log *slog.Logger, mm *mcp.Metrics) (*Relay, error) {
	colls := cfg.Collections
	if len(colls) == 0 {
		colls = table.Collections()
	}
	r := &Relay{cfg: cfg, log: log.With("component", "relay"), table: table, cache: mcp.NewCache(colls...), mm: mm,
		down: map[*mcp.StreamInfo]*api.RelayedSink{}, got: map[string]bool{}}
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

// open opens the state file (held until close: one minion at a time) and serves what it
// holds at once if it is whole.
func (r *Relay) open() error {
	if r.cfg.StateFile == "" {
		return nil
	}
	db, err := bolt.Open(r.cfg.StateFile, 0o600, &bolt.Options{Timeout: relayStateOpenTimeout})
	if err != nil {
		return fmt.Errorf("relay.stateFile: %w", err)
	}
	r.db = db
	whole, n, err := r.load()
	if err != nil {
		r.close()
		return fmt.Errorf("relay.stateFile %s: %w", r.cfg.StateFile, err)
	}
	if whole {
		r.mu.Lock()
		r.kept = true
		r.mu.Unlock()
		r.log.Info("serving the last state received from the hub until it answers", "file", r.cfg.StateFile, "resources", n)
	}
	return nil
}

func (r *Relay) close() {
	if r.db != nil {
		_ = r.db.Close()
		r.db = nil
	}
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
	return st
}

// Cache is what the relay serves.
func (r *Relay) Cache() *mcp.Cache { return r.cache }

// versions are what the relay holds of a collection, declared to the hub on a new stream.
func (r *Relay) versions(collection string) map[string]string {
	out := map[string]string{}
	for _, e := range r.cache.Entries(collection) {
		out[e.Name] = e.Version
	}
	return out
}

// apply keeps a push from the hub: in the file first, then served, so a restart never
// serves a state older than what istiod last saw. A push that cannot be kept is refused and
// the stream ended: on the next one the relay declares what it holds, and the hub resends.
func (r *Relay) apply(_ context.Context, c *mcp.Change) error {
	if err := r.persist(c); err != nil {
		r.log.Error("cannot keep the relayed state; not serving this push, resubscribing", "collection", c.Collection, "err", err)
		c.Stream.Close()
		return fmt.Errorf("relay state file: %w", err)
	}
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
func (r *Relay) upstreamOpened(*mcp.StreamInfo) {
	r.upstream.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.got)
}

func (r *Relay) upstreamClosed(*mcp.StreamInfo, error) { r.upstream.Add(-1) }

// markWhole records in the state file that every collection has been received whole (the
// relay serves from then on): a restart before the hub answers serves it too, as long as it
// relays the same collections.
func (r *Relay) markWhole() {
	if r.db != nil {
		if err := r.db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(metaBucket)
			if err != nil {
				return err
			}
			return b.Put(wholeKey, []byte(r.collectionSet()))
		}); err != nil {
			r.log.Error("cannot mark the relayed state whole", "err", err)
		}
	}
	r.log.Info("relaying the hub's state for this cluster")
}

// collectionSet names the relayed collections, as the whole marker records them.
func (r *Relay) collectionSet() string { return strings.Join(r.cache.Collections(), ",") }

var (
	metaBucket = []byte("meta")
	wholeKey   = []byte("whole")
)

const collectionPrefix = "collection/"

func collectionBucket(c string) []byte { return []byte(collectionPrefix + c) }

func (r *Relay) persist(c *mcp.Change) error {
	if r.db == nil {
		return nil
	}
	return r.db.Update(func(tx *bolt.Tx) error {
		name := collectionBucket(c.Collection)
		if !c.Incremental {
			if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return err
			}
		}
		b, err := tx.CreateBucketIfNotExists(name)
		if err != nil {
			return err
		}
		for _, e := range c.Entries {
			if err := b.Put([]byte(e.Name), e.Encoded); err != nil {
				return err
			}
		}
		for _, n := range c.Removed {
			if err := b.Delete([]byte(n)); err != nil {
				return err
			}
		}
		return nil
	})
}

// load serves what the file holds; whole reports whether it was marked whole for the
// collections relayed now. Collections no longer relayed are dropped from the file.
func (r *Relay) load() (whole bool, n int, err error) {
	relayed := map[string]bool{}
	for _, c := range r.cache.Collections() {
		relayed[string(collectionBucket(c))] = true
	}
	err = r.db.Update(func(tx *bolt.Tx) error {
		if m := tx.Bucket(metaBucket); m != nil && string(m.Get(wholeKey)) == r.collectionSet() {
			whole = true
		}
		var stale [][]byte
		if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			if strings.HasPrefix(string(name), collectionPrefix) && !relayed[string(name)] {
				stale = append(stale, append([]byte(nil), name...))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, name := range stale {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		for _, c := range r.cache.Collections() {
			b := tx.Bucket(collectionBucket(c))
			if b == nil {
				continue
			}
			var entries []*mcp.Entry
			if err := b.ForEach(func(_, v []byte) error {
				e, err := mcp.EntryFromBytes(append([]byte(nil), v...)) // bbolt's bytes live only in the transaction
				if err != nil {
					return err
				}
				entries = append(entries, e)
				return nil
			}); err != nil {
				return fmt.Errorf("collection %s: %w", c, err)
			}
			r.cache.Replace(c, entries)
			n += len(entries)
		}
		return nil
	})
	return whole, n, err
}

// serve runs the relay's listener until ctx ends: MCP ResourceSource and MCP-over-xDS over
// what it holds, refused (Unavailable, so istiod retries) until it has a whole state. Its
// connections are admitted by m's bounds.
func (r *Relay) serve(ctx context.Context, m *Minion) error {
	tlsOn := r.creds != nil
	lis, err := m.conns.Listen("relay", r.cfg.Listen, grpcListener(tlsOn))
	if err != nil {
		return fmt.Errorf("relay.listen: %w", err)
	}
	addr := lis.Addr().String()
	r.addr.Store(&addr)
	opts := append(mcp.SourceServerOptions(), m.grpcConnOptions(r.creds, tlsOn)...)
	if !tlsOn {
		r.log.Warn("relay listener is plaintext: keep it pod-local or cluster-internal", "addr", addr)
	}
	srv := grpc.NewServer(opts...)
	sc := mcp.ServerConfig{Ready: r.serving, Logger: r.log, Metrics: r.mm, Unauthenticated: true}
	hooks := mcp.Hooks{StreamOpened: r.downOpened, StreamClosed: r.downClosed, Pushed: r.downPushed, Acked: r.downAcked}
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: r.cache, Logger: r.log, Metrics: r.mm, Hooks: hooks})
	if err != nil {
		return err
	}
	mcp.NewSourceServer(src, sc).Register(srv)
	xds, err := mcp.NewXDSServer(r.cache, mcp.XDSOptions{Resolve: r.resolve, Server: sc, Hooks: hooks})
	if err != nil {
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
func (r *Relay) serving() (time.Duration, string, bool) {
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
