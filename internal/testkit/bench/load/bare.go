package load

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"

	"google.golang.org/grpc"

	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// Bare is the baseline ResourceSource: no store, no diff, no encoding. Each version is a
// full-state message and an incremental one, encoded by its caller; a stream gets the full
// state first (and whenever it is more than one version behind) and the incremental
// message after when it asked for incremental, each with its own nonce appended, and waits
// for the ACK of one push before the next, as MCP requires. The versus table runs it as a
// process (RunBare); the benchmarks' in-process baselines serve it directly.
type Bare struct {
	mcppb.UnimplementedResourceSourceServer

	mu            sync.Mutex // guards cur, staged and stagD
	cur           *version
	staged, stagD []byte
}

// version is one published state. Its next is closed when a newer one is published: each
// stream waits on its own receive, with no lock shared by all the streams.
type version struct {
	n           int
	full, delta []byte
	next        chan struct{}
}

// NewBare returns a Bare with nothing published: its streams wait for the first Publish.
func NewBare() *Bare { return &Bare{cur: &version{next: make(chan struct{})}} }

// Server is a gRPC server serving b, with the transport settings of meshfed's servers of
// sinks (mcp.SourceWindowOptions) and nothing else of meshfed.
func (b *Bare) Server() *grpc.Server {
	srv := grpc.NewServer(append(mcp.SourceWindowOptions(), grpc.ForceServerCodecV2(RawCodec{}), grpc.MaxRecvMsgSize(64<<20))...)
	mcppb.RegisterResourceSourceServer(srv, b)
	return srv
}

// Stage sets the next version's messages (encoded Resources without a nonce; delta nil: the
// full state for everyone). Encoding them is the caller's, before any clock starts.
func (b *Bare) Stage(full, delta []byte) {
	b.mu.Lock()
	b.staged, b.stagD = full, delta
	b.mu.Unlock()
}

// Publish serves what was staged as the next version: a pointer swap, and the streams
// waiting on the previous version woken.
func (b *Bare) Publish() {
	b.mu.Lock()
	old := b.cur
	b.cur = &version{n: old.n + 1, full: b.staged, delta: b.stagD, next: make(chan struct{})}
	close(old.next)
	b.mu.Unlock()
}

func (b *Bare) current() *version {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cur
}

// RunBare serves the bare source on addr (its bound address is the "listening" event)
// until in ends.
func RunBare(addr string, in io.Reader, out io.Writer) error {
	if _, err := RaiseNoFile(); err != nil {
		return err
	}
	b := NewBare()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := b.Server()
	go srv.Serve(lis)
	defer srv.Stop()
	e := newEmitter(out)
	e.emit(Event{Event: "listening", Addr: lis.Addr().String()})
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	for sc.Scan() {
		var c Command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			e.emit(Event{Event: "error", Message: fmt.Sprintf("bad command: %v", err)})
			continue
		}
		switch c.Op {
		case "stage": // decoded before the clock starts: the change itself is a pointer swap
			b.Stage(c.Full, c.Delta)
			e.emit(Event{Event: "staged"})
		case "publish":
			b.Publish()
			e.emit(Event{Event: "published"})
		default:
			e.emit(Event{Event: "error", Message: fmt.Sprintf("unknown op %q", c.Op)})
		}
	}
	return sc.Err()
}

// EstablishResourceStream serves one sink (see Bare).
func (b *Bare) EstablishResourceStream(st grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]) error {
	req := new(mcppb.RequestResources)
	if err := st.RecvMsg(req); err != nil {
		return err
	}
	incremental := req.Incremental
	var sent *version
	v := b.current()
	for nonce := 1; ; nonce++ {
		for v.n == 0 || v == sent { // nothing published yet, or nothing new
			select {
			case <-v.next:
				v = b.current()
			case <-st.Context().Done():
				return st.Context().Err()
			}
		}
		msg := v.full
		if incremental && sent != nil && sent.n == v.n-1 && v.delta != nil {
			msg = v.delta
		}
		sent = v
		if err := st.SendMsg(&RawMsg{B: msg, Tail: NonceField(strconv.Itoa(nonce))}); err != nil {
			return err
		}
		if err := st.RecvMsg(req); err != nil { // its ACK
			return err
		}
	}
}
