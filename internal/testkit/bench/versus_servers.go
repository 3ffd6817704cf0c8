package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/bench/load"
	"github.com/meshfed/meshfed/internal/testkit/hubproc"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// vsServer is one ResourceSource of the versus table, a process serving hubCollection.
// State k (0 the initial one) is prepared by stage outside the clock, made by publish
// inside it (right after the load process's "start"), and settle waits, after the clock,
// for the server's answer to it.
type vsServer interface {
	addr() string
	pid() int
	// served is the version a sink sees of a resource set at version v.
	served(v int) string
	// stage prepares state k: all, in which changed is new (nil for state 0).
	stage(k int, changed *mcpapi.Resource, all []*mcpapi.Resource)
	publish()
	settle()
	stop()
}

func startServer(t procTB, name string, cfg VersusConfig) vsServer {
	t.Helper()
	switch name {
	case "istio":
		return startIstio(t, cfg.Incremental, cfg.IstioLogLevel)
	case "meshfed":
		return startMeshfed(t)
	case "bare":
		return startBare(t)
	}
	t.Fatalf("no server %q (istio, meshfed, bare)", name)
	return nil
}

func snapshotVersion(k int) string { return "s" + strconv.Itoa(k) }

// istioServer is Istio 1.8's own source (pkg/mcp source server and snapshot cache, as
// Galley ran it) in test/istio's peer: state 0 is a "set" of everything, a change a "put"
// of the changed resource (the peer parses one resource, not the state).
type istioServer struct {
	j    *jproc
	at   string
	line []byte // the next command
	op   string
}

func startIstio(t procTB, incremental bool, logLevel string) *istioServer {
	args := []string{"-mode", "source-server", "-addr", "127.0.0.1:0", "-collections", hubCollection}
	if incremental {
		args = append(args, "-incremental") // the source allows it; the sinks ask for it
	}
	env := os.Environ()
	if logLevel != "" {
		env = append(env, "ISTIO_MCP_PEER_LOG_LEVEL="+logLevel)
	}
	s := &istioServer{j: startJSON(t, testbin.Require(t, "istio-mcp-peer"), args, env, nil)}
	s.at = s.j.next("listening", 30*time.Second).Addr
	return s
}

func (s *istioServer) addr() string        { return s.at }
func (s *istioServer) pid() int            { return s.j.p.Pid() }
func (s *istioServer) served(v int) string { return strconv.Itoa(v) }
func (s *istioServer) stop()               { s.j.stop() }
func (s *istioServer) publish()            { s.j.write(s.line) }
func (s *istioServer) settle()             { s.j.next(s.op, time.Minute) }

func (s *istioServer) stage(k int, changed *mcpapi.Resource, all []*mcpapi.Resource) {
	s.op = "set"
	if changed != nil {
		s.op, all = "put", []*mcpapi.Resource{changed}
	}
	rs := make([]map[string]any, len(all))
	for i, r := range all {
		rs[i] = map[string]any{"name": r.Metadata.Name, "version": r.Metadata.Version,
			"body": map[string]any{"typeUrl": r.Body.TypeUrl, "value": r.Body.Value}}
	}
	b, err := json.Marshal(map[string]any{"op": s.op, "collection": hubCollection, "version": snapshotVersion(k), "resources": rs})
	if err != nil { // encoded here, outside the clock
		s.j.t.Fatal(err)
	}
	s.line = append(b, '\n')
}

// meshfedServer is meshfed's hub as a process (cmd/hub, insecure, on loopback), fed by
// this process as cluster c000 the way a minion feeds it: an MCP push to its ingest
// listener. Its figures include that hop.
type meshfedServer struct {
	t                   procTB
	hub                 *hubproc.Hub
	serve, ingest, http string
	cache               *mcp.Cache
	cl                  *cluster
	next                *mcp.Entry
}

func startMeshfed(t procTB) *meshfedServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "meshfed-bench-versus-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := hubConfig(1, func(c *hub.Config) { c.HTTP = "127.0.0.1:0" })
	cfg.StateDir = filepath.Join(dir, "state")
	s := &meshfedServer{t: t, cache: mcp.NewCache(hubCollection), hub: hubproc.Start(t, cfg, dir, nil)}
	s.serve, s.ingest, s.http = s.hub.Addr(t, "serve", 30*time.Second), s.hub.Addr(t, "ingest", 30*time.Second), s.hub.Addr(t, "http", 30*time.Second)
	return s
}

func (s *meshfedServer) addr() string        { return s.serve }
func (s *meshfedServer) pid() int            { return s.hub.Pid() }
func (s *meshfedServer) served(v int) string { return "c000/" + strconv.Itoa(v) }

func (s *meshfedServer) stop() {
	if s.cl != nil {
		s.cl.stop()
	}
	s.hub.Kill()
}

func (s *meshfedServer) stage(k int, changed *mcpapi.Resource, all []*mcpapi.Resource) {
	if changed == nil {
		if _, err := s.cache.PutResources(hubCollection, all...); err != nil {
			s.t.Fatal(err)
		}
		return
	}
	e, err := mcp.NewEntry(changed) // the minion's encoding, outside the clock
	if err != nil {
		s.t.Fatal(err)
	}
	s.next = e
}

func (s *meshfedServer) publish() {
	if s.cl == nil { // state 0: the cluster connects with it
		cl, err := pushTo(s.ingest, "c000", s.cache, mcp.Hooks{})
		if err != nil {
			s.t.Fatal(err)
		}
		s.cl = cl
		return
	}
	s.cache.Put(hubCollection, s.next)
}

// settle waits, for state 0, until the hub is ready (the cluster has synced) and its state
// file has it; a change needs nothing (the sinks had it).
func (s *meshfedServer) settle() {
	if s.next != nil {
		return
	}
	testwait.For(s.t, time.Minute, "the hub ready", s.hub.Ready)
	if err := stateWritten(s.http); err != nil {
		s.t.Fatal(err)
	}
}

// bareServer is the baseline: cmd/mcpload -mode bare sending messages this process encoded
// once (package load).
type bareServer struct {
	j  *jproc
	at string
}

func startBare(t procTB) *bareServer {
	s := &bareServer{j: startJSON(t, testbin.Own(t, "mcpload"), []string{"-mode", "bare", "-addr", "127.0.0.1:0"}, nil, nil)}
	s.at = s.j.next("listening", 30*time.Second).Addr
	return s
}

func (s *bareServer) addr() string        { return s.at }
func (s *bareServer) pid() int            { return s.j.p.Pid() }
func (s *bareServer) served(v int) string { return strconv.Itoa(v) }
func (s *bareServer) stop()               { s.j.stop() }
func (s *bareServer) publish()            { s.j.send(load.Command{Op: "publish"}) }
func (s *bareServer) settle()             { s.j.next("published", time.Minute) }

func (s *bareServer) stage(k int, changed *mcpapi.Resource, all []*mcpapi.Resource) {
	enc := func(m *mcppb.Resources) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			s.j.t.Fatal(err)
		}
		return b
	}
	c := load.Command{Op: "stage", Full: enc(&mcppb.Resources{Collection: hubCollection, SystemVersionInfo: snapshotVersion(k), Resources: all})}
	if changed != nil {
		c.Delta = enc(&mcppb.Resources{Collection: hubCollection, SystemVersionInfo: snapshotVersion(k), Resources: []*mcpapi.Resource{changed}, Incremental: true})
	}
	s.j.send(c)
	s.j.next("staged", time.Minute)
}
