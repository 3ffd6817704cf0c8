package replicas

import (
	"slices"
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/mcp"
)

// ForwardClusterAnnotation names, in the SinkNode of a replica-to-replica stream, the
// cluster whose store the stream follows.
const ForwardClusterAnnotation = "meshfed.io/forward-cluster"

// ForwardCopyAnnotation, "true" in a replica-to-replica stream's SinkNode, asks for the
// copy a replica keeps of a cluster that no replica holds (its minion is away): a replica
// that starts meanwhile takes it from a peer, so the cluster's last state survives the
// replicas' restarts under the staleness policy.
const ForwardCopyAnnotation = "meshfed.io/forward-copy"

// ForwardEpochAnnotation, with ForwardCopyAnnotation, is the epoch the asker wants the copy
// to be at least (decimal): a peer whose copy is older refuses, so a view of the copies
// out of date cannot make the asker take an older state than it knows exists.
const ForwardEpochAnnotation = "meshfed.io/forward-epoch"

// feeds are, per cluster, its resources as this replica received them: what peers follow.
type feeds struct {
	mu    sync.Mutex // guards by
	by    map[string]*mcp.Cache
	colls []string
}

// of returns cluster's feed, creating it.
func (f *feeds) of(cluster string) *mcp.Cache {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.by[cluster]
	if c == nil {
		if f.by == nil {
			f.by = map[string]*mcp.Cache{}
		}
		c = mcp.NewCache(f.colls...)
		f.by[cluster] = c
	}
	return c
}

func (f *feeds) drop(cluster string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.by, cluster)
}

// StateChanged brings the cluster's feed up to date (under the store's lock, so in the
// order the store changed).
func (l *Layer) StateChanged(cluster, collection string, put []*mcp.Entry, removed []string) {
	l.feeds.of(cluster).Update(collection, put, removed)
}

// ClusterRemoved drops a cluster that left the configuration: its feed, its copy's epoch,
// and the peers' streams following it from here. The membership keeps the highest epoch it
// saw for it, so sessions of a cluster added again still order after the old ones.
//
// A cluster that departed (the core keeps its objects until an operator confirms its
// removal, when ClusterRemoved comes again) keeps its feed and its copy's epoch: its copy
// takes part in the group's copy exchange like any other cluster's whose minion is away
// (copies.go), so a replica that missed its last changes (down at the removal) or lost it
// (wiped) takes the newest one from its peers; and configured again, it has what it had,
// offerable at its epoch (a feed emptied meanwhile would send the peers following it the
// deletion of every object). The peers' streams following its session from here end: no
// session of it is live any more.
func (l *Layer) ClusterRemoved(cluster string) {
	departed := l.h.ClusterDeparted(cluster)
	if !departed {
		l.feeds.drop(cluster)
	}
	l.peers.closeAll(cluster)
	if !departed {
		l.mu.Lock()
		if c := l.clusters[cluster]; c != nil {
			c.epoch, c.restored = 0, false
		}
		if m := l.members(); m != nil {
			m.SetCopy(cluster, "", 0, false)
		}
		l.mu.Unlock()
	}
	if m := l.members(); m != nil {
		m.Poke() // the next reconciliation stops following it
	}
}

// ClusterRenamed carries the renamed cluster's copy over to its new name: the same
// session's state (store.transfer moved it), so at the same epoch, offered to the peers as
// before (without an epoch no peer would offer it, and a replica without a copy, wiped,
// would never have it). A copy held back (restored, not confirmed) stays held back. The
// core moved the epoch it keeps in the state file with the state (Hub.rename).
func (l *Layer) ClusterRenamed(from, to string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var epoch uint64 // 0: the state moved is of no session known (what to had is replaced all the same)
	restored := false
	if old := l.clusters[from]; old != nil {
		epoch, restored = old.epoch, old.restored
	}
	c := l.repLocked(to)
	c.epoch, c.restored = epoch, restored // the core moved its epoch with its state
	if m := l.members(); m != nil {
		l.advertiseLocked(m, to, c)
	}
}

// feedRouter serves the replica-to-replica streams: each follows one cluster's resources
// as this replica received them, and only while this replica holds the cluster's session
// (or, for a copy, while nobody does and this replica has one).
type feedRouter struct{ l *Layer }

// Check refuses a stream for a cluster this replica may not serve: an empty answer would
// read as deletions at the follower.
func (f feedRouter) Check(info *mcp.StreamInfo, _ string) error {
	l := f.l
	cluster := info.Node().GetAnnotations()[ForwardClusterAnnotation]
	if !slices.Contains(l.h.KeptClusters(), cluster) {
		return status.Errorf(codes.InvalidArgument, "%s %q is not a cluster this replica keeps", ForwardClusterAnnotation, cluster)
	}
	departed := l.h.ClusterDeparted(cluster) // no session of it is live: only copies
	if info.Node().GetAnnotations()[ForwardCopyAnnotation] == "true" {
		if a, held := l.members().Authorities()[cluster]; held && !departed {
			return status.Errorf(codes.FailedPrecondition, "cluster %q is held by replica %q: follow it from there", cluster, a.Replica)
		}
		if !l.h.ClusterSynced(cluster) || !l.h.ClusterIsSessionState(cluster) {
			// An empty answer would make the asking replica ready without the cluster; a
			// restored copy not confirmed yet may be older than what the asker knows; one
			// this replica does not know whole would delete at the asker what it lacks.
			return status.Errorf(codes.FailedPrecondition, "replica %q has no copy of cluster %q it may give", l.cfg.Name, cluster)
		}
		if want := info.Node().GetAnnotations()[ForwardEpochAnnotation]; want != "" {
			e, err := strconv.ParseUint(want, 10, 64)
			if err != nil {
				return status.Errorf(codes.InvalidArgument, "%s %q: %v", ForwardEpochAnnotation, want, err)
			}
			if have := l.copyEpoch(cluster); have < e {
				return status.Errorf(codes.FailedPrecondition, "replica %q's copy of cluster %q is of epoch %d, older than %d", l.cfg.Name, cluster, have, e)
			}
		}
		return nil
	}
	if departed || !l.members().Holds(cluster) {
		return status.Errorf(codes.FailedPrecondition, "replica %q does not hold cluster %q's session", l.cfg.Name, cluster)
	}
	return nil
}

// Watch implements mcp.Watcher.
func (f feedRouter) Watch(info *mcp.StreamInfo, collection string, notify func()) (mcp.Collection, func(), bool) {
	cluster := info.Node().GetAnnotations()[ForwardClusterAnnotation]
	untrack := f.l.peers.add(cluster, info)
	coll, cancel, ok := f.l.feeds.of(cluster).Watch(info, collection, notify)
	// The cluster may have been released between Check and now, after its release closed
	// the streams it knew of: this one must not outlive it.
	if f.Check(info, collection) != nil {
		info.Close()
	}
	return coll, func() { cancel(); untrack() }, ok
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

// ClusterDecided implements hub.Layer: an operator's decision here is about to change what
// this replica holds of cluster. Held here (a live session of this replica's), it is the
// group's: the followers follow this replica's state. Otherwise the peers' streams
// following this replica's copy end now, before the change, so that none carries it (the
// core has marked the copy as not its session's state, so none starts again; a stream
// closed sends nothing more, see mcp's Source.Serve), and the copy is advertised held back.
func (l *Layer) ClusterDecided(cluster string) bool {
	m := l.members()
	if m != nil && m.Holds(cluster) {
		return true
	}
	if m != nil {
		l.mu.Lock()
		if c := l.clusters[cluster]; c != nil {
			l.advertiseLocked(m, cluster, c)
		}
		l.mu.Unlock()
	}
	if n := l.peers.closeAll(cluster); n > 0 {
		l.log.Info("an operator's decision here changes the cluster's copy: closed the peers' streams following it", "cluster", cluster, "streams", n)
	}
	return false
}
