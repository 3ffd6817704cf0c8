package invariant

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/durable"
	"github.com/meshfed/meshfed/mcp"
)

// The harness: the real hub in process (real gRPC on loopback, its real state file), the
// minions as the engine's Source over a Cache (what the minion publishes through), and
// real MCP sinks. The hub's clock is the harness's.

var colls = map[string]string{
	"vs": "istio/networking/v1alpha3/virtualservices",
	"dr": "istio/networking/v1alpha3/destinationrules",
}

func collOf(short string) string { return colls[short] }

func shortOf(coll string) string {
	for s, c := range colls {
		if c == coll {
			return s
		}
	}
	return coll
}

// clock is the hub's time, moved only by the sequence.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// violation is a failure of the invariant or of the model's expectations.
type violation struct {
	step int
	msg  string
}

type harness struct {
	dir   string
	clock *clock
	log   *ringLog
	m     *model

	step atomic.Int64 // the step being run (its index in the sequence)

	// The hub: its current process-in-process, and its addresses for dialers.
	hub    *hub.Hub
	stop   context.CancelFunc
	ended  chan error
	ingest atomic.Value // string; "" while it is down
	serve  atomic.Value

	// The state file's disk.
	disk
	// roStart: the hub running now opened its state file read-only (its run writes nothing,
	// and leaves no trace for the next start).
	roStart bool
	// stepLoose are the namespaces made loose during the step being checked: what the
	// sinks received of them during it is not judged (the model's before and after may
	// both protect them, the writer having resynced by the end of the step).
	stepLoose map[string]bool

	minions map[string]*minion
	seconds map[string]*minion // a second minion with the same identity (a copied Secret)
	sinks   []*sink

	violations []violation
}

func newHarness(dir string) *harness {
	h := &harness{dir: dir, clock: &clock{t: time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)}, log: newRingLog(400), m: newModel(),
		minions: map[string]*minion{}, seconds: map[string]*minion{}}
	h.ingest.Store("")
	h.serve.Store("")
	for _, n := range minionNames {
		h.minions[n] = &minion{id: n, h: h}
		h.seconds[n] = &minion{id: n, h: h, second: true}
	}
	for i, incremental := range []bool{true, true, false, false} {
		h.sinks = append(h.sinks, newSink(h, fmt.Sprintf("sink-%d", i), incremental))
	}
	return h
}

func (h *harness) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// config is the hub's configuration for the model's entries.
func (h *harness) config(entries []entry) (*hub.Config, error) {
	var cl strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&cl, "- {name: %s, identities: [%s], namespaces: [%s], hosts: [\"*\"]}\n", e.name, e.identity, e.ns)
	}
	yaml := fmt.Sprintf(`insecure: true
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
stateDir: %s
collections: [%s, %s]
warmUp: 10s
breaker: {maxDeleteShare: 0.5, minDeletes: 3, settle: 2s}
limits: {streamsPerSecond: 100000, streamBurst: 100000, refusalDelay: 0s, maxStreamsPerPeer: 1000}
quotas: {pushesPerSecond: 100000, pushBurst: 100000}
routing: {default: {name: all}}
clusters:
%s`, h.dir, colls["vs"], colls["dr"], cl.String())
	return hub.ParseConfig([]byte(yaml))
}

// disk is a hub process's state file's disk as the sequence has it.
type disk struct {
	killed   atomic.Bool // the process is dead: nothing more reaches the disk
	diskFull atomic.Bool
	readonly atomic.Bool
}

// faults are d's faults for the state file; dead is what a commit of a killed process does.
func (d *disk) faults(dead func() error) *durable.Faults {
	return &durable.Faults{
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			if d.readonly.Load() && flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE) != 0 {
				return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EROFS}
			}
			return os.OpenFile(name, flag, perm)
		},
		BeforeMark: func() error {
			if d.killed.Load() {
				return errKilled
			}
			return nil
		},
		BeforeCommit: func() error {
			switch {
			case d.killed.Load():
				return dead()
			case d.diskFull.Load():
				return syscall.ENOSPC
			}
			return nil
		},
	}
}

var errKilled = errors.New("the process was killed")

// faults are the single hub's: a killed process's commit fails.
func (h *harness) faults() *durable.Faults {
	return h.disk.faults(func() error { return errKilled })
}

// startHub starts the hub on its state directory with the model's configuration.
func (h *harness) startHub() error {
	cfg, err := h.config(h.m.cfg)
	if err != nil {
		return err
	}
	if h.roStart && !h.readonly.Load() {
		for _, c := range h.m.cfg {
			h.m.loose[c.ns] = true // the last run, read-only, left no trace in the file
			if h.stepLoose == nil {
				h.stepLoose = map[string]bool{}
			}
			h.stepLoose[c.ns] = true
		}
	}
	h.roStart = h.readonly.Load()
	hb, err := hub.New(cfg, h.logger().With("side", "hub"), hub.Options{Clock: h.clock.now, StateFaults: h.faults()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- hb.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ing, srv, _ := hb.Addrs()
		if ing != "" && srv != "" {
			h.hub, h.stop, h.ended = hb, cancel, ended
			h.ingest.Store(ing)
			h.serve.Store(srv)
			return nil
		}
		select {
		case err := <-ended:
			cancel()
			return fmt.Errorf("the hub did not start: %v", err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-ended
			return errors.New("the hub did not listen within 10s")
		}
	}
}

// stopHub stops the hub: killed, nothing more reaches its state file (what it had
// committed is what a restart finds), else cleanly.
func (h *harness) stopHub(kill bool) {
	if h.hub == nil {
		return
	}
	h.ingest.Store("")
	h.serve.Store("")
	if kill {
		h.killed.Store(true)
	}
	h.stop()
	<-h.ended
	h.killed.Store(false)
	h.hub, h.stop, h.ended = nil, nil, nil
}

// close stops everything the harness started.
func (h *harness) close() {
	for _, m := range h.minions {
		m.halt()
	}
	for _, m := range h.seconds {
		m.halt()
	}
	for _, s := range h.sinks {
		s.halt()
	}
	h.stopHub(false)
}

// body is a resource's body for a collection, distinct per version.
func body(coll, name string, v int) *anypb.Any {
	host := fmt.Sprintf("%s.v%d.example.com", strings.ReplaceAll(name, "/", "-"), v)
	var msg proto.Message = &networking.VirtualService{Hosts: []string{host}}
	if coll == "dr" {
		msg = &networking.DestinationRule{Host: host}
	}
	a, err := anypb.New(msg)
	if err != nil {
		panic(err)
	}
	return a
}

func newEntry(coll, name string, v int) *mcp.Entry {
	e, err := mcp.NewEntry(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: fmt.Sprintf("v%d", v)}, Body: body(coll, name, v)})
	if err != nil {
		panic(err)
	}
	return e
}

// minion publishes one cluster's objects through the engine's Source over a Cache, as the
// minion does, redialling the hub's current ingest address.
type minion struct {
	id     string
	second bool // the identity's second minion
	h      *harness
	dial   func() string // the ingest address of its next stream (nil: the hub's)

	cache  *mcp.Cache
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	want      map[string]uint64 // collection -> the cache's version
	answered  map[string]uint64 // collection -> the newest version the current stream got an answer to
	refused   bool              // the last stream was refused at admission (unknown identity)
	to        string            // the ingest address of the current stream ("" between streams)
	refusedBy string            // the ingest address that refused it
	gen       int               // mayWriteNow calls: a refusal of a stream opened before the last settles nothing
	ended     int               // streams that ended after the hub had answered them (admitted ones)
	cut       context.CancelFunc
}

// start runs a new process of the minion over its source's current state.
func (m *minion) start(src map[key]int) {
	m.halt()
	m.cache = mcp.NewCache(colls["vs"], colls["dr"])
	m.mu.Lock()
	m.want, m.answered, m.refused = map[string]uint64{}, map[string]uint64{}, false
	for short, coll := range colls {
		var es []*mcp.Entry
		for k, v := range src {
			if k.coll == short {
				es = append(es, newEntry(short, k.name, v))
			}
		}
		m.want[coll] = m.cache.Replace(coll, es)
	}
	m.mu.Unlock()
	source, err := mcp.NewSource(mcp.SourceOptions{Watcher: m.cache, Logger: m.h.logger().With("side", "minion-"+m.id), Hooks: mcp.Hooks{
		Acked: func(_ *mcp.StreamInfo, e mcp.AckEvent) {
			m.mu.Lock()
			m.refused = false
			if a, ok := m.answered[e.Collection]; !ok || e.Version > a {
				m.answered[e.Collection] = e.Version
			}
			m.mu.Unlock()
		},
	}})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			addr := m.h.ingest.Load().(string)
			if m.dial != nil {
				addr = m.dial()
			}
			if addr == "" {
				pause(ctx, time.Millisecond)
				continue
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				panic(err)
			}
			sctx, cut := context.WithCancel(metadata.AppendToOutgoingContext(ctx, mcp.DevIdentityHeader, m.id))
			m.mu.Lock()
			m.cut, m.to, m.answered, m.refused = cut, addr, map[string]uint64{}, false
			gen := m.gen
			m.mu.Unlock()
			err = source.PushTo(sctx, conn)
			cut()
			_ = conn.Close()
			m.mu.Lock()
			if len(m.answered) > 0 {
				m.ended++
			}
			m.to, m.answered = "", map[string]uint64{}
			// Refused: its identity is no cluster's, or another minion of it writes the cluster.
			// A stream opened before mayWriteNow was judged by what the hub had then (a
			// configuration since reloaded): its refusal settles nothing.
			m.refused = (status.Code(err) == codes.PermissionDenied || status.Code(err) == codes.FailedPrecondition) && gen == m.gen
			m.refusedBy = addr
			m.mu.Unlock()
			pause(ctx, 2*time.Millisecond)
		}
	}()
}

// halt stops the minion's process.
func (m *minion) halt() {
	if m.cancel == nil {
		return
	}
	m.cancel()
	<-m.done
	m.cancel, m.cache = nil, nil
}

func (m *minion) running() bool { return m.cancel != nil }

// set changes what the running minion publishes.
func (m *minion) set(k key, v int) {
	if m.cache == nil {
		return
	}
	coll := collOf(k.coll)
	var ver uint64
	if v < 0 {
		ver = m.cache.Remove(coll, k.name)
	} else {
		ver = m.cache.Put(coll, newEntry(k.coll, k.name, v))
	}
	m.mu.Lock()
	m.want[coll] = max(m.want[coll], ver)
	m.mu.Unlock()
}

// replace sets what the running minion publishes to src.
func (m *minion) replace(src map[key]int) {
	if m.cache == nil {
		return
	}
	for short, coll := range colls {
		var es []*mcp.Entry
		for k, v := range src {
			if k.coll == short {
				es = append(es, newEntry(short, k.name, v))
			}
		}
		ver := m.cache.Replace(coll, es)
		m.mu.Lock()
		m.want[coll] = max(m.want[coll], ver)
		m.mu.Unlock()
	}
}

func (m *minion) cutStream() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut != nil {
		m.cut()
	}
}

// settled: the hub listening on ingest answered the minion's current stream for every
// collection at its current version, or refused the stream.
func (m *minion) settled(ingest string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refused && m.refusedBy == ingest {
		return true
	}
	if m.to != ingest {
		return false
	}
	for c, v := range m.want {
		if a, ok := m.answered[c]; !ok || a < v { // every collection answered on this stream
			return false
		}
	}
	return true
}

// sink is a real MCP sink of the hub's serve listener: what it holds, and every deletion
// and change of version it received, with the step it arrived in.
type sink struct {
	name string
	h    *harness
	s    *mcp.Sink

	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	state   sinkState
	changes []change
}

// change is one object a sink lost (version "") or got a version of.
type change struct {
	step    int
	k       key
	version string
}

func newSink(h *harness, name string, incremental bool) *sink {
	return newSinkDialing(h, name, incremental, func() string { return h.serve.Load().(string) })
}

// newSinkDialing is a sink whose every stream goes to the address dial returns ("": none
// now, it waits).
func newSinkDialing(h *harness, name string, incremental bool, dial func() string) *sink {
	s := &sink{name: name, h: h, state: sinkState{}}
	var err error
	s.s, err = mcp.NewSink(mcp.SinkOptions{Collections: []string{colls["vs"], colls["dr"]}, Applier: s, FullStateOnly: !incremental,
		Logger: h.logger().With("side", name)})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			addr := dial()
			if addr == "" {
				pause(ctx, time.Millisecond)
				continue
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				panic(err)
			}
			_ = s.s.PullFrom(metadata.AppendToOutgoingContext(ctx, mcp.DevIdentityHeader, name), conn)
			_ = conn.Close()
			pause(ctx, 2*time.Millisecond)
		}
	}()
	return s
}

func (s *sink) halt() {
	s.cancel()
	<-s.done
}

// Apply records a push: a full state replaces the collection, an incremental one changes it.
func (s *sink) Apply(_ context.Context, c *mcp.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	step := int(s.h.step.Load())
	short := shortOf(c.Collection)
	seen := map[string]bool{}
	for _, r := range c.Resources {
		k := key{short, r.GetMetadata().GetName()}
		seen[k.name] = true
		v := r.GetMetadata().GetVersion()
		if s.state[k] != v {
			s.state[k] = v
			s.changes = append(s.changes, change{step: step, k: k, version: v})
		}
	}
	var gone []key
	if c.Incremental {
		for _, n := range c.Removed {
			gone = append(gone, key{short, n})
		}
	} else {
		for k := range s.state {
			if k.coll == short && !seen[k.name] {
				gone = append(gone, k)
			}
		}
	}
	for _, k := range gone {
		if _, ok := s.state[k]; ok {
			delete(s.state, k)
			s.changes = append(s.changes, change{step: step, k: k})
		}
	}
	return nil
}

func (s *sink) snapshot() sinkState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(sinkState, len(s.state))
	for k, v := range s.state {
		out[k] = v
	}
	return out
}

// takeChanges returns the changes recorded since the last call.
func (s *sink) takeChanges() []change {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.changes
	s.changes = nil
	return out
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// damage damages the state file (the hub is stopped): seed picks where.
func damage(path, kind string, seed int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	switch kind {
	case "bitflip": // one bit anywhere
		if len(b) > 0 {
			i := r.IntN(len(b))
			b[i] ^= 1 << r.IntN(8)
		}
	case "record": // one bit inside one resource's name, where it is a key
		var at []int
		for _, ns := range []string{"shop/", "pay/"} {
			for i := 0; ; {
				j := bytes.Index(b[i:], []byte(ns))
				if j < 0 {
					break
				}
				at = append(at, i+j)
				i += j + 1
			}
		}
		if len(at) > 0 {
			i := at[r.IntN(len(at))] + r.IntN(4)
			b[i] ^= 1 << r.IntN(7)
		}
	case "truncate":
		if len(b) > 1 {
			b = b[:1+r.IntN(len(b)-1)]
		}
	case "zero":
		b = nil
	case "garbage":
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
	default:
		return fmt.Errorf("unknown damage %q", kind)
	}
	return os.WriteFile(path, b, 0o600)
}

func statePath(dir string) string { return filepath.Join(dir, hub.StateFile) }

// ringLog keeps the last lines written to it, for a failure's report, and sends every line
// to -invariant.log's file if it is set.
type ringLog struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
	part  []byte
}

func newRingLog(n int) *ringLog { return &ringLog{lines: make([]string, n)} }

// fullLog is -invariant.log's file (nil without it), opened once for every sequence: the
// ring of a sequence whose steps wait keeps only the probes of its last one.
var fullLog = sync.OnceValue(func() io.Writer {
	if *logTo == "" {
		return nil
	}
	f, err := os.OpenFile(*logTo, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "-invariant.log: %v\n", err)
		return nil
	}
	return f
})

// mark writes the line that starts step i, e, to the log.
func (l *ringLog) mark(i int, e event) {
	fmt.Fprintf(l, "=== step %d: %s\n", i, e)
}

func (l *ringLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := fullLog(); w != nil {
		_, _ = w.Write(p)
	}
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			break
		}
		l.lines[l.next] = string(l.part[:i])
		l.next = (l.next + 1) % len(l.lines)
		l.full = l.full || l.next == 0
		l.part = l.part[i+1:]
	}
	return len(p), nil
}

func (l *ringLog) dump(w io.Writer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	if l.full {
		out = append(out, l.lines[l.next:]...)
	}
	out = append(out, l.lines[:l.next]...)
	fmt.Fprintln(w, strings.Join(out, "\n"))
}

// heldNames are the objects the hub says its breakers hold (still served), with the
// cluster whose breaker holds each.
func heldNames(hb *hub.Hub) map[key]string {
	out := map[key]string{}
	for _, c := range hb.Clusters() {
		if c.Breaker == nil {
			continue
		}
		for coll, names := range c.Breaker.Pending {
			for _, n := range names {
				out[key{shortOf(coll), n}] = c.Name
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[key]V) []key {
	out := make([]key, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// probe returns what the hub serves now: the first push of each collection to a new
// full-state sink.
func (h *harness) probe(within time.Duration) (sinkState, error) {
	return h.probeAt(h.serve.Load().(string), within)
}

// probeAt is probe of the hub serving at addr.
func (h *harness) probeAt(addr string, within time.Duration) (sinkState, error) {
	got := sinkState{}
	seen := map[string]bool{}
	var mu sync.Mutex
	all := make(chan struct{})
	k, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{colls["vs"], colls["dr"]}, FullStateOnly: true, Logger: h.logger().With("side", "probe"),
		Applier: mcp.ApplierFunc(func(_ context.Context, c *mcp.Change) error {
			mu.Lock()
			defer mu.Unlock()
			if seen[c.Collection] {
				return nil
			}
			seen[c.Collection] = true
			for _, r := range c.Resources {
				got[key{shortOf(c.Collection), r.GetMetadata().GetName()}] = r.GetMetadata().GetVersion()
			}
			if len(seen) == len(colls) {
				close(all)
			}
			return nil
		})})
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- k.PullFrom(metadata.AppendToOutgoingContext(ctx, mcp.DevIdentityHeader, "probe"), conn)
	}()
	select {
	case <-all:
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return got, nil
	case err := <-done:
		if status.Code(err) == codes.Unavailable {
			return nil, errNotServing
		}
		return nil, fmt.Errorf("the probe's stream ended before it had every collection: %v", err)
	}
}

// errNotServing: the hub refuses the sinks (Unavailable): they keep what they hold.
var errNotServing = errors.New("the hub serves no sink now")

// diff says how a sink's state differs from what the hub serves ("" if it does not).
func diff(s, served sinkState) string {
	var out []string
	for _, k := range sortedKeys(served) {
		if s[k] != served[k] {
			out = append(out, fmt.Sprintf("%s at %q, served %s", k, s[k], served[k]))
		}
	}
	for _, k := range sortedKeys(s) {
		if _, ok := served[k]; !ok {
			out = append(out, fmt.Sprintf("%s@%s not served", k, s[k]))
		}
	}
	return strings.Join(out, "; ")
}

// reviewedDigest is the digest of what cluster's breaker holds, as an operator sees it.
func reviewedDigest(hb *hub.Hub, cluster string) string {
	for _, c := range hb.Clusters() {
		if c.Name == cluster && c.Breaker != nil {
			return c.Breaker.Digest
		}
	}
	return ""
}

// endedStreams counts the minions' streams that ended after the hub had answered them.
func (h *harness) endedStreams() int {
	n := 0
	for _, ms := range []map[string]*minion{h.minions, h.seconds} {
		for _, m := range ms {
			m.mu.Lock()
			n += m.ended
			m.mu.Unlock()
		}
	}
	return n
}

// writes reports whether the hub listening on ingest takes m's pushes: its current stream
// has been answered there.
func (m *minion) writes(ingest string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.refused && m.to == ingest && len(m.answered) > 0
}

// mayWriteNow forgets that m's last stream was refused: the hub may admit its next one (its
// cluster is configured again, the minion it competed with stopped), so only an answer or
// a refusal after this settles it.
func (m *minion) mayWriteNow() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refused = false
	m.gen++
}
