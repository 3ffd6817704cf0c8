// Package replicas is the replica layer: several hub processes with a replicas section
// act as one hub. It plugs into the single-hub core (package hub) through hub.Layer and
// depends on it, never the reverse; cmd/hub wires it in only when the configuration has a
// replicas section.
//
// Two channels connect the replicas. Membership (package hub/replicas/membership,
// hashicorp/memberlist) says who is alive, where each replica's ingest listener is, and
// which replica holds which cluster's minion session at which epoch. MCP carries the
// resources: each replica serves, on its ingest listener, the clusters it holds as it
// received them (feed.go), and follows every cluster another replica holds with one stream
// (follow.go) whose pushes go through the core's ACL, merge and views like a minion's. The
// session rules (sessions.go) keep one writer per cluster copy; each dial-out runs on one
// replica at a time (tasks.go).
package replicas

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/replicas/membership"
	"github.com/meshfed/meshfed/mcp"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Layer is one replica's part beside the core: it implements hub.Layer.
type Layer struct {
	h       *hub.Hub
	cfg     hub.ReplicasConfig
	id      string // this replica's identity (replicaID)
	td      string // the trust domain ("" in insecure mode without one)
	log     *slog.Logger
	metrics *metrics
	peerSrc *mcp.Source
	peers   peerStreams
	feeds   feeds
	// join starts the membership (membership.Start; tests give a fake).
	join func(membership.Config, *slog.Logger) (members, error)
	mem  atomic.Pointer[memberRef] // set by Start, before any stream is served
	// learned: the departed clusters the group kept when it was first known are kept here
	// too (learnDeparted), once.
	learned atomic.Bool

	// tookOver is, per cluster, when this replica last saw it change hands from one live
	// session to another (GroupWriter). Its own lock: the core asks under its cluster lock,
	// which l.mu's holders take.
	tmu      sync.Mutex
	tookOver map[string]time.Time

	mu        sync.Mutex // guards the following fields
	clusters  map[string]*clusterRep
	follows   map[*hub.Session]*follow // the sessions of the follows' streams
	runs      map[string]bool          // dial-out tasks this replica runs
	following map[string]string        // cluster -> what this replica follows it from
	seen      struct {                 // the membership at the last reconcile, for its events
		replicas map[string]bool                 // nil before the first
		auth     map[string]membership.Authority // cluster -> its authority
	}
}

// clusterRep is what this replica knows of one cluster's sessions here.
type clusterRep struct {
	// minion maps each open minion session here to the epoch it holds (0: it has not
	// delivered every collection yet, so this replica does not hold it for it).
	minion map[*hub.Session]uint64
	// follow is the stream this replica follows the cluster by, if any.
	follow *follow
	// epoch is the epoch of the session whose state this replica's copy of the cluster is
	// (0: none known). It is kept in the state file (Hub.SetClusterEpoch) and told to the
	// peers (Members.SetCopy): when no replica holds the cluster, the newest copy wins.
	epoch uint64
	// restored: the copy was read from the state file, at epoch, and is held back — not
	// counted as the cluster's state, not given to peers — until the group is known to have
	// nothing newer (copies.go), or a newer state has replaced it.
	restored bool
}

// resyncing reports whether a minion session here has not delivered everything yet: it is
// then the freshest source and the only writer of the cluster's copy.
func (c *clusterRep) resyncing() bool {
	for _, epoch := range c.minion {
		if epoch == 0 {
			return true
		}
	}
	return false
}

// members is the membership as the layer uses it (*membership.Members).
type members interface {
	Hold(cluster string) uint64
	Release(cluster string, epoch uint64)
	Holds(cluster string) bool
	Authority(cluster string) (replica string, epoch uint64, ok bool)
	Authorities() map[string]membership.Authority
	SetCopy(cluster, tenant string, epoch uint64, restored bool)
	Copies(cluster string) []membership.Copy
	CopiedClusters() []string
	Synced() bool
	Replicas() []membership.Replica
	Changed() <-chan struct{}
	Watch() (<-chan struct{}, func())
	Poke()
	Addr() string
	Close() error
	Crash()
}

type memberRef struct{ members }

// New builds a hub that is one replica of several: the core (cfg must have a replicas
// section) with this layer plugged in. reg receives the metrics (nil: a new registry).
func New(cfg *hub.Config, log *slog.Logger, reg *prometheus.Registry) (*hub.Hub, *Layer, error) {
	return NewWithOptions(cfg, log, hub.Options{Registry: reg})
}

// NewWithOptions is New with the core's options (for tests: its Clock and StateFaults);
// opts.Layer must be nil, as this layer is the one plugged in.
func NewWithOptions(cfg *hub.Config, log *slog.Logger, opts hub.Options) (*hub.Hub, *Layer, error) {
	if cfg.Replicas == nil {
		return nil, nil, errors.New("replicas: the configuration has no replicas section")
	}
	if opts.Layer != nil {
		return nil, nil, errors.New("replicas: hub.Options.Layer is the replica layer's own")
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	l := &Layer{cfg: *cfg.Replicas, td: cfg.SPIFFETrustDomain(), log: log, metrics: newMetrics(reg),
		join:     func(c membership.Config, log *slog.Logger) (members, error) { return membership.Start(c, log) },
		clusters: map[string]*clusterRep{}, follows: map[*hub.Session]*follow{}, runs: map[string]bool{}, following: map[string]string{}}
	l.id = replicaID(l.td, l.cfg.Name)
	l.feeds.colls = cfg.Collections
	opts.Registry, opts.Layer = reg, l
	h, err := hub.New(cfg, log, opts)
	if err != nil {
		return nil, nil, err
	}
	l.h = h
	// A cluster's first push to a peer is its whole store: allow what ingest allows.
	l.peerSrc, err = mcp.NewSource(mcp.SourceOptions{Watcher: feedRouter{l}, MaxMessageSize: hub.MaxIngestMessageSize,
		Logger: log.With("role", "replica"), Metrics: h.MCPMetrics()})
	if err != nil {
		return nil, nil, err
	}
	return h, l, nil
}

// members returns the membership: nil until Start.
func (l *Layer) members() members {
	if r := l.mem.Load(); r != nil {
		return r.members
	}
	return nil
}

// Start joins the replicas' membership, advertising the ingest listener, serves the held
// clusters to peers on it, adds /api/replicas to the admin API and follows the peers'
// clusters until ctx ends.
func (l *Layer) Start(ctx context.Context, g *errgroup.Group, ls hub.Listeners) error {
	adv := l.cfg.Advertise
	if adv == "" {
		host, port, _ := net.SplitHostPort(ls.IngestAddr)
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			if host = privateIP(); host == "" {
				return errors.New("replicas.advertise: required: the ingest listener listens on every interface and this host has no private address")
			}
		}
		adv = net.JoinHostPort(host, port)
	}
	rc := l.cfg
	m, err := l.join(membership.Config{Name: rc.Name, Bind: rc.Gossip, MCPAddr: adv, Seeds: rc.Seeds, SeedDNS: rc.SeedDNS,
		KeyFile: rc.KeyFile, Local: rc.Profile == "local", Tuning: membership.Tuning{ProbeInterval: rc.ProbeInterval.Duration,
			ProbeTimeout: rc.ProbeTimeout.Duration, SuspicionMult: rc.SuspicionMult, GossipInterval: rc.GossipInterval.Duration,
			PushPullInterval: rc.PushPullInterval.Duration, RejoinInterval: rc.RejoinInterval.Duration},
		RestoredCopies: l.restoredCopies()}, l.log)
	if err != nil {
		return err
	}
	l.mem.Store(&memberRef{m})
	l.log.Info("replica started", "replica", rc.Name, "gossip", m.Addr(), "advertise", adv, "identity", l.id)

	// Peers follow the clusters this replica holds on the ingest listener; a replica opens
	// one stream per cluster at once, so the per-peer limit is far higher than a sink's.
	ls.PeerSource(mcp.NewSourceServer(l.peerSrc, mcp.ServerConfig{Authenticate: l.authenticatePeer, Logger: l.log, Metrics: l.h.MCPMetrics(),
		StreamRate: 1000, StreamBurst: 10000}), l.isReplica)
	ls.Admin.HandleFunc("/api/replicas", func(w http.ResponseWriter, _ *http.Request) { hub.WriteJSON(w, l.Status()) })
	g.Go(func() error { l.followPeers(ctx); return nil })
	g.Go(func() error {
		<-ctx.Done()
		if err := m.Close(); err != nil {
			l.log.Warn("leaving the replicas", "err", err)
		}
		return nil
	})
	return nil
}

// replicaID is a replica's identity: spiffe://<trustDomain>/hub/<name>, or, in insecure
// mode without a trust domain, hub/<name> (like clusters' bare names there).
func replicaID(trustDomain, name string) string {
	if trustDomain == "" {
		return meshtls.KindHub + "/" + name
	}
	return meshtls.ID(trustDomain, meshtls.KindHub, name)
}

// isReplica reports whether id is a replica's identity.
func (l *Layer) isReplica(id string) bool {
	if l.td == "" {
		name, ok := strings.CutPrefix(id, meshtls.KindHub+"/")
		return ok && name != ""
	}
	k, _, _ := meshtls.ParseID(l.td, id)
	return k == meshtls.KindHub
}

// authenticatePeer admits a replica-to-replica stream only from a hub identity of the trust
// domain (in insecure mode too: the claimed identity must still be a replica's).
func (l *Layer) authenticatePeer(ctx context.Context) (string, error) {
	id, err := hub.PeerIdentity(ctx, l.h.Config().Insecure)
	if err != nil {
		return "", err
	}
	if !l.isReplica(id) {
		return "", status.Errorf(codes.PermissionDenied, "identity %q is not a hub replica identity (%s): only replicas may follow a cluster's store",
			id, replicaID(l.td, "NAME"))
	}
	return id, nil
}

// privateIP returns this host's first private IPv4 address (a pod's IP), else its first
// global unicast address, else "".
func privateIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	var global string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() {
			continue
		}
		if n.IP.To4() != nil && n.IP.IsPrivate() {
			return n.IP.String()
		}
		if global == "" && n.IP.IsGlobalUnicast() {
			global = n.IP.String()
		}
	}
	return global
}

// Status returns the replica view (nil before Start).
func (l *Layer) Status() *api.ReplicaStatus {
	m := l.members()
	if m == nil {
		return nil
	}
	st := &api.ReplicaStatus{Self: l.cfg.Name, Authorities: map[string]api.Holder{}, Runs: []string{}, Following: map[string]string{}}
	for _, r := range m.Replicas() {
		st.Replicas = append(st.Replicas, api.Replica{Name: r.Name, MCPAddr: r.MCPAddr, Holding: r.Holding})
	}
	for c, a := range m.Authorities() {
		st.Authorities[c] = holder(a)
	}
	l.mu.Lock()
	for k := range l.runs {
		st.Runs = append(st.Runs, k)
	}
	for c, from := range l.following {
		st.Following[c] = from
	}
	l.mu.Unlock()
	sort.Strings(st.Runs)
	return st
}

func holder(a membership.Authority) api.Holder {
	return api.Holder{Replica: a.Replica, MCPAddr: a.MCPAddr, Epoch: a.Epoch}
}

// DescribeCluster adds which replica holds the cluster.
func (l *Layer) DescribeCluster(st *api.ClusterStatus) {
	m := l.members()
	if m == nil {
		return
	}
	if a, ok := m.Authorities()[st.Name]; ok {
		h := holder(a)
		st.HeldBy = &h
	}
}

// Crash ends this replica's membership as a killed process's ends: without leaving, and
// saying nothing more (no release of what it held), so its peers notice by their probes.
// For tests that run replicas in one process and kill one: call it, then end Run.
func (l *Layer) Crash() {
	if m := l.members(); m != nil {
		m.Crash()
	}
}

// GossipAddr returns the replica's bound gossip address ("" before Start).
func (l *Layer) GossipAddr() string {
	if m := l.members(); m != nil {
		return m.Addr()
	}
	return ""
}
