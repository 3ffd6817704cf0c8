package connlimit

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

// wait is how long a test waits for an event it caused (a close, a refusal): far beyond
// what it takes, so that only a missing event fails.
const wait = 20 * time.Second

// refusals counts what a Guard reports, by "listener/reason".
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *refusals) add(listener, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[listener+"/"+reason]++
}

func (r *refusals) get(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

func newGuard(t *testing.T, cfg Config) (*Guard, *refusals) {
	t.Helper()
	r := &refusals{n: map[string]int{}}
	g, err := New(cfg, Options{Logger: testlog.New(t), Refused: r.add, FDLimit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	return g, r
}

// serve listens on loopback through g and accepts until the test ends; accepted gets each
// connection, which the test's cleanup closes.
func serve(t *testing.T, g *Guard, name string, o ListenerOptions) (addr string, accepted <-chan net.Conn) {
	t.Helper()
	l, err := g.Listen(name, "127.0.0.1:0", o)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		close(ch)
		for c := range ch {
			c.Close()
		}
	})
	return l.Addr().String(), ch
}

// client is a connection from the test's side, with a channel closed once the server has
// closed it (a read ended).
type client struct {
	net.Conn
	gone chan struct{}
}

// dial connects from the loopback address from (Linux routes all of 127.0.0.0/8 to lo) and
// reads until the server closes the connection; the test's cleanup closes it.
func dial(t *testing.T, from, addr string) *client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	cl := &client{Conn: c, gone: make(chan struct{})}
	go func() {
		defer close(cl.gone)
		b := make([]byte, 64)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-cl.gone })
	return cl
}

func waitGone(t *testing.T, c *client, what string) {
	t.Helper()
	select {
	case <-c.gone:
	case <-time.After(wait):
		t.Fatalf("timed out after %v waiting: %s", wait, what)
	}
}

func next(t *testing.T, accepted <-chan net.Conn, what string) net.Conn {
	t.Helper()
	select {
	case c := <-accepted:
		return c
	case <-time.After(wait):
		t.Fatalf("timed out after %v waiting: %s", wait, what)
		return nil
	}
}

// open reports whether c is still up: a byte it writes reaches the server's end s.
func open(c *client, s net.Conn) bool {
	if _, err := c.Write([]byte{1}); err != nil {
		return false
	}
	b := make([]byte, 1)
	_ = s.SetReadDeadline(time.Now().Add(wait))
	_, err := io.ReadFull(s, b)
	_ = s.SetReadDeadline(time.Time{})
	return err == nil
}

// noLeaks waits until g holds no connection and no pending count: everything taken was
// given back.
func noLeaks(t *testing.T, g *Guard) {
	t.Helper()
	testwait.For(t, wait, "every connection's slot and pending count given back", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.open == 0 && g.shared == 0 && g.pendingN == 0 && len(g.pending) == 0
	})
}

func TestDerive(t *testing.T) {
	for _, tc := range []struct{ limit, max, reserve int }{
		{20_000, 18_000, 2_000},
		{1_048_576, 943_719, 104_857},
		{1024, 922, 102},
		{512, 448, 64},
		{100, 36, 64},
		{64, 0, 64},
		{0, 0, 64},
	} {
		if m, r := Derive(tc.limit); m != tc.max || r != tc.reserve {
			t.Errorf("Derive(%d) = %d, %d; want %d, %d", tc.limit, m, r, tc.max, tc.reserve)
		}
	}
}

func TestNew(t *testing.T) {
	if _, err := New(Config{}, Options{Logger: testlog.New(t), FDLimit: 64}); err == nil || !strings.Contains(err.Error(), "limits.maxConnections") {
		t.Errorf("a limit the reserve takes whole: %v, want an error naming limits.maxConnections", err)
	}
	g, err := New(Config{MaxConnections: 10}, Options{Logger: testlog.New(t), FDLimit: 64})
	if err != nil || g.Max() != 10 {
		t.Errorf("maxConnections 10: %v, max %d", err, g.Max())
	}
	if g, err := New(Config{}, Options{Logger: testlog.New(t)}); err != nil || g.Max() <= 0 {
		t.Errorf("derived from this process's limit: %v", err)
	}
}

// A connection that does not complete its handshake in time is closed; one that has is
// not, nor is one that sent its first bytes on a FirstBytes listener.
func TestHandshakeTimeout(t *testing.T) {
	g, r := newGuard(t, Config{HandshakeTimeout: 200 * time.Millisecond})
	addr, accepted := serve(t, g, "grpc", ListenerOptions{})
	plainAddr, plainAccepted := serve(t, g, "plain", ListenerOptions{FirstBytes: true})

	done := dial(t, "127.0.0.1", addr)
	doneS := next(t, accepted, "the first connection")
	Established(doneS)
	spoke := dial(t, "127.0.0.1", plainAddr)
	spokeS := next(t, plainAccepted, "the plaintext connection")
	if !open(spoke, spokeS) { // its first byte, read by the server
		t.Fatal("the plaintext connection is not up")
	}
	// Started after the others: when its timeout has passed, theirs has too.
	stall := dial(t, "127.0.0.1", addr)
	next(t, accepted, "the stalled connection")
	waitGone(t, stall, "the stalled connection closed by the hub")
	if n := r.get("grpc/" + ReasonHandshakeTimeout); n != 1 {
		t.Errorf("handshake timeouts counted: %d, want 1", n)
	}
	if !open(done, doneS) || !open(spoke, spokeS) {
		t.Error("a connection past its handshake was closed")
	}
	if _, p := g.Counts(); p != 0 {
		t.Errorf("%d connections pending, want 0", p)
	}
	doneS.Close()
	spokeS.Close()
	noLeaks(t, g)
}

// One address may have MaxPendingPerIP connections in handshake, on all listeners
// together; one more is closed as it is accepted. A handshake completed frees its place;
// other addresses are not affected.
func TestPendingPerIP(t *testing.T) {
	g, r := newGuard(t, Config{MaxPendingPerIP: 2})
	a, acceptedA := serve(t, g, "a", ListenerOptions{})
	b, acceptedB := serve(t, g, "b", ListenerOptions{})
	dial(t, "127.0.0.1", a)
	first := next(t, acceptedA, "the first connection")
	dial(t, "127.0.0.1", b)
	next(t, acceptedB, "the second connection")
	over := dial(t, "127.0.0.1", b)
	waitGone(t, over, "the third pending connection from 127.0.0.1 refused")
	if n := r.get("b/" + ReasonPendingPerIP); n != 1 {
		t.Errorf("pending_per_ip refusals: %d, want 1", n)
	}
	Established(first)
	again := dial(t, "127.0.0.1", a)
	againS := next(t, acceptedA, "a connection once one has completed its handshake")
	if !open(again, againS) {
		t.Error("the connection admitted after a handshake is not up")
	}
	if !loopbackAliases(t) {
		return
	}
	other := dial(t, "127.0.0.2", a)
	otherS := next(t, acceptedA, "a connection from another address")
	if !open(other, otherS) {
		t.Error("another address's connection is not up")
	}
}

// loopbackAliases reports whether this system routes 127.0.0.2 to loopback (Linux does);
// a test of several addresses is skipped where it does not.
func loopbackAliases(t *testing.T) bool {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Logf("127.0.0.2 is not a local address here: %v", err)
		return false
	}
	l.Close()
	return true
}

// The process holds MaxConnections at most; a listener's reserve is its own: the other
// listeners cannot take it, and it can take shared slots once its own are used.
func TestMaxConnectionsAndReserve(t *testing.T) {
	g, r := newGuard(t, Config{MaxConnections: 4})
	grpcAddr, grpcAccepted := serve(t, g, "grpc", ListenerOptions{})
	httpAddr, httpAccepted := serve(t, g, "http", ListenerOptions{Reserve: 100}) // half of 4: 2
	var grpcConns []net.Conn
	for range 2 {
		dial(t, "127.0.0.1", grpcAddr)
		grpcConns = append(grpcConns, next(t, grpcAccepted, "a gRPC connection within the shared slots"))
	}
	over := dial(t, "127.0.0.1", grpcAddr)
	waitGone(t, over, "a gRPC connection over the shared slots refused")
	if n := r.get("grpc/" + ReasonMaxConnections); n != 1 {
		t.Errorf("max_connections refusals: %d, want 1", n)
	}
	for i := range 2 {
		c := dial(t, "127.0.0.1", httpAddr)
		if !open(c, next(t, httpAccepted, "an http connection on its reserve")) {
			t.Errorf("http connection %d on the reserve is not up", i)
		}
	}
	overHTTP := dial(t, "127.0.0.1", httpAddr)
	waitGone(t, overHTTP, "an http connection over its reserve and the shared slots refused")
	// A shared slot freed goes to whichever listener comes first: here, http.
	grpcConns[0].Close()
	testwait.For(t, wait, "the closed connection's slot given back", func() bool { n, _ := g.Counts(); return n == 3 })
	c := dial(t, "127.0.0.1", httpAddr)
	if !open(c, next(t, httpAccepted, "an http connection on a shared slot")) {
		t.Error("the http connection on a shared slot is not up")
	}
	if n, _ := g.Counts(); n != 4 {
		t.Errorf("%d connections open, want 4", n)
	}
}

// Every way a connection ends gives back what it took: refused (either cap), timed out,
// closed in handshake, closed after it, closed twice; and a closed listener its reserve.
func TestNoLeaks(t *testing.T) {
	g, _ := newGuard(t, Config{HandshakeTimeout: 100 * time.Millisecond, MaxPendingPerIP: 3, MaxConnections: 8})
	l, err := g.Listen("x", "127.0.0.1:0", ListenerOptions{Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	accepted := make(chan net.Conn, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []*client
	for range 5 { // 3 admitted, 2 over the per-address cap
		clients = append(clients, dial(t, "127.0.0.1", addr))
	}
	s1, s2, s3 := next(t, accepted, "1"), next(t, accepted, "2"), next(t, accepted, "3")
	Established(s1)
	Established(s1)
	s1.Close()
	s1.Close()
	s2.Close() // in handshake
	_ = s3     // left to the timeout
	for _, c := range clients {
		waitGone(t, c, "every connection closed")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	noLeaks(t, g)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reserved != 0 {
		t.Errorf("%d reserved after the listener closed, want 0", g.reserved)
	}
}

// Established finds the guarded connection under a *tls.Conn (an HTTP server's), and
// ServerCredentials marks it once the credentials' handshake succeeded.
func TestEstablishedThroughWrappers(t *testing.T) {
	g, _ := newGuard(t, Config{})
	addr, accepted := serve(t, g, "x", ListenerOptions{})
	dial(t, "127.0.0.1", addr)
	viaTLS := next(t, accepted, "the first connection")
	dial(t, "127.0.0.1", addr)
	viaCreds := next(t, accepted, "the second connection")
	pendingIs := func(want int) {
		t.Helper()
		if _, p := g.Counts(); p != want {
			t.Fatalf("%d pending, want %d", p, want)
		}
	}
	pendingIs(2)
	Established(tls.Server(viaTLS, &tls.Config{}))
	pendingIs(1)
	if _, _, err := ServerCredentials(insecure.NewCredentials()).Clone().ServerHandshake(viaCreds); err != nil {
		t.Fatal(err)
	}
	pendingIs(0)
	Established(&net.TCPConn{}) // not a guarded connection: nothing
}

func TestAddrKey(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.7:443":                    "192.0.2.7",
		"[::ffff:192.0.2.7]:443":           "192.0.2.7",
		"[2001:db8:1:2:aaaa:bbbb:c:d]:443": "2001:db8:1:2::",
		"[2001:db8:1:2::1]:1":              "2001:db8:1:2::",
	} {
		ap := netip.MustParseAddrPort(addr)
		if got := addrKey(net.TCPAddrFromAddrPort(ap)).String(); got != want {
			t.Errorf("addrKey(%s) = %s, want %s", addr, got, want)
		}
		if got := addrKey(fakeAddr(addr)).String(); got != want {
			t.Errorf("addrKey(%s, not a *net.TCPAddr) = %s, want %s", addr, got, want)
		}
	}
}

type fakeAddr string

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }

// The cost of a connection through a Guard (a handshake timeout's timer, both caps), next
// to a bare listener, in the same run: each operation dials, accepts and closes one
// loopback connection.
func BenchmarkAccept(b *testing.B) {
	for _, name := range []string{"bare", "guarded"} {
		b.Run(name, func(b *testing.B) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			if name == "guarded" {
				g, err := New(Config{HandshakeTimeout: 10 * time.Second, MaxPendingPerIP: 64}, Options{Logger: discard(), FDLimit: 20_000})
				if err != nil {
					b.Fatal(err)
				}
				l = g.Wrap("bench", l, ListenerOptions{})
			}
			defer l.Close()
			addr := l.Addr().String()
			errs := make(chan error, 1)
			go func() {
				for range b.N {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						errs <- err
						return
					}
					c.Close()
				}
				errs <- nil
			}()
			b.ReportAllocs()
			for range b.N {
				c, err := l.Accept()
				if err != nil {
					b.Fatal(err)
				}
				Established(c)
				c.Close()
			}
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// The wrapper's own work per connection, without the network: admit, mark established,
// close, on a connection that is not a socket.
func BenchmarkAdmit(b *testing.B) {
	g, err := New(Config{HandshakeTimeout: 10 * time.Second, MaxPendingPerIP: 64}, Options{Logger: discard(), FDLimit: 20_000})
	if err != nil {
		b.Fatal(err)
	}
	l := g.Wrap("bench", nil, ListenerOptions{}).(*listener)
	c := nopConn{}
	b.ReportAllocs()
	for range b.N {
		gc := l.admit(c)
		if gc == nil {
			b.Fatal("refused")
		}
		Established(gc)
		gc.Close()
	}
}

type nopConn struct{ net.Conn }

var nopAddr = &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}

func (nopConn) RemoteAddr() net.Addr { return nopAddr }
func (nopConn) Close() error         { return nil }

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
