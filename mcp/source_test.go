package mcp

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

const (
	vs = "istio/networking/v1alpha3/virtualservices"
	dr = "istio/networking/v1alpha3/destinationrules"
)

// forEachDirection runs a source-role test over both gRPC directions.
func forEachDirection(t *testing.T, fn func(t *testing.T, d direction)) {
	for _, d := range directions {
		t.Run(string(d), func(t *testing.T) { fn(t, d) })
	}
}

func TestSourceAnswersEveryRequestedCollection(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs, dr)
		c.Put(vs, entry(t, "default/a", "1"))
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.request(vs, false, nil)
		sink.request(dr, false, nil)                // served, empty
		sink.request("not/served/here", false, nil) // not served: empty state, stream stays up
		got := map[string][]string{}
		nonces := map[string]bool{}
		for range 3 {
			m := sink.next()
			if m.Incremental {
				t.Errorf("%s: incremental push to a sink that did not ask", m.Collection)
			}
			if m.Nonce == "" || nonces[m.Nonce] {
				t.Errorf("%s: nonce %q empty or reused", m.Collection, m.Nonce)
			}
			nonces[m.Nonce] = true
			got[m.Collection] = names(m)
			sink.ack(m)
		}
		if !equal(got[vs], []string{"default/a@1"}) || len(got[dr]) != 0 || len(got["not/served/here"]) != 0 {
			t.Fatalf("pushes = %v", got)
		}
		if _, ok := got["not/served/here"]; !ok {
			t.Fatal("unserved collection got no answer")
		}
		// The stream is alive: a change still arrives.
		c.Put(vs, entry(t, "default/b", "1"))
		if m := sink.next(); !equal(names(m), []string{"default/a@1", "default/b@1"}) {
			t.Fatalf("after change: %v", names(m))
		}
	})
}

func TestSourceOneOutstandingPushAndCoalescing(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.request(vs, false, nil)
		first := sink.next()
		// Not ACKed yet: a burst of 1,000 changes must not produce a second push.
		for i := range 1000 {
			c.Put(vs, entry(t, fmt.Sprintf("ns/r%d", i%10), fmt.Sprint(i)))
		}
		sink.none(dr) // round trip: nothing of vs was sent
		sink.ack(first)
		m := sink.next()
		want := []string{}
		for i := 990; i < 1000; i++ {
			want = append(want, fmt.Sprintf("ns/r%d@%d", i%10, i))
		}
		if got := names(m); !equal(got, sortedCopy(want)) {
			t.Fatalf("coalesced push = %v, want %v", got, want)
		}
		sink.ack(m)
		sink.none("probe/2") // and nothing more: the sink ends on the latest state
	})
}

// A change racing with the ACK of the push in flight is never lost: the watcher's notify
// does not wake a stream with a push in flight (the ACK's path pushes what is dirty), so
// the two must meet on every interleaving. A writer changes the collection as fast as it
// can while the sink ACKs each push at once; once the writer stops, the sink must end on
// its last change.
func TestSourceChangeRacingAnAckIsNeverLost(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.request(vs, false, nil)
		const changes = 3000
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range changes {
				c.Put(vs, entry(t, "ns/r", fmt.Sprint(i)))
			}
		}()
		last := fmt.Sprintf("ns/r@%d", changes-1)
		for {
			m := sink.next() // fails the test if nothing arrives within its wait
			sink.ack(m)
			if got := names(m); len(got) == 1 && got[0] == last {
				break
			}
		}
		<-done
		sink.none("probe/1") // and nothing more: the sink ends on the latest state
	})
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sortStrings(out)
	return out
}

func TestSourceIgnoresStaleAndUnknownNonces(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		c.Put(vs, entry(t, "ns/a", "1"))
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.request(vs, false, nil)
		m1 := sink.next()
		sink.ack(m1)
		c.Put(vs, entry(t, "ns/a", "2"))
		m2 := sink.next()
		// A stale ACK (m1's nonce) and an unknown one must not complete m2.
		sink.sendReq(&mcppb.RequestResources{Collection: vs, ResponseNonce: m1.Nonce})
		sink.sendReq(&mcppb.RequestResources{Collection: vs, ResponseNonce: "no-such-nonce"})
		c.Put(vs, entry(t, "ns/a", "3"))
		sink.none("probe/1") // still waiting for m2's ACK: no push
		sink.ack(m2)
		if got := names(sink.next()); !equal(got, []string{"ns/a@3"}) {
			t.Fatalf("after ACK: %v", got)
		}
	})
}

func TestSourceDoesNotResendNackedSet(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		reg := newTestMetrics(t)
		c := NewCache(vs)
		c.Put(vs, entry(t, "ns/bad", "1"))
		sink := newRawSink(t, newTestSource(t, c, func(o *SourceOptions) { o.Metrics = reg.m }), d)
		sink.request(vs, false, nil)
		m := sink.next()
		sink.sendReq(&mcppb.RequestResources{Collection: vs, ResponseNonce: m.Nonce,
			ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "ns/bad: unknown field"}})
		sink.none("probe/1")
		// Re-putting the same version changes nothing and must not resend.
		c.Put(vs, entry(t, "ns/bad", "1"))
		sink.none("probe/2")
		// A real change is pushed.
		c.Put(vs, entry(t, "ns/bad", "2"))
		if got := names(sink.next()); !equal(got, []string{"ns/bad@2"}) {
			t.Fatalf("after change: %v", got)
		}
		if n := reg.counter(t, "meshfed_mcp_nacks_total", "collection", vs, "reason", "InvalidArgument"); n != 1 {
			t.Errorf("nacks_total{InvalidArgument} = %v, want 1", n)
		}
	})
}

func TestSourceIncrementalOnlyWhenAsked(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs, dr)
		c.Put(vs, entry(t, "ns/a", "1"), entry(t, "ns/b", "1"))
		c.Put(dr, entry(t, "ns/a", "1"), entry(t, "ns/b", "1"))
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.request(vs, true, nil)  // incremental
		sink.request(dr, false, nil) // full state
		for range 2 {
			m := sink.next()
			if m.Incremental {
				t.Fatalf("%s: first push to a sink without state must be full", m.Collection)
			}
			sink.ack(m)
		}
		// One change each: two would race the push the first one releases.
		c.Update(vs, []*Entry{entry(t, "ns/a", "2")}, []string{"ns/b"})
		c.Update(dr, []*Entry{entry(t, "ns/a", "2")}, []string{"ns/b"})
		for range 2 {
			m := sink.next()
			switch m.Collection {
			case vs:
				if !m.Incremental || !equal(names(m), []string{"ns/a@2"}) || !equal(m.RemovedResources, []string{"ns/b"}) {
					t.Errorf("vs delta: incremental=%v resources=%v removed=%v", m.Incremental, names(m), m.RemovedResources)
				}
			case dr:
				if m.Incremental || !equal(names(m), []string{"ns/a@2"}) || len(m.RemovedResources) != 0 {
					t.Errorf("dr full: incremental=%v resources=%v removed=%v", m.Incremental, names(m), m.RemovedResources)
				}
			}
			sink.ack(m)
		}
	})
}

func TestSourceResumesFromInitialVersions(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs, dr)
		c.Put(vs, entry(t, "ns/same", "1"), entry(t, "ns/changed", "2"), entry(t, "ns/new", "1"))
		c.Put(dr, entry(t, "ns/same", "1"))
		sink := newRawSink(t, newTestSource(t, c), d)
		declared := map[string]string{"ns/same": "1", "ns/changed": "1", "ns/gone": "1"}
		sink.request(vs, true, declared)
		m := sink.next()
		if !m.Incremental || !equal(names(m), []string{"ns/changed@2", "ns/new@1"}) || !equal(m.RemovedResources, []string{"ns/gone"}) {
			t.Fatalf("resume push: incremental=%v resources=%v removed=%v", m.Incremental, names(m), m.RemovedResources)
		}
		sink.ack(m)
		// Nothing differs: the sink still gets one (empty) answer, so it can become ready.
		sink.request(dr, true, map[string]string{"ns/same": "1"})
		m = sink.next()
		if !m.Incremental || len(m.Resources) != 0 || len(m.RemovedResources) != 0 {
			t.Fatalf("up-to-date resume: incremental=%v resources=%v removed=%v", m.Incremental, names(m), m.RemovedResources)
		}
		sink.ack(m)
		// A sink that declares versions but cannot take incremental pushes gets full state.
		sink.request("istio/other", false, nil)
		sink.ack(sink.next())
	})
}

func TestSourceFullStateWhenResumeWithoutIncremental(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		c.Put(vs, entry(t, "ns/a", "1"), entry(t, "ns/b", "1"))
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.request(vs, false, map[string]string{"ns/a": "1"})
		m := sink.next()
		if m.Incremental || !equal(names(m), []string{"ns/a@1", "ns/b@1"}) {
			t.Fatalf("push: incremental=%v resources=%v", m.Incremental, names(m))
		}
	})
}

func TestSourceEmptyNonceWhilePendingIsAck(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		c.Put(vs, entry(t, "ns/a", "1"))
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.request(vs, false, nil)
		sink.next()
		c.Put(vs, entry(t, "ns/a", "2"))
		// Istio's sink re-requests with an empty nonce: it counts as the ACK.
		sink.request(vs, false, nil)
		if got := names(sink.next()); !equal(got, []string{"ns/a@2"}) {
			t.Fatalf("after empty-nonce request: %v", got)
		}
	})
}

func TestSourceToleratesOddRequests(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		c.Put(vs, entry(t, "ns/a", "1"))
		sink := newRawSink(t, newTestSource(t, c), d)
		sink.sendReq(&mcppb.RequestResources{})                                    // no collection
		sink.sendReq(&mcppb.RequestResources{Collection: TriggerCollection})       // trigger echo
		sink.sendReq(&mcppb.RequestResources{Collection: vs, ResponseNonce: "42"}) // first request with a nonce (istiod does)
		m := sink.next()
		if m.Collection != vs || !equal(names(m), []string{"ns/a@1"}) {
			t.Fatalf("push = %s %v", m.Collection, names(m))
		}
	})
}

func TestSourceSplitsIncrementalPushesAndRefusesOversizedFullState(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		reg := newTestMetrics(t)
		c := NewCache(vs, dr)
		var all []string
		for i := range 40 {
			e := entry(t, fmt.Sprintf("ns/r%02d", i), "1")
			c.Put(vs, e)
			c.Put(dr, e)
			all = append(all, e.Name+"@1")
		}
		maxSize := 1000 // about a dozen resources per push
		src := newTestSource(t, c, func(o *SourceOptions) { o.MaxMessageSize = maxSize; o.Metrics = reg.m })
		sink := newRawSink(t, src, d)
		sink.request(vs, true, nil)
		var got, versions []string
		pushes := 0
		for len(got) < len(all) {
			m := sink.next()
			versions = append(versions, m.SystemVersionInfo)
			if size := protoSize(m); size > maxSize {
				t.Fatalf("push of %d bytes exceeds the %d limit", size, maxSize)
			}
			if !m.Incremental {
				t.Fatal("split pushes must be incremental")
			}
			got = append(got, names(m)...)
			pushes++
			sink.ack(m)
		}
		if pushes < 2 || !equal(sortedCopy(got), all) {
			t.Fatalf("%d pushes delivered %d resources", pushes, len(got))
		}
		// Each chunk says it is one, and all but the last that more follow.
		for i, v := range versions {
			if want := fmt.Sprintf(";chunk=%d/%d", i+1, pushes); !strings.HasSuffix(v, want) || moreChunks(v) != (i < pushes-1) {
				t.Errorf("chunk %d: system_version_info %q (more %v), want suffix %q", i+1, v, moreChunks(v), want)
			}
		}
		// A full-state sink cannot be split for: nothing is sent, the error is counted.
		sink.request(dr, false, nil)
		sink.none("probe/1")
		if n := reg.counter(t, "meshfed_mcp_push_errors_total", "collection", dr, "reason", "too_large"); n != 1 {
			t.Errorf("push_errors_total{too_large} = %v, want 1", n)
		}
	})
}

func TestRejectionsRoundTrip(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		c.Put(vs, entry(t, "ns/ok", "1"), entry(t, "ns/bad", "1"), entry(t, "ns/worse", "1"))
		acks := make(chan AckEvent, 4)
		src := newTestSource(t, c, func(o *SourceOptions) { o.Hooks.Acked = func(_ *StreamInfo, e AckEvent) { acks <- e } })
		rec := newRecorder()
		rec.reject = func(ch *Change) error {
			return RejectionError(codes.PermissionDenied, ch.Collection, []Rejection{
				{Resource: "ns/bad", Reason: `host "x.com" is owned by cluster east`},
				{Resource: "ns/worse", Reason: `namespace "ns" is not owned by this cluster`},
			})
		}
		pair(t, d, src, newTestSink(t, rec, []string{vs}))
		ev := <-acks
		got := Rejections(ev.Detail)
		if ev.Code != codes.PermissionDenied || len(got) != 2 || got[0].Resource != "ns/bad" || got[1].Reason != `namespace "ns" is not owned by this cluster` {
			t.Fatalf("NACK = %v %q, rejections %+v", ev.Code, ev.Message, got)
		}
	})
}

// TestStreamInfoCloseEndsTheStream: a store can end a stream it serves (e.g. after a
// configuration reload routes the peer elsewhere); the peer sees the stream end.
func TestStreamInfoCloseEndsTheStream(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		c := NewCache(vs)
		c.Put(vs, entry(t, "ns/a", "1"))
		infos := make(chan *StreamInfo, 1)
		src := newTestSource(t, c, func(o *SourceOptions) { o.Hooks.StreamOpened = func(i *StreamInfo) { infos <- i } })
		raw := newRawSink(t, src, d)
		raw.request(vs, false, nil)
		raw.next()
		(<-infos).Close()
		select {
		case err := <-raw.errc:
			t.Logf("stream ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("the stream did not end")
		}
	})
}

func TestMoreChunks(t *testing.T) {
	for v, want := range map[string]bool{
		"12": false, "12;chunk=1/3": true, "12;chunk=2/3": true, "12;chunk=3/3": false, "12;chunk=4/3": false,
		"12;chunk=0/3": false, "12;chunk=x/3": false, "12;chunk=1": false, "": false, "istio 2020-01-01": false,
	} {
		if got := moreChunks(v); got != want {
			t.Errorf("moreChunks(%q) = %v, want %v", v, got, want)
		}
	}
}

func FuzzMoreChunks(f *testing.F) {
	f.Add("12;chunk=1/3")
	f.Add("7")
	f.Fuzz(func(t *testing.T, v string) {
		more := moreChunks(v)
		var version uint64
		var i, n int
		if _, err := fmt.Sscanf(v, "%d;chunk=%d/%d", &version, &i, &n); err == nil && chunkVersion(version, i, n) == v && more != (i >= 1 && i < n) {
			t.Fatalf("moreChunks(%q) = %v", v, more)
		}
	})
}

// TestSourcePartialNACK: a NACK that says the rest of the push was applied (RejectionError)
// completes the version, so the next change is sent against it and the refused resource is
// not resent; a plain NACK (a stock Istio sink's) leaves the sink at what it last ACKed, and
// the next change is sent against that.
func TestSourcePartialNACK(t *testing.T) {
	for _, partial := range []bool{true, false} {
		t.Run(fmt.Sprintf("partial=%v", partial), func(t *testing.T) {
			c := NewCache(vs)
			c.Put(vs, entry(t, "ns/ok", "1"), entry(t, "ns/bad", "1"))
			sink := newRawSink(t, newTestSource(t, c), sinkServes)
			sink.request(vs, true, nil)
			first := sink.next()
			nack := RejectionError(codes.PermissionDenied, vs, []Rejection{{Resource: "ns/bad", Reason: "not owned"}})
			if !partial {
				nack = status.Error(codes.InvalidArgument, "rejected")
			}
			sink.sendReq(&mcppb.RequestResources{Collection: vs, ResponseNonce: first.Nonce, ErrorDetail: status.Convert(nack).Proto()})
			c.Put(vs, entry(t, "ns/new", "1"))
			next := sink.next()
			want := []string{"ns/new@1"}
			if !partial {
				want = []string{"ns/bad@1", "ns/new@1", "ns/ok@1"} // nothing was ever ACKed: the full state again
			}
			if got := names(next); !equal(got, want) {
				t.Errorf("push after the NACK carries %v, want %v", got, want)
			}
		})
	}
}

// A request with StatusNonce only carries a report in its SinkNode: the source records the
// node (LatestNode; routing keeps the first, Node) and does nothing else: no subscription,
// no ACK of the outstanding push.
func TestSourceStatusRequestOnlyRecordsTheNode(t *testing.T) {
	c := NewCache(vs)
	c.Put(vs, entry(t, "ns/a", "1"))
	infos := make(chan *StreamInfo, 1)
	src := newTestSource(t, c, func(o *SourceOptions) { o.Hooks.StreamOpened = func(i *StreamInfo) { infos <- i } })
	sink := newRawSink(t, src, sinkServes)
	sink.request(vs, true, nil)
	first := sink.next() // outstanding: not ACKed yet
	info := <-infos
	sink.sendReq(&mcppb.RequestResources{Collection: dr, ResponseNonce: StatusNonce, SinkNode: &mcppb.SinkNode{Id: "raw-sink", Annotations: map[string]string{"k": "v"}}})
	// A probe without a node: once it is answered, the report before it was handled.
	sink.sendReq(&mcppb.RequestResources{Collection: "probe/1"})
	if m := sink.next(); m.Collection != "probe/1" {
		t.Fatalf("push of %s, want only the probe's (dr was not subscribed)", m.Collection)
	}
	if got := info.LatestNode().GetAnnotations()["k"]; got != "v" {
		t.Errorf("LatestNode annotations = %v", info.LatestNode().GetAnnotations())
	}
	if got := info.Node().GetAnnotations()["k"]; got != "" {
		t.Errorf("Node (routing's) changed by a report: %v", info.Node().GetAnnotations())
	}
	// The push is still outstanding: a change waits for its ACK, then comes.
	c.Put(vs, entry(t, "ns/b", "1"))
	sink.ack(first)
	if next := sink.next(); next.Collection != vs {
		t.Errorf("after the ACK: push of %s, want %s", next.Collection, vs)
	}
}
