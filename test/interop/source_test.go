package interop

// Directions 3 and 4: meshfed's engine is the source (an mcp.Cache as its Watcher), Istio
// the sink.

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshfed/meshfed/mcp"
)

// sourceDirection is how meshfed's source and Istio's sink are connected.
type sourceDirection struct {
	name      string
	istioMode string
}

var (
	// dir3: Istio's sink dials meshfed's ResourceSource server (mcp.NewSourceServer).
	dir3 = sourceDirection{name: "3_istio-sink-client_meshfed-SourceServer", istioMode: "sink-client"}
	// dir4: Istio's ResourceSink server; meshfed's Source dials it (Source.PushTo).
	dir4 = sourceDirection{name: "4_istio-sink-server_meshfed-PushTo", istioMode: "sink-server"}

	sourceDirections = []sourceDirection{dir3, dir4}
)

// sourceVariant is a direction and whether Istio's sink asks for incremental pushes.
type sourceVariant struct {
	dir         sourceDirection
	incremental bool
}

func (v sourceVariant) String() string {
	if v.incremental {
		return v.dir.name + "/incremental"
	}
	return v.dir.name + "/full-state"
}

func sourceVariants() []sourceVariant {
	var out []sourceVariant
	for _, d := range sourceDirections {
		out = append(out, sourceVariant{d, false}, sourceVariant{d, true})
	}
	return out
}

// sourceSetup is one meshfed Source over an mcp.Cache connected to one Istio sink process.
type sourceSetup struct {
	t      *testing.T
	v      sourceVariant
	cache  *mcp.Cache
	src    *mcp.Source
	rec    *streamRecorder
	reg    *prometheus.Registry
	istio  *istioPeer
	server *meshfedServer // dir3 only
}

type sourceOpts struct {
	// collections Istio's sink requests; default collA and collB (the ones the cache serves).
	collections []string
	// initial is put into the cache before the two sides connect.
	initial map[string]state
}

func newSourceSetup(t *testing.T, v sourceVariant, o sourceOpts) *sourceSetup {
	t.Helper()
	s := &sourceSetup{t: t, v: v, cache: mcp.NewCache(collA, collB), rec: &streamRecorder{}, reg: prometheus.NewRegistry()}
	for coll, st := range o.initial {
		s.cache.Replace(coll, entries(t, st))
	}
	log := testLogger(t, "meshfed source: ")
	metrics := mcp.NewMetrics(s.reg)
	src, err := mcp.NewSource(mcp.SourceOptions{Watcher: s.cache, Logger: log, Metrics: metrics, Hooks: s.rec.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	s.src = src
	if o.collections == nil {
		o.collections = []string{collA, collB}
	}
	cfg := peerConfig{mode: v.dir.istioMode, collections: o.collections, incremental: v.incremental}
	switch v.dir {
	case dir3:
		s.server = startMeshfedServer(t, func(g *grpc.Server) {
			mcp.NewSourceServer(src, mcp.ServerConfig{Logger: log, Metrics: metrics}).Register(g)
		})
		cfg.addr = s.server.addr
		s.istio = startPeer(t, cfg)
	case dir4:
		cfg.addr = "127.0.0.1:0"
		s.istio = startPeer(t, cfg)
		cc := dial(t, s.istio.addr)
		runLoop(t, log, "Source.PushTo", func(ctx context.Context) error { return src.PushTo(ctx, cc) })
	}
	return s
}

func (s *sourceSetup) checkOneStream() {
	s.t.Helper()
	if opened, closed := s.rec.streams(); opened != 1 || len(closed) != 0 {
		s.t.Errorf("meshfed source streams: opened %d, closed %v; want 1 open stream", opened, closed)
	}
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
	t.Parallel()
	for _, v := range sourceVariants() {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			s := newSourceSetup(t, v, sourceOpts{initial: map[string]state{collA: vsV1, collB: drV1}})
			s.istio.waitSinkState(collA, vsV1)
			s.istio.waitSinkState(collB, drV1)

			s.cache.Replace(collA, entries(t, vsV2))
			s.cache.Replace(collB, entries(t, drV2))
			s.istio.waitSinkState(collA, vsV2)
			s.istio.waitSinkState(collB, drV2)

			// Everything may be deleted: an empty state is pushed and applied too.
			s.cache.Replace(collB, nil)
			s.istio.waitSinkState(collB, state{})

			s.checkKinds(collA, collB)
			if v.dir == dir4 {
				// Istio's sink server NACKs the trigger PushTo opens with; the source ignores it.
				if got := metric(t, s.reg, "meshfed_mcp_ignored_messages_total", map[string]string{"reason": "trigger"}); got != 1 {
					t.Errorf("ignored trigger NACKs = %v, want 1", got)
				}
			}
			for _, c := range []string{collA, collB} {
				for _, a := range s.rec.acksFor(c) {
					if a.Code != codes.OK {
						t.Errorf("Istio sink answered %s version %d with %v %q, want only ACKs", c, a.Version, a.Code, a.Message)
					}
				}
			}
			s.checkOneStream()
		})
	}
}

// TestSourceIstioNACKNotResent: Istio's sink NACKs a push whose body type gogo's registry
// does not know (before applying anything). meshfed's source does not resend that version:
// it is pushed exactly once, the other collection keeps flowing, and the next version is
// pushed and applied. For an incremental sink the push after the NACK is still incremental
// (Istio's NACK requests do not carry the incremental flag).
func TestSourceIstioNACKNotResent(t *testing.T) {
	t.Parallel()
	for _, v := range sourceVariants() {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			s := newSourceSetup(t, v, sourceOpts{initial: map[string]state{collA: vsV1, collB: drV1}})
			s.istio.waitSinkState(collA, vsV1)
			s.istio.waitSinkState(collB, drV1)
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
			if got := metric(t, s.reg, "meshfed_mcp_nacks_total", map[string]string{"role": "source", "collection": collA}); got != 1 {
				t.Errorf("source NACKs for %s = %v, want 1", collA, got)
			}
			s.checkKinds(collA, collB)
			if v.incremental {
				applied := s.istio.applied(collA)
				last := applied[len(applied)-1]
				if fmt.Sprint(last.state()) != fmt.Sprint(state{"default/details": {"2", "vs details v2"}}) || len(last.Removed) != 0 {
					t.Errorf("push after the NACK = %v, want incremental with only default/details@2", last)
				}
			}
			s.checkOneStream()
		})
	}
}

// TestSourceCoalescesBurst: while a push of a collection is outstanding, 50 more changes
// (updates and a deletion) happen. meshfed's source sends exactly one more push, carrying all
// of them, and Istio's sink ends on the latest state. To make "while outstanding"
// deterministic the source stream is held inside its Pushed hook (on the stream's own
// goroutine) right after the first push until the burst is done.
func TestSourceCoalescesBurst(t *testing.T) {
	t.Parallel()
	for _, v := range sourceVariants() {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			s := newSourceSetup(t, v, sourceOpts{initial: map[string]state{collA: vsV1, collB: drV1}})
			s.istio.waitSinkState(collA, vsV1)
			s.istio.waitSinkState(collB, drV1)
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
}

// TestSourceUnservedCollection: Istio's sink requests a collection meshfed's cache does not
// serve. It gets one empty full state (which it applies and ACKs), the stream stays up, and
// the served collections keep flowing.
func TestSourceUnservedCollection(t *testing.T) {
	t.Parallel()
	for _, v := range sourceVariants() {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			s := newSourceSetup(t, v, sourceOpts{
				collections: []string{collA, collB, collX},
				initial:     map[string]state{collA: vsV1, collB: drV1},
			})
			s.istio.waitSinkState(collA, vsV1)
			s.istio.waitSinkState(collB, drV1)
			waitUntil(t, "Istio sink to apply an empty state of "+collX, func() (bool, string) {
				return len(s.istio.applied(collX)) > 0, s.istio.describe()
			})

			s.cache.Replace(collA, entries(t, vsV2))
			s.cache.Replace(collB, entries(t, drV2))
			s.istio.waitSinkState(collA, vsV2)
			s.istio.waitSinkState(collB, drV2)

			if x := s.istio.applied(collX); len(x) != 1 || x[0].Incremental || len(x[0].Resources) != 0 || len(x[0].Removed) != 0 {
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
			if got := metric(t, s.reg, "meshfed_mcp_ignored_messages_total", map[string]string{"reason": "unknown_collection"}); got != 1 {
				t.Errorf("ignored unknown_collection = %v, want 1", got)
			}
			s.checkKinds(collA, collB)
			s.checkOneStream()
		})
	}
}

// TestSourceIncremental: Istio's sink asks for incremental pushes. It gets full state first
// (it declared nothing), then pushes with incremental=true carrying only the changed
// resources and the removed names, which it applies to the same state meshfed holds.
func TestSourceIncremental(t *testing.T) {
	t.Parallel()
	for _, dir := range sourceDirections {
		t.Run(dir.name, func(t *testing.T) {
			t.Parallel()
			s := newSourceSetup(t, sourceVariant{dir, true}, sourceOpts{initial: map[string]state{collA: vsV1, collB: drV1}})
			s.istio.waitSinkState(collA, vsV1)
			s.istio.waitSinkState(collB, drV1)

			check := func(coll string, wantRes state, wantRemoved string) {
				t.Helper()
				applied := s.istio.applied(coll)
				last := applied[len(applied)-1]
				if !last.Incremental || !last.state().equal(wantRes) || fmt.Sprint(last.Removed) != wantRemoved {
					t.Errorf("last push of %s = %v, want incremental with resources %v and removed %s", coll, last, wantRes, wantRemoved)
				}
			}
			// reviews changed, ratings deleted, details added.
			s.cache.Update(collA, entries(t, vsV2), []string{"default/ratings"})
			s.istio.waitSinkState(collA, vsV2)
			check(collA, state{"default/reviews": vsV2["default/reviews"], "default/details": vsV2["default/details"]}, "[default/ratings]")

			s.cache.Remove(collB, "default/ratings")
			s.istio.waitSinkState(collB, drV2)
			check(collB, state{}, "[default/ratings]")

			s.cache.Put(collB, newEntry(t, "default/details", "1", "dr details v1"))
			s.istio.waitSinkState(collB, drV3)
			check(collB, state{"default/details": drV3["default/details"]}, "[]")

			for _, p := range s.rec.pushesFor(collA)[1:] {
				if !p.Incremental {
					t.Errorf("meshfed pushed %s version %d as full state, want incremental", collA, p.Version)
				}
			}
			s.checkKinds(collA, collB)
			s.checkOneStream()
		})
	}
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
	t.Parallel()
	for _, v := range sourceVariants() {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			s := newSourceSetup(t, v, sourceOpts{initial: map[string]state{collA: vsV1, collB: drV1}})
			s.istio.waitSinkState(collA, vsV1)
			s.istio.waitSinkState(collB, drV1)

			if v.dir == dir3 {
				appliedBefore := len(s.istio.applied(collA))
				s.server.stop()
				s.cache.Replace(collA, entries(t, vsV2))
				s.server.start()
				s.istio.waitSinkState(collA, vsV2)
				s.istio.waitSinkState(collB, drV1)
				if opened, _ := s.rec.streams(); opened < 2 {
					t.Errorf("meshfed source streams opened = %d, want a second one after the restart", opened)
				}
				resumed := s.istio.applied(collA)[appliedBefore]
				if v.incremental {
					wantRes := state{"default/reviews": vsV2["default/reviews"], "default/details": vsV2["default/details"]}
					if !resumed.Incremental || !resumed.state().equal(wantRes) || fmt.Sprint(resumed.Removed) != "[default/ratings]" {
						t.Errorf("first push of %s after the restart = %v, want the difference from the declared versions: incremental, %v, removed [default/ratings]",
							collA, resumed, wantRes)
					}
				} else if resumed.Incremental || !resumed.state().equal(vsV2) {
					t.Errorf("first push of %s after the restart = %v, want full state %v", collA, resumed, vsV2)
				}
			}

			opened, _ := s.rec.streams()
			s.istio.kill()
			s.cache.Replace(collA, entries(t, vsV3))
			s.cache.Replace(collB, entries(t, drV3))
			s.istio = s.istio.restart()
			s.istio.waitSinkState(collA, vsV3)
			s.istio.waitSinkState(collB, drV3)
			if now, _ := s.rec.streams(); now <= opened {
				t.Errorf("meshfed source streams opened = %d, want more than %d after the Istio restart", now, opened)
			}
			for _, c := range []string{collA, collB} {
				if a := s.istio.applied(c); a[0].Incremental || !a[0].state().equal(map[string]state{collA: vsV3, collB: drV3}[c]) {
					t.Errorf("first push of %s to the restarted Istio sink = %v, want full state", c, a[0])
				}
			}
		})
	}
}
