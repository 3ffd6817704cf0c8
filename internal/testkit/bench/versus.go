package bench

import (
	"strconv"
	"time"

	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/testkit/bench/load"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
)

// VersusServers are the servers of the versus table, in its column order: Istio 1.8's own
// MCP source, meshfed's hub, and bare gRPC sending pre-encoded messages.
var VersusServers = []string{"istio", "meshfed", "bare"}

// VersusConfig is one row of the versus table: a server process holding Resources
// resources of about Size bytes each, Sinks sinks of the load process connecting at once,
// then Changes one-resource changes, each timed to the last sink, Gap apart.
type VersusConfig struct {
	Resources, Size, Sinks, Changes int
	Incremental                     bool
	Gap                             time.Duration
	// IstioLogLevel is the level of Istio's mcp log scope ("": its default, info, which
	// logs every ACK: a line per sink per change).
	IstioLogLevel string
}

// VersusResult is one server's figures in a row.
type VersusResult struct {
	Server string
	// Connect is the sinks' connect storm: from "connect" until each sink held the full
	// initial state.
	Connect load.Event
	// Changes are the changes, each over the sinks from "start" to the message bringing it.
	Changes []load.Event
	// RSSBeforeKiB and RSSAfterKiB are the server's resident set before the sinks connected
	// and a second after they all held the initial state.
	RSSBeforeKiB, RSSAfterKiB int
	// NoFile is the load process's open-file limit.
	NoFile uint64
	// CPUPerChange is the server process's CPU time (user+system) over the changes, per
	// change: its ACKs of the previous change and the gap included.
	CPUPerChange time.Duration
}

// Last is the median over the changes of the time until the last sink had the change.
func (r VersusResult) Last() time.Duration { return over(r.Changes, lastSink).P50 }

// LastP99 is the 99th percentile over the changes of that time (with few changes, their
// slowest).
func (r VersusResult) LastP99() time.Duration { return over(r.Changes, lastSink).P99 }

// SinkP50 is the median over the changes of the median sink's time.
func (r VersusResult) SinkP50() time.Duration {
	return over(r.Changes, func(e load.Event) time.Duration { return e.P50 }).P50
}

func lastSink(e load.Event) time.Duration { return e.Last }

// Bytes is the mean size of the message that brought a change to a sink.
func (r VersusResult) Bytes() int {
	sum := 0
	for _, e := range r.Changes {
		sum += e.Bytes
	}
	return sum / max(len(r.Changes), 1)
}

// RSSPerSinkKiB is the server's resident set per connected sink.
func (r VersusResult) RSSPerSinkKiB() float64 {
	return float64(r.RSSAfterKiB-r.RSSBeforeKiB) / float64(max(r.Connect.Sinks, 1))
}

// over is the distribution of f over the changes es.
func over(es []load.Event, f func(load.Event) time.Duration) Latencies {
	d := make([]time.Duration, len(es))
	for i, e := range es {
		d[i] = f(e)
	}
	return distribution(d)
}

// Versus runs cfg against each of servers (names of VersusServers) in turn, each as a
// process driven by one load process (cmd/mcpload), and stops every process it started
// before it returns.
func Versus(cfg VersusConfig, servers []string) ([]VersusResult, error) {
	var out []VersusResult
	err := run(func(r *runner) {
		for _, s := range servers {
			out = append(out, versusOne(r, cfg, s))
		}
	})
	return out, err
}

func versusOne(t procTB, cfg VersusConfig, name string) VersusResult {
	t.Helper()
	res := VersusResult{Server: name}
	loadBin := testbin.Own(t, "mcpload")
	srv := startServer(t, name, cfg)
	defer srv.stop()
	all := make([]*mcpapi.Resource, cfg.Resources)
	for i := range all {
		all[i] = Resource(i, 0, cfg.Size)
	}
	srv.stage(0, nil, all)
	srv.publish()
	srv.settle()
	time.Sleep(200 * time.Millisecond)
	var err error
	if res.RSSBeforeKiB, err = testproc.RSSKiB(srv.pid()); err != nil {
		t.Fatal(err)
	}

	args := []string{"-mode", "sinks", "-addr", srv.addr(), "-sinks", strconv.Itoa(cfg.Sinks), "-collection", hubCollection}
	if cfg.Incremental {
		args = append(args, "-incremental")
	}
	l := startJSON(t, loadBin, args, nil, nil)
	defer l.stop()
	res.NoFile = l.next("ready", 30*time.Second).NoFile
	l.send(load.Command{Op: "connect", Expect: cfg.Resources})
	res.Connect = l.next("connected", 5*time.Minute)
	time.Sleep(time.Second)
	if res.RSSAfterKiB, err = testproc.RSSKiB(srv.pid()); err != nil {
		t.Fatal(err)
	}

	cpu0, err := testproc.CPU(srv.pid())
	if err != nil {
		t.Fatal(err)
	}
	for k := 1; k <= cfg.Changes; k++ {
		i := (k - 1) % cfg.Resources
		all[i] = Resource(i, k, cfg.Size)
		srv.stage(k, all[i], all)
		l.send(load.Command{Op: "arm", ID: k, Name: all[i].Metadata.Name, Version: srv.served(k)})
		l.next("armed", 30*time.Second)
		l.send(load.Command{Op: "start", ID: k})
		l.next("started", 30*time.Second) // the load process has taken the time: the change comes after it
		srv.publish()
		res.Changes = append(res.Changes, l.next("change", 2*time.Minute))
		srv.settle()
		time.Sleep(cfg.Gap)
	}
	if cfg.Changes > 0 {
		cpu1, err := testproc.CPU(srv.pid())
		if err != nil {
			t.Fatal(err)
		}
		res.CPUPerChange = (cpu1 - cpu0) / time.Duration(cfg.Changes)
	}
	return res
}
