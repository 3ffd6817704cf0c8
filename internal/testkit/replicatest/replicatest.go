// Package replicatest runs a group of hub replicas as real processes on loopback, with
// minion processes publishing files and in-process MCP sinks, all over mutual TLS from one
// test CA: the world the replica tests (test/replicas) and the replica benchmarks
// (internal/testkit/bench) kill, restart and split.
//
// Hub and minion binaries are built from this module into .cache/bin on first use. Every
// process is started in its own process group and killed (SIGKILL) when the test ends;
// their logs go to files in the world's directory, whose tails Dump prints.
//
// It is test infrastructure; nothing in the product imports it.
package replicatest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/internal/testkit/kubetest"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

// TB is what the world needs of a test (testing.TB, or a benchmark's runner): what a
// kube-apiserver environment needs, and Logf for the processes' logs.
type TB interface {
	kubetest.TB
	Logf(format string, args ...any)
}

// TrustDomain of every identity in a world.
const TrustDomain = "mesh.test"

// Collection is the one collection a world publishes.
const Collection = "istio/networking/v1alpha3/virtualservices"

// Options shape a world.
type Options struct {
	// Clusters is the number of clusters, c1..cN; each owns namespace ns-cN and hosts
	// *.cN.example.com. Routing: node ids global-* get every cluster, odd-* the odd
	// clusters, even-* the even ones.
	Clusters int
	// Objects each cluster publishes at the start (VirtualServices vs-0..).
	Objects int
	// ProbeInterval of the replicas' failure detection. Default 200ms.
	ProbeInterval time.Duration
	// WarmUp of every replica. Default 20s.
	WarmUp time.Duration
	// Staleness default of every replica. Default keep.
	Staleness string
}

// World is a running group of replicas, minions and sinks.
type World struct {
	tb     TB
	opts   Options
	Dir    string
	bins   string
	ca     *tlstest.CA
	bundle string
	key    string // gossip key file

	net *Net // nil: every replica on 127.0.0.1

	mu        sync.Mutex
	hubs      map[string]*Hub
	minions   map[string]*Minion
	sinkCerts map[string]*meshtls.Source
}

// New prepares a world (nothing runs yet).
func New(tb TB, opts Options) *World {
	tb.Helper()
	testbin.Own(tb, "minion")
	bins := filepath.Dir(testbin.Own(tb, "hub"))
	if opts.ProbeInterval == 0 {
		opts.ProbeInterval = 200 * time.Millisecond
	}
	if opts.WarmUp == 0 {
		opts.WarmUp = 20 * time.Second
	}
	w := &World{tb: tb, opts: opts, Dir: tb.TempDir(), bins: bins, ca: tlstest.NewCA(tb, "mesh-ca"),
		hubs: map[string]*Hub{}, minions: map[string]*Minion{}, sinkCerts: map[string]*meshtls.Source{}}
	w.bundle = filepath.Join(w.Dir, "ca.crt")
	tlstest.WriteBundle(tb, w.bundle, w.ca)
	w.key = filepath.Join(w.Dir, "gossip.key")
	tlstest.WriteAtomic(tb, w.key, []byte("bWVzaGZlZC10ZXN0LWdvc3NpcC1rZXktMzJieXRlcyE=\n")) // 32 bytes
	for i := 1; i <= opts.Clusters; i++ {
		for j := 0; j < opts.Objects; j++ {
			w.Write(ClusterName(i), fmt.Sprintf("vs-%d", j), 1)
		}
	}
	tb.Cleanup(w.killAll)
	return w
}

// ClusterName is the name of cluster i (1-based).
func ClusterName(i int) string { return fmt.Sprintf("c%d", i) }

// Write publishes (or changes) VirtualService name in cluster's directory; gen makes the
// content (and so the version) differ.
func (w *World) Write(cluster, name string, gen int) {
	ns := "ns-" + cluster
	body := fmt.Sprintf("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: %s\n  namespace: %s\n"+
		"spec:\n  hosts: [%s.%s.example.com]\n  http:\n  - route:\n    - destination: {host: %s.%s.svc.cluster.local, subset: g%d}\n",
		name, ns, name, cluster, name, ns, gen)
	p := filepath.Join(w.Dir, "clusters", cluster, ns, name+".yaml")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		w.tb.Fatal(err)
	}
	tlstest.WriteAtomic(w.tb, p, []byte(body))
}

// Delete removes VirtualService name from cluster's directory.
func (w *World) Delete(cluster, name string) {
	if err := os.Remove(filepath.Join(w.Dir, "clusters", cluster, "ns-"+cluster, name+".yaml")); err != nil {
		w.tb.Fatal(err)
	}
}

// UseNet runs the replicas started from now on in n's namespaces, on their addresses there.
func (w *World) UseNet(n *Net) { w.net = n }

// config is the hub configuration every replica shares, for replica name.
func (w *World) config(name string, addrs *Hub, seeds []string) *hub.Config {
	host := "127.0.0.1"
	if w.net != nil {
		host = w.net.IP(name)
	}
	cfg := hub.Defaults()
	cfg.Ingest, cfg.Serve, cfg.HTTP = host+":0", host+":0", host+":0"
	cfg.TrustDomain = TrustDomain
	cfg.StateDir = filepath.Join(w.Dir, "state-"+name)
	cfg.Collections = []string{Collection}
	cfg.WarmUp = ops.D(w.opts.WarmUp)
	cfg.Backoff = ops.Backoff{Initial: ops.D(50 * time.Millisecond), Max: ops.D(500 * time.Millisecond)}
	cfg.Staleness = hub.StalenessConfig{Default: w.opts.Staleness}
	cfg.Limits = hub.LimitsConfig{StreamsPerSecond: 1000, StreamBurst: 5000}
	cfg.Replicas = hub.DefaultReplicas()
	cfg.Replicas.Name, cfg.Replicas.Gossip, cfg.Replicas.Seeds, cfg.Replicas.KeyFile, cfg.Replicas.Profile = name, host+":0", seeds, w.key, "local"
	cfg.Replicas.ProbeInterval, cfg.Replicas.RejoinInterval, cfg.Replicas.GossipInterval = ops.D(w.opts.ProbeInterval), ops.D(time.Second), ops.D(50*time.Millisecond)
	switch {
	case addrs != nil: // a restart keeps its addresses
		cfg.Ingest, cfg.Serve, cfg.HTTP, cfg.Replicas.Gossip = addrs.Ingest, addrs.Serve, addrs.HTTP, addrs.Gossip
	case w.net == nil:
		// On the shared loopback, ports below the ephemeral range: a replica restarted on
		// its addresses must find them free, and the kernel may hand a freed ephemeral
		// port to any other process meanwhile. (In a namespace of its own, port 0 is fine.)
		cfg.Ingest, cfg.Serve, cfg.HTTP, cfg.Replicas.Gossip = FreeAddr(w.tb, false), FreeAddr(w.tb, false), FreeAddr(w.tb, false), FreeAddr(w.tb, true)
	}
	c, k, _ := w.ca.Issue(w.tb, w.Dir, "hub-"+name, host, "spiffe://"+TrustDomain+"/hub/"+name)
	cfg.TLS = &meshtls.Config{Files: meshtls.Files{Cert: c, Key: k, CA: w.bundle}}
	var odd, even []string
	for i := 1; i <= w.opts.Clusters; i++ {
		cfg.Clusters = append(cfg.Clusters, hub.ClusterConfig{Name: ClusterName(i), Namespaces: []string{"ns-" + ClusterName(i)},
			Hosts: []string{"*." + ClusterName(i) + ".example.com"}})
		if i%2 == 1 {
			odd = append(odd, ClusterName(i))
		} else {
			even = append(even, ClusterName(i))
		}
	}
	cfg.Routing.Rules = []routing.Rule{{Name: "global", NodeIDs: []string{"global-*"}},
		{Name: "odd", NodeIDs: []string{"odd-*"}, Clusters: odd}, {Name: "even", NodeIDs: []string{"even-*"}, Clusters: even}}
	return cfg
}

// FreeAddr returns a free 127.0.0.1 address whose port is below Linux's ephemeral range
// (32768 and up), free for UDP too when udp is set. For a process that must be given its
// addresses up front, or restarted on them: the kernel hands a freed ephemeral port to any
// other process meanwhile, never one below that range. It never returns an address twice in
// one test process: two processes given the same free port would race for it.
func FreeAddr(tb TB, udp bool) string {
	tb.Helper()
	for range 200 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
		if !handOut(addr) { // free now, but already given to a process that may not listen yet
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		if udp {
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				l.Close()
				continue
			}
			u.Close()
		}
		l.Close()
		return addr
	}
	tb.Fatal("no free port below the ephemeral range")
	return ""
}

var (
	handedMu sync.Mutex
	handed   = map[string]bool{} // addresses FreeAddr returned
)

// handOut records addr as given out, unless it already was.
func handOut(addr string) bool {
	handedMu.Lock()
	defer handedMu.Unlock()
	if handed[addr] {
		return false
	}
	handed[addr] = true
	return true
}

// Hub is one replica process.
type Hub struct {
	Name                        string
	Ingest, Serve, HTTP, Gossip string
	Pid                         int
	// Listening is when the process had reported every address (it serves from then on,
	// once ready).
	Listening time.Time
	logPath   string
	cmd       *exec.Cmd
	done      chan struct{}
}

// StartHub starts replica name joining seeds (gossip addresses). Given prev (an earlier
// life of the replica), it listens on the same addresses; its state directory is emptied
// either way when fresh is true (otherwise it restores the clusters' state it kept).
func (w *World) StartHub(name string, prev *Hub, fresh bool, seeds ...string) *Hub {
	w.tb.Helper()
	return w.startHub(name, prev, fresh, false, seeds)
}

// StartSingle starts hub name without a replicas section: a single hub, as cmd/hub runs
// one. prev and fresh are as for StartHub.
func (w *World) StartSingle(name string, prev *Hub, fresh bool) *Hub {
	w.tb.Helper()
	return w.startHub(name, prev, fresh, true, nil)
}

func (w *World) startHub(name string, prev *Hub, fresh, single bool, seeds []string) *Hub {
	w.tb.Helper()
	cfg := w.config(name, prev, seeds)
	if single {
		cfg.Replicas = nil
	}
	if fresh {
		_ = os.RemoveAll(cfg.StateDir)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		w.tb.Fatal(err)
	}
	cfgPath := filepath.Join(w.Dir, "hub-"+name+".yaml")
	tlstest.WriteAtomic(w.tb, cfgPath, b)
	h := &Hub{Name: name, logPath: filepath.Join(w.Dir, fmt.Sprintf("hub-%s.%d.log", name, time.Now().UnixNano())), done: make(chan struct{})}
	h.cmd = exec.Command(filepath.Join(w.bins, "meshfed-hub"), "-config", cfgPath)
	if w.net != nil { // ip execs the hub inside the namespace: same process
		h.cmd = exec.Command("ip", "netns", "exec", w.net.ns[name], filepath.Join(w.bins, "meshfed-hub"), "-config", cfgPath)
	}
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := h.cmd.StderrPipe()
	if err != nil {
		w.tb.Fatal(err)
	}
	logf, err := os.Create(h.logPath)
	if err != nil {
		w.tb.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		w.tb.Fatal(err)
	}
	h.Pid = h.cmd.Process.Pid
	addrs := make(chan [2]string, 8)
	go func() {
		defer close(h.done)
		defer logf.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n'))
			var a [2]string
			var ev struct{ Msg, Gossip string }
			if listener, addr, ok := testproc.Listening(line); ok {
				a = [2]string{listener, addr}
			} else if json.Unmarshal(line, &ev) == nil && ev.Msg == "replica started" {
				a = [2]string{"gossip", ev.Gossip}
			} else {
				continue
			}
			select {
			case addrs <- a:
			default: // nobody reads after the start: never block the hub's stderr
			}
		}
		_ = h.cmd.Wait()
	}()
	w.mu.Lock()
	w.hubs[name] = h
	w.mu.Unlock()
	deadline := time.After(30 * time.Second)
	for h.Ingest == "" || h.Serve == "" || (h.Gossip == "" && !single) || h.HTTP == "" {
		select {
		case a := <-addrs:
			switch a[0] {
			case "ingest":
				h.Ingest = a[1]
			case "serve":
				h.Serve = a[1]
			case "gossip":
				h.Gossip = a[1]
			case "http":
				h.HTTP = a[1]
			}
		case <-h.done:
			w.Dump()
			w.tb.Fatalf("hub %s exited at start", name)
		case <-deadline:
			w.Dump()
			w.tb.Fatalf("hub %s did not report its addresses", name)
		}
	}
	h.Listening = time.Now()
	return h
}

// Kill sends SIGKILL to the replica's process group and waits for it (nothing if it has
// already exited: its PID may belong to another process by now).
func (h *Hub) Kill() { killGroup(h.Pid, h.done) }

// Running reports whether the replica's process has not exited.
func (h *Hub) Running() bool {
	select {
	case <-h.done:
		return false
	default:
		return true
	}
}

// Freeze stops the replica's process (SIGSTOP): it holds its connections and answers
// nothing, as a replica that hangs does, until Thaw.
func (h *Hub) Freeze() { signalGroup(h.Pid, h.done, syscall.SIGSTOP) }

// Thaw resumes a frozen replica (SIGCONT).
func (h *Hub) Thaw() { signalGroup(h.Pid, h.done, syscall.SIGCONT) }

// signalGroup sends sig to process group pid unless done (its PID may be another
// process's by then).
func signalGroup(pid int, done <-chan struct{}, sig syscall.Signal) {
	select {
	case <-done:
	default:
		_ = syscall.Kill(-pid, sig)
	}
}

// killGroup sends SIGKILL to process group pid unless done (closed when the process has
// exited: its PID may belong to another process by then), and waits for done.
func killGroup(pid int, done <-chan struct{}) {
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-done
}

// Get fetches one admin API path of the replica as JSON into v.
func (h *Hub) Get(path string, v any) error {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + h.HTTP + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, b)
	}
	return json.Unmarshal(b, v)
}

// HeldBy returns which replica holds each cluster, as this replica sees it.
func (h *Hub) HeldBy() (map[string]string, error) {
	var cs []api.ClusterStatus
	if err := h.Get("/api/clusters", &cs); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, c := range cs {
		if c.HeldBy != nil {
			out[c.Name] = c.HeldBy.Replica
		}
	}
	return out, nil
}

// SinkCount returns how many sinks are connected to the replica.
func (h *Hub) SinkCount() (int, error) {
	var ss []api.SinkStatus
	err := h.Get("/api/sinks", &ss)
	return len(ss), err
}

// CPU returns the replica's user+system CPU time so far.
func (h *Hub) CPU() (time.Duration, error) { return testproc.CPU(h.Pid) }

// Minion is one minion process.
type Minion struct {
	Cluster string
	Pid     int
	done    chan struct{}
}

// StartMinion starts cluster's minion pushing to the replicas' ingest addresses in the
// order given (it fails over along the list).
func (w *World) StartMinion(cluster string, prefer ...*Hub) *Minion {
	w.tb.Helper()
	var addrs []string
	for _, h := range prefer {
		addrs = append(addrs, h.Ingest)
	}
	c, k, _ := w.ca.Issue(w.tb, w.Dir, "minion-"+cluster, "spiffe://"+TrustDomain+"/cluster/"+cluster)
	cfg := minion.Defaults()
	cfg.Cluster = cluster
	cfg.Sources = []minion.SourceConfig{{URL: "fs://" + filepath.Join(w.Dir, "clusters", cluster)}}
	cfg.Collections = []string{Collection}
	cfg.Destinations.Push = []string{"push://" + strings.Join(addrs, ",")}
	cfg.Destinations.Backoff = ops.Backoff{Initial: ops.D(50 * time.Millisecond), Max: ops.D(500 * time.Millisecond)}
	cfg.HTTP = "127.0.0.1:0"
	cfg.TLS = &meshtls.Config{Files: meshtls.Files{Cert: c, Key: k, CA: w.bundle}}
	b, err := json.Marshal(cfg)
	if err != nil {
		w.tb.Fatal(err)
	}
	cfgPath := filepath.Join(w.Dir, "minion-"+cluster+".yaml")
	tlstest.WriteAtomic(w.tb, cfgPath, b)
	logf, err := os.Create(filepath.Join(w.Dir, fmt.Sprintf("minion-%s.%d.log", cluster, time.Now().UnixNano())))
	if err != nil {
		w.tb.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(w.bins, "meshfed-minion"), "-config", cfgPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		w.tb.Fatal(err)
	}
	m := &Minion{Cluster: cluster, Pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(m.done) }()
	w.mu.Lock()
	w.minions[cluster] = m
	w.mu.Unlock()
	return m
}

// Kill sends SIGKILL to the minion's process group and waits for it (nothing if it has
// already exited).
func (m *Minion) Kill() { killGroup(m.Pid, m.done) }

func (w *World) killAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.minions {
		m.Kill()
	}
	for _, h := range w.hubs {
		h.Kill()
	}
}

// Dump logs the tail of every process log of the world (for a failing test).
func (w *World) Dump() {
	logs, _ := filepath.Glob(filepath.Join(w.Dir, "*.log"))
	sort.Strings(logs)
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if keep := 40; len(lines) > keep && os.Getenv("MESHFED_TEST_FULL_LOGS") == "" {
			lines = lines[len(lines)-keep:]
		}
		w.tb.Logf("--- %s (last %d lines)\n%s", filepath.Base(l), len(lines), strings.Join(lines, "\n"))
	}
}

// Eventually polls cond every 20ms until it holds, and fails the test (with the world's
// logs) after d.
func (w *World) Eventually(d time.Duration, what string, cond func() bool) time.Duration {
	w.tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			w.Dump()
			w.tb.Fatalf("timed out after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}
