package mcp

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

func TestRefusedCollection(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Errorf(codes.InvalidArgument, "unsupported collection %q", vs), vs},
		{status.Errorf(codes.InvalidArgument, "unsupported collection %q", `we"ird`), `we"ird`},
		{status.Errorf(codes.Unavailable, "unsupported collection %q", vs), ""},
		{status.Error(codes.InvalidArgument, "unsupported collection"), ""},
		{errors.New(`unsupported collection "x"`), ""},
		{nil, ""},
	} {
		got, ok := refusedCollection(tc.err)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("refusedCollection(%v) = %q, %v; want %q", tc.err, got, ok, tc.want)
		}
	}
}

func FuzzRefusedCollection(f *testing.F) {
	f.Add(fmt.Sprintf("unsupported collection %q", vs))
	f.Add(`unsupported collection "\x"`)
	f.Fuzz(func(t *testing.T, msg string) {
		name, ok := refusedCollection(status.Error(codes.InvalidArgument, msg))
		if !ok {
			return
		}
		// What Istio's source would say of that collection names it again.
		if again, ok := refusedCollection(status.Errorf(codes.InvalidArgument, "unsupported collection %q", name)); !ok || again != name {
			t.Fatalf("%q: refused %q, but Istio's message for it reads back as %q, %v", msg, name, again, ok)
		}
	})
}

// A collection is taken as refused when two streams in a row are left waiting for it, never
// when the peer has served it (a reconnect during the subscription is not a refusal). A
// refusal stays for the next streams; a stream that ran without it and ended for another
// reason lets the next one ask again; a stream closed as superseded is not such an end.
func TestNegotiationRefusalAndRetry(t *testing.T) {
	n := NewNegotiation(discardLogger(), nil)
	stream := func(waitFor string) *StreamInfo {
		i := NewStreamInfo("", nil, nil)
		n.superseded(i)
		if waitFor != "" {
			n.wait(i, waitFor)
		}
		return i
	}
	a := stream(vs)
	b := stream(vs) // a left waiting for vs: suspected only
	n.ended(a, nil, false)
	if r := n.Refused(); len(r) != 0 {
		t.Fatalf("after one stream left waiting: refused %v, want none", r)
	}
	c := stream(dr) // b left waiting for vs again: refused
	n.ended(b, nil, false)
	if r := n.Refused(); len(r) != 1 || r[vs] == "" {
		t.Fatalf("after two streams left waiting: refused %v, want %s", r, vs)
	}
	want, left := n.wanted([]string{vs, dr})
	if !equal(want, []string{dr}) || !left[vs] {
		t.Fatalf("wanted = %v, left %v", want, left)
	}

	// dr was served once: streams left waiting for it later are reconnects, not refusals.
	n.answered(c, dr)
	n.wait(c, dr)
	d := stream(dr)
	e := stream("")
	if r := n.Refused(); len(r) != 1 {
		t.Errorf("streams left waiting for a served collection: refused %v, want only %s", r, vs)
	}
	n.wait(c, dr) // a closed stream does not wait again
	n.mu.Lock()
	_, waiting := n.waiting[c]
	n.mu.Unlock()
	if waiting {
		t.Error("a superseded stream waits again")
	}

	n.ended(d, left, false)
	n.ended(e, left, false) // ran without vs, ended for another reason: vs is asked again
	if r := n.Refused(); len(r) != 0 {
		t.Errorf("after a stream ended for another reason: refused %v, want none", r)
	}
}

// A source that does not say it resumes (Istio's): nothing is declared after the first
// request, and a collection's first push on the stream is its full state, even flagged
// incremental and split in chunks.
func TestSinkFirstPushOfANonResumingSourceIsFullState(t *testing.T) {
	rec := newRecorder()
	rec.state[dr] = map[string]string{"ns/stale": "1"} // held from an earlier stream
	sink := newTestSink(t, rec, []string{vs, dr})
	src := newRawSourceAs(t, sink, sourceServes, false)
	first := src.next()
	if first.Collection != vs {
		t.Fatalf("first request = %v, want %s", first, vs)
	}
	src.push(&mcppb.Resources{Collection: vs, Nonce: "1", Resources: []*mcpapi.Resource{res("ns/a", "1", "A")}})
	src.next() // ACK
	other := src.next()
	if other.Collection != dr || len(other.InitialResourceVersions) != 0 || other.ResponseNonce != "" {
		t.Fatalf("second request = %v, want %s, declaring nothing", other, dr)
	}
	src.push(&mcppb.Resources{Collection: vs, Nonce: "2", Incremental: true, Resources: []*mcpapi.Resource{res("ns/new", "1", "N")}})
	src.next()
	src.push(&mcppb.Resources{Collection: other.Collection, Nonce: "3", Incremental: true, SystemVersionInfo: "9;chunk=1/2",
		Resources: []*mcpapi.Resource{res("ns/x", "1", "X")}})
	src.next()
	src.push(&mcppb.Resources{Collection: other.Collection, Nonce: "4", Incremental: true, SystemVersionInfo: "9;chunk=2/2",
		Resources: []*mcpapi.Resource{res("ns/y", "1", "Y")}})
	src.next()
	rec.waitState(t, other.Collection, map[string]string{"ns/x": "1", "ns/y": "1"})
	rec.mu.Lock()
	last := rec.changes[len(rec.changes)-1]
	rec.mu.Unlock()
	if last.Incremental || len(last.Entries) != 2 {
		t.Errorf("the split first push was applied as %d entries, incremental %v; want one full state of 2", len(last.Entries), last.Incremental)
	}
	if len(last.Resources) != len(last.Entries) {
		t.Fatalf("the split first push was applied with %d resources for %d entries", len(last.Resources), len(last.Entries))
	}
	for i, e := range last.Entries {
		if r, err := e.Decode(); err != nil || !proto.Equal(r, last.Resources[i]) {
			t.Errorf("resources[%d] = %v, not entries[%d] (%s) decoded", i, last.Resources[i], i, e.Name)
		}
	}
	// Later pushes are what they say.
	rec.waitState(t, vs, map[string]string{"ns/a": "1", "ns/new": "1"})
}

// A first push refused whole leaves the full state awaited: the next push, flagged
// incremental by Istio's source (it never had an ACK), is still applied as the full state.
func TestSinkFullStateAwaitedAfterARefusedFirstPush(t *testing.T) {
	rec := newRecorder()
	rec.state[vs] = map[string]string{"ns/stale": "1"}
	refuse := true
	rec.reject = func(c *Change) error {
		if refuse && c.Collection == vs {
			refuse = false
			return errors.New("not now")
		}
		return nil
	}
	sink := newTestSink(t, rec, []string{dr, vs})
	src := newRawSourceAs(t, sink, sourceServes, false)
	src.next() // dr
	src.push(&mcppb.Resources{Collection: dr, Nonce: "1"})
	src.next() // ACK
	if r := src.next(); r.Collection != vs {
		t.Fatalf("request = %v, want %s", r, vs)
	}
	src.push(&mcppb.Resources{Collection: vs, Nonce: "2", Incremental: true, Resources: []*mcpapi.Resource{res("ns/a", "1", "A")}})
	if ack := src.next(); ack.ErrorDetail == nil {
		t.Fatalf("the refused push was ACKed: %v", ack)
	}
	src.push(&mcppb.Resources{Collection: vs, Nonce: "3", Incremental: true, Resources: []*mcpapi.Resource{res("ns/a", "1", "A")}})
	src.next()
	rec.waitState(t, vs, map[string]string{"ns/a": "1"})
}

// Source.PushTo says it resumes (ResumesHeader) next to the caller's own metadata (its
// identity header), and the sink server sees both; SourceServer says so in its header.
func TestSourceSaysItResumes(t *testing.T) {
	c := NewCache(vs)
	c.Put(vs, entry(t, "ns/a", "1"))
	src := newTestSource(t, c)
	infos := make(chan *StreamInfo, 1)
	sink := newTestSink(t, newRecorder(), []string{vs})
	addr := serve(t, func(s *grpc.Server) {
		NewSinkServer(func(_ context.Context, i *StreamInfo) (*Sink, error) { infos <- i; return sink, nil },
			ServerConfig{Logger: testLogger(t), Authenticate: identityFromMetadata}).Register(s)
	})
	cc := dial(t, addr)
	goRun(t, func(ctx context.Context) error {
		return src.PushTo(metadata.AppendToOutgoingContext(ctx, "x-test-identity", "minion"), cc)
	})
	select {
	case i := <-infos:
		if i.Identity != "minion" || !i.PeerResumes() {
			t.Errorf("the sink server saw identity %q, resumes %v; want minion, true", i.Identity, i.PeerResumes())
		}
	case <-time.After(waitFor):
		t.Fatal("PushTo opened no stream")
	}

	addr = serve(t, func(s *grpc.Server) { NewSourceServer(src, ServerConfig{Logger: testLogger(t)}).Register(s) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := mcppb.NewResourceSourceClient(dial(t, addr)).EstablishResourceStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if md, err := st.Header(); err != nil || !mdResumes(md) {
		t.Errorf("SourceServer's header = %v, %v; want %s", md, err, ResumesHeader)
	}
}
