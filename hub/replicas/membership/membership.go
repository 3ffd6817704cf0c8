// Package membership is the membership of a hub's replicas: who is alive (hashicorp/memberlist
// failure detection), where each replica's replica-to-replica MCP service listens, and which
// replica holds which cluster's live minion stream, with an epoch that orders sessions.
//
// It carries membership and that small metadata only, never resource data: resources move
// between replicas over MCP.
//
// Gossip: each change of a holding is one small delta (one cluster, ~80 bytes, whatever the
// number of clusters), sent as a broadcast and over memberlist's TCP channel to each member;
// full states travel in memberlist's push/pull and whenever a replica (re)joins (each side
// sends its own and asks for the other's). Every replica stamps its changes with a version that
// only grows, and with an incarnation (its start time), so a replica that restarts under the
// same name before its death was noticed still supersedes what it said before.
//
// Epochs: a replica that takes a cluster's session holds it at one more than the highest
// epoch it has ever seen for that cluster (departed replicas included), so the newest
// session wins wherever it started; ties (possible only when two sides of a network split
// took the cluster independently) go to the lower replica name. A replica that leaves or
// dies drops out of the view with its holdings.
//
// Copies: each replica also says, per cluster it has a copy of, the epoch of the session
// whose state that copy is, and whether the copy was restored from its state file and not
// yet confirmed (SetCopy). When no replica holds a cluster, the copies' epochs say which is
// newest; they count among the epochs seen, so a new session is newer than every copy.
package membership

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config configures one replica's membership.
type Config struct {
	// Name is the replica's unique name.
	Name string
	// Bind is the gossip address, host:port (port 0 picks a free one).
	Bind string
	// MCPAddr is where peers reach this replica's replica-to-replica MCP service.
	MCPAddr string
	// Seeds are gossip addresses of other replicas to join.
	Seeds []string
	// SeedDNS is a name:port whose addresses are the other replicas (a Kubernetes headless
	// Service); resolved at start, joined like Seeds.
	SeedDNS string
	// KeyFile holds the gossip encryption key (16, 24 or 32 bytes, base64): every replica
	// must have the same. Empty: unencrypted gossip (logged).
	KeyFile string
	// Local starts from memberlist's local-network defaults (fast probes) instead of its
	// LAN defaults.
	Local bool
	// Tuning overrides the chosen defaults; zero fields keep them.
	Tuning Tuning
	// Incarnation orders this replica's lives; default the start time. Tests set it.
	Incarnation int64
	// RestoredCopies are the copies this replica restored from its state file, by cluster,
	// at their epochs: in its state from the first message it sends, the join's full state
	// included, so that no peer counts itself synced with this replica without knowing them
	// (it could confirm an older copy of its own meanwhile).
	RestoredCopies map[string]uint64

	broadcastOnly bool // tests: holding changes by gossip broadcast only, not over TCP
}

// Tuning is the part of memberlist's failure detection worth changing.
type Tuning struct {
	// ProbeInterval between failure probes of a random peer (LAN default 1s).
	ProbeInterval time.Duration
	// ProbeTimeout for a probe's answer (LAN default 500ms).
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspected peer has to refute before it is declared
	// dead (LAN default 4).
	SuspicionMult int
	// GossipInterval between gossip rounds (LAN default 200ms).
	GossipInterval time.Duration
	// PushPullInterval between full-state exchanges (LAN default 30s).
	PushPullInterval time.Duration
	// RejoinInterval between attempts to join the seeds and the replicas that left or
	// died, while they are not members: how a network split heals (memberlist itself stops
	// contacting a dead member after a while). Default 10s.
	RejoinInterval time.Duration
}

// Copy is a peer's copy of a cluster, as the view holds it.
type Copy struct {
	Replica string
	MCPAddr string
	// Epoch is the epoch of the session whose state the copy is.
	Epoch uint64
	// Restored: read from the peer's state file and not confirmed yet (the peer does not
	// serve it to other replicas until it is).
	Restored bool
	// Tenant is the tenant the cluster belongs to on the peer: a replica that does not
	// know the cluster (it left the configuration while that replica was down) keeps it
	// there.
	Tenant string
}

// Replica is one member as the view holds it.
type Replica struct {
	Name    string            `json:"name"`
	MCPAddr string            `json:"mcpAddr"`
	Holding map[string]uint64 `json:"holding"` // cluster -> epoch of its live session there
}

// hold is one replica's holding of one cluster, or its copy of one: Epoch 0 is a release
// (kept as a tombstone until a full state supersedes it, so an older hold arriving late
// cannot revive it).
type hold struct {
	Epoch    uint64 `json:"e"`
	Ver      uint64 `json:"v"`           // the replica's version when it changed
	Restored bool   `json:"r,omitempty"` // copies: restored, not confirmed yet
	Tenant   string `json:"t,omitempty"` // copies: the cluster's tenant
}

// message is what replicas gossip: a replica's full state (push/pull) or one cluster's
// change (broadcast).
type message struct {
	Name    string          `json:"n"`
	MCPAddr string          `json:"a,omitempty"`
	Inc     int64           `json:"i"`
	Ver     uint64          `json:"v"`
	Full    bool            `json:"f,omitempty"`
	Ask     bool            `json:"q,omitempty"` // Full: answer with your full state
	Holding map[string]hold `json:"h,omitempty"` // Full: every live holding; else the one changed
	Copies  map[string]hold `json:"c,omitempty"` // Full: every copy; else the one changed (then Holding is empty)
}

// peer is what this replica knows of one replica.
type peer struct {
	name    string
	mcpAddr string
	inc     int64
	ver     uint64 // the version of the newest full state merged
	holding map[string]hold
	copies  map[string]hold
	full    bool // a full state of its current life has been merged
}

// MaxMessage bounds a decoded gossip message (memberlist's push/pull is capped too).
const MaxMessage = 4 << 20

// decode parses one gossip message, refusing anything malformed with a reason.
func decode(b []byte) (message, error) {
	var m message
	if len(b) > MaxMessage {
		return m, fmt.Errorf("gossip message of %d bytes exceeds %d", len(b), MaxMessage)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("gossip message: %w", err)
	}
	if m.Name == "" {
		return m, errors.New("gossip message without a replica name")
	}
	if n := len(m.Holding) + len(m.Copies); !m.Full && n != 1 {
		return m, fmt.Errorf("gossip delta from %q changes %d clusters, want 1", m.Name, n)
	}
	for _, entries := range []map[string]hold{m.Holding, m.Copies} {
		for c, h := range entries {
			if c == "" {
				return m, fmt.Errorf("gossip message from %q holds a cluster without a name", m.Name)
			}
			if m.Full && h.Epoch == 0 {
				return m, fmt.Errorf("gossip state from %q lists cluster %q with epoch 0", m.Name, c)
			}
			if h.Ver > m.Ver {
				return m, fmt.Errorf("gossip message from %q: cluster %q changed at version %d, after the message's %d", m.Name, c, h.Ver, m.Ver)
			}
		}
	}
	return m, nil
}

// Members is this replica's membership. It is safe for concurrent use.
type Members struct {
	cfg   Config
	log   *slog.Logger
	ml    *memberlist.Memberlist
	queue *memberlist.TransmitLimitedQueue

	closeOnce sync.Once
	closeErr  error
	stop      chan struct{}
	rejoined  sync.WaitGroup // the rejoin and send goroutines
	sending   sync.WaitGroup // sends in flight
	live      atomic.Int32   // members known (this one included), for the broadcast queue
	sends     chan outgoing  // messages to send over TCP

	mu    sync.Mutex // guards the following fields
	self  message    // Full, Holding without tombstones
	peers map[string]*peer
	gone  map[string]departed // left or dead since their last join: their late messages are ignored, and they are rejoined for a while
	// nodes are the live members' gossip addresses (this replica's too), copied in
	// memberlist's event callbacks: memberlist rewrites the Nodes Members returns in place
	// (a replica restarting under its name), so reading them anywhere else is a data race
	// (hashicorp/memberlist#306).
	nodes    map[string]memberlist.Node
	maxEpoch map[string]uint64 // cluster -> highest epoch ever seen
	changed  chan struct{}
	watchers map[chan struct{}]bool // Watch's channels
	joined   bool                   // Start has tried its seeds
	synced   bool                   // see Synced
}

// Start creates the replica's membership and joins the seeds (those that answer; none
// answering is not an error: the others will join this one).
func Start(cfg Config, logger *slog.Logger) (*Members, error) {
	if cfg.Name == "" {
		return nil, errors.New("replicas: name is required")
	}
	mc := memberlist.DefaultLANConfig()
	if cfg.Local {
		mc = memberlist.DefaultLocalConfig()
	}
	tune(mc, cfg.Tuning)
	mc.Name = cfg.Name
	host, port, err := net.SplitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("replicas: bind %q: %v", cfg.Bind, err)
	}
	mc.BindAddr = host
	if mc.BindPort, err = strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("replicas: bind %q: %v", cfg.Bind, err)
	}
	mc.AdvertisePort = mc.BindPort
	if cfg.KeyFile != "" {
		key, err := readKey(cfg.KeyFile)
		if err != nil {
			return nil, err
		}
		mc.SecretKey = key
	} else {
		logger.Warn("replica gossip is not encrypted (no keyFile)")
	}
	if cfg.Incarnation == 0 {
		cfg.Incarnation = time.Now().UnixNano()
	}
	mc.Logger = log.New(io.Discard, "", 0)
	if os.Getenv("MESHFED_MEMBERLIST_LOG") != "" { // memberlist's own log, for debugging
		mc.Logger = log.New(os.Stderr, "memberlist "+cfg.Name+" ", log.Lmicroseconds)
	}
	m := &Members{cfg: cfg, log: logger.With("replica", cfg.Name), peers: map[string]*peer{}, gone: map[string]departed{}, nodes: map[string]memberlist.Node{},
		maxEpoch: map[string]uint64{}, changed: make(chan struct{}, 1), stop: make(chan struct{}),
		sends: make(chan outgoing, 1024),
		self:  message{Name: cfg.Name, MCPAddr: cfg.MCPAddr, Inc: cfg.Incarnation, Full: true, Holding: map[string]hold{}, Copies: map[string]hold{}}}
	for cluster, epoch := range cfg.RestoredCopies {
		if epoch > 0 {
			m.self.Ver++
			m.self.Copies[cluster] = hold{Epoch: epoch, Ver: m.self.Ver, Restored: true}
			m.maxEpoch[cluster] = max(m.maxEpoch[cluster], epoch)
		}
	}
	m.watchers = map[chan struct{}]bool{m.changed: true}
	mc.Delegate = delegate{m}
	mc.Events = events{m}
	// The queue must not call into memberlist: memberlist calls the event delegates with its
	// node lock held, and those take m.mu, under which broadcasts are queued.
	m.live.Store(1)
	// Holding changes are rare and small: transmit each more often than memberlist's own
	// messages (4 × log(N+1) on a LAN), since memberlist piggybacks them on any packet and
	// a few transmissions can all go to the same peer. The TCP send covers the rest.
	m.queue = &memberlist.TransmitLimitedQueue{NumNodes: func() int { return int(m.live.Load()) }, RetransmitMult: max(mc.RetransmitMult, 16)}
	if m.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("replicas: %w", err)
	}
	if cfg.SeedDNS != "" {
		if _, _, err := net.SplitHostPort(cfg.SeedDNS); err != nil {
			_ = m.ml.Shutdown()
			return nil, fmt.Errorf("replicas: seedDNS %q: %v", cfg.SeedDNS, err)
		}
	}
	if seeds := m.seeds(); len(seeds) > 0 {
		if n, err := m.ml.Join(seeds); err != nil && n == 0 {
			m.log.Warn("no seed answered; waiting to be joined", "seeds", seeds, "err", err)
		}
	}
	m.mu.Lock()
	m.joined = true
	m.checkSyncedLocked()
	m.mu.Unlock()
	every := cfg.Tuning.RejoinInterval
	if every <= 0 {
		every = 10 * time.Second
	}
	m.rejoined.Add(2)
	go m.rejoin(every)
	go m.send()
	return m, nil
}

// departed is a replica that left or died: where it was, and when.
type departed struct {
	addr string
	at   time.Time
}

// forgetAfter is how long a departed replica is rejoined (a split that lasts longer heals
// through the seeds); after that it is forgotten, so replaced pods do not pile up.
const forgetAfter = time.Hour

// outgoing is a message for one member (to) or every member (to empty).
type outgoing struct {
	to  string
	msg []byte
}

// enqueue queues a message for the send goroutine without blocking (gossip and push/pull
// still carry the state if the queue is full).
func (m *Members) enqueue(o outgoing) {
	select {
	case m.sends <- o:
	default:
	}
}

// send delivers messages over memberlist's reliable (TCP) channel: each holding change to
// every member, as well as by gossip (a broadcast's few transmissions may all be
// piggybacked on packets to the same peer, and a handover must not wait for the next
// push/pull), and full states exchanged when a replica (re)joins.
func (m *Members) send() {
	defer m.rejoined.Done()
	sem := make(chan struct{}, 32) // sends in flight: one unreachable peer must not hold up the others
	for {
		select {
		case <-m.stop:
			return
		case o := <-m.sends:
			m.mu.Lock()
			var to []memberlist.Node
			for name, n := range m.nodes {
				if name != m.cfg.Name && (o.to == "" || name == o.to) {
					to = append(to, n)
				}
			}
			m.mu.Unlock()
			for _, n := range to {
				select {
				case sem <- struct{}{}:
				case <-m.stop:
					return
				}
				m.sending.Add(1)
				go func() {
					defer m.sending.Done()
					defer func() { <-sem }()
					if err := m.ml.SendReliable(&n, o.msg); err != nil {
						m.log.Debug("sending to a replica", "peer", n.Name, "err", err)
					}
				}()
			}
		}
	}
}

// fullLocked is this replica's full state, asking for the receiver's when ask is set.
func (m *Members) fullLocked(ask bool) []byte {
	st := m.self
	st.Ask = ask
	b, _ := json.Marshal(st)
	return b
}

// seeds returns the configured seeds and what SeedDNS resolves to now.
func (m *Members) seeds() []string {
	seeds := append([]string(nil), m.cfg.Seeds...)
	if m.cfg.SeedDNS != "" {
		h, p, _ := net.SplitHostPort(m.cfg.SeedDNS)
		addrs, err := net.LookupHost(h)
		if err != nil {
			m.log.Warn("seed DNS name does not resolve", "name", h, "err", err)
		}
		for _, a := range addrs {
			seeds = append(seeds, net.JoinHostPort(a, p))
		}
	}
	return seeds
}

// rejoin periodically joins the seeds and the replicas that left or died that are not
// members now: after a network split, each side has declared the other dead and
// memberlist alone would not bring them back together.
func (m *Members) rejoin(every time.Duration) {
	defer m.rejoined.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		live := map[string]bool{}
		m.mu.Lock()
		for _, n := range m.nodes {
			live[net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))] = true
		}
		m.mu.Unlock()
		var try []string
		for _, a := range m.seeds() {
			if !live[a] {
				try = append(try, a)
			}
		}
		m.mu.Lock()
		for name, d := range m.gone {
			if time.Since(d.at) > forgetAfter {
				delete(m.gone, name)
				continue
			}
			if !live[d.addr] {
				try = append(try, d.addr)
			}
		}
		m.mu.Unlock()
		if len(try) == 0 {
			continue
		}
		if n, err := m.ml.Join(try); n > 0 {
			m.log.Info("rejoined replicas", "contacted", n, "tried", try)
		} else if err != nil {
			m.log.Debug("rejoin found no replica", "tried", try, "err", err)
		}
	}
}

func tune(mc *memberlist.Config, t Tuning) {
	if t.ProbeInterval > 0 {
		mc.ProbeInterval = t.ProbeInterval
	}
	if t.ProbeTimeout > 0 {
		mc.ProbeTimeout = t.ProbeTimeout
	}
	if t.SuspicionMult > 0 {
		mc.SuspicionMult = t.SuspicionMult
	}
	if t.GossipInterval > 0 {
		mc.GossipInterval = t.GossipInterval
	}
	if t.PushPullInterval > 0 {
		mc.PushPullInterval = t.PushPullInterval
	}
	// A replica that left the group may come back (a restart, a healed split) with the
	// same name at once: allow it to reclaim its name after a short while.
	mc.DeadNodeReclaimTime = 5 * mc.ProbeInterval
}

func readKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("replicas: keyFile: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("replicas: keyFile %s: not base64: %v", path, err)
	}
	if l := len(key); l != 16 && l != 24 && l != 32 {
		return nil, fmt.Errorf("replicas: keyFile %s: the key is %d bytes, want 16, 24 or 32", path, l)
	}
	return key, nil
}

// Name returns this replica's name.
func (m *Members) Name() string { return m.cfg.Name }

// Addr returns the gossip address this replica listens on.
func (m *Members) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Hold records that this replica now holds cluster's live session and returns its epoch:
// one more than any epoch ever seen for the cluster.
func (m *Members) Hold(cluster string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	epoch := m.maxEpoch[cluster] + 1
	m.maxEpoch[cluster] = epoch
	m.changeLocked(cluster, epoch)
	return epoch
}

// Holds reports whether this replica holds cluster's session (whatever the others hold).
func (m *Members) Holds(cluster string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.self.Holding[cluster]
	return ok
}

// Release records that the session of epoch ended here (a later session keeps it held).
func (m *Members) Release(cluster string, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.self.Holding[cluster]; !ok || h.Epoch != epoch {
		return
	}
	m.changeLocked(cluster, 0)
}

// changeLocked records a holding change (epoch 0: released) and broadcasts it.
func (m *Members) changeLocked(cluster string, epoch uint64) {
	m.self.Ver++
	h := hold{Epoch: epoch, Ver: m.self.Ver}
	if epoch == 0 {
		delete(m.self.Holding, cluster)
	} else {
		m.self.Holding[cluster] = h
	}
	m.sendLocked(message{Name: m.self.Name, Inc: m.self.Inc, Ver: m.self.Ver, Holding: map[string]hold{cluster: h}}, "hold/"+cluster)
	m.notifyLocked()
}

// sendLocked broadcasts a delta, and sends it over TCP to each member.
func (m *Members) sendLocked(d message, key string) {
	if b, err := json.Marshal(d); err == nil {
		m.queue.QueueBroadcast(broadcast{name: m.self.Name, key: key, msg: b})
		if !m.cfg.broadcastOnly {
			m.enqueue(outgoing{msg: b})
		}
	}
}

// SetCopy records that this replica's copy of cluster (of tenant) is the state of the
// session of epoch (0: it has none), restored from its state file and not confirmed yet if
// restored, and tells the peers. The epoch counts among those seen for the cluster.
func (m *Members) SetCopy(cluster, tenant string, epoch uint64, restored bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.self.Copies == nil {
		m.self.Copies = map[string]hold{}
	}
	old, had := m.self.Copies[cluster]
	if (!had && epoch == 0) || (had && old.Epoch == epoch && old.Restored == restored && old.Tenant == tenant) {
		return
	}
	if epoch > m.maxEpoch[cluster] {
		m.maxEpoch[cluster] = epoch
	}
	m.self.Ver++
	h := hold{Epoch: epoch, Ver: m.self.Ver, Restored: restored, Tenant: tenant}
	if epoch == 0 {
		h.Restored, h.Tenant = false, ""
		delete(m.self.Copies, cluster)
	} else {
		m.self.Copies[cluster] = h
	}
	m.sendLocked(message{Name: m.self.Name, Inc: m.self.Inc, Ver: m.self.Ver, Copies: map[string]hold{cluster: h}}, "copy/"+cluster)
}

// Copies returns the live peers' copies of cluster, by replica name.
func (m *Members) Copies(cluster string) []Copy {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Copy
	for _, p := range m.peers {
		if h := p.copies[cluster]; h.Epoch > 0 {
			out = append(out, Copy{Replica: p.name, MCPAddr: p.mcpAddr, Epoch: h.Epoch, Restored: h.Restored, Tenant: h.Tenant})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Replica < out[j].Replica })
	return out
}

// CopiedClusters returns the clusters the live peers have a copy of, sorted.
func (m *Members) CopiedClusters() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, p := range m.peers {
		for c, h := range p.copies {
			if h.Epoch > 0 {
				seen[c] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// Synced reports whether this replica knows what the group has: it has tried its seeds,
// knows at least one peer, and has merged a full state of every peer it knows. Until then a
// copy it restored may be older than a peer's, and a replica that knows no peer cannot tell
// a group of one from peers it cannot reach yet. Once true it stays true: it is asked
// about what a replica restored at its start.
func (m *Members) Synced() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.synced
}

// checkSyncedLocked sets synced once it holds, and wakes the consumers then.
func (m *Members) checkSyncedLocked() {
	if m.synced || !m.joined || len(m.peers) == 0 {
		return
	}
	for _, p := range m.peers {
		if !p.full {
			return
		}
	}
	m.synced = true
	m.log.Info("heard every replica's full state: what the group has is known")
	m.notifyLocked()
}

func (m *Members) notifyLocked() {
	for w := range m.watchers { // Changed's channel among them
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// Poke wakes Changed's and Watch's consumers without a change of the view (a caller whose
// own state changed what they should do).
func (m *Members) Poke() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.notifyLocked()
}

// Watch returns a channel poked (without blocking) on every change of the view, for a
// second consumer besides Changed, and a function that stops it.
func (m *Members) Watch() (<-chan struct{}, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := make(chan struct{}, 1)
	m.watchers[w] = true
	return w, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.watchers, w)
	}
}

// Changed is poked (without blocking) on every change of the view.
func (m *Members) Changed() <-chan struct{} { return m.changed }

// holdingsLocked calls f for every live holding, this replica's included.
func (m *Members) holdingsLocked(f func(replica, addr, cluster string, epoch uint64)) {
	for c, h := range m.self.Holding {
		f(m.self.Name, m.self.MCPAddr, c, h.Epoch)
	}
	for _, p := range m.peers {
		for c, h := range p.holding {
			if h.Epoch > 0 {
				f(p.name, p.mcpAddr, c, h.Epoch)
			}
		}
	}
}

// Authority is the replica holding a cluster's newest session.
type Authority struct {
	Replica string `json:"replica"`
	MCPAddr string `json:"mcpAddr"`
	Epoch   uint64 `json:"epoch"`
}

// Authorities returns, for every held cluster, the replica holding it with the newest
// epoch (ties: the lower replica name).
func (m *Members) Authorities() map[string]Authority {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]Authority{}
	m.holdingsLocked(func(replica, addr, cluster string, epoch uint64) {
		a, ok := out[cluster]
		if !ok || epoch > a.Epoch || (epoch == a.Epoch && replica < a.Replica) {
			out[cluster] = Authority{Replica: replica, MCPAddr: addr, Epoch: epoch}
		}
	})
	return out
}

// Authority returns the replica holding cluster with the newest epoch.
func (m *Members) Authority(cluster string) (replica string, epoch uint64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	consider := func(name string, e uint64) {
		if e > epoch || (e == epoch && e > 0 && name < replica) {
			replica, epoch, ok = name, e, true
		}
	}
	if h, held := m.self.Holding[cluster]; held {
		consider(m.self.Name, h.Epoch)
	}
	for _, p := range m.peers {
		if h := p.holding[cluster]; h.Epoch > 0 {
			consider(p.name, h.Epoch)
		}
	}
	return replica, epoch, ok
}

// Replicas returns the live replicas (this one included), by name.
func (m *Members) Replicas() []Replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	byName := map[string]*Replica{m.self.Name: {Name: m.self.Name, MCPAddr: m.self.MCPAddr, Holding: map[string]uint64{}}}
	for _, p := range m.peers {
		byName[p.name] = &Replica{Name: p.name, MCPAddr: p.mcpAddr, Holding: map[string]uint64{}}
	}
	m.holdingsLocked(func(replica, _, cluster string, epoch uint64) { byName[replica].Holding[cluster] = epoch })
	out := make([]Replica, 0, len(byName))
	for _, r := range byName {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Crash stops as a killed process (kill -9) does: without leaving, and nothing more is
// sent or answered, so the peers notice by their probes. For tests that run replicas in one
// process. Close after it does nothing more.
func (m *Members) Crash() {
	m.closeOnce.Do(func() {
		close(m.stop)
		m.rejoined.Wait()
		m.closeErr = m.ml.Shutdown()
		m.sending.Wait()
	})
}

// Close leaves the membership (peers drop this replica at once) and stops. Safe to call
// more than once.
func (m *Members) Close() error {
	m.closeOnce.Do(func() {
		close(m.stop)
		m.rejoined.Wait()
		m.closeErr = m.ml.Leave(2 * time.Second)
		if err := m.ml.Shutdown(); m.closeErr == nil {
			m.closeErr = err
		}
		m.sending.Wait() // a send to an unreachable peer ends at memberlist's TCP timeout
	})
	return m.closeErr
}

// merge applies a peer's full state or delta.
func (m *Members) merge(b []byte) {
	msg, err := decode(b)
	if err != nil {
		m.log.Warn("ignoring a malformed gossip message", "err", err)
		return
	}
	if msg.Name == m.cfg.Name {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if msg.Ask {
		m.enqueue(outgoing{to: msg.Name, msg: m.fullLocked(false)})
	}
	if _, gone := m.gone[msg.Name]; gone {
		return // a departed replica's late message must not bring it back
	}
	p := m.peers[msg.Name]
	if p == nil {
		p = &peer{name: msg.Name, holding: map[string]hold{}, copies: map[string]hold{}}
		m.peers[msg.Name] = p
		m.live.Store(int32(len(m.peers) + 1))
	}
	switch {
	case msg.Inc < p.inc:
		return // from an earlier life
	case msg.Inc > p.inc:
		changed := len(p.holding) > 0 || len(p.copies) > 0
		p.inc, p.ver, p.holding, p.copies, p.full = msg.Inc, 0, map[string]hold{}, map[string]hold{}, false
		if changed {
			m.notifyLocked() // its earlier life's holdings are gone
		}
	}
	if msg.MCPAddr != "" {
		p.mcpAddr = msg.MCPAddr
	}
	changed := m.mergeLocked(p.holding, msg.Holding, p.ver)
	changed = m.mergeLocked(p.copies, msg.Copies, p.ver) || changed
	if msg.Full && msg.Ver > p.ver {
		p.ver = msg.Ver
		changed = prune(p.holding, msg.Holding, msg.Ver) || changed
		changed = prune(p.copies, msg.Copies, msg.Ver) || changed
	}
	if msg.Full {
		p.full = true
		m.checkSyncedLocked()
	}
	if changed {
		m.notifyLocked()
	}
}

// mergeLocked merges a message's entries of one kind (holdings or copies) into what a peer
// had of that kind, its last full state being of version ver, and reports whether an
// entry changed.
func (m *Members) mergeLocked(have, got map[string]hold, ver uint64) bool {
	changed := false
	for c, h := range got {
		if h.Epoch > m.maxEpoch[c] {
			m.maxEpoch[c] = h.Epoch
		}
		old, ok := have[c]
		if !ok {
			old.Ver = ver // a full state at least this new did not list it
		}
		if h.Ver > old.Ver {
			have[c] = h
			changed = changed || old.Epoch != h.Epoch || old.Restored != h.Restored || old.Tenant != h.Tenant
		}
	}
	return changed
}

// prune drops what a full state of version ver no longer lists (released before it), and
// reports whether a live entry went.
func prune(have, listed map[string]hold, ver uint64) bool {
	changed := false
	for c, h := range have {
		if _, ok := listed[c]; !ok && h.Ver <= ver {
			delete(have, c)
			changed = changed || h.Epoch > 0
		}
	}
	return changed
}

type delegate struct{ m *Members }

// NodeMeta carries the replica's MCP address, so peers know it from the join on.
func (d delegate) NodeMeta(limit int) []byte {
	if len(d.m.cfg.MCPAddr) > limit {
		return nil
	}
	return []byte(d.m.cfg.MCPAddr)
}

func (d delegate) NotifyMsg(b []byte) { d.m.merge(b) }

func (d delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.m.queue.GetBroadcasts(overhead, limit)
}

// LocalState is this replica's own full state, for push/pull (TCP, any size).
func (d delegate) LocalState(bool) []byte {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.m.fullLocked(false)
}

func (d delegate) MergeRemoteState(b []byte, _ bool) { d.m.merge(b) }

type events struct{ m *Members }

// NotifyJoin forgets that a (re)joining replica had gone. memberlist calls the event
// methods with its own lock held: they take only m.mu and never call memberlist.
func (e events) NotifyJoin(n *memberlist.Node) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	e.m.nodes[n.Name] = nodeCopy(n)
	delete(e.m.gone, n.Name)
	if n.Name == e.m.cfg.Name {
		return
	}
	if p, ok := e.m.peers[n.Name]; ok {
		p.mcpAddr = string(n.Meta)
	}
	// Exchange full states now: what the peer sent while it was still gone here (a healed
	// split, a quick restart) was dropped, and the next push/pull may be far off.
	e.m.enqueue(outgoing{to: n.Name, msg: e.m.fullLocked(true)})
	if _, ok := e.m.peers[n.Name]; !ok {
		e.m.peers[n.Name] = &peer{name: n.Name, mcpAddr: string(n.Meta), holding: map[string]hold{}, copies: map[string]hold{}}
		e.m.live.Store(int32(len(e.m.peers) + 1))
		e.m.log.Info("replica joined", "peer", n.Name, "mcp_addr", string(n.Meta))
		e.m.notifyLocked()
	}
}

// NotifyLeave drops a replica that left or was declared dead, with its holdings.
func (e events) NotifyLeave(n *memberlist.Node) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	delete(e.m.nodes, n.Name)
	if n.Name == e.m.cfg.Name {
		return
	}
	e.m.gone[n.Name] = departed{addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), at: time.Now()}
	if _, ok := e.m.peers[n.Name]; ok {
		delete(e.m.peers, n.Name)
		e.m.live.Store(int32(len(e.m.peers) + 1))
		e.m.log.Warn("replica left or died", "peer", n.Name)
		e.m.checkSyncedLocked() // the full states awaited may have been its
		e.m.notifyLocked()
	}
}

func (e events) NotifyUpdate(n *memberlist.Node) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	e.m.nodes[n.Name] = nodeCopy(n)
	if p, ok := e.m.peers[n.Name]; ok && n.Name != e.m.cfg.Name {
		p.mcpAddr = string(n.Meta)
	}
}

// nodeCopy is what the membership keeps of a member's Node: its name and gossip address,
// copied while memberlist holds its lock.
func nodeCopy(n *memberlist.Node) memberlist.Node {
	return memberlist.Node{Name: n.Name, Addr: slices.Clone(n.Addr), Port: n.Port}
}

// broadcast is one replica's change of one cluster's holding or copy (key); a newer one of
// the same key replaces it in the queue.
type broadcast struct {
	name, key string
	msg       []byte
}

func (b broadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(broadcast)
	return ok && ob.name == b.name && ob.key == b.key
}
func (b broadcast) Message() []byte { return b.msg }
func (b broadcast) Finished()       {}
