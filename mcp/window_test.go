package mcp

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// A server of sinks must not ping a sink for each ACK it receives: gRPC's bandwidth-delay
// estimator does so when the receive window is dynamic (a write by the server and a read and
// write by the sink per sink and push). The test counts the PING frames the server writes
// while a sink takes pushes and ACKs them, over a real connection through a counting proxy;
// with ServerOptions alone (a dynamic window) it sees them, which shows it can fail.
func TestSourceServerDoesNotPingPerAck(t *testing.T) {
	const pushes = 20
	for _, tc := range []struct {
		name      string
		opts      []grpc.ServerOption
		wantPings bool
	}{
		{"SourceServerOptions", SourceServerOptions(), false},
		{"ServerOptions (dynamic window)", ServerOptions(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCache(vs)
			c.Put(vs, entry(t, "default/a", "0"))
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s := grpc.NewServer(tc.opts...)
			NewSourceServer(newTestSource(t, c), ServerConfig{Logger: testLogger(t)}).Register(s)
			served := make(chan struct{})
			go func() { defer close(served); _ = s.Serve(lis) }()
			t.Cleanup(func() { s.Stop(); <-served })
			p := newFrameCounter(t, lis.Addr().String())

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := mcppb.NewResourceSourceClient(dial(t, p.addr)).EstablishResourceStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&mcppb.RequestResources{Collection: vs}); err != nil {
				t.Fatal(err)
			}
			for k := 0; k <= pushes; k++ {
				m, err := st.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Send(&mcppb.RequestResources{Collection: vs, ResponseNonce: m.Nonce}); err != nil {
					t.Fatal(err)
				}
				if k < pushes {
					c.Put(vs, entry(t, "default/a", string(rune('a'+k))))
				}
			}
			cancel()
			p.close()
			pings := p.pings.Load()
			if tc.wantPings && pings == 0 {
				t.Fatalf("no PING from a server with a dynamic window over %d ACKs: the count does not see them", pushes)
			}
			if !tc.wantPings && pings != 0 {
				t.Fatalf("the server sent %d PINGs over %d ACKs; want none (a fixed receive window)", pings, pushes)
			}
			t.Logf("%d PINGs over %d ACKs", pings, pushes)
		})
	}
}

// frameCounter is a TCP proxy to a gRPC server that counts the HTTP/2 PING frames (not ACKs)
// the server writes.
type frameCounter struct {
	addr  string
	lis   net.Listener
	pings atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newFrameCounter(t *testing.T, server string) *frameCounter {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &frameCounter{addr: lis.Addr().String(), lis: lis}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", server)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
			go func() { defer p.wg.Done(); p.count(in, out); in.Close() }()
		}
	}()
	t.Cleanup(p.close)
	return p
}

// count copies the server's bytes to the client, parsing them as HTTP/2 frames (the server
// writes no preface).
func (p *frameCounter) count(client io.Writer, server io.Reader) {
	var buf []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := server.Read(chunk)
		if n > 0 {
			if _, werr := client.Write(chunk[:n]); werr != nil {
				return
			}
			buf = append(buf, chunk[:n]...)
			for len(buf) >= 9 {
				size := int(binary.BigEndian.Uint32(append([]byte{0}, buf[:3]...)))
				if len(buf) < 9+size {
					break
				}
				const ping, ack = 6, 1
				if buf[3] == ping && buf[4]&ack == 0 {
					p.pings.Add(1)
				}
				buf = buf[9+size:]
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *frameCounter) close() {
	p.lis.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
