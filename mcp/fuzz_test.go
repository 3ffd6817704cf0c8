package mcp

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"testing"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// memStream is an in-memory MsgStream for the unit tier: it delivers in, in order, then
// io.EOF, and logs every message in both directions in the order the engine saw them.
type memStream struct {
	ctx context.Context
	mu  sync.Mutex
	in  [][]byte
	log []memEvent
}

type memEvent struct {
	sent  bool
	req   *mcppb.RequestResources // received by a source
	push  *mcppb.Resources        // sent by a source, or received by a sink
	raw   []byte
	acked *AckEvent // the source processed an ACK/NACK (logged by its Acked hook)
}

// ackedHook logs, in processing order, the ACKs and NACKs the source acted on.
func (m *memStream) ackedHook(_ *StreamInfo, ev AckEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log = append(m.log, memEvent{acked: &ev})
}

func (m *memStream) Context() context.Context { return m.ctx }

func (m *memStream) RecvMsg(v any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.in) == 0 {
		return io.EOF
	}
	b := m.in[0]
	m.in = m.in[1:]
	switch v := v.(type) {
	case *rawFrame:
		v.b = slices.Clone(b)
		return nil
	case *mcppb.RequestResources:
		if err := proto.Unmarshal(b, v); err != nil {
			return err
		}
		m.log = append(m.log, memEvent{req: v})
		return nil
	}
	return fmt.Errorf("memStream: cannot receive %T", v)
}

func (m *memStream) SendMsg(v any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch v := v.(type) {
	case *frame:
		b := append(slices.Clone(v.body), nonceField(v.nonce)...)
		p := new(mcppb.Resources)
		if err := proto.Unmarshal(b, p); err != nil {
			return fmt.Errorf("engine sent an undecodable push: %v", err)
		}
		m.log = append(m.log, memEvent{sent: true, push: p, raw: b})
	case *mcppb.RequestResources:
		m.log = append(m.log, memEvent{sent: true, req: proto.Clone(v).(*mcppb.RequestResources)})
	case *mcppb.Resources:
		m.log = append(m.log, memEvent{sent: true, push: v})
	default:
		return fmt.Errorf("memStream: cannot send %T", v)
	}
	return nil
}

// FuzzParsePush: the sink's parser of network input never panics and agrees with the
// protobuf library on every message both accept.
func FuzzParsePush(f *testing.F) {
	good, _ := proto.Marshal(&mcppb.Resources{Collection: vs, Nonce: "7", Incremental: true, SystemVersionInfo: "3",
		Resources: []*mcpapi.Resource{res("ns/a", "1", "A"), res("ns/b", "2", "B")}, RemovedResources: []string{"ns/c"}})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x1a, 0x00})             // a resource with nothing in it
	f.Add([]byte{0x1a, 0x02, 0x0a, 0x00}) // metadata without a name
	f.Add([]byte{0x2a, 0xff})             // truncated nonce
	f.Add([]byte{0x30, 0x80})             // truncated varint
	f.Add([]byte{0x10, 0x01})             // collection with the wrong wire type
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePush(b)
		if p == nil {
			t.Fatal("nil push")
		}
		want := new(mcppb.Resources)
		perr := proto.Unmarshal(b, want)
		if err != nil {
			return // rejected with an error: fine, whatever the library thinks
		}
		if perr != nil {
			t.Fatalf("parsePush accepted what protobuf rejects (%v)", perr)
		}
		if p.Collection != want.Collection || p.Nonce != want.Nonce || p.Incremental != want.Incremental ||
			p.SystemVersionInfo != want.SystemVersionInfo || !slices.Equal(p.Removed, want.RemovedResources) ||
			len(p.Entries) != len(want.Resources) {
			t.Fatalf("parsePush = %+v, protobuf = %v", p, want)
		}
		for i, e := range p.Entries {
			md := want.Resources[i].GetMetadata()
			if e.Name != md.GetName() || e.Version != md.GetVersion() || e.Name == "" {
				t.Fatalf("entry %d = %s@%s, protobuf %s@%s", i, e.Name, e.Version, md.GetName(), md.GetVersion())
			}
		}
	})
}

// FuzzSourceStream drives a source with a fuzzed sequence of requests and store changes and
// checks the protocol's invariants on everything it sent.
func FuzzSourceStream(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 7, 1, 7, 2, 3, 1, 9, 9, 4})
	f.Add([]byte{8, 0xff, 0x00, 0x12, 5, 5, 6, 6})
	f.Fuzz(func(t *testing.T, ops []byte) {
		colls := []string{"a", "b", "c"}
		c := NewCache("a", "b")
		c.Put("a", entry(t, "ns/x", "1"))
		var in [][]byte
		marshal := func(r *mcppb.RequestResources) []byte { b, _ := proto.Marshal(r); return b }
		for i := 0; i < len(ops); i++ {
			op, arg := ops[i]%10, 0
			if i+1 < len(ops) {
				arg = int(ops[i+1])
			}
			coll := colls[arg%len(colls)]
			nonce := strconv.Itoa(arg % 8)
			switch op {
			case 0, 1:
				in = append(in, marshal(&mcppb.RequestResources{Collection: coll, Incremental: op == 1,
					InitialResourceVersions: map[string]string{"ns/x": nonce}}))
			case 2:
				in = append(in, marshal(&mcppb.RequestResources{Collection: coll, ResponseNonce: nonce, Incremental: arg%2 == 0}))
			case 3:
				in = append(in, marshal(&mcppb.RequestResources{Collection: coll, ResponseNonce: nonce, ErrorDetail: &rpcstatus.Status{Code: 3, Message: "no"}}))
			case 4:
				in = append(in, marshal(&mcppb.RequestResources{Collection: coll}))
			case 5:
				c.Put("a", entry(t, fmt.Sprintf("ns/r%d", arg%4), nonce))
			case 6:
				c.Remove("b", fmt.Sprintf("ns/r%d", arg%4))
				c.Put("b", entry(t, fmt.Sprintf("ns/r%d", (arg+1)%4), nonce))
			case 7:
				in = append(in, marshal(&mcppb.RequestResources{}))
			case 8:
				end := min(len(ops), i+1+arg%8)
				in = append(in, slices.Clone(ops[i+1:end])) // garbage
			case 9:
				in = append(in, marshal(&mcppb.RequestResources{Collection: TriggerCollection, ErrorDetail: &rpcstatus.Status{Code: 12}}))
			}
		}
		st := &memStream{ctx: context.Background(), in: in}
		src, err := NewSource(SourceOptions{Watcher: c, Logger: discardLogger(), MaxMessageSize: 300,
			Hooks: Hooks{Acked: st.ackedHook}})
		if err != nil {
			t.Fatal(err)
		}
		_ = src.Serve(context.Background(), st, newStreamInfo("source", "server", "fuzz", ""))
		checkSourceInvariants(t, st.log, 300)
	})
}

// checkSourceInvariants: nonces are unique, pushes fit the limit, a collection never has two
// pushes outstanding (between two pushes of a collection the source acted on an ACK or NACK
// of the first), and every ACK it acted on answers the outstanding push with a request that
// really arrived: one carrying that nonce, or Istio's empty-nonce re-request.
func checkSourceInvariants(t *testing.T, log []memEvent, maxSize int) {
	t.Helper()
	nonces := map[string]bool{}
	outstanding := map[string]string{} // collection -> nonce of the unanswered push
	type key struct{ coll, nonce string }
	received := map[key]int{} // requests received, not yet matched to an ACK
	for _, ev := range log {
		switch {
		case ev.sent && ev.push != nil:
			p := ev.push
			if nonces[p.Nonce] || p.Nonce == "" {
				t.Fatalf("nonce %q empty or reused", p.Nonce)
			}
			nonces[p.Nonce] = true
			if len(ev.raw) > maxSize {
				t.Fatalf("push of %d bytes exceeds %d", len(ev.raw), maxSize)
			}
			if n, ok := outstanding[p.Collection]; ok {
				t.Fatalf("push %s of %s while push %s is unanswered", p.Nonce, p.Collection, n)
			}
			outstanding[p.Collection] = p.Nonce
		case !ev.sent && ev.req != nil:
			received[key{ev.req.Collection, ev.req.ResponseNonce}]++
		case ev.acked != nil:
			a := ev.acked
			if outstanding[a.Collection] != a.Nonce {
				t.Fatalf("acted on an ACK of %s/%s; outstanding is %q", a.Collection, a.Nonce, outstanding[a.Collection])
			}
			switch {
			case received[key{a.Collection, a.Nonce}] > 0:
				received[key{a.Collection, a.Nonce}]--
			case received[key{a.Collection, ""}] > 0:
				received[key{a.Collection, ""}]--
			default:
				t.Fatalf("acted on an ACK of %s/%s that no request carried", a.Collection, a.Nonce)
			}
			delete(outstanding, a.Collection)
		}
	}
}

// FuzzSinkStream feeds a sink fuzzed frames: it never panics, applies only valid pushes, and
// answers every push that has a nonce with an ACK or NACK carrying that nonce.
func FuzzSinkStream(f *testing.F) {
	good, _ := proto.Marshal(&mcppb.Resources{Collection: vs, Nonce: "1", Resources: []*mcpapi.Resource{res("ns/a", "1", "A")}})
	incr, _ := proto.Marshal(&mcppb.Resources{Collection: vs, Nonce: "2", Incremental: true, RemovedResources: []string{"ns/a"}})
	f.Add(good, incr, []byte{})
	f.Add([]byte{0x2a, 0x01, 0x31, 0x1a, 0x00}, good, []byte{0x12, 0x03, 'x', 'y', 'z', 0x2a, 0x01, 0x39})
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		var applied []*Change
		sink, err := NewSink(SinkOptions{Collections: []string{vs}, Logger: discardLogger(),
			Applier: ApplierFunc(func(_ context.Context, ch *Change) error {
				applied = append(applied, ch)
				return nil
			})})
		if err != nil {
			t.Fatal(err)
		}
		st := &memStream{ctx: context.Background(), in: [][]byte{a, b, c}}
		if err := sink.Serve(context.Background(), st, newStreamInfo("sink", "server", "fuzz", "")); err != nil {
			t.Fatalf("sink ended with %v on bad input; it must NACK or ignore", err)
		}
		answered := map[string]bool{}
		for _, ev := range st.log {
			if ev.sent && ev.req != nil && ev.req.ResponseNonce != "" {
				answered[ev.req.ResponseNonce] = true
			}
		}
		for _, in := range [][]byte{a, b, c} {
			p, _ := parsePush(in)
			if p.Nonce != "" && !answered[p.Nonce] {
				t.Fatalf("push with nonce %q was not answered", p.Nonce)
			}
		}
		for _, ch := range applied {
			if ch.Collection != vs {
				t.Fatalf("applied a push of unrequested %q", ch.Collection)
			}
			seen := map[string]bool{}
			for _, e := range ch.Entries {
				if e.Name == "" || seen[e.Name] {
					t.Fatalf("applied an invalid or duplicate entry %q", e.Name)
				}
				seen[e.Name] = true
			}
		}
	})
}
