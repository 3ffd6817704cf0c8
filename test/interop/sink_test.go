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
// with incremental=true, listing every resource as added. meshfed's sink applies it onto the
// empty state it declared. Later changes arrive as incremental pushes (changed resources plus
// removed_resources) and the sink ends on the latest state.
func TestSinkIstioIncrementalFirstPush(t *testing.T) {
	forEachDirection(t, sinkDirections, func(t *testing.T, dir direction) {
		s := newSinkSetup(t, variant{dir: dir, incremental: true}, nil)

		incrementalFirst := 0
		for coll, want := range map[string]state{collA: vsV1, collB: drV1} {
			first := s.applier.callsFor(coll)[0]
			if !first.incremental {
				continue
			}
			incrementalFirst++
			checkPush(t, "incremental first push of "+coll+" (every resource added)", first.push(), incrementalPush(want))
		}
		if incrementalFirst != 1 {
			t.Errorf("%d collections had an incremental first push, want exactly 1 (Istio sends only the stream's first response as full state); calls: %v",
				incrementalFirst, s.applier.allCalls())
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

// TestSinkKnownLimitIstioIncrementalReconnect characterizes the known limit ARCHITECTURE.md
// describes ("a foreign source that ignores the declared versions and sends its first push
// incremental"), reproduced here with Istio 1.8's own source. It asserts what happens today;
// it is not the desired behaviour.
//
// With incremental allowed, Istio's source ignores initial_resource_versions and starts
// every stream with an empty acked-version map: only the stream's first response is full
// state; the other collection's first push is incremental=true, lists every resource as
// added and has no removed_resources. meshfed's sink applies that onto the versions it
// declared (those of the previous stream), so a resource deleted while disconnected stays in
// Sink.Versions and in the Applier's store; Istio's later incremental pushes never remove it
// either (it never acked it on this stream). The collection that happened to be pushed first
// converges.
func TestSinkKnownLimitIstioIncrementalReconnect(t *testing.T) {
	forEachDirection(t, sinkDirections, func(t *testing.T, dir direction) {
		s := newSinkSetup(t, variant{dir: dir, incremental: true}, nil)
		before := map[string]int{collA: len(s.applier.callsFor(collA)), collB: len(s.applier.callsFor(collB))}

		// A new Istio process (same address for direction 1) whose state deleted
		// default/ratings from both collections.
		s.istio = s.istio.restart()
		s.istio.set(collA, "vs-2", vsV2)
		s.istio.set(collB, "dr-2", drV2)
		want := map[string]state{collA: vsV2, collB: drV2}
		deleted := map[string]res{collA: vsV1["default/ratings"], collB: drV1["default/ratings"]}
		waitUntil(t, "a push of each collection on the new stream", func() (bool, string) {
			return len(s.applier.callsFor(collA)) > before[collA] && len(s.applier.callsFor(collB)) > before[collB], fmt.Sprint(s.applier.allCalls())
		})

		stale := 0
		for _, coll := range []string{collA, collB} {
			first := s.applier.callsFor(coll)[before[coll]]
			if !first.incremental {
				s.applier.waitState(t, coll, want[coll])
				continue
			}
			stale++
			checkPush(t, "first push of "+coll+" on the new stream (every resource added, nothing removed)", first.push(), incrementalPush(want[coll]))
			staleState := maps.Clone(want[coll])
			staleState["default/ratings"] = deleted[coll]
			s.applier.waitState(t, coll, staleState)
			if v := s.sink.Versions(coll); v["default/ratings"] != "1" {
				t.Errorf("Sink.Versions(%s) = %v; the known limit keeps default/ratings@1", coll, v)
			}
			t.Logf("known limit reproduced: %s keeps default/ratings, deleted while disconnected: %v", coll, s.applier.collectionState(coll))
		}
		if stale != 1 {
			t.Errorf("%d collections got an incremental first push on the new stream, want 1: %v", stale, s.applier.allCalls())
		}
	})
}
