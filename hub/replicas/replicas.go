// Package replicas is the membership of a hub's replicas: who is alive (hashicorp/memberlist
// failure detection), where each replica's replica-to-replica MCP service listens, and which
// replica holds which cluster's live minion stream, with an epoch that orders sessions.
//
// It carries membership and that small metadata only, never resource data: resources move
// between replicas over MCP. Holdings travel in gossip broadcasts while they are small and
// in memberlist's TCP push/pull (full state) always.
//
// Epochs: a replica that takes a cluster's stream holds it at one more than the highest epoch
// it knows for that cluster, so the newest session wins wherever it started; a replica that
// leaves or dies drops out of the view with its holdings.
package replicas

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
	"sort"
	"strconv"
	"strings"
	"sync"
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
	// Local tunes memberlist for one machine (fast probes): for tests. Default: LAN.
	Local bool
}

// Replica is one member as the view holds it.
type Replica struct {
	Name    string            `json:"name"`
	MCPAddr string            `json:"mcpAddr"`
	Holding map[string]uint64 `json:"holding"` // cluster -> epoch of its live stream here
}

// maxBroadcast is the largest state sent as a gossip broadcast.
const maxBroadcast = 1000

// state is one replica's gossiped holdings; Version orders its updates.
type state struct {
	Name    string            `json:"n"`
	MCPAddr string            `json:"a"`
	Version uint64            `json:"v"`
	Holding map[string]uint64 `json:"h"`
}

// Members is this replica's membership. It is safe for concurrent use.
type Members struct {
	cfg   Config
	log   *slog.Logger
	ml    *memberlist.Memberlist
	queue *memberlist.TransmitLimitedQueue

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex // guards the following fields
	self    state
	peers   map[string]state // by name, alive members only (and self)
	gone    map[string]bool  // left or dead since their last join: their late messages are ignored
	changed chan struct{}
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
	mc.Logger = log.New(io.Discard, "", 0)
	m := &Members{cfg: cfg, log: logger.With("replica", cfg.Name), peers: map[string]state{}, gone: map[string]bool{}, changed: make(chan struct{}, 1),
		self: state{Name: cfg.Name, MCPAddr: cfg.MCPAddr, Holding: map[string]uint64{}}}
	m.peers[cfg.Name] = m.self
	mc.Delegate = delegate{m}
	mc.Events = events{m}
	if m.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("replicas: %w", err)
	}
	m.queue = &memberlist.TransmitLimitedQueue{NumNodes: m.ml.NumMembers, RetransmitMult: 3}
	seeds := append([]string(nil), cfg.Seeds...)
	if cfg.SeedDNS != "" {
		h, p, err := net.SplitHostPort(cfg.SeedDNS)
		if err != nil {
			return nil, fmt.Errorf("replicas: seedDNS %q: %v", cfg.SeedDNS, err)
		}
		addrs, err := net.LookupHost(h)
		if err != nil {
			m.log.Warn("seed DNS name does not resolve yet", "name", h, "err", err)
		}
		for _, a := range addrs {
			seeds = append(seeds, net.JoinHostPort(a, p))
		}
	}
	if len(seeds) > 0 {
		if n, err := m.ml.Join(seeds); err != nil && n == 0 {
			m.log.Warn("no seed answered; waiting to be joined", "seeds", seeds, "err", err)
		}
	}
	return m, nil
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

// Addr returns the gossip address this replica listens on.
func (m *Members) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Hold records that this replica now holds cluster's live stream and returns the session's
// epoch: one more than any epoch known for the cluster.
func (m *Members) Hold(cluster string) uint64 {
	m.mu.Lock()
	var epoch uint64
	for _, p := range m.peers {
		epoch = max(epoch, p.Holding[cluster])
	}
	epoch++
	m.self.Holding[cluster] = epoch
	m.publishLocked()
	m.mu.Unlock()
	return epoch
}

// Release records that the stream of epoch ended here (a later session keeps it held).
func (m *Members) Release(cluster string, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.self.Holding[cluster] != epoch {
		return
	}
	delete(m.self.Holding, cluster)
	m.publishLocked()
}

// publishLocked bumps this replica's version, updates the view and queues a broadcast.
func (m *Members) publishLocked() {
	m.self.Version++
	cp := m.self
	cp.Holding = make(map[string]uint64, len(m.self.Holding))
	for k, v := range m.self.Holding {
		cp.Holding[k] = v
	}
	m.peers[m.self.Name] = cp
	// Gossip packets are ~1.4 KB: a larger state travels by push/pull only.
	if b, err := json.Marshal(cp); err == nil && len(b) <= maxBroadcast {
		m.queue.QueueBroadcast(broadcast{name: cp.Name, msg: b})
	}
	m.notifyLocked()
}

func (m *Members) notifyLocked() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Changed is poked (without blocking) on every change of the view.
func (m *Members) Changed() <-chan struct{} { return m.changed }

// Authority returns the replica holding cluster with the newest epoch.
func (m *Members) Authority(cluster string) (replica string, epoch uint64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, p := range m.peers {
		if e := p.Holding[cluster]; e > epoch || (e == epoch && e > 0 && name < replica) {
			replica, epoch, ok = name, e, true
		}
	}
	return replica, epoch, ok
}

// Replicas returns the live replicas (this one included), by name.
func (m *Members) Replicas() []Replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Replica, 0, len(m.peers))
	for _, p := range m.peers {
		r := Replica{Name: p.Name, MCPAddr: p.MCPAddr, Holding: map[string]uint64{}}
		for k, v := range p.Holding {
			r.Holding[k] = v
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Close leaves the membership (peers drop this replica at once) and stops. Safe to call
// more than once.
func (m *Members) Close() error {
	m.closeOnce.Do(func() {
		m.closeErr = m.ml.Leave(2 * time.Second)
		if err := m.ml.Shutdown(); m.closeErr == nil {
			m.closeErr = err
		}
	})
	return m.closeErr
}

// merge takes a peer's state if it is newer than the one known.
func (m *Members) merge(s state) {
	if s.Name == "" || s.Name == m.cfg.Name {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.peers[s.Name]; ok && old.Version >= s.Version {
		return
	}
	if m.gone[s.Name] {
		return // a departed replica's late message must not bring it back
	}
	if s.Holding == nil {
		s.Holding = map[string]uint64{}
	}
	m.peers[s.Name] = s
	m.notifyLocked()
}

type delegate struct{ m *Members }

// NodeMeta carries the replica's MCP address, so peers know it from the join on.
func (d delegate) NodeMeta(limit int) []byte {
	if len(d.m.cfg.MCPAddr) > limit {
		return nil
	}
	return []byte(d.m.cfg.MCPAddr)
}

func (d delegate) NotifyMsg(b []byte) {
	var s state
	if json.Unmarshal(b, &s) == nil {
		d.m.merge(s)
	}
}

func (d delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.m.queue.GetBroadcasts(overhead, limit)
}

// LocalState is this replica's own state, for push/pull (TCP, any size).
func (d delegate) LocalState(bool) []byte {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	b, _ := json.Marshal(d.m.peers[d.m.cfg.Name])
	return b
}

func (d delegate) MergeRemoteState(b []byte, _ bool) {
	var s state
	if json.Unmarshal(b, &s) == nil {
		d.m.merge(s)
	}
}

type events struct{ m *Members }

// NotifyJoin forgets that a (re)joining replica had gone. memberlist calls the event
// methods with its own lock held: they take only m.mu and never call memberlist.
func (e events) NotifyJoin(n *memberlist.Node) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	delete(e.m.gone, n.Name)
	if _, ok := e.m.peers[n.Name]; !ok && n.Name != e.m.cfg.Name {
		e.m.peers[n.Name] = state{Name: n.Name, MCPAddr: string(n.Meta), Holding: map[string]uint64{}}
		e.m.notifyLocked()
	}
}

// NotifyLeave drops a replica that left or was declared dead, with its holdings.
func (e events) NotifyLeave(n *memberlist.Node) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	if n.Name == e.m.cfg.Name {
		return
	}
	e.m.gone[n.Name] = true
	if _, ok := e.m.peers[n.Name]; ok {
		delete(e.m.peers, n.Name)
		e.m.log.Warn("replica left", "peer", n.Name)
		e.m.notifyLocked()
	}
}

func (e events) NotifyUpdate(n *memberlist.Node) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	if p, ok := e.m.peers[n.Name]; ok && n.Name != e.m.cfg.Name {
		p.MCPAddr = string(n.Meta)
		e.m.peers[n.Name] = p
	}
}

// broadcast is one replica's state; a newer one of the same replica replaces it.
type broadcast struct {
	name string
	msg  []byte
}

func (b broadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(broadcast)
	return ok && ob.name == b.name
}
func (b broadcast) Message() []byte { return b.msg }
func (b broadcast) Finished()       {}
