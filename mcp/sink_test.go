package mcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// initialRequests reads the sink's first requests, one per collection.
func initialRequests(t *testing.T, src *rawSource, n int) map[string]*mcppb.RequestResources {
	t.Helper()
	out := map[string]*mcppb.RequestResources{}
	for range n {
		r := src.next()
		if r.ResponseNonce != "" {
			t.Fatalf("initial request for %s carries nonce %q", r.Collection, r.ResponseNonce)
		}
		out[r.Collection] = r
	}
	return out
}

// A source that resumes and dialed in is asked for every collection at once; a source the
// sink dialed is asked for one first (its header, with the first push, says whether it
// resumes), then for the rest.
func TestSinkRequestsEveryCollection(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		rec := newRecorder()
		sink := newTestSink(t, rec, []string{vs, dr})
		src := newRawSource(t, sink, d)
		var reqs map[string]*mcppb.RequestResources
		if d == sinkServes {
			reqs = initialRequests(t, src, 2)
		} else {
			reqs = initialRequests(t, src, 1)
			if reqs[vs] == nil {
				t.Fatalf("first request = %v, want %s first (the configured order)", reqs, vs)
			}
			src.push(&mcppb.Resources{Collection: vs, Nonce: "1"})
			if ack := src.next(); ack.ResponseNonce != "1" {
				t.Fatalf("ack = %v", ack)
			}
			maps.Copy(reqs, initialRequests(t, src, 1))
		}
		for _, c := range []string{vs, dr} {
			r := reqs[c]
			if r == nil || !r.Incremental || r.SinkNode.GetId() != "test-sink" {
				t.Fatalf("request for %s = %v", c, r)
			}
		}
	})
}

func TestSinkAppliesAndAcks(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		rec := newRecorder()
		sink := newTestSink(t, rec, []string{vs})
		src := newRawSource(t, sink, d)
		initialRequests(t, src, 1)
		// Istio's source speaks first with a trigger and no nonce: ignored, not answered.
		src.push(&mcppb.Resources{Collection: TriggerCollection})
		src.push(&mcppb.Resources{Collection: vs, Nonce: "1", Resources: []*mcpapi.Resource{res("ns/a", "1", "A"), res("ns/b", "1", "B")}})
		ack := src.next()
		if ack.ResponseNonce != "1" || ack.ErrorDetail != nil || ack.Collection != vs {
			t.Fatalf("ack = %v", ack)
		}
		rec.waitState(t, vs, map[string]string{"ns/a": "1", "ns/b": "1"})
		if !sink.Synced() {
			t.Error("sink not synced after a push for its only collection")
		}
		// Incremental: update a, remove b.
		src.push(&mcppb.Resources{Collection: vs, Nonce: "2", Incremental: true, Resources: []*mcpapi.Resource{res("ns/a", "2", "A2")}, RemovedResources: []string{"ns/b"}})
		if ack := src.next(); ack.ResponseNonce != "2" || ack.ErrorDetail != nil {
			t.Fatalf("ack = %v", ack)
		}
		rec.waitState(t, vs, map[string]string{"ns/a": "2"})
		// Full state replaces everything.
		src.push(&mcppb.Resources{Collection: vs, Nonce: "3", Resources: []*mcpapi.Resource{res("ns/c", "1", "C")}})
		src.next()
		rec.waitState(t, vs, map[string]string{"ns/c": "1"})
		if got := sink.Versions(vs); !mapsEqual(got, map[string]string{"ns/c": "1"}) {
			t.Errorf("tracked versions = %v", got)
		}
	})
}

func TestSinkFirstIncrementalPushAppliesOntoEmptyState(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		rec := newRecorder()
		sink := newTestSink(t, rec, []string{vs})
		src := newRawSource(t, sink, d)
		initialRequests(t, src, 1)
		src.push(&mcppb.Resources{Collection: vs, Nonce: "1", Incremental: true, Resources: []*mcpapi.Resource{res("ns/a", "1", "A")}})
		if ack := src.next(); ack.ErrorDetail != nil {
			t.Fatalf("NACK: %v", ack.ErrorDetail)
		}
		rec.waitState(t, vs, map[string]string{"ns/a": "1"})
	})
}

func TestSinkNacks(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		rec := newRecorder()
		detail, _ := anypb.New(wrapperspb.String("ns/bad: host not owned"))
		rec.reject = func(c *Change) error {
			for _, e := range c.Entries {
				if e.Name == "ns/bad" {
					s := status.New(codes.PermissionDenied, "1 resource rejected")
					p := s.Proto()
					p.Details = append(p.Details, detail)
					return status.FromProto(p).Err()
				}
				if e.Name == "ns/plain" {
					return errors.New("plain error")
				}
			}
			return nil
		}
		reg := newTestMetrics(t)
		sink := newTestSink(t, rec, []string{vs}, func(o *SinkOptions) { o.Metrics = reg.m })
		src := newRawSource(t, sink, d)
		initialRequests(t, src, 1)

		cases := []struct {
			name string
			push *mcppb.Resources
			code codes.Code
		}{
			{"applier status with details", &mcppb.Resources{Collection: vs, Nonce: "1", Resources: []*mcpapi.Resource{res("ns/bad", "1", "x")}}, codes.PermissionDenied},
			{"applier plain error", &mcppb.Resources{Collection: vs, Nonce: "2", Resources: []*mcpapi.Resource{res("ns/plain", "1", "x")}}, codes.InvalidArgument},
			{"collection not requested", &mcppb.Resources{Collection: dr, Nonce: "3"}, codes.Unimplemented},
			{"resource without name", &mcppb.Resources{Collection: vs, Nonce: "4", Resources: []*mcpapi.Resource{{Metadata: &mcpapi.Metadata{}}}}, codes.InvalidArgument},
			{"resource without metadata", &mcppb.Resources{Collection: vs, Nonce: "5", Resources: []*mcpapi.Resource{{}}}, codes.InvalidArgument},
			{"duplicate names", &mcppb.Resources{Collection: vs, Nonce: "6", Resources: []*mcpapi.Resource{res("ns/a", "1", "x"), res("ns/a", "2", "y")}}, codes.InvalidArgument},
		}
		for _, tc := range cases {
			src.push(tc.push)
			r := src.next()
			if r.ResponseNonce != tc.push.Nonce || r.ErrorDetail == nil || codes.Code(r.ErrorDetail.Code) != tc.code {
				t.Errorf("%s: answer nonce=%q detail=%v, want NACK %v", tc.name, r.ResponseNonce, r.ErrorDetail, tc.code)
			}
			if tc.name == "applier status with details" && len(r.ErrorDetail.GetDetails()) != 1 {
				t.Errorf("%s: details lost: %v", tc.name, r.ErrorDetail)
			}
		}
		if rec.changeCount() != 0 {
			t.Errorf("%d changes applied, want none", rec.changeCount())
		}
		if sink.Synced() {
			t.Error("synced without an applied push")
		}
		if n := reg.counter(t, "meshfed_mcp_nacks_total", "role", "sink"); n != float64(len(cases)) {
			t.Errorf("sink nacks_total = %v, want %d", n, len(cases))
		}
		// Nothing already accepted is lost, and the stream still works.
		src.push(&mcppb.Resources{Collection: vs, Nonce: "7", Resources: []*mcpapi.Resource{res("ns/good", "1", "x")}})
		if r := src.next(); r.ErrorDetail != nil {
			t.Fatalf("good push NACKed: %v", r.ErrorDetail)
		}
		rec.waitState(t, vs, map[string]string{"ns/good": "1"})
	})
}

func TestSinkResumesOnNewStream(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		rec := newRecorder()
		sink := newTestSink(t, rec, []string{vs})
		src := newRawSource(t, sink, d)
		initialRequests(t, src, 1)
		src.push(&mcppb.Resources{Collection: vs, Nonce: "1", Resources: []*mcpapi.Resource{res("ns/a", "1", "A"), res("ns/b", "3", "B")}})
		src.next()
		// A second stream with the same Sink declares what it holds.
		src2 := newRawSource(t, sink, d)
		r := src2.next()
		if !mapsEqual(r.InitialResourceVersions, map[string]string{"ns/a": "1", "ns/b": "3"}) || !r.Incremental {
			t.Fatalf("resume request = %v", r)
		}
	})
}

func TestSinkUsesCallerVersions(t *testing.T) {
	rec := newRecorder()
	sink := newTestSink(t, rec, []string{vs}, func(o *SinkOptions) {
		o.FullStateOnly = true
		o.InitialVersions = func(c string) map[string]string { return map[string]string{"ns/x": c} }
	})
	src := newRawSource(t, sink, sinkServes)
	r := src.next()
	if r.Incremental || r.InitialResourceVersions["ns/x"] != vs {
		t.Fatalf("request = %v", r)
	}
}

func TestNewSinkValidates(t *testing.T) {
	apply := ApplierFunc(func(context.Context, *Change) error { return nil })
	for _, tc := range []struct {
		name string
		opts SinkOptions
	}{
		{"no collections", SinkOptions{Applier: apply}},
		{"empty name", SinkOptions{Collections: []string{""}, Applier: apply}},
		{"duplicate", SinkOptions{Collections: []string{vs, vs}, Applier: apply}},
		{"no applier", SinkOptions{Collections: []string{vs}}},
	} {
		if _, err := NewSink(tc.opts); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if _, err := NewSource(SourceOptions{}); err == nil {
		t.Error("NewSource without a Watcher: no error")
	}
}

// A sink with Annotations sends them in every request; Report sends them at once, in a
// StatusNonce request, to a source that says it resumes, in either direction and with a
// single collection too (dialing out, the source says so in the header of its first push);
// a source that does not say so gets nothing until the next ACK.
func TestSinkReport(t *testing.T) {
	forEachDirection(t, func(t *testing.T, d direction) {
		for _, resumes := range []bool{true, false} {
			t.Run(fmt.Sprintf("resumes=%v", resumes), func(t *testing.T) {
				var note atomic.Value
				note.Store("1")
				sink := newTestSink(t, newRecorder(), []string{vs}, func(o *SinkOptions) {
					o.Node.Annotations = map[string]string{"node": "n"}
					o.Annotations = func() map[string]string { return map[string]string{"note": note.Load().(string)} }
				})
				src := newRawSourceAs(t, sink, d, resumes)
				annotated := func(r *mcppb.RequestResources, want string) {
					t.Helper()
					if a := r.GetSinkNode().GetAnnotations(); r.GetSinkNode().GetId() != "test-sink" || a["node"] != "n" || a["note"] != want {
						t.Errorf("request %v: SinkNode %v, want test-sink with node=n, note=%s", r, r.GetSinkNode(), want)
					}
				}
				annotated(src.next(), "1")
				src.push(&mcppb.Resources{Collection: vs, Nonce: "1"})
				annotated(src.next(), "1") // the ACK

				note.Store("2")
				sink.Report()
				if !resumes {
					src.push(&mcppb.Resources{Collection: vs, Nonce: "2"})
				}
				r := src.next()
				if resumes && r.ResponseNonce != StatusNonce || !resumes && r.ResponseNonce != "2" {
					t.Fatalf("after Report: request %v, want a report (%s) only to a source that resumes", r, StatusNonce)
				}
				annotated(r, "2")
			})
		}
	})
}
