package interop

// Directions 3 and 4: meshfed's engine is the source (an mcp.Cache as its Watcher), Istio
// the sink.

import (
	"fmt"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshfed/meshfed/mcp"
)

// sourceSetup is one meshfed Source over an mcp.Cache connected to one Istio sink process.
type sourceSetup struct {
	*pair
	cache *mcp.Cache
	src   *mcp.Source
}

// newSourceSetup connects a meshfed Source, whose cache serves collA and collB, to an Istio
// sink that requests those two and the unserved ones. The cache holds vsV1 and drV1 before
// the two sides connect; newSourceSetup waits until Istio's sink holds them, the state every
// scenario starts from.
func newSourceSetup(t *testing.T, v variant, unserved ...string) *sourceSetup {
	t.Helper()
	s := &sourceSetup{pair: newPair(t, v, "meshfed source"), cache: mcp.NewCache(collA, collB)}
	s.cache.Replace(collA, entries(t, vsV1))
	s.cache.Replace(collB, entries(t, drV1))
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: s.cache, Logger: s.log, Metrics: s.metrics, Hooks: s.rec.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	s.src = src
	s.connect(append([]string{collA, collB}, unserved...), func(g *grpc.Server) {
		mcp.NewSourceServer(src, mcp.ServerConfig{Logger: s.log, Metrics: s.metrics}).Register(g)
	}, "Source.PushTo", src.PushTo)
	s.waitBoth(vsV1, drV1)
	return s
}

// waitBoth waits until Istio's sink holds vs for collA and dr for collB.
func (s *sourceSetup) waitBoth(vs, dr state) {
	s.t.Helper()
	s.istio.waitSinkState(collA, vs)
	s.istio.waitSinkState(collB, dr)
}

// replaceBoth replaces collA and then collB in meshfed's cache and waits until Istio's sink
// holds both.
func (s *sourceSetup) replaceBoth(vs, dr state) {
	s.t.Helper()
	s.cache.Replace(collA, entries(s.t, vs))
	s.cache.Replace(collB, entries(s.t, dr))
	s.waitBoth(vs, dr)
}

// checkKinds checks the kind of every applied event after the first full state
// of each collection: incremental exactly when Istio's sink asked for it.
func (s *sourceSetup) checkKinds(collections ...string) {
	s.t.Helper()
	for _, c := range collections {
		for i, e := range s.istio.applied(c) {
			want := s.v.incremental && i > 0
			if e.Incremental != want {
				s.t.Errorf("Istio applied push %d of %s with incremental=%v, want %v: %v", i, c, e.Incremental, want, e)
			}
		}
	}
}

// TestSourceInitialUpdateDelete: meshfed's source serves two collections from an mcp.Cache;
// Istio's sink gets their full state, then an update (changed, deleted and added resources),
// a deletion and finally the deletion of every resource, and ends on the latest state,
// ACKing every push on one stream. An incremental Istio sink gets full state first and
// incremental pushes after. In direction 4 Istio's NACK of PushTo's opening trigger message
// is ignored.
func TestSourceInitialUpdateDelete(t *testing.T) {
	forEachVariant(t, sourceDirections, func(t *testing.T, v variant) {
		s := newSourceSetup(t, v)

		s.replaceBoth(vsV2, drV2)

		// Everything may be deleted: an empty state is pushed and applied too.
		s.cache.Replace(collB, nil)
		s.istio.waitSinkState(collB, state{})

		s.checkKinds(collA, collB)
		if v.dir == dir4 {
			// Istio's sink server NACKs the trigger PushTo opens with; the source ignores it.
			s.checkMetric("meshfed_mcp_ignored_messages_total", map[string]string{"reason": "trigger"}, 1)
		}
		s.checkOnlyACKs(collA, collB)
		s.checkOneStream()
	})
}

// TestSourceIstioNACKNotResent: Istio's sink NACKs a push whose body type gogo's registry
// does not know (before applying anything). meshfed's source does not resend that version:
// it is pushed exactly once, the other collection keeps flowing, and the next version is
// pushed and applied. For an incremental sink the push after the NACK is still incremental
// (Istio's NACK requests do not carry the incremental flag).
func TestSourceIstioNACKNotResent(t *testing.T) {
	forEachVariant(t, sourceDirections, func(t *testing.T, v variant) {
		s := newSourceSetup(t, v)
		appliedBefore := len(s.istio.applied(collA))

		unknown := &anypb.Any{TypeUrl: "type.googleapis.com/meshfed.interop.NotRegistered", Value: []byte("\x0a\x03abc")}
		vBad := s.cache.Put(collA, newEntryWithBody(t, "default/details", "1", unknown))
		waitUntil(t, "Istio sink to NACK the unknown body type", func() (bool, string) {
			for _, a := range s.rec.acksFor(collA) {
				if a.Version == vBad && a.Code != codes.OK {
					return true, ""
				}
			}
			return false, fmt.Sprintf("acks %+v; istio: %s", s.rec.acksFor(collA), s.istio.describe())
		})

		// A round trip on the other collection after the NACK.
		s.cache.Replace(collB, entries(t, drV2))
		s.istio.waitSinkState(collB, drV2)
		if n := len(s.istio.applied(collA)); n != appliedBefore {
			t.Errorf("Istio applied %d pushes of %s after the NACKed one, want none", n-appliedBefore, collA)
		}

		vFix := s.cache.Put(collA, newEntry(t, "default/details", "2", "vs details v2"))
		want := state{"default/reviews": vsV1["default/reviews"], "default/ratings": vsV1["default/ratings"], "default/details": {"2", "vs details v2"}}
		s.istio.waitSinkState(collA, want)

		waitUntil(t, "meshfed to record the push of the fixed version", func() (bool, string) {
			p := s.rec.pushesFor(collA)
			return len(p) > 0 && p[len(p)-1].Version == vFix, fmt.Sprintf("%+v", p)
		})
		var versions []string
		for _, p := range s.rec.pushesFor(collA) {
			versions = append(versions, strconv.FormatUint(p.Version, 10))
		}
		if wantV := []string{"1", strconv.FormatUint(vBad, 10), strconv.FormatUint(vFix, 10)}; fmt.Sprint(versions) != fmt.Sprint(wantV) {
			t.Errorf("meshfed pushed %s versions %v, want %v (the NACKed version exactly once)", collA, versions, wantV)
		}
		s.checkMetric("meshfed_mcp_nacks_total", map[string]string{"role": "source", "collection": collA}, 1)
		s.checkKinds(collA, collB)
		if v.incremental {
			checkPush(t, "push after the NACK", s.istio.lastApplied(collA), incrementalPush(state{"default/details": want["default/details"]}))
		}
		s.checkOneStream()
	})
}

// TestSourceCoalescesBurst: while a push of a collection is outstanding, 50 more changes
// (updates and a deletion) happen. meshfed's source sends exactly one more push, carrying all
// of them, and Istio's sink ends on the latest state. To make "while outstanding"
// deterministic the source stream is held inside its Pushed hook (on the stream's own
// goroutine) right after the first push until the burst is done.
func TestSourceCoalescesBurst(t *testing.T) {
	forEachVariant(t, sourceDirections, func(t *testing.T, v variant) {
		s := newSourceSetup(t, v)
		pushesBefore := len(s.rec.pushesFor(collA))
		appliedBefore := len(s.istio.applied(collA))

		gate := s.rec.armGate(t, collA)
		first := s.cache.Put(collA, newEntry(t, "default/burst", "0", "burst 0"))
		waitChan(t, "the first push of the burst", gate.reached)
		const burst = 50
		var last uint64
		for i := 1; i <= burst; i++ {
			last = s.cache.Put(collA, newEntry(t, "default/burst", strconv.Itoa(i), "burst "+strconv.Itoa(i)))
			if i == burst/2 {
				last = s.cache.Remove(collA, "default/ratings")
			}
		}
		gate.open()

		want := state{"default/reviews": vsV1["default/reviews"], "default/burst": {strconv.Itoa(burst), "burst " + strconv.Itoa(burst)}}
		s.istio.waitSinkState(collA, want)

		// The Pushed hook runs after the send: wait until it has recorded the last push.
		waitUntil(t, "meshfed to record the burst's pushes", func() (bool, string) {
			return len(s.rec.pushesFor(collA)) >= pushesBefore+2, fmt.Sprintf("%+v", s.rec.pushesFor(collA))
		})
		pushes := s.rec.pushesFor(collA)[pushesBefore:]
		if len(pushes) != 2 || pushes[0].Version != first || pushes[1].Version != last {
			t.Errorf("pushes of %s during the burst: %+v; want exactly 2, of versions %d and %d", collA, pushes, first, last)
		}
		if n := len(s.istio.applied(collA)) - appliedBefore; n != 2 {
			t.Errorf("Istio applied %d pushes of %s for %d changes, want 2", n, collA, burst+2)
		}
		s.checkKinds(collA, collB)
		s.checkOneStream()
	})
}

// TestSourceUnservedCollection: Istio's sink requests a collection meshfed's cache does not
// serve. It gets one empty full state (which it applies and ACKs), the stream stays up, and
// the served collections keep flowing.
func TestSourceUnservedCollection(t *testing.T) {
	forEachVariant(t, sourceDirections, func(t *testing.T, v variant) {
		s := newSourceSetup(t, v, collX)
		waitUntil(t, "Istio sink to apply an empty state of "+collX, func() (bool, string) {
			return len(s.istio.applied(collX)) > 0, s.istio.describe()
		})

		s.replaceBoth(vsV2, drV2)

		if x := s.istio.applied(collX); len(x) != 1 || !x[0].push().equal(fullState(nil)) {
			t.Errorf("Istio applied %v for %s, want exactly one empty full state", x, collX)
		}
		waitUntil(t, "meshfed to receive the ACK of "+collX, func() (bool, string) {
			return len(s.rec.acksFor(collX)) > 0, ""
		})
		if acks := s.rec.acksFor(collX); len(acks) != 1 || acks[0].Code != codes.OK {
			t.Errorf("answers for %s: %+v, want one ACK", collX, acks)
		}
		if p := s.rec.pushesFor(collX); len(p) != 1 || p[0].Resources != 0 || p[0].Incremental {
			t.Errorf("meshfed pushes of %s: %+v, want one empty full state", collX, p)
		}
		s.checkMetric("meshfed_mcp_ignored_messages_total", map[string]string{"reason": "unknown_collection"}, 1)
		s.checkKinds(collA, collB)
		s.checkOneStream()
	})
}

// TestSourceIncremental: Istio's sink asks for incremental pushes. It gets full state first
// (it declared nothing), then pushes with incremental=true carrying only the changed
// resources and the removed names, which it applies to the same state meshfed holds.
func TestSourceIncremental(t *testing.T) {
	forEachDirection(t, sourceDirections, func(t *testing.T, dir direction) {
		s := newSourceSetup(t, variant{dir: dir, incremental: true})

		// reviews changed, ratings deleted, details added: all of vsV2 is pushed.
		s.cache.Update(collA, entries(t, vsV2), []string{"default/ratings"})
		s.istio.waitSinkState(collA, vsV2)
		checkPush(t, "last push of "+collA, s.istio.lastApplied(collA), incrementalPush(vsV2, "default/ratings"))

		s.cache.Remove(collB, "default/ratings")
		s.istio.waitSinkState(collB, drV2)
		checkPush(t, "last push of "+collB, s.istio.lastApplied(collB), incrementalPush(nil, "default/ratings"))

		s.cache.Put(collB, newEntry(t, "default/details", "1", "dr details v1"))
		s.istio.waitSinkState(collB, drV3)
		checkPush(t, "last push of "+collB, s.istio.lastApplied(collB), incrementalPush(state{"default/details": drV3["default/details"]}))

		for _, p := range s.rec.pushesFor(collA)[1:] {
			if !p.Incremental {
				t.Errorf("meshfed pushed %s version %d as full state, want incremental", collA, p.Version)
			}
		}
		s.checkKinds(collA, collB)
		s.checkOneStream()
	})
}

// TestSourceReconnect: the stream breaks, the cache changes meanwhile, and Istio's sink
// converges after the new stream.
//
//   - Direction 3, meshfed restart: meshfed's SourceServer is stopped and started again on
//     the same address while Istio's sink client keeps running. An incremental Istio sink
//     declares the versions it holds (initial_resource_versions) and meshfed resumes from
//     them: the first push on the new stream is incremental and carries only the difference.
//   - Both directions, Istio restart: Istio's process is SIGKILLed and started again (a
//     server on the same address); the new process holds nothing and gets full state.
func TestSourceReconnect(t *testing.T) {
	forEachVariant(t, sourceDirections, func(t *testing.T, v variant) {
		s := newSourceSetup(t, v)

		if v.dir == dir3 {
			appliedBefore := len(s.istio.applied(collA))
			s.server.stop()
			s.cache.Replace(collA, entries(t, vsV2))
			s.server.start()
			s.waitBoth(vsV2, drV1)
			s.checkNewStream(1, "the server restart")
			resumed := s.istio.applied(collA)[appliedBefore].push()
			if v.incremental {
				// The difference from the declared vsV1 is all of vsV2, and ratings removed.
				checkPush(t, "first push of "+collA+" after the restart (the difference from the declared versions)", resumed, incrementalPush(vsV2, "default/ratings"))
			} else {
				checkPush(t, "first push of "+collA+" after the restart", resumed, fullState(vsV2))
			}
		}

		opened, _ := s.rec.streams()
		s.istio.kill()
		s.cache.Replace(collA, entries(t, vsV3))
		s.cache.Replace(collB, entries(t, drV3))
		s.istio = s.istio.restart()
		s.waitBoth(vsV3, drV3)
		s.checkNewStream(opened, "the Istio process restart")
		for c, want := range map[string]state{collA: vsV3, collB: drV3} {
			checkPush(t, "first push of "+c+" to the restarted Istio sink", s.istio.applied(c)[0].push(), fullState(want))
		}
	})
}
