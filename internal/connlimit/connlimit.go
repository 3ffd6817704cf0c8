// Package connlimit bounds what a program's listeners hold for peers that have not yet
// said who they are. A TCP connection costs a file descriptor from accept on, and a TLS
// handshake, which is where a peer's identity is proven, comes after: every limit keyed by
// identity (the engine's admission, a tenant's limits) is too late for a peer that opens
// connections and never finishes its handshake. Left alone, 19,800 connections that each
// sent 6 bytes of a TLS ClientHello took all 20,000 descriptors of a hub: no sink, minion
// or probe could connect, and none had been closed after 75 s.
//
// A Guard is shared by every listener of a process (Wrap, Listen) and bounds, before the
// handshake:
//
//   - how long: a connection that has not completed its handshake within the handshake
//     timeout is closed (handshake_timeout);
//   - how many per peer address: a connection from an address (an IPv6 /64) that already
//     has MaxPendingPerIP connections in handshake is closed as it is accepted
//     (pending_per_ip), so that one address cannot hold the others' share;
//   - how many in all: the process holds at most MaxConnections accepted connections,
//     derived by default from its limit of open files with a reserve kept for everything
//     else it opens (Derive); one more is closed as it is accepted (max_connections). A
//     listener may have slots of its own that no other listener can take (the http
//     listener's HTTPReserve): probes and scrapes then get through a flood of the others.
//
// A connection is refused by accepting and closing it at once: left in the kernel's
// accept queue, it would hold up the peers queued behind it. Each refusal and each
// timeout is told to Options.Refused (the programs' metrics) and logged at most once per
// address and reason per interval (internal/lograte).
//
// What "handshake completed" means is the protocol's: a TLS listener's gRPC credentials
// (ServerCredentials) mark a connection established once its TLS handshake succeeded, an
// HTTP server once a request has begun (Established, from http.Server's ConnState), and a
// plaintext gRPC listener at its first bytes (ListenerOptions.FirstBytes). After that the
// connection belongs to its protocol's limits (gRPC's connection timeout for HTTP/2's
// preface, the engine's admission of streams, http.Server's timeouts), and counts only
// against MaxConnections until it is closed.
//
// It knows no protocol beyond that mark, and no policy of who may connect.
package connlimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshfed/meshfed/internal/lograte"
)

// Reasons a connection is refused or closed before its handshake: the reason label of the
// programs' connections_refused_total metrics.
const (
	ReasonMaxConnections   = "max_connections"
	ReasonPendingPerIP     = "pending_per_ip"
	ReasonHandshakeTimeout = "handshake_timeout"
)

// Config bounds a Guard's connections (the programs' files have it as ops.Connections, in
// their limits section; the defaults are each program's).
type Config struct {
	// HandshakeTimeout closes a connection that has not completed its handshake (TLS; on
	// a plaintext listener, sent its first bytes) within it. 0: none.
	HandshakeTimeout time.Duration
	// MaxPendingPerIP is how many connections one address (an IPv6 /64) may have in
	// handshake at once, on all the listeners together. 0: no cap.
	MaxPendingPerIP int
	// MaxConnections is how many accepted connections the process holds at once, on all
	// its listeners together. 0: derived from the limit of open files (Derive).
	MaxConnections int
}

// MinReserve is the least number of file descriptors Derive keeps from connections.
const MinReserve = 64

// Derive returns the connections a process allowed fdLimit open files may hold, and the
// descriptors it keeps for the rest: a tenth of the limit, at least MinReserve. The rest is
// the state file, the log, the listeners themselves, the connections the program dials
// (minions and relays to the hub, dialSinks, polls, replicas), the TLS files re-read at
// handshake time, the runtime's own (epoll, pipes) and the moment a connection refused for
// being over the cap is open before it is closed. A program at its cap then still opens
// what it needs, instead of failing its own writes and dials with "too many open files".
// A limit at or below the reserve leaves no connections (0).
func Derive(fdLimit int) (maxConns, reserve int) {
	reserve = max(MinReserve, fdLimit/10)
	return max(fdLimit-reserve, 0), reserve
}

// HTTPReserve is how many of the connections a program's http listener (/healthz,
// /readyz, /metrics) has to itself: a liveness probe, a readiness probe, Prometheus and a
// few operators at once, with room for connections lost but not yet closed. A flood of the
// gRPC listeners cannot take them, so the probes do not restart a process that is only
// being flooded.
const HTTPReserve = 32

// Options are what a Guard reports to.
type Options struct {
	// Logger gets one line per address and reason per lograte.DefaultInterval, and one at
	// start with the bounds (nil: slog's default).
	Logger *slog.Logger
	// Refused, if set, is told of every connection refused or closed, by listener and
	// reason: the caller's metric.
	Refused func(listener, reason string)
	// FDLimit is the process's limit of open files MaxConnections 0 is derived from (0:
	// read RLIMIT_NOFILE). For tests.
	FDLimit int
}

// Guard bounds the connections of a process's listeners. It is safe for concurrent use.
type Guard struct {
	timeout time.Duration
	perIP   int
	max     int
	log     *slog.Logger
	logs    *lograte.Limiter
	refused func(listener, reason string)

	mu       sync.Mutex         // guards the following fields
	open     int                // connections open, on every listener
	shared   int                // of them, those on shared slots (not a listener's reserve)
	reserved int                // the reserves of the open listeners, together
	pending  map[netip.Addr]int // connections in handshake by address; only addresses that have some
	pendingN int                // the sum of pending's counts
}

// New returns a Guard for cfg. A MaxConnections of 0 is derived from the limit of open
// files; a limit that leaves no connection is an error, and a MaxConnections that leaves
// less than MinReserve is logged.
func New(cfg Config, o Options) (*Guard, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	fdLimit := o.FDLimit
	if fdLimit == 0 {
		fdLimit = fileLimit()
	}
	maxConns, reserve := Derive(fdLimit)
	switch {
	case cfg.MaxConnections > 0:
		if fdLimit > 0 && cfg.MaxConnections > fdLimit-MinReserve {
			log.Warn("limits.maxConnections leaves fewer than MinReserve of the process's open files for everything else: at the cap, its own files and dials may fail",
				"maxConnections", cfg.MaxConnections, "fdLimit", fdLimit, "minReserve", MinReserve)
		}
		maxConns, reserve = cfg.MaxConnections, max(fdLimit-cfg.MaxConnections, 0)
	case fdLimit <= 0:
		return nil, errors.New("limits.maxConnections: the process's limit of open files is unknown here: set it")
	case maxConns == 0:
		return nil, fmt.Errorf("limits.maxConnections: the process may open %d files, which the reserve of %d takes whole: raise the limit (ulimit -n) or set it", fdLimit, reserve)
	}
	g := &Guard{timeout: cfg.HandshakeTimeout, perIP: cfg.MaxPendingPerIP, max: maxConns, log: log,
		logs: lograte.New(lograte.DefaultInterval, nil), refused: o.Refused, pending: map[netip.Addr]int{}}
	log.Info("connections bounded", "maxConnections", maxConns, "fdLimit", fdLimit, "reserve", reserve,
		"handshakeTimeout", g.timeout, "maxPendingPerIP", g.perIP)
	return g, nil
}

// Max is how many connections the process may hold.
func (g *Guard) Max() int { return g.max }

// Counts returns the connections open and those still in handshake, on every listener.
func (g *Guard) Counts() (open, pending int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.pendingN
}

// ListenerOptions say how a listener's connections are admitted.
type ListenerOptions struct {
	// Reserve is how many connections this listener has to itself (HTTPReserve for the
	// http listener); at most half of what the other listeners leave is given.
	Reserve int
	// FirstBytes marks a connection established once it has sent something: for a
	// listener whose protocol has no handshake of its own (plaintext gRPC).
	FirstBytes bool
	// TCPUserTimeout, if set, is set on each connection (TCP_USER_TIMEOUT, Linux): gRPC
	// sets its keepalive timeout there itself, but only on a *net.TCPConn, which a guarded
	// connection is not, so a gRPC listener passes it here.
	TCPUserTimeout time.Duration
}

// Listen listens on addr (TCP) and wraps the listener (Wrap).
func (g *Guard) Listen(name, addr string, o ListenerOptions) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return g.Wrap(name, l, o), nil
}

// Wrap returns l admitting its connections through g; name is its listener label.
// Closing it gives its reserve back.
func (g *Guard) Wrap(name string, l net.Listener, o ListenerOptions) net.Listener {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := min(max(o.Reserve, 0), (g.max-g.reserved)/2)
	g.reserved += r
	return &listener{Listener: l, g: g, name: name, reserve: r, firstBytes: o.FirstBytes, userTimeout: o.TCPUserTimeout}
}

type listener struct {
	net.Listener
	g           *Guard
	name        string
	reserve     int
	firstBytes  bool
	userTimeout time.Duration
	own         int // connections on its reserved slots (g.mu)
	closed      sync.Once
}

// Accept returns the next connection the bounds admit; those they refuse are closed here.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.admit(c); gc != nil {
			return gc, nil
		}
	}
}

// Close closes the listener and gives its reserve back (its open connections keep theirs
// until they close).
func (l *listener) Close() error {
	l.closed.Do(func() {
		l.g.mu.Lock()
		l.g.reserved -= l.reserve
		l.g.mu.Unlock()
	})
	return l.Listener.Close()
}

// admit takes a slot and, with a per-address cap, a pending count for c, or closes it.
func (l *listener) admit(c net.Conn) net.Conn {
	g := l.g
	key := addrKey(c.RemoteAddr())
	reason, own := "", false
	g.mu.Lock()
	switch {
	case g.perIP > 0 && g.pending[key] >= g.perIP:
		reason = ReasonPendingPerIP
	case l.own < l.reserve:
		l.own++
		own = true
	case g.shared < g.max-g.reserved:
		g.shared++
	default:
		reason = ReasonMaxConnections
	}
	if reason == "" {
		g.open++
		g.pending[key]++
		g.pendingN++
	}
	g.mu.Unlock()
	if reason != "" {
		g.report(l.name, reason, key) // counted before the peer can see the close
		_ = c.Close()
		return nil
	}
	if l.userTimeout > 0 {
		setUserTimeout(c, l.userTimeout)
	}
	gc := &conn{Conn: c, l: l, key: key, own: own}
	if g.timeout > 0 {
		gc.timer = time.AfterFunc(g.timeout, gc.expire)
	}
	return gc
}

// report counts a refusal and logs it, once per address and reason per interval.
func (g *Guard) report(listener, reason string, key netip.Addr) {
	if g.refused != nil {
		g.refused(listener, reason)
	}
	if ok, suppressed := g.logs.Allow(reason + "\x00" + key.String()); ok {
		msg := "connection refused before its handshake"
		if reason == ReasonHandshakeTimeout {
			msg = "connection closed: no handshake within the handshake timeout"
		}
		g.log.Warn(msg, "listener", listener, "reason", reason, "peer", key.String(), "suppressed", suppressed)
	}
}

// addrKey is what the per-address cap counts by: the IP address, and for IPv6 its /64,
// which one host commonly has whole (one address each would make the cap no cap).
func addrKey(a net.Addr) netip.Addr {
	var ip netip.Addr
	switch x := a.(type) {
	case *net.TCPAddr:
		ip = x.AddrPort().Addr()
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// A connection's states.
const (
	pending int32 = iota
	established
	closed
)

type conn struct {
	net.Conn
	l     *listener
	key   netip.Addr
	own   bool        // on its listener's reserved slots
	timer *time.Timer // nil without a handshake timeout
	state atomic.Int32
	once  sync.Once // gives the slot back
}

// endPending moves a pending connection to state to and gives its pending count back;
// false if it was not pending.
func (c *conn) endPending(to int32) bool {
	if !c.state.CompareAndSwap(pending, to) {
		return false
	}
	g := c.l.g
	g.mu.Lock()
	if g.pending[c.key]--; g.pending[c.key] <= 0 {
		delete(g.pending, c.key)
	}
	g.pendingN--
	g.mu.Unlock()
	return true
}

// established marks the handshake done.
func (c *conn) established() {
	if c.state.Load() == pending && c.endPending(established) && c.timer != nil {
		c.timer.Stop()
	}
}

// expire closes the connection if its handshake has not completed.
func (c *conn) expire() {
	if c.endPending(closed) {
		c.l.g.report(c.l.name, ReasonHandshakeTimeout, c.key)
		_ = c.close()
	}
}

// Read marks a FirstBytes listener's connection established at its first bytes.
func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.l.firstBytes {
		c.established()
	}
	return n, err
}

// Close closes the connection and gives its slot and pending count back.
func (c *conn) Close() error {
	if c.endPending(closed) && c.timer != nil {
		c.timer.Stop()
	}
	return c.close()
}

func (c *conn) close() error {
	c.once.Do(func() {
		g := c.l.g
		g.mu.Lock()
		if c.own {
			c.l.own--
		} else {
			g.shared--
		}
		g.open--
		g.mu.Unlock()
	})
	return c.Conn.Close()
}

// CloseWrite half-closes a TCP connection (net/http's graceful close asks for it).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Established marks c, a connection a Guard's listener returned (or one wrapping it, as a
// *tls.Conn does), as past its handshake: it no longer counts against its address's
// pending cap and the handshake timeout no longer applies. Any other connection is left
// as it is; calling it again does nothing.
func Established(c net.Conn) {
	for {
		switch x := c.(type) {
		case *conn:
			x.established()
			return
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return
		}
	}
}
