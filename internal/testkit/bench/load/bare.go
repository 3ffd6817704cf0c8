package load

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"

	"google.golang.org/grpc"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// bare is the baseline ResourceSource: no store, no diff, no encoding. Each version is a
// full-state message and an incremental one, encoded by the controller; a stream gets the
// full state first (and whenever it is more than one version behind) and the incremental
// message after when it asked for incremental, each with its own nonce appended, and waits
// for the ACK of one push before the next, as MCP requires.
type bare struct {
	mcppb.UnimplementedResourceSourceServer

	mu            sync.Mutex // guards the fields below
	cond          *sync.Cond
	version       int
	full, delta   []byte
	staged, stagD []byte
}

// RunBare serves the bare source on addr (its bound address is the "listening" event)
// until in ends.
func RunBare(addr string, in io.Reader, out io.Writer) error {
	if _, err := RaiseNoFile(); err != nil {
		return err
	}
	b := &bare{}
	b.cond = sync.NewCond(&b.mu)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(RawCodec{}), grpc.MaxRecvMsgSize(64<<20))
	mcppb.RegisterResourceSourceServer(srv, b)
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
			b.mu.Lock()
			b.staged, b.stagD = c.Full, c.Delta
			b.mu.Unlock()
			e.emit(Event{Event: "staged"})
		case "publish":
			b.mu.Lock()
			b.version++
			b.full, b.delta = b.staged, b.stagD
			b.cond.Broadcast()
			b.mu.Unlock()
			e.emit(Event{Event: "published"})
		default:
			e.emit(Event{Event: "error", Message: fmt.Sprintf("unknown op %q", c.Op)})
		}
	}
	return sc.Err()
}

func (b *bare) EstablishResourceStream(st grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]) error {
	req := new(mcppb.RequestResources)
	if err := st.RecvMsg(req); err != nil {
		return err
	}
	incremental := req.Incremental
	stop := context.AfterFunc(st.Context(), func() { b.mu.Lock(); b.cond.Broadcast(); b.mu.Unlock() })
	defer stop()
	sent := 0
	for nonce := 1; ; nonce++ {
		b.mu.Lock()
		for b.version == sent && st.Context().Err() == nil {
			b.cond.Wait()
		}
		msg := b.full
		if incremental && sent > 0 && sent == b.version-1 && b.delta != nil {
			msg = b.delta
		}
		sent = b.version
		b.mu.Unlock()
		if err := st.Context().Err(); err != nil {
			return err
		}
		if err := st.SendMsg(&RawMsg{B: msg, Tail: NonceField(strconv.Itoa(nonce))}); err != nil {
			return err
		}
		if err := st.RecvMsg(req); err != nil { // its ACK
			return err
		}
	}
}
