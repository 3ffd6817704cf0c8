package hub

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub/replicas"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// ForwardClusterAnnotation names, in the SinkNode of a replica-to-replica stream, the
// cluster whose store the stream follows.
const ForwardClusterAnnotation = "meshfed.io/forward-cluster"

// ForwardCopyAnnotation, "true" in a replica-to-replica stream's SinkNode, asks for the
// copy a replica keeps of a cluster that no replica holds (its minion is away): a replica
// that starts meanwhile takes it from a peer, so the cluster's last state survives the
// replicas' restarts under the staleness policy.
const ForwardCopyAnnotation = "meshfed.io/forward-copy"

// ReplicasConfig makes a hub one replica of several that act as one hub: any minion and any
// sink may use any replica. Every replica must run the same configuration otherwise.
//
// Membership and failure detection are hashicorp/memberlist's (gossip); a cluster's
// resources travel between replicas over MCP, on the ingest listener, from the replica
// holding the cluster's newest minion session to every other one.
type ReplicasConfig struct {
	// Name is this replica's unique name; its identity is spiffe://<trustDomain>/hub/<name>
	// (the certificate it presents to its peers). Default: the host name.
	Name string `json:"name,omitempty"`
	// Gossip is the memberlist address (UDP and TCP). Default 0.0.0.0:7946.
	Gossip string `json:"gossip,omitempty"`
	// Advertise is the address (host:port) peers dial to reach this replica's ingest
	// listener. Default: the ingest listener's address; when it listens on every
	// interface, the host's first private IPv4 address (a pod's IP) with its port.
	Advertise string `json:"advertise,omitempty"`
	// Seeds are other replicas' gossip addresses; SeedDNS a name:port resolving to them
	// (a Kubernetes headless Service). Unreachable seeds are not an error: the first
	// replica has none to join.
	Seeds   []string `json:"seeds,omitempty"`
	SeedDNS string   `json:"seedDNS,omitempty"`
	// KeyFile holds the gossip encryption key, base64 of 16, 24 or 32 bytes, the same on
	// every replica. Without it gossip is plaintext (logged).
	KeyFile string `json:"keyFile,omitempty"`
	// Profile picks memberlist's defaults: "lan" (the default: 1 s probes, ~5 s to
	// declare a silent replica dead) or "local" (one machine or a fast network).
	Profile string `json:"profile,omitempty"`
	// ProbeInterval, ProbeTimeout, SuspicionMult, GossipInterval and PushPullInterval
	// override the profile's failure detection and gossip timing.
	ProbeInterval    Duration `json:"probeInterval,omitempty"`
	ProbeTimeout     Duration `json:"probeTimeout,omitempty"`
	SuspicionMult    int      `json:"suspicionMult,omitempty"`
	GossipInterval   Duration `json:"gossipInterval,omitempty"`
	PushPullInterval Duration `json:"pushPullInterval,omitempty"`
	// RejoinInterval between attempts to join the seeds and the replicas that left or
	// died while they are not members (how a network split heals). Default 10s.
	RejoinInterval Duration `json:"rejoinInterval,omitempty"`
}

func (r *ReplicasConfig) validate(c *Config) error {
	if r == nil {
		return nil
	}
	if r.Name == "" {
		r.Name, _ = os.Hostname()
	}
	if r.Name == "" || strings.ContainsAny(r.Name, "/:?# ") {
		return fmt.Errorf("replicas.name: %q is not a valid replica name (it becomes spiffe://<trustDomain>/hub/<name>)", r.Name)
	}
	if c.TrustDomain == "" && !c.Insecure {
		return errors.New("replicas: trustDomain is required: replicas authenticate each other as spiffe://<trustDomain>/hub/<name>")
	}
	if r.Gossip == "" {
		r.Gossip = "0.0.0.0:7946"
	}
	addrs := map[string]string{"replicas.gossip": r.Gossip, "replicas.advertise": r.Advertise, "replicas.seedDNS": r.SeedDNS}
	for i, s := range r.Seeds {
		addrs[fmt.Sprintf("replicas.seeds[%d]", i)] = s
	}
	for field, a := range addrs {
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("%s: %v", field, err)
		}
	}
	switch r.Profile {
	case "":
		r.Profile = "lan"
	case "lan", "local":
	default:
		return fmt.Errorf("replicas.profile: %q: want lan or local", r.Profile)
	}
	for field, d := range map[string]*Duration{"replicas.probeInterval": &r.ProbeInterval, "replicas.probeTimeout": &r.ProbeTimeout,
		"replicas.gossipInterval": &r.GossipInterval, "replicas.pushPullInterval": &r.PushPullInterval, "replicas.rejoinInterval": &r.RejoinInterval} {
		if err := d.Check(field); err != nil {
			return err
		}
	}
	if r.SuspicionMult < 0 {
		return fmt.Errorf("replicas.suspicionMult: %d is negative", r.SuspicionMult)
	}
	return nil
}

// mem returns the replicas' membership: nil for a single hub, and until Run starts it.
func (h *Hub) mem() *replicas.Members { return h.members.Load() }

// replicaID is this replica's identity: spiffe://<trustDomain>/hub/<name>, or, in insecure
// mode without a trust domain, hub/<name> (like clusters' bare names there).
func (h *Hub) replicaID() string {
	if h.cfg.TrustDomain == "" {
		return meshtls.KindHub + "/" + h.cfg.Replicas.Name
	}
	return meshtls.ID(h.cfg.TrustDomain, meshtls.KindHub, h.cfg.Replicas.Name)
}

// isReplica reports whether id is a replica's identity.
func (h *Hub) isReplica(id string) bool {
	if h.cfg.TrustDomain == "" {
		name, ok := strings.CutPrefix(id, meshtls.KindHub+"/")
		return ok && name != ""
	}
	k, _, _ := meshtls.ParseID(h.cfg.TrustDomain, id)
	return k == meshtls.KindHub
}

// startReplicas joins the replicas' membership, advertising ingest (the bound address).
func (h *Hub) startReplicas(ingest string) error {
	rc := h.cfg.Replicas
	adv := rc.Advertise
	if adv == "" {
		host, port, _ := net.SplitHostPort(ingest)
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			if host = privateIP(); host == "" {
				return errors.New("replicas.advertise: required: the ingest listener listens on every interface and this host has no private address")
			}
		}
		adv = net.JoinHostPort(host, port)
	}
	m, err := replicas.Start(replicas.Config{Name: rc.Name, Bind: rc.Gossip, MCPAddr: adv, Seeds: rc.Seeds, SeedDNS: rc.SeedDNS,
		KeyFile: rc.KeyFile, Local: rc.Profile == "local", Tuning: replicas.Tuning{ProbeInterval: rc.ProbeInterval.Duration,
			ProbeTimeout: rc.ProbeTimeout.Duration, SuspicionMult: rc.SuspicionMult, GossipInterval: rc.GossipInterval.Duration,
			PushPullInterval: rc.PushPullInterval.Duration, RejoinInterval: rc.RejoinInterval.Duration}}, h.log)
	if err != nil {
		return err
	}
	h.members.Store(m)
	h.log.Info("replica started", "replica", rc.Name, "gossip", m.Addr(), "advertise", adv, "identity", h.replicaID())
	return nil
}

// privateIP returns this host's first private IPv4 address (a pod's IP), else its first
// global unicast address, else "".
func privateIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	var global string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() {
			continue
		}
		if n.IP.To4() != nil && n.IP.IsPrivate() {
			return n.IP.String()
		}
		if global == "" && n.IP.IsGlobalUnicast() {
			global = n.IP.String()
		}
	}
	return global
}

// authenticatePeer admits a replica-to-replica stream only from a hub identity of the trust
// domain (in insecure mode too: the claimed identity must still be a replica's).
func (h *Hub) authenticatePeer(ctx context.Context) (string, error) {
	id, err := peerIdentity(ctx, h.cfg.Insecure)
	if err != nil {
		return "", err
	}
	if !h.isReplica(id) {
		return "", status.Errorf(codes.PermissionDenied, "identity %q is not a hub replica identity (%s): only replicas may follow a cluster's store",
			id, strings.TrimSuffix(h.replicaID(), h.cfg.Replicas.Name)+"NAME")
	}
	return id, nil
}

// feedRouter serves the replica-to-replica streams: each follows one cluster's resources
// as this replica received them, and only while this replica holds the cluster's session.
type feedRouter struct{ h *Hub }

// Check refuses a stream for a cluster this replica does not hold: an empty answer would
// read as deletions at the follower.
func (f feedRouter) Check(info *mcp.StreamInfo, _ string) error {
	cluster := info.Node().GetAnnotations()[ForwardClusterAnnotation]
	if f.h.cluster(cluster) == nil || f.h.current().comp.removed(cluster) {
		return status.Errorf(codes.InvalidArgument, "%s %q is not a configured cluster", ForwardClusterAnnotation, cluster)
	}
	if info.Node().GetAnnotations()[ForwardCopyAnnotation] == "true" {
		if a, held := f.h.mem().Authorities()[cluster]; held {
			return status.Errorf(codes.FailedPrecondition, "cluster %q is held by replica %q: follow it from there", cluster, a.Replica)
		}
		if !f.h.hasCopy(f.h.cluster(cluster)) {
			// An empty answer would make the asking replica ready without the cluster.
			return status.Errorf(codes.FailedPrecondition, "replica %q has no copy of cluster %q", f.h.cfg.Replicas.Name, cluster)
		}
		return nil
	}
	if !f.h.mem().Holds(cluster) {
		return status.Errorf(codes.FailedPrecondition, "replica %q does not hold cluster %q's session", f.h.cfg.Replicas.Name, cluster)
	}
	return nil
}

// Watch implements mcp.Watcher.
func (f feedRouter) Watch(info *mcp.StreamInfo, collection string, notify func()) (mcp.Collection, func(), bool) {
	cluster := info.Node().GetAnnotations()[ForwardClusterAnnotation]
	untrack := f.h.peerStreams.add(cluster, info)
	coll, cancel, ok := f.h.store.feed(cluster).Watch(info, collection, notify)
	// The cluster may have been released between Check and now, after its release closed
	// the streams it knew of: this one must not outlive it.
	if f.Check(info, collection) != nil {
		info.Close()
	}
	return coll, func() { cancel(); untrack() }, ok
}

// follow is one replica-to-replica stream of one cluster from the replica holding it.
type follow struct {
	replica, addr string
	copy          bool     // the copy of a cluster no replica holds (ForwardCopyAnnotation)
	peers         []string // copy: the peers asked, in order
	cancel        context.CancelFunc
	retired       atomic.Bool // superseded: its pushes are no longer applied
}

func (f *follow) stop() {
	f.retired.Store(true)
	f.cancel()
}

// followPeers keeps, for every cluster another replica holds, one stream from that replica
// (its authority). When the authority changes, the old stream stops at once (it carries
// an older session) and a stream to the new authority declares the versions this replica
// has: the cluster's copy stays in the store meanwhile and the new stream's first push is
// only the difference, so nothing that still exists vanishes. When no replica holds the
// cluster any more, the stream stops and the copy stays, served under the staleness
// policy. A cluster this replica holds itself is followed from nowhere.
func (h *Hub) followPeers(ctx context.Context) {
	follows := map[string]*follow{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		h.reconcileFollows(ctx, follows, &wg)
		select {
		case <-ctx.Done():
			for _, f := range follows {
				f.stop()
			}
			return
		case <-h.mem().Changed():
		case <-tick.C:
		}
	}
}

func (h *Hub) reconcileFollows(ctx context.Context, follows map[string]*follow, wg *sync.WaitGroup) {
	auth := h.mem().Authorities()
	self := h.cfg.Replicas.Name
	cur := h.current()
	held, followed := map[string]bool{}, map[string]bool{}
	var names []string
	defer func() {
		h.metrics.replicaView(len(h.mem().Replicas()), held, followed, names)
		view := map[string]string{}
		for c, f := range follows {
			switch {
			case f.copy:
				view[c] = "copy from " + strings.Join(f.peers, " or ")
			default:
				view[c] = f.replica
			}
		}
		h.mu.Lock()
		h.following = view
		h.mu.Unlock()
	}()
	for _, cs := range h.clusterList() {
		names = append(names, cs.name)
		held[cs.name] = h.mem().Holds(cs.name)
		a, ok := auth[cs.name]
		f := follows[cs.name]
		cs.mu.Lock()
		resyncing := cs.local > len(cs.sessions) // a minion stream here has not delivered everything yet
		cs.mu.Unlock()
		if resyncing {
			// The minion is here: its stream is the freshest source and the only writer of
			// the cluster's store until it syncs (and holds it) or ends.
			if f != nil {
				f.stop()
				delete(follows, cs.name)
			}
			continue
		}
		switch {
		case cur.comp.removed(cs.name):
			ok = false // no longer configured: nothing to follow
		case f != nil && f.retired.Load():
			f = nil // retired by a session of this replica's own that has ended since
		}
		if !ok && !cur.comp.removed(cs.name) {
			// No replica holds the cluster. A replica without a copy of its own (it started
			// while the cluster was away) takes a peer's copy and keeps mirroring it (a
			// staleness drop there reaches it); one with its own copy keeps that.
			if peers := h.copySources(cs.name); len(peers) > 0 && (f == nil || !f.copy || !samePeers(f.peers, peers)) && !h.hasCopy(cs) {
				if old := follows[cs.name]; old != nil {
					old.stop()
				}
				follows[cs.name] = h.startCopy(ctx, cs, peers, wg)
				followed[cs.name] = true
				continue
			}
			if f != nil && f.copy && len(h.copySources(cs.name)) > 0 {
				followed[cs.name] = true // keeps mirroring the copy it has taken
				continue
			}
		}
		if !ok || a.Replica == self {
			if old := follows[cs.name]; old != nil {
				old.stop()
				why := "no replica holds it"
				if ok {
					why = "this replica holds it"
				}
				cs.log.Info("no longer following the cluster from a peer", "why", why)
				delete(follows, cs.name)
			}
			continue
		}
		if f == nil || f.copy || f.replica != a.Replica || f.addr != a.MCPAddr {
			if old := follows[cs.name]; old != nil {
				old.stop()
			}
			f = h.startFollow(ctx, cs, a, wg)
			follows[cs.name] = f
		}
		followed[cs.name] = true
	}
}

func (h *Hub) startFollow(ctx context.Context, cs *clusterState, a replicas.Authority, wg *sync.WaitGroup) *follow {
	f := &follow{replica: a.Replica, addr: a.MCPAddr}
	log := cs.log.With("from_replica", a.Replica, "addr", a.MCPAddr)
	log.Info("following the cluster from the replica holding it", "epoch", a.Epoch)
	h.runFollow(ctx, cs, f, []string{a.MCPAddr}, log, wg)
	return f
}

// startCopy takes the copy of cs, which no replica holds, from the first of peers that has
// one, and keeps mirroring it.
func (h *Hub) startCopy(ctx context.Context, cs *clusterState, peers []replicas.Replica, wg *sync.WaitGroup) *follow {
	f := &follow{copy: true}
	var addrs []string
	for _, p := range peers {
		f.peers = append(f.peers, p.Name)
		addrs = append(addrs, p.MCPAddr)
	}
	log := cs.log.With("from_replicas", f.peers)
	log.Info("no replica holds the cluster: taking a peer's copy")
	h.runFollow(ctx, cs, f, addrs, log, wg)
	return f
}

// samePeers reports whether a copy follow asks the peers it would ask now.
func samePeers(asked []string, now []replicas.Replica) bool {
	if len(asked) != len(now) {
		return false
	}
	for i, r := range now {
		if asked[i] != r.Name {
			return false
		}
	}
	return true
}

// runFollow runs f's stream, trying addrs in turn, until f is stopped.
func (h *Hub) runFollow(ctx context.Context, cs *clusterState, f *follow, addrs []string, log *slog.Logger, wg *sync.WaitGroup) {
	ctx, f.cancel = context.WithCancel(ctx)
	h.metrics.followStarted()
	ctx = metadata.AppendToOutgoingContext(ctx, DevIdentityHeader, h.replicaID())
	b := mcp.Backoff{Initial: h.cfg.Backoff.Initial.Duration, Max: h.cfg.Backoff.Max.Duration}
	wg.Add(1)
	go func() {
		defer wg.Done()
		mcp.Redial(ctx, addrs, h.dialCred, b, log, nil, func(ctx context.Context, conn *grpc.ClientConn) error {
			sink, err := h.forwardSink(cs, f)
			if err != nil {
				return err
			}
			return sink.PullFrom(ctx, conn)
		})
	}()
}

// peerStreams are the replica-to-replica streams this replica serves, by cluster, so that
// releasing a cluster ends them: its copy may change afterwards (staleness, a reload) and
// must not reach followers as if it were the cluster's.
type peerStreams struct {
	mu      sync.Mutex // guards streams
	streams map[string]map[*mcp.StreamInfo]int
}

func (p *peerStreams) add(cluster string, info *mcp.StreamInfo) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streams == nil {
		p.streams = map[string]map[*mcp.StreamInfo]int{}
	}
	if p.streams[cluster] == nil {
		p.streams[cluster] = map[*mcp.StreamInfo]int{}
	}
	p.streams[cluster][info]++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.streams[cluster][info]--; p.streams[cluster][info] <= 0 {
				delete(p.streams[cluster], info)
			}
		})
	}
}

// closeAll ends the streams following cluster and returns how many.
func (p *peerStreams) closeAll(cluster string) int {
	p.mu.Lock()
	infos := make([]*mcp.StreamInfo, 0, len(p.streams[cluster]))
	for i := range p.streams[cluster] {
		infos = append(infos, i)
	}
	p.mu.Unlock()
	for _, i := range infos {
		i.Close()
	}
	return len(infos)
}

// assigned reports whether this replica is the one of the live replicas to run key, a
// dial-out task (a sink that only listens, a minion the hub polls): rendezvous hashing,
// so every replica computes the same answer from the same membership and a departure
// moves only the departed replica's tasks.
func (h *Hub) assigned(key string) bool {
	m := h.mem()
	if m == nil {
		return true
	}
	best, bestScore := "", uint64(0)
	for _, r := range m.Replicas() {
		if s := rendezvous(r.Name, key); best == "" || s > bestScore || (s == bestScore && r.Name < best) {
			best, bestScore = r.Name, s
		}
	}
	return best == h.cfg.Replicas.Name
}

// rendezvous is replica's score for key: the replica with the highest score runs it (every
// replica computes the same from the same membership; a departure moves only its keys).
func rendezvous(replica, key string) uint64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte(replica + "\x00" + key))
	return f.Sum64()
}

// runAssigned runs run while this replica is assigned key (always, for a single hub),
// stopping it when membership gives key to another replica and starting it again when it
// comes back: each listening sink is pushed to, and each listening minion polled, by one
// replica at a time.
func (h *Hub) runAssigned(ctx context.Context, key string, log *slog.Logger, run func(ctx context.Context)) {
	m := h.mem()
	if m == nil {
		run(ctx)
		return
	}
	changed, stop := m.Watch()
	defer stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-tick.C:
		}
		return true
	}
	for {
		for !h.assigned(key) {
			if !wait() {
				return
			}
		}
		log.Info("this replica runs the dial-out", "task", key)
		h.running(key, true)
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); run(tctx) }()
		for h.assigned(key) && wait() {
		}
		cancel()
		<-done
		h.running(key, false)
		if ctx.Err() != nil {
			return
		}
		log.Info("another replica runs the dial-out now", "task", key)
	}
}

// running records the dial-out tasks this replica runs, for /api/replicas.
func (h *Hub) running(key string, on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.runs == nil {
		h.runs = map[string]bool{}
	}
	if on {
		h.runs[key] = true
	} else {
		delete(h.runs, key)
	}
}

// ReplicaStatus is the replica view as the admin API shows it.
type ReplicaStatus struct {
	// Self is this replica's name.
	Self string `json:"self"`
	// Replicas are the live replicas and the clusters each holds (with the epoch).
	Replicas []replicas.Replica `json:"replicas"`
	// Authorities maps each held cluster to the replica holding its newest session.
	Authorities map[string]replicas.Authority `json:"authorities"`
	// Runs are the dial-out tasks this replica runs: dialSink/<name>, poll/<cluster>.
	Runs []string `json:"runs"`
	// Following maps each cluster this replica follows to the replica it follows it from
	// ("copy from a or b" for the copy of a cluster no replica holds).
	Following map[string]string `json:"following"`
}

// Replicas returns the replica view, or nil for a single hub.
func (h *Hub) Replicas() *ReplicaStatus {
	if h.mem() == nil {
		return nil
	}
	st := &ReplicaStatus{Self: h.cfg.Replicas.Name, Replicas: h.mem().Replicas(), Authorities: h.mem().Authorities(), Runs: []string{}}
	st.Following = map[string]string{}
	h.mu.Lock()
	for k := range h.runs {
		st.Runs = append(st.Runs, k)
	}
	for c, from := range h.following {
		st.Following[c] = from
	}
	h.mu.Unlock()
	sort.Strings(st.Runs)
	return st
}

// GossipAddr returns the replica's bound gossip address ("" for a single hub or before Run).
func (h *Hub) GossipAddr() string {
	if h.mem() == nil {
		return ""
	}
	return h.mem().Addr()
}

// forwardNode is what a follower's stream tells the replica it follows.
func (h *Hub) forwardNode(cluster string, copy bool) *mcppb.SinkNode {
	ann := map[string]string{ForwardClusterAnnotation: cluster}
	if copy {
		ann[ForwardCopyAnnotation] = "true"
	}
	return &mcppb.SinkNode{Id: h.cfg.Replicas.Name, Annotations: ann}
}

// hasCopy reports whether this replica has the cluster's state of its own: a stream (its
// minion's or a follow from its holder) delivered it since the start.
func (h *Hub) hasCopy(cs *clusterState) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.everSynced
}

// copySources orders the live peers to ask for the copy of a cluster no replica holds
// (rendezvous hashing, so replicas starting together ask the same one first); a peer
// without a copy refuses and the next is asked.
func (h *Hub) copySources(cluster string) []replicas.Replica {
	type scored struct {
		r     replicas.Replica
		score uint64
	}
	var peers []scored
	for _, r := range h.mem().Replicas() {
		if r.Name == h.cfg.Replicas.Name || r.MCPAddr == "" {
			continue
		}
		peers = append(peers, scored{r, rendezvous(r.Name, "copy/"+cluster)})
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].score > peers[j].score })
	out := make([]replicas.Replica, len(peers))
	for i, p := range peers {
		out[i] = p.r
	}
	return out
}
