package interop

// Directions 1 and 2: Istio is the source, meshfed's engine the sink.

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// sinkSetup is one Istio source process connected to one meshfed Sink.
type sinkSetup struct {
	*pair
	applier *recordingApplier
	sink    *mcp.Sink
}

// newSinkSetup connects an Istio source to a meshfed Sink whose Applier NACKs what reject
// (optional) refuses. It then sets vsV1 and drV1 in Istio's source and waits until the sink
// holds them, the state every scenario starts from.
func newSinkSetup(t *testing.T, v variant, reject func(c *mcp.Change) error) *sinkSetup {
	t.Helper()
	s := &sinkSetup{pair: newPair(t, v, "meshfed sink"), applier: newRecordingApplier(reject)}
	sink, err := mcp.NewSink(mcp.SinkOptions{
		Collections: []string{collA, collB},
		Node:        &mcppb.SinkNode{Id: "meshfed-interop"},
		Applier:     s.applier,
		Logger:      s.log,
		Metrics:     s.metrics,
		Hooks:       s.rec.hooks(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.sink = sink
	s.connect([]string{collA, collB}, func(g *grpc.Server) {
		// One Sink for every stream, so a reconnecting source resumes.
		mcp.NewSinkServer(func(context.Context, *mcp.StreamInfo) (*mcp.Sink, error) { return sink, nil },
			mcp.ServerConfig{Logger: s.log, Metrics: s.metrics}).Register(g)
	}, "Sink.PullFrom", sink.PullFrom)
	s.setBoth("vs-1", vsV1, "dr-1", drV1)
	return s
}

// setBoth sets collA and then collB in Istio's source and waits until meshfed's sink holds
// both.
func (s *sinkSetup) setBoth(vsVersion string, vs state, drVersion string, dr state) {
	s.t.Helper()
	s.istio.set(collA, vsVersion, vs)
	s.istio.set(collB, drVersion, dr)
	s.applier.waitState(s.t, collA, vs)
	s.applier.waitState(s.t, collB, dr)
}

// TestSinkInitialUpdateDelete: Istio's source pushes the full state of two collections,
// then an update (one resource changed, one deleted, one added), a deletion and an empty
// state; meshfed's sink applies every push as full state and ends on the latest state, on
// one stream.
func TestSinkInitialUpdateDelete(t *testing.T) {
	forEachDirection(t, sinkDirections, func(t *testing.T, dir direction) {
		s := newSinkSetup(t, variant{dir: dir}, nil)
		if !s.sink.Synced() {
			t.Error("Sink.Synced() = false after both collections were applied")
		}

		s.setBoth("vs-2", vsV2, "dr-2", drV2)

		// Everything deleted: an empty full state.
		s.istio.set(collB, "dr-empty", state{})
		s.applier.waitState(t, collB, state{})

		for _, c := range s.applier.allCalls() {
			if c.incremental || c.err != nil || (c.collection != collA && c.collection != collB) {
				t.Errorf("unexpected Apply call %v: want only full-state pushes of the two collections, all applied", c)
			}
		}
		if got, want := s.sink.Versions(collA), map[string]string{"default/reviews": "2", "default/details": "1"}; !maps.Equal(got, want) {
			t.Errorf("Sink.Versions(%s) = %v, want %v", collA, got, want)
		}
		s.checkOnlyACKs(collA, collB)
		s.checkOneStream()
	})
}

// TestSinkToleratesIstioTrigger: Istio's source client opens the ResourceSink stream with
// Resources{collection: "$triggerCollection"} and no nonce. meshfed's sink ignores it (counted
// as ignored "trigger"), never hands it to the Applier, and the stream stays up and carries
// the real pushes.
func TestSinkToleratesIstioTrigger(t *testing.T) {
	t.Parallel()
	s := newSinkSetup(t, variant{dir: dir2}, nil)
	s.checkMetric("meshfed_mcp_ignored_messages_total", map[string]string{"reason": "trigger"}, 1)
	for _, c := range s.applier.allCalls() {
		if c.collection == mcp.TriggerCollection {
			t.Errorf("the trigger reached the Applier: %v", c)
		}
	}
	for _, a := range s.rec.acksFor(mcp.TriggerCollection) {
		t.Errorf("meshfed sink answered the trigger: %+v", a)
	}
	s.checkOneStream()
}

// TestSinkNACKNotResent: meshfed's Applier rejects one version of a collection (a
// RejectionError, sent as the NACK's error_detail). Istio's source does not resend that
// version: the rejected version reaches the Applier exactly once, the other collection keeps
// flowing, and the next version of the rejected collection is pushed and applied. With
// incremental allowed, that next push is the difference from the last ACKed version, and the
// sink (which did not apply the NACKed push) ends on the right state.
func TestSinkNACKNotResent(t *testing.T) {
	forEachVariant(t, sinkDirections, func(t *testing.T, v variant) {
		reject := func(c *mcp.Change) error {
			if c.Collection == collA && c.SystemVersionInfo == "vs-2" {
				return mcp.RejectionError(codes.InvalidArgument, c.Collection,
					[]mcp.Rejection{{Resource: "default/details", Reason: "interop test rejects vs-2"}})
			}
			return nil
		}
		s := newSinkSetup(t, v, reject)

		s.istio.set(collA, "vs-2", vsV2)
		waitUntil(t, "meshfed sink to NACK vs-2", func() (bool, string) {
			for _, a := range s.rec.acksFor(collA) {
				if a.Code == codes.InvalidArgument {
					return true, ""
				}
			}
			return false, fmt.Sprint(s.applier.callsFor(collA))
		})
		if got := s.applier.collectionState(collA); !got.equal(vsV1) {
			t.Errorf("after the NACK the sink holds %v, want the previous state %v", got, vsV1)
		}

		// The other collection still flows on the same stream (and its round trip
		// happens after Istio got the NACK).
		s.istio.set(collB, "dr-2", drV2)
		s.applier.waitState(t, collB, drV2)

		s.istio.set(collA, "vs-3", vsV3)
		s.applier.waitState(t, collA, vsV3)

		var versions []string
		for _, c := range s.applier.callsFor(collA) {
			ver := c.version
			if c.err != nil {
				ver += "(NACK)"
			}
			versions = append(versions, ver)
		}
		if want := []string{"vs-1", "vs-2(NACK)", "vs-3"}; fmt.Sprint(versions) != fmt.Sprint(want) {
			t.Errorf("Apply calls for %s: %v, want %v (a NACKed version must not be resent)", collA, versions, want)
		}
		if v.incremental {
			// Istio computes the push after a NACK against what was last ACKed (vs-1), from
			// which every resource of vs-3 differs.
			checkPush(t, "push of vs-3 (incremental from vs-1)", s.applier.lastCall(t, collA).push(), incrementalPush(vsV3, "default/ratings"))
		}
		s.checkMetric("meshfed_mcp_nacks_total", map[string]string{"role": "sink", "collection": collA, "reason": "InvalidArgument"}, 1)
		s.checkOneStream()
	})
}

// TestSinkIstioIncrementalFirstPush: with incremental allowed, Istio's source sends only the
// very first response of a stream as full state; the other collection's first push arrives
// with incremental=true, listing every resource as added. Istio's source does not say it
// resumes (mcp.ResumesHeader), so meshfed's sink declared no versions and applies each
// collection's first push on the stream as that collection's full state. Later changes
// arrive as incremental pushes (changed resources plus removed_resources) and the sink ends
// on the latest state.
func TestSinkIstioIncrementalFirstPush(t *testing.T) {
	forEachDirection(t, sinkDirections, func(t *testing.T, dir direction) {
		s := newSinkSetup(t, variant{dir: dir, incremental: true}, nil)
		for coll, want := range map[string]state{collA: vsV1, collB: drV1} {
			checkPush(t, "first push of "+coll+" as applied", s.applier.callsFor(coll)[0].push(), fullState(want))
		}

		// vs-2 changes reviews and adds details (all of vsV2) and deletes ratings.
		s.istio.set(collA, "vs-2", vsV2)
		s.applier.waitState(t, collA, vsV2)
		checkPush(t, "push of vs-2", s.applier.lastCall(t, collA).push(), incrementalPush(vsV2, "default/ratings"))

		s.istio.set(collB, "dr-2", drV2)
		s.applier.waitState(t, collB, drV2)
		checkPush(t, "push of dr-2", s.applier.lastCall(t, collB).push(), incrementalPush(nil, "default/ratings"))
		s.checkOneStream()
	})
}

// TestSinkReconnect: the stream breaks and is re-established, and the sink converges on
// what the source holds afterwards.
//
//   - Direction 1: Istio's source server is SIGKILLed and a new process listens on the same
//     address with changed state; meshfed's PullFrom loop redials.
//   - Direction 2: meshfed's SinkServer is stopped, the state changes in the still running
//     Istio source, and the server starts again on the same address; Istio's client
//     reconnects. Then Istio's process is SIGKILLed and started again with changed state.
func TestSinkReconnect(t *testing.T) {
	forEachDirection(t, sinkDirections, func(t *testing.T, dir direction) {
		s := newSinkSetup(t, variant{dir: dir}, nil)

		if dir == dir2 {
			s.server.stop()
			s.istio.set(collA, "vs-2", vsV2)
			s.server.start()
			s.applier.waitState(t, collA, vsV2)
			s.applier.waitState(t, collB, drV1)
			s.checkNewStream(1, "the server restart")
		}

		opened, _ := s.rec.streams()
		s.istio = s.istio.restart()
		s.setBoth("vs-3", vsV3, "dr-2", drV2)
		s.checkNewStream(opened, "the Istio process restart")
		for _, c := range s.applier.allCalls() {
			if c.err != nil {
				t.Errorf("unexpected NACK: %v", c)
			}
		}
	})
}

// TestSinkIstioIncrementalReconnectConverges: Istio's source ignores
// initial_resource_versions and starts every stream with an empty acked-version map, so on a
// new stream the first push of all but one collection is incremental=true, lists every
// resource as added and removes nothing. A sink that applied it as a change would keep what
// was deleted while it was disconnected, for good (Istio never removes what it never sent on
// the stream). meshfed's sink takes the first push of each collection on the stream as its
// full state, so both collections converge.
func TestSinkIstioIncrementalReconnectConverges(t *testing.T) {
	forEachDirection(t, sinkDirections, func(t *testing.T, dir direction) {
		s := newSinkSetup(t, variant{dir: dir, incremental: true}, nil)
		before := map[string]int{collA: len(s.applier.callsFor(collA)), collB: len(s.applier.callsFor(collB))}

		// A new Istio process (same address for direction 1) whose state deleted
		// default/ratings from both collections.
		s.istio = s.istio.restart()
		s.istio.set(collA, "vs-2", vsV2)
		s.istio.set(collB, "dr-2", drV2)
		want := map[string]state{collA: vsV2, collB: drV2}
		for _, coll := range []string{collA, collB} {
			s.applier.waitState(t, coll, want[coll])
			if v := s.sink.Versions(coll); v["default/ratings"] != "" {
				t.Errorf("Sink.Versions(%s) = %v: default/ratings was deleted while disconnected", coll, v)
			}
			checkPush(t, "first push of "+coll+" on the new stream, as applied", s.applier.callsFor(coll)[before[coll]].push(), fullState(want[coll]))
		}
	})
}

// TestSinkIstioSourceServesFewerCollections: Istio's source ends the whole stream when asked
// for a collection it was not configured with (`InvalidArgument: unsupported collection`);
// dialing out, its client then leaves the stream and dials again. meshfed's sink asks for
// the refused collection first, and goes on without it (dialed in, once a second stream was
// left waiting for it): the refusal is recorded once
// (Sink.Refused, the collections_refused_total metric), the next stream carries the served
// collection, the sink is synced, and that stream stays up for later changes.
func TestSinkIstioSourceServesFewerCollections(t *testing.T) {
	forEachDirection(t, sinkDirections, func(t *testing.T, dir direction) {
		p := newPair(t, variant{dir: dir}, "meshfed sink")
		applier := newRecordingApplier(nil)
		sink, err := mcp.NewSink(mcp.SinkOptions{
			Collections: []string{collB, collA}, // the refused one first: every stream meets it
			Node:        &mcppb.SinkNode{Id: "meshfed-interop"},
			Applier:     applier,
			Logger:      p.log,
			Metrics:     p.metrics,
			Hooks:       p.rec.hooks(),
		})
		if err != nil {
			t.Fatal(err)
		}
		p.connect([]string{collA}, func(g *grpc.Server) {
			mcp.NewSinkServer(func(context.Context, *mcp.StreamInfo) (*mcp.Sink, error) { return sink, nil },
				mcp.ServerConfig{Logger: p.log, Metrics: p.metrics}).Register(g)
		}, "Sink.PullFrom", sink.PullFrom)
		p.istio.set(collA, "vs-1", vsV1)
		applier.waitState(t, collA, vsV1)
		waitUntil(t, "the sink synced without "+collB, func() (bool, string) {
			return sink.Synced(), fmt.Sprint(sink.Refused())
		})
		if r := sink.Refused(); len(r) != 1 || r[collB] == "" {
			t.Errorf("Refused() = %v, want only %s", r, collB)
		}
		if n := metric(t, p.reg, "meshfed_mcp_collections_refused_total", map[string]string{"collection": collB}); n != 1 {
			t.Errorf("collections_refused_total{%s} = %v, want 1", collB, n)
		}
		// Dialing out, the refusal ends one stream. Dialed in, Istio's client leaves the stream
		// and dials again: two streams left waiting for the same collection are a refusal.
		opened, _ := p.rec.streams()
		if want := map[direction]int{dir1: 2, dir2: 3}[dir]; opened != want {
			t.Errorf("streams opened = %d, want %d: those %s ended, and the one that goes on", opened, want, collB)
		}
		p.istio.set(collA, "vs-2", vsV2)
		applier.waitState(t, collA, vsV2)
		if now, _ := p.rec.streams(); now != opened {
			t.Errorf("streams opened = %d after a change, want still %d", now, opened)
		}
		if calls := applier.callsFor(collB); len(calls) != 0 {
			t.Errorf("%s applied %v, want nothing", collB, calls)
		}
	})
}
