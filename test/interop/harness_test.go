package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/mcp"
)

// TestMain fails the run if any goroutine (gRPC, stream, process reader) outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	// waitTimeout bounds every wait. Tests never assert durations; this only turns a hang
	// into a failure with a description of what was missing.
	waitTimeout  = 20 * time.Second
	pollInterval = 5 * time.Millisecond
	// redialDelay is how long meshfed's client loops pause between streams, as a product
	// caller's backoff would.
	redialDelay = 20 * time.Millisecond

	collA = "istio/networking/v1alpha3/virtualservices"
	collB = "istio/networking/v1alpha3/destinationrules"
	// collX is requested by Istio's sinks but not served by meshfed's source.
	collX = "istio/networking/v1alpha3/gateways"
)

// ---- resources and states ----

// res is one resource as both implementations see it: metadata.version and the value of its
// google.protobuf.StringValue body.
type res struct{ version, value string }

// state is a collection's content by metadata.name.
type state map[string]res

func (s state) String() string {
	names := slices.Sorted(maps.Keys(s))
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s@%s=%q", n, s[n].version, s[n].value))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func (s state) equal(o state) bool { return maps.Equal(s, o) }

// newEntry builds a meshfed Entry with a StringValue body, the only body type both sides
// (Istio through gogo's registry) can decode.
func newEntry(t testing.TB, name, version, value string) *mcp.Entry {
	t.Helper()
	body, err := anypb.New(wrapperspb.String(value))
	if err != nil {
		t.Fatal(err)
	}
	return newEntryWithBody(t, name, version, body)
}

func newEntryWithBody(t testing.TB, name, version string, body *anypb.Any) *mcp.Entry {
	t.Helper()
	e, err := mcp.NewEntry(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: version}, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func entries(t testing.TB, s state) []*mcp.Entry {
	t.Helper()
	out := make([]*mcp.Entry, 0, len(s))
	for _, n := range slices.Sorted(maps.Keys(s)) {
		out = append(out, newEntry(t, n, s[n].version, s[n].value))
	}
	return out
}

// Some states of the two collections used throughout. Every scenario starts from vsV1 and
// drV1.
var (
	vsV1 = state{"default/reviews": {"1", "vs reviews v1"}, "default/ratings": {"1", "vs ratings v1"}}
	// vsV2 updates reviews, deletes ratings and adds details.
	vsV2 = state{"default/reviews": {"2", "vs reviews v2"}, "default/details": {"1", "vs details v1"}}
	// vsV3 updates details and adds productpage.
	vsV3 = state{"default/reviews": {"2", "vs reviews v2"}, "default/details": {"2", "vs details v2"}, "default/productpage": {"1", "vs productpage v1"}}
	drV1 = state{"default/reviews": {"1", "dr reviews v1"}, "default/ratings": {"1", "dr ratings v1"}}
	// drV2 deletes ratings.
	drV2 = state{"default/reviews": {"1", "dr reviews v1"}}
	// drV3 adds details.
	drV3 = state{"default/reviews": {"1", "dr reviews v1"}, "default/details": {"1", "dr details v1"}}
)

// push is what one Resources message gave a sink to apply, in the same terms whichever side
// recorded it (meshfed's Applier or Istio's applied event), so one check serves both.
type push struct {
	incremental bool
	resources   state
	removed     []string // compared in order; nil and empty are equal
}

func fullState(s state) push { return push{resources: s} }

func incrementalPush(s state, removed ...string) push {
	return push{incremental: true, resources: s, removed: removed}
}

func (p push) equal(o push) bool {
	return p.incremental == o.incremental && p.resources.equal(o.resources) && slices.Equal(p.removed, o.removed)
}

func (p push) String() string {
	kind := "full state"
	if p.incremental {
		kind = "incremental"
	}
	return fmt.Sprintf("%s resources=%v removed=%v", kind, p.resources, p.removed)
}

// checkPush reports a push that is not want; what names the push (and why want is expected
// where that is not obvious).
func checkPush(t testing.TB, what string, got, want push) {
	t.Helper()
	if !got.equal(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// inCollection returns, in order, the items of xs that belong to collection (read by coll).
func inCollection[T any](xs []T, collection string, coll func(T) string) []T {
	var out []T
	for _, x := range xs {
		if coll(x) == collection {
			out = append(out, x)
		}
	}
	return out
}

// lastOf returns the last of xs, failing the test (instead of panicking) if there is none.
func lastOf[T any](t testing.TB, what string, xs []T) T {
	t.Helper()
	if len(xs) == 0 {
		t.Fatalf("no %s", what)
	}
	return xs[len(xs)-1]
}

// ---- waiting ----

// waitUntil polls cond until it holds, failing the test after waitTimeout with cond's last
// description of what it saw.
func waitUntil(t testing.TB, what string, cond func() (ok bool, saw string)) {
	t.Helper()
	waitUntilFor(t, waitTimeout, what, cond)
}

// waitUntilFor is waitUntil with a timeout of d, for what takes the peer's own delays.
func waitUntilFor(t testing.TB, d time.Duration, what string, cond func() (ok bool, saw string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last seen: %s", d, what, saw)
		}
		time.Sleep(pollInterval)
	}
}

// waitChan waits for ch to be closed or to deliver.
func waitChan[T any](t testing.TB, what string, ch <-chan T) {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
	}
}

// ---- logging ----

// testLogger is meshfed's logger for one test (MESHFED_TEST_DEBUG=1 for debug level).
func testLogger(t testing.TB, prefix string) *slog.Logger {
	if prefix == "" {
		return testlog.New(t)
	}
	return testlog.New(t).With("side", strings.TrimSuffix(prefix, ": "))
}

// ---- the Istio peer process ----

// peerResource, peerEvent and peerCommand are istio-mcp-peer's stdout and stdin JSON
// (test/istio/README.md).
type peerResource struct {
	Name    string   `json:"name"`
	Version string   `json:"version"`
	Value   string   `json:"value"`
	Body    *peerAny `json:"body,omitempty"`
}

// peerAny is a body the peer serves as it is (a real Istio spec).
type peerAny struct {
	TypeURL string `json:"typeUrl"`
	Value   []byte `json:"value"`
}

type peerEvent struct {
	Event       string         `json:"event"`
	Addr        string         `json:"addr"`
	Collection  string         `json:"collection"`
	Incremental bool           `json:"incremental"`
	Resources   []peerResource `json:"resources"`
	Removed     []string       `json:"removed"`
	Message     string         `json:"message"`
}

func (e peerEvent) state() state {
	s := state{}
	for _, r := range e.Resources {
		s[r.Name] = res{r.Version, r.Value}
	}
	return s
}

func (e peerEvent) push() push { return push{e.Incremental, e.state(), e.Removed} }

func (e peerEvent) String() string {
	if e.Event != "applied" {
		var parts []string
		for _, f := range []string{e.Addr, e.Collection, e.Message} {
			if f != "" {
				parts = append(parts, f)
			}
		}
		return e.Event + "(" + strings.Join(parts, " ") + ")"
	}
	return fmt.Sprintf("applied(%s incremental=%v resources=%v removed=%v)", e.Collection, e.Incremental, e.state(), e.Removed)
}

type peerCommand struct {
	Op         string         `json:"op"`
	Collection string         `json:"collection"`
	Version    string         `json:"version"`
	Resources  []peerResource `json:"resources"`
}

type peerConfig struct {
	mode        string // source-server, source-client, sink-server, sink-client
	addr        string // listen (servers; 127.0.0.1:0 first) or dial (clients)
	collections []string
	incremental bool
	meta        string // client modes: gRPC metadata key=value,... (-meta)
}

// istioPeer is one istio-mcp-peer process. A restart is a new istioPeer.
type istioPeer struct {
	t        testing.TB
	cfg      peerConfig
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	cancel   context.CancelFunc
	readDone chan struct{}
	killOnce sync.Once

	// addr is the bound address (server modes) or the dialed one (client modes).
	addr string

	mu      sync.Mutex
	events  []peerEvent
	badLine []string // stdout lines that are not JSON events
	killed  bool     // kill was requested: the process ending is expected
	eof     bool     // stdout ended: the process is gone or going
}

// startPeer starts istio-mcp-peer and waits for its listening or dialing event. The process
// is SIGKILLed and awaited when the test ends (or earlier, by kill).
func startPeer(t testing.TB, cfg peerConfig) *istioPeer {
	t.Helper()
	bin := testbin.Require(t, "istio-mcp-peer")
	args := []string{"-mode", cfg.mode, "-addr", cfg.addr, "-collections", strings.Join(cfg.collections, ",")}
	if cfg.meta != "" {
		args = append(args, "-meta", cfg.meta)
	}
	if cfg.incremental {
		args = append(args, "-incremental")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	cmd.Stderr = testlog.Writer(t, "istio "+cfg.mode+": ")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting %s %v: %v", bin, args, err)
	}
	p := &istioPeer{t: t, cfg: cfg, cmd: cmd, stdin: stdin, cancel: cancel, readDone: make(chan struct{})}
	go p.read(stdout)
	t.Cleanup(p.kill)
	t.Logf("started istio-mcp-peer (pid %d) %s", cmd.Process.Pid, strings.Join(args, " "))

	want := "dialing"
	if strings.HasSuffix(cfg.mode, "-server") {
		want = "listening"
	}
	waitUntil(t, "istio-mcp-peer's "+want+" event", func() (bool, string) {
		p.failIfEnded()
		for _, e := range p.all() {
			if e.Event == want {
				p.addr = e.Addr
				return true, ""
			}
		}
		return false, p.describe()
	})
	return p
}

func (p *istioPeer) read(stdout io.Reader) {
	defer close(p.readDone)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var e peerEvent
		err := json.Unmarshal(sc.Bytes(), &e)
		p.mu.Lock()
		if err != nil || e.Event == "" {
			p.badLine = append(p.badLine, sc.Text())
		} else {
			p.events = append(p.events, e)
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.eof = true
	p.mu.Unlock()
}

// kill SIGKILLs the process and waits for it and its output. It reports a process that had
// ended on its own, error events and unparsable output as test errors.
func (p *istioPeer) kill() {
	p.killOnce.Do(func() {
		p.mu.Lock()
		endedEarly := p.eof
		p.killed = true
		p.mu.Unlock()
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.readDone
		err := p.cmd.Wait()
		p.cancel()
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && !ws.Signaled() {
			endedEarly = true
		}
		if endedEarly {
			p.t.Errorf("istio-mcp-peer %s ended before the test killed it: %v", p.cfg.mode, err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.events {
			if e.Event == "error" {
				p.t.Errorf("istio-mcp-peer %s reported an error: %s", p.cfg.mode, e.Message)
			}
		}
		if len(p.badLine) > 0 {
			p.t.Errorf("istio-mcp-peer %s wrote non-event stdout lines: %q", p.cfg.mode, p.badLine)
		}
	})
}

// restart SIGKILLs the process and starts a new one with the same configuration; a server
// listens again on the address the first one was given by the kernel.
func (p *istioPeer) restart() *istioPeer {
	p.t.Helper()
	p.kill()
	cfg := p.cfg
	cfg.addr = p.addr
	return startPeer(p.t, cfg)
}

// failIfEnded fails the test at once if the process ended without being killed (for
// example because it could not listen).
func (p *istioPeer) failIfEnded() {
	p.t.Helper()
	p.mu.Lock()
	ended := p.eof && !p.killed
	p.mu.Unlock()
	if ended {
		<-p.readDone
		p.t.Fatalf("istio-mcp-peer %s ended unexpectedly; events: %s", p.cfg.mode, p.describe())
	}
}

func (p *istioPeer) all() []peerEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

func (p *istioPeer) describe() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	if p.eof && !p.killed {
		b.WriteString("[process ended] ")
	}
	start := max(0, len(p.events)-20)
	for _, e := range p.events[start:] {
		b.WriteString(e.String())
		b.WriteString("; ")
	}
	return b.String()
}

// set replaces a collection's state in an Istio source at snapshot version and waits until
// the peer confirms it.
func (p *istioPeer) set(collection, version string, s state) {
	p.t.Helper()
	cmd := peerCommand{Op: "set", Collection: collection, Version: version, Resources: []peerResource{}}
	for _, n := range slices.Sorted(maps.Keys(s)) {
		cmd.Resources = append(cmd.Resources, peerResource{Name: n, Version: s[n].version, Value: s[n].value})
	}
	p.send(cmd)
}

// setSpecs replaces collection's full state at version with real specs, by name; every
// resource is at version "1" unless its name has "@v" (ns/name@2).
func (p *istioPeer) setSpecs(collection, version string, specs map[string]proto.Message) {
	p.t.Helper()
	cmd := peerCommand{Op: "set", Collection: collection, Version: version, Resources: []peerResource{}}
	for _, n := range slices.Sorted(maps.Keys(specs)) {
		body, err := anypb.New(specs[n])
		if err != nil {
			p.t.Fatal(err)
		}
		name, v, ok := strings.Cut(n, "@")
		if !ok {
			v = "1"
		}
		cmd.Resources = append(cmd.Resources, peerResource{Name: name, Version: v, Body: &peerAny{TypeURL: body.TypeUrl, Value: body.Value}})
	}
	p.send(cmd)
}

// send writes a set command and waits for the peer to confirm it.
func (p *istioPeer) send(cmd peerCommand) {
	p.t.Helper()
	collection, version := cmd.Collection, cmd.Version
	count := func() int {
		n := 0
		for _, e := range p.all() {
			if e.Event == "set" && e.Collection == collection {
				n++
			}
		}
		return n
	}
	before := count()
	line, err := json.Marshal(cmd)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		p.t.Fatalf("writing to istio-mcp-peer: %v", err)
	}
	waitUntil(p.t, fmt.Sprintf("istio-mcp-peer to confirm set %s@%s", collection, version), func() (bool, string) {
		p.failIfEnded()
		return count() > before, p.describe()
	})
}

// applied returns an Istio sink's applied events for a collection, in order.
func (p *istioPeer) applied(collection string) []peerEvent {
	var out []peerEvent
	for _, e := range p.all() {
		if e.Event == "applied" && e.Collection == collection {
			out = append(out, e)
		}
	}
	return out
}

// lastApplied returns what an Istio sink applied last for a collection.
func (p *istioPeer) lastApplied(collection string) push {
	p.t.Helper()
	return lastOf(p.t, "push of "+collection+" applied by Istio's sink", p.applied(collection)).push()
}

// sinkState replays an Istio sink's applied events for a collection (full state replaces,
// incremental adds, updates and removes) into the state that sink holds.
func (p *istioPeer) sinkState(collection string) (s state, pushes int) {
	applied := p.applied(collection)
	return replay(applied), len(applied)
}

func replay(events []peerEvent) state {
	s := state{}
	for _, e := range events {
		if !e.Incremental {
			s = state{}
		}
		maps.Copy(s, e.state())
		for _, n := range e.Removed {
			delete(s, n)
		}
	}
	return s
}

// waitSinkState waits until the Istio sink holds want for collection.
func (p *istioPeer) waitSinkState(collection string, want state) {
	p.t.Helper()
	waitUntil(p.t, fmt.Sprintf("Istio sink to hold %s = %v", collection, want), func() (bool, string) {
		got, n := p.sinkState(collection)
		return got.equal(want), fmt.Sprintf("%v after %d pushes; events: %s", got, n, p.describe())
	})
}

// ---- meshfed's sink side: a recording Applier ----

// applyCall is one Applier.Apply call.
type applyCall struct {
	collection  string
	version     string // SystemVersionInfo
	incremental bool
	resources   state
	removed     []string
	err         error // non-nil: the push was NACKed
}

func (c applyCall) push() push { return push{c.incremental, c.resources, c.removed} }

func (c applyCall) String() string {
	s := fmt.Sprintf("%s@%s incremental=%v resources=%v removed=%v", c.collection, c.version, c.incremental, c.resources, c.removed)
	if c.err != nil {
		s += " NACK(" + c.err.Error() + ")"
	}
	return s
}

// recordingApplier is meshfed's Applier in these tests: it keeps every call and the state
// the sink holds, and NACKs what reject refuses.
type recordingApplier struct {
	reject func(c *mcp.Change) error // optional; set before the sink starts

	mu    sync.Mutex
	calls []applyCall
	state map[string]state
}

func newRecordingApplier(reject func(c *mcp.Change) error) *recordingApplier {
	return &recordingApplier{reject: reject, state: make(map[string]state)}
}

func (a *recordingApplier) Apply(_ context.Context, c *mcp.Change) error {
	call := applyCall{collection: c.Collection, version: c.SystemVersionInfo, incremental: c.Incremental, resources: state{}, removed: slices.Clone(c.Removed)}
	var err error
	for _, r := range c.Resources {
		var sv wrapperspb.StringValue
		if uerr := r.GetBody().UnmarshalTo(&sv); uerr != nil {
			err = fmt.Errorf("resource %s: body is not a StringValue: %w", r.GetMetadata().GetName(), uerr)
			break
		}
		call.resources[r.GetMetadata().GetName()] = res{r.GetMetadata().GetVersion(), sv.GetValue()}
	}
	if err == nil && a.reject != nil {
		err = a.reject(c)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	call.err = err
	a.calls = append(a.calls, call)
	if err != nil {
		return err
	}
	s := a.state[c.Collection]
	if !c.Incremental || s == nil {
		s = state{}
	}
	maps.Copy(s, call.resources)
	for _, n := range c.Removed {
		delete(s, n)
	}
	a.state[c.Collection] = s
	return nil
}

func (a *recordingApplier) collectionState(collection string) state {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.state[collection])
}

// callsFor returns the Apply calls for a collection, in order.
func (a *recordingApplier) callsFor(collection string) []applyCall {
	return inCollection(a.allCalls(), collection, func(c applyCall) string { return c.collection })
}

// lastCall returns the last Apply call for a collection.
func (a *recordingApplier) lastCall(t testing.TB, collection string) applyCall {
	t.Helper()
	return lastOf(t, "Apply call for "+collection, a.callsFor(collection))
}

func (a *recordingApplier) allCalls() []applyCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

func (a *recordingApplier) waitState(t testing.TB, collection string, want state) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("meshfed sink to hold %s = %v", collection, want), func() (bool, string) {
		got := a.collectionState(collection)
		return got.equal(want), fmt.Sprintf("%v; calls: %v", got, a.callsFor(collection))
	})
}

// ---- meshfed stream observation ----

// streamRecorder records meshfed's stream hooks. It can also hold a source stream right
// after one push (a gate), to make coalescing deterministic.
type streamRecorder struct {
	mu       sync.Mutex
	opened   int
	closed   []error
	pushes   []mcp.PushEvent
	acks     []mcp.AckEvent
	gate     *pushGate
	gateTest testing.TB
}

// pushGate holds the source stream inside its Pushed hook (which runs on the stream's own
// goroutine) after the next push of collection, until released.
type pushGate struct {
	collection string
	reached    chan struct{}
	release    chan struct{}
	once       sync.Once
}

func (g *pushGate) open() { g.once.Do(func() { close(g.release) }) }

func (r *streamRecorder) hooks() mcp.Hooks {
	return mcp.Hooks{
		StreamOpened: func(*mcp.StreamInfo) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.opened++
		},
		StreamClosed: func(_ *mcp.StreamInfo, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.closed = append(r.closed, err)
		},
		Pushed: func(_ *mcp.StreamInfo, e mcp.PushEvent) {
			r.mu.Lock()
			r.pushes = append(r.pushes, e)
			g := r.gate
			if g != nil && g.collection == e.Collection {
				r.gate = nil
			} else {
				g = nil
			}
			r.mu.Unlock()
			if g != nil {
				close(g.reached)
				<-g.release
			}
		},
		Acked: func(_ *mcp.StreamInfo, e mcp.AckEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.acks = append(r.acks, e)
		},
	}
}

// armGate makes the next push of collection wait in the hook until the gate is opened. The
// gate is opened when the test ends at the latest.
func (r *streamRecorder) armGate(t testing.TB, collection string) *pushGate {
	g := &pushGate{collection: collection, reached: make(chan struct{}), release: make(chan struct{})}
	r.mu.Lock()
	r.gate = g
	r.mu.Unlock()
	t.Cleanup(g.open)
	return g
}

func (r *streamRecorder) streams() (opened int, closed []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.opened, slices.Clone(r.closed)
}

func (r *streamRecorder) pushesFor(collection string) []mcp.PushEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return inCollection(r.pushes, collection, func(p mcp.PushEvent) string { return p.Collection })
}

func (r *streamRecorder) acksFor(collection string) []mcp.AckEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return inCollection(r.acks, collection, func(a mcp.AckEvent) string { return a.Collection })
}

// metric sums the series of a counter or gauge family whose labels include want.
func metric(t testing.TB, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	return promtest.Sum(t, reg, name, want)
}

// ---- meshfed's gRPC plumbing ----

// meshfedServer is a gRPC server with meshfed's MCP options on 127.0.0.1, restartable on the
// same address.
type meshfedServer struct {
	t        testing.TB
	register func(*grpc.Server)
	addr     string

	mu   sync.Mutex
	srv  *grpc.Server
	done chan struct{}
}

func startMeshfedServer(t testing.TB, register func(*grpc.Server)) *meshfedServer {
	t.Helper()
	s := &meshfedServer{t: t, register: register, addr: "127.0.0.1:0"}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *meshfedServer) start() {
	s.t.Helper()
	var lis net.Listener
	// The address is free again once the previous server stopped; retry briefly in case
	// the kernel has not released it yet.
	waitUntil(s.t, "listening on "+s.addr, func() (bool, string) {
		var err error
		lis, err = net.Listen("tcp", s.addr)
		if err != nil && !errors.Is(err, syscall.EADDRINUSE) {
			s.t.Fatalf("listen %s: %v", s.addr, err)
		}
		return err == nil, fmt.Sprint(err)
	})
	s.addr = lis.Addr().String()
	srv := grpc.NewServer(mcp.ServerOptions()...)
	s.register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	s.mu.Lock()
	s.srv, s.done = srv, done
	s.mu.Unlock()
}

// stop stops the server (closing its listener and every stream); it may be started again.
func (s *meshfedServer) stop() {
	s.mu.Lock()
	srv, done := s.srv, s.done
	s.srv, s.done = nil, nil
	s.mu.Unlock()
	if srv != nil {
		srv.Stop()
		<-done
	}
}

func (s *meshfedServer) restart() {
	s.t.Helper()
	s.stop()
	s.start()
}

// dial returns a client connection to addr, closed when the test ends. Its reconnect backoff
// is short so a restarted peer is found quickly.
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// runLoop runs fn (a PullFrom or PushTo) again each time it returns, as a product caller
// redials, until the test ends; it then cancels fn and waits for it.
func runLoop(t testing.TB, log *slog.Logger, what string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			err := fn(ctx)
			if ctx.Err() != nil {
				return
			}
			log.Info(what+" ended; redialing", "err", err)
			timer := time.NewTimer(redialDelay)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// ---- directions ----

// direction is one of the four ways Istio's peer and meshfed's engine are connected (see the
// package comment).
type direction struct {
	name      string // the subtest name: number, Istio's side, meshfed's side
	istioMode string // the Istio peer's -mode
}

var (
	// dir1: Istio's ResourceSource server; meshfed's Sink dials it (Sink.PullFrom).
	dir1 = direction{name: "1_istio-source-server_meshfed-PullFrom", istioMode: "source-server"}
	// dir2: Istio's source dials meshfed's ResourceSink server (mcp.NewSinkServer).
	dir2 = direction{name: "2_istio-source-client_meshfed-SinkServer", istioMode: "source-client"}
	// dir3: Istio's sink dials meshfed's ResourceSource server (mcp.NewSourceServer).
	dir3 = direction{name: "3_istio-sink-client_meshfed-SourceServer", istioMode: "sink-client"}
	// dir4: Istio's ResourceSink server; meshfed's Source dials it (Source.PushTo).
	dir4 = direction{name: "4_istio-sink-server_meshfed-PushTo", istioMode: "sink-server"}

	// sinkDirections have Istio as the source and meshfed as the sink (sink_test.go),
	// sourceDirections the reverse (source_test.go).
	sinkDirections   = []direction{dir1, dir2}
	sourceDirections = []direction{dir3, dir4}
)

// meshfedServes reports whether meshfed runs the gRPC server (Istio's process dials it)
// rather than dialing Istio's.
func (d direction) meshfedServes() bool { return strings.HasSuffix(d.istioMode, "-client") }

// variant is a direction and whether Istio's peer runs with -incremental: a source then
// allows incremental pushes, a sink asks for them.
type variant struct {
	dir         direction
	incremental bool
}

func (v variant) String() string {
	if v.incremental {
		return v.dir.name + "/incremental"
	}
	return v.dir.name + "/full-state"
}

// forEachDirection runs body once per direction, as parallel subtests named after the
// direction; t itself runs in parallel too.
func forEachDirection(t *testing.T, dirs []direction, body func(t *testing.T, dir direction)) {
	t.Parallel()
	for _, d := range dirs {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			body(t, d)
		})
	}
}

// forEachVariant runs body once per direction with full-state and once with incremental
// pushes, as parallel subtests named "<direction>/full-state" and "<direction>/incremental";
// t itself runs in parallel too.
func forEachVariant(t *testing.T, dirs []direction, body func(t *testing.T, v variant)) {
	t.Parallel()
	for _, d := range dirs {
		for _, v := range []variant{{d, false}, {d, true}} {
			t.Run(v.String(), func(t *testing.T) {
				t.Parallel()
				body(t, v)
			})
		}
	}
}

// ---- one Istio process connected to meshfed's engine ----

// pair is what every scenario has whichever way the two sides are connected: the Istio
// process, meshfed's stream recorder, metrics and logger, and meshfed's server in the
// directions where meshfed serves. sinkSetup and sourceSetup add meshfed's engine.
type pair struct {
	t       *testing.T
	v       variant
	side    string // meshfed's role, "meshfed sink" or "meshfed source", for logs and errors
	log     *slog.Logger
	rec     *streamRecorder
	reg     *prometheus.Registry
	metrics *mcp.Metrics
	istio   *istioPeer
	server  *meshfedServer // nil unless v.dir.meshfedServes()
}

func newPair(t *testing.T, v variant, side string) *pair {
	reg := prometheus.NewRegistry()
	return &pair{t: t, v: v, side: side, log: testLogger(t, side+": "), rec: &streamRecorder{}, reg: reg, metrics: mcp.NewMetrics(reg)}
}

// connect starts Istio's peer for collections and connects meshfed's engine to it the way
// the direction says: either register puts meshfed's service on a new meshfed server that
// Istio's process dials, or Istio's process listens and call (named what: PullFrom or
// PushTo) runs over a connection to it in a redial loop until the test ends.
func (p *pair) connect(collections []string, register func(*grpc.Server), what string, call func(context.Context, grpc.ClientConnInterface) error) {
	p.t.Helper()
	cfg := peerConfig{mode: p.v.dir.istioMode, collections: collections, incremental: p.v.incremental}
	if p.v.dir.meshfedServes() {
		p.server = startMeshfedServer(p.t, register)
		cfg.addr = p.server.addr
		p.istio = startPeer(p.t, cfg)
		return
	}
	cfg.addr = "127.0.0.1:0"
	p.istio = startPeer(p.t, cfg)
	cc := dial(p.t, p.istio.addr)
	runLoop(p.t, p.log, what, func(ctx context.Context) error { return call(ctx, cc) })
}

// checkOneStream checks that everything so far went over a single stream that is still up.
func (p *pair) checkOneStream() {
	p.t.Helper()
	if opened, closed := p.rec.streams(); opened != 1 || len(closed) != 0 {
		p.t.Errorf("%s streams: opened %d, closed %v; want 1 open stream", p.side, opened, closed)
	}
}

// checkNewStream checks that meshfed opened a new stream after a restart: more than before
// in all.
func (p *pair) checkNewStream(before int, restart string) {
	p.t.Helper()
	if opened, _ := p.rec.streams(); opened <= before {
		p.t.Errorf("%s streams opened = %d, want more than %d after %s", p.side, opened, before, restart)
	}
}

// checkOnlyACKs checks that every push of the collections was ACKed: sent by meshfed's sink,
// or received by meshfed's source.
func (p *pair) checkOnlyACKs(collections ...string) {
	p.t.Helper()
	for _, c := range collections {
		for _, a := range p.rec.acksFor(c) {
			if a.Code != codes.OK {
				p.t.Errorf("%s saw %v %q for %s (nonce %s, version %d), want only ACKs", p.side, a.Code, a.Message, c, a.Nonce, a.Version)
			}
		}
	}
}

// checkMetric checks the sum of a metric's series whose labels include labels.
func (p *pair) checkMetric(name string, labels map[string]string, want float64) {
	p.t.Helper()
	if got := metric(p.t, p.reg, name, labels); got != want {
		var sel []string
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			sel = append(sel, fmt.Sprintf("%s=%q", k, labels[k]))
		}
		p.t.Errorf("%s %s{%s} = %v, want %v", p.side, name, strings.Join(sel, ","), got, want)
	}
}
