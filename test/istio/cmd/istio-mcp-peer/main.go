// Command istio-mcp-peer runs Istio's own Mesh Configuration Protocol
// implementation (istio.io/istio/pkg/mcp, Istio 1.8.0) as a source or a sink,
// as a server or a client, so that meshfed's engine can be checked for wire
// interop against it. See ../../README.md for the contract.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gogo/protobuf/types"
	xrate "golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	mcp "istio.io/api/mcp/v1alpha1"
	"istio.io/istio/pkg/mcp/rate"
	"istio.io/istio/pkg/mcp/server"
	"istio.io/istio/pkg/mcp/sink"
	"istio.io/istio/pkg/mcp/snapshot"
	"istio.io/istio/pkg/mcp/source"
	"istio.io/pkg/log"
)

// snapshotGroup is the single snapshot group every sink is mapped to.
const snapshotGroup = "default"

// out writes one JSON object per line to stdout. os.Stdout is unbuffered, so
// each line is flushed as it is written.
var (
	outMu sync.Mutex
	enc   = json.NewEncoder(os.Stdout)
)

func emit(v any) {
	outMu.Lock()
	defer outMu.Unlock()
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(os.Stderr, "istio-mcp-peer: writing stdout: %v\n", err)
	}
}

func emitError(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(os.Stderr, "istio-mcp-peer: error: %s\n", msg)
	emit(map[string]string{"event": "error", "message": msg})
}

func fatal(format string, args ...any) {
	emitError(format, args...)
	os.Exit(1)
}

// ---- stdout event shapes ----

type addrEvent struct {
	Event string `json:"event"`
	Addr  string `json:"addr"`
}

type resourceJSON struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Value   string `json:"value"`
	// Body, when set (set and put commands only), is the resource's body as it is, a
	// google.protobuf.Any of any type: a test sends real Istio specs through.
	Body *anyJSON `json:"body,omitempty"`
}

// anyJSON is a google.protobuf.Any: its type URL and its value's bytes (base64 in JSON).
type anyJSON struct {
	TypeURL string `json:"typeUrl"`
	Value   []byte `json:"value"`
}

type appliedEvent struct {
	Event       string         `json:"event"`
	Collection  string         `json:"collection"`
	Incremental bool           `json:"incremental"`
	Resources   []resourceJSON `json:"resources"`
	Removed     []string       `json:"removed"`
}

type setEvent struct {
	Event      string `json:"event"`
	Collection string `json:"collection"`
}

// ---- stdin command ----

type command struct {
	Op         string         `json:"op"`
	Collection string         `json:"collection"`
	Version    string         `json:"version"`
	Resources  []resourceJSON `json:"resources"`
}

// ---- Istio plumbing ----

// nopReporter satisfies istio.io/istio/pkg/mcp/monitoring.Reporter without
// recording anything.
type nopReporter struct{}

func (nopReporter) Close() error                                { return nil }
func (nopReporter) RecordSendError(error, codes.Code)           {}
func (nopReporter) RecordRecvError(error, codes.Code)           {}
func (nopReporter) RecordRequestSize(string, int64, int)        {}
func (nopReporter) RecordRequestAck(string, int64)              {}
func (nopReporter) RecordRequestNack(string, int64, codes.Code) {}
func (nopReporter) SetStreamCount(int64)                        {}
func (nopReporter) RecordStreamCreateSuccess()                  {}

// unlimited is a rate.Limit that never waits (the sink server calls its
// connection limiter unconditionally, so it cannot be nil).
func unlimited() rate.Limit { return xrate.NewLimiter(xrate.Inf, 1) }

// generousLimits is a per-connection request limiter factory for sources
// (Source.newConnection calls Create() unconditionally).
type generousLimits struct{}

func (generousLimits) Create() rate.Limit { return unlimited() }

// printingUpdater is the sink's Updater: it reports every change Istio's sink
// applies as an "applied" event, and accepts it (ACK).
type printingUpdater struct{}

func (printingUpdater) Apply(c *sink.Change) error {
	ev := appliedEvent{
		Event:       "applied",
		Collection:  c.Collection,
		Incremental: c.Incremental,
		Resources:   make([]resourceJSON, 0, len(c.Objects)),
		Removed:     append([]string{}, c.Removed...),
	}
	for _, o := range c.Objects {
		r := resourceJSON{}
		if o.Metadata != nil {
			r.Name = o.Metadata.Name
			r.Version = o.Metadata.Version
		}
		if sv, ok := o.Body.(*types.StringValue); ok {
			r.Value = sv.Value
		}
		ev.Resources = append(ev.Resources, r)
	}
	sort.Slice(ev.Resources, func(i, j int) bool { return ev.Resources[i].Name < ev.Resources[j].Name })
	sort.Strings(ev.Removed)
	emit(ev)
	return nil
}

// snapshotState keeps each collection's full state and rebuilds an immutable
// snapshot.InMemory for Istio's snapshot cache on every change.
type snapshotState struct {
	mu        sync.Mutex
	cache     *snapshot.Cache
	versions  map[string]string
	resources map[string][]*mcp.Resource
}

func newSnapshotState() *snapshotState {
	return &snapshotState{
		cache:     snapshot.New(func(string, *mcp.SinkNode) string { return snapshotGroup }),
		versions:  map[string]string{},
		resources: map[string][]*mcp.Resource{},
	}
}

func (s *snapshotState) set(cmd *command) error {
	res, err := convert(cmd.Resources)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resources[cmd.Collection] = res
	s.publish(cmd.Collection, cmd.Version)
	return nil
}

// put replaces or adds the given resources (by name) in a collection's state and publishes
// it at the command's version: a benchmark's one-resource change costs a one-resource
// parse here, not the whole state's (Galley kept its state in memory the same way).
func (s *snapshotState) put(cmd *command) error {
	res, err := convert(cmd.Resources)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := append([]*mcp.Resource(nil), s.resources[cmd.Collection]...)
	at := make(map[string]int, len(cur))
	for i, r := range cur {
		at[r.Metadata.Name] = i
	}
	for _, r := range res {
		if i, ok := at[r.Metadata.Name]; ok {
			cur[i] = r
		} else {
			cur = append(cur, r)
		}
	}
	s.resources[cmd.Collection] = cur
	s.publish(cmd.Collection, cmd.Version)
	return nil
}

// publish sets collection c's version and rebuilds the snapshot from every collection's
// state (s.mu held).
func (s *snapshotState) publish(c, version string) {
	s.versions[c] = version
	b := snapshot.NewInMemoryBuilder()
	for c, v := range s.versions {
		b.Set(c, v, s.resources[c])
	}
	s.cache.SetSnapshot(snapshotGroup, b.Build())
}

func convert(rs []resourceJSON) ([]*mcp.Resource, error) {
	res := make([]*mcp.Resource, 0, len(rs))
	for _, r := range rs {
		body, err := types.MarshalAny(&types.StringValue{Value: r.Value})
		if err != nil {
			return nil, fmt.Errorf("marshal %q: %v", r.Name, err)
		}
		if r.Body != nil {
			body = &types.Any{TypeUrl: r.Body.TypeURL, Value: r.Body.Value}
		}
		res = append(res, &mcp.Resource{
			Metadata: &mcp.Metadata{Name: r.Name, Version: r.Version},
			Body:     body,
		})
	}
	return res, nil
}

func readCommands(st *snapshotState) {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var cmd command
		if err := json.Unmarshal([]byte(line), &cmd); err != nil {
			emitError("bad command %q: %v", line, err)
			continue
		}
		switch cmd.Op {
		case "set", "put":
			if cmd.Collection == "" {
				emitError("%s: missing collection", cmd.Op)
				continue
			}
			apply := st.set
			if cmd.Op == "put" {
				apply = st.put
			}
			if err := apply(&cmd); err != nil {
				emitError("%s %s: %v", cmd.Op, cmd.Collection, err)
				continue
			}
			emit(setEvent{Event: cmd.Op, Collection: cmd.Collection})
		default:
			emitError("unknown op %q", cmd.Op)
		}
	}
	if err := sc.Err(); err != nil {
		emitError("reading stdin: %v", err)
	}
	fmt.Fprintln(os.Stderr, "istio-mcp-peer: stdin closed; still serving until SIGTERM")
}

func configureIstioLogging() {
	o := log.DefaultOptions()
	// Istio logs to stdout by default; stdout is reserved for JSON events.
	o.OutputPaths = []string{"stderr"}
	o.ErrorOutputPaths = []string{"stderr"}
	if lvl := os.Getenv("ISTIO_MCP_PEER_LOG_LEVEL"); lvl != "" {
		if l, ok := map[string]log.Level{
			"debug": log.DebugLevel, "info": log.InfoLevel, "warn": log.WarnLevel,
			"error": log.ErrorLevel, "none": log.NoneLevel,
		}[lvl]; ok {
			o.SetOutputLevel("mcp", l)
		}
	}
	if err := log.Configure(o); err != nil {
		fmt.Fprintf(os.Stderr, "istio-mcp-peer: configuring istio log: %v\n", err)
	}
}

func main() {
	mode := flag.String("mode", "", "source-server | source-client | sink-server | sink-client")
	addr := flag.String("addr", "", "HOST:PORT to listen on (server modes) or dial (client modes)")
	collections := flag.String("collections", "", "comma-separated collection names")
	incremental := flag.Bool("incremental", false, "sinks request incremental updates; sources allow them")
	id := flag.String("id", "istio-mcp-peer", "sink node id")
	meta := flag.String("meta", "", "client modes: gRPC metadata key=value pairs, comma-separated, sent on the stream (as Galley's --sinkMeta)")
	flag.Parse()

	configureIstioLogging()

	if *addr == "" {
		fatal("-addr is required")
	}
	var names []string
	for _, c := range strings.Split(*collections, ",") {
		if c = strings.TrimSpace(c); c != "" {
			names = append(names, c)
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if *meta != "" {
		md := metadata.MD{}
		for _, kv := range strings.Split(*meta, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				fatal("-meta %q: want key=value pairs", *meta)
			}
			md.Append(strings.TrimSpace(k), strings.TrimSpace(v))
		}
		ctx = metadata.NewOutgoingContext(ctx, md)
	}

	srcOpts := func(st *snapshotState) *source.Options {
		co := make([]source.CollectionOptions, 0, len(names))
		for _, n := range names {
			co = append(co, source.CollectionOptions{Name: n, Incremental: *incremental})
		}
		return &source.Options{
			Watcher:            st.cache,
			CollectionsOptions: co,
			Reporter:           nopReporter{},
			ConnRateLimiter:    generousLimits{},
		}
	}
	sinkOpts := func() *sink.Options {
		co := make([]sink.CollectionOptions, 0, len(names))
		for _, n := range names {
			co = append(co, sink.CollectionOptions{Name: n, Incremental: *incremental})
		}
		return &sink.Options{
			CollectionOptions: co,
			Updater:           printingUpdater{},
			ID:                *id,
			Reporter:          nopReporter{},
		}
	}
	listen := func() net.Listener {
		lis, err := net.Listen("tcp", *addr)
		if err != nil {
			fatal("listen %s: %v", *addr, err)
		}
		emit(addrEvent{Event: "listening", Addr: lis.Addr().String()})
		return lis
	}
	serve := func(gs *grpc.Server, lis net.Listener) {
		go func() {
			if err := gs.Serve(lis); err != nil {
				emitError("grpc serve: %v", err)
			}
		}()
		<-ctx.Done()
		gs.Stop()
	}
	dial := func() *grpc.ClientConn {
		emit(addrEvent{Event: "dialing", Addr: *addr})
		conn, err := grpc.Dial(*addr, grpc.WithInsecure())
		if err != nil {
			fatal("dial %s: %v", *addr, err)
		}
		return conn
	}

	switch *mode {
	case "source-server":
		st := newSnapshotState()
		gs := grpc.NewServer()
		mcp.RegisterResourceSourceServer(gs, source.NewServer(srcOpts(st), &source.ServerOptions{
			AuthChecker: server.NewAllowAllChecker(),
			RateLimiter: unlimited(),
		}))
		lis := listen()
		go readCommands(st)
		serve(gs, lis)
	case "source-client":
		st := newSnapshotState()
		conn := dial()
		defer conn.Close()
		go readCommands(st)
		c := source.NewClient(mcp.NewResourceSinkClient(conn), srcOpts(st))
		c.Run(ctx)
	case "sink-server":
		gs := grpc.NewServer()
		mcp.RegisterResourceSinkServer(gs, sink.NewServer(sinkOpts(), &sink.ServerOptions{
			AuthChecker: server.NewAllowAllChecker(),
			RateLimiter: unlimited(),
		}))
		serve(gs, listen())
	case "sink-client":
		conn := dial()
		defer conn.Close()
		c := sink.NewClient(mcp.NewResourceSourceClient(conn), sinkOpts())
		c.Run(ctx)
	default:
		fatal("unknown -mode %q (want source-server, source-client, sink-server or sink-client)", *mode)
	}
	// Give a moment for the last writes to land; then exit cleanly.
	time.Sleep(10 * time.Millisecond)
}
