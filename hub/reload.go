package hub

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

// watchRegistry knows which subset every serving stream (MCP or xDS) watches, so a reload
// can close the streams whose routing changed.
type watchRegistry struct {
	mu      sync.Mutex // guards streams
	streams map[*mcp.StreamInfo]*watched
}

type watched struct {
	key  string
	refs int
}

func newWatchRegistry() *watchRegistry {
	return &watchRegistry{streams: map[*mcp.StreamInfo]*watched{}}
}

func (r *watchRegistry) track(info *mcp.StreamInfo, key string) func() {
	r.mu.Lock()
	w := r.streams[info]
	if w == nil {
		w = &watched{key: key}
		r.streams[info] = w
	}
	w.refs++
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if w.refs--; w.refs == 0 && r.streams[info] == w {
				delete(r.streams, info)
			}
		})
	}
}

// rerouted closes every stream whose subset under table differs from the one it watches,
// and returns how many it closed. Such a sink reconnects and gets its new view (resuming
// by versions if it declares them).
func (r *watchRegistry) rerouted(table *routing.Table) int {
	r.mu.Lock()
	var stale []*mcp.StreamInfo
	for info, w := range r.streams {
		node := info.Node()
		if table.Select(routing.Sink{Identity: info.Identity, NodeID: node.GetId(), Annotations: node.GetAnnotations()}).Key() != w.key {
			stale = append(stale, info)
		}
	}
	r.mu.Unlock()
	for _, i := range stale {
		i.Close()
	}
	return len(stale)
}

// ReloadResult says what a reload changed.
type ReloadResult struct {
	// Refused are stored resources the new ownership no longer allows: no longer served.
	Refused int
	// ClosedIngest and ClosedSinks are the streams closed so they reconnect under the new
	// configuration (clusters whose ownership or identity changed; sinks routed elsewhere).
	ClosedIngest, ClosedSinks int
}

// restartOnly are the fields a reload cannot change: they shape listeners and streams.
func restartOnly(old, next *Config) error {
	for _, f := range []struct {
		name string
		a, b any
	}{
		{"ingest", old.Ingest, next.Ingest}, {"serve", old.Serve, next.Serve}, {"http", old.HTTP, next.HTTP},
		{"tls", old.TLS, next.TLS}, {"insecure", old.Insecure, next.Insecure}, {"collections", old.Collections, next.Collections},
		{"maxMessageSize", old.MaxMessageSize, next.MaxMessageSize}, {"dialSinks", old.DialSinks, next.DialSinks},
		{"poll", old.Poll, next.Poll}, {"backoff", old.Backoff.Initial.Duration, next.Backoff.Initial.Duration},
		{"backoff", old.Backoff.Max.Duration, next.Backoff.Max.Duration}, {"limits", old.Limits, next.Limits},
		{"replicas", old.Replicas, next.Replicas},
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			return fmt.Errorf("%s: changing it needs a restart of the hub; the running configuration stays", f.name)
		}
	}
	return nil
}

// Reload applies a new configuration without a restart: ownership, shared namespaces,
// conflict policy, staleness and routing. Stored resources are re-checked against the new
// ownership (those now refused stop being served); clusters whose ownership or identities
// changed are asked to reconnect, so what was refused before is resent; winners are
// re-chosen under the new policy; open views are recomputed under the new rules and push
// only what changed; sinks whose rules changed are asked to reconnect. A field that shapes
// listeners or streams (see restartOnly) refuses the whole change.
func (h *Hub) Reload(next *Config) (ReloadResult, error) {
	var res ReloadResult
	comp, err := next.compile()
	if err != nil {
		return res, err
	}
	if err := restartOnly(h.cfg, next); err != nil {
		return res, err
	}
	old := h.current()
	oldClusters := map[string]ClusterConfig{}
	for _, c := range old.cfg.Clusters {
		oldClusters[c.Name] = c
	}
	h.clustersMu.Lock()
	for _, c := range next.Clusters {
		if h.clusters[c.Name] == nil {
			h.clusters[c.Name] = &clusterState{name: c.Name, log: h.log.With("cluster", c.Name)}
		}
	}
	h.clustersMu.Unlock()
	h.live.Store(&live{cfg: next, comp: comp})

	// Ownership: re-check what is stored; drop clusters no longer configured.
	refused := h.store.recheck(func(r *resource) error {
		if comp.removed(r.cluster) {
			return fmt.Errorf("cluster %q is no longer in the hub's configuration", r.cluster)
		}
		return comp.policy.Check(r.cluster, acl.Object{Collection: r.collection, Name: r.name, Hosts: r.hosts})
	})
	for cluster, rs := range refused {
		res.Refused += len(rs)
		if cs := h.cluster(cluster); cs != nil {
			cs.mu.Lock()
			if cs.rejections == nil {
				cs.rejections = map[string]map[string]string{}
			}
			for _, r := range rs {
				if cs.rejections[r.collection] == nil {
					cs.rejections[r.collection] = map[string]string{}
				}
				cs.rejections[r.collection][r.name] = r.reason
			}
			cs.mu.Unlock()
			cs.log.Warn("reload: stored resources no longer allowed; not served any more", "count", len(rs))
		}
	}
	for _, c := range next.Clusters {
		if prev, ok := oldClusters[c.Name]; ok && !reflect.DeepEqual(prev, c) {
			if cs := h.cluster(c.Name); cs != nil {
				res.ClosedIngest += cs.closeStreams()
			}
		}
	}
	for name := range oldClusters {
		if comp.removed(name) {
			if cs := h.cluster(name); cs != nil {
				res.ClosedIngest += cs.closeStreams()
				h.peerStreams.closeAll(name)
				cs.mu.Lock()
				cs.everSynced = false // re-added later, it starts over (a peer's copy, its minion)
				cs.mu.Unlock()
			}
		}
	}
	// Merge, then views, then the sinks routed elsewhere.
	h.store.setPolicy(ConflictPolicy{Priority: next.Conflicts.Priority})
	h.store.reroute(comp.routes)
	res.ClosedSinks = h.watchers.rerouted(comp.routes)
	h.log.Info("configuration reloaded", "refused", res.Refused, "closed_ingest_streams", res.ClosedIngest, "closed_sink_streams", res.ClosedSinks)
	return res, nil
}

// RunWithReload runs the hub with the configuration in path and follows the file: a valid
// change is applied with Reload; an invalid one, or one that needs a restart, is logged
// and counted, and the running configuration stays.
func RunWithReload(ctx context.Context, path string, log *slog.Logger, reg *prometheus.Registry) error {
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	h, err := New(cfg, log, reg)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return h.Run(ctx) })
	g.Go(func() error { return h.watchConfig(ctx, path) })
	return g.Wait()
}

// watchConfig reloads the file after each burst of changes to its directory.
func (h *Hub) watchConfig(ctx context.Context, path string) error {
	return ops.WatchFile(ctx, path, 100*time.Millisecond, h.log, func() {
		next, err := LoadConfig(path)
		if err == nil && reflect.DeepEqual(next, h.current().cfg) {
			return
		}
		if err == nil {
			_, err = h.Reload(next)
		}
		if err != nil {
			h.log.Error("configuration refused; keeping the running one", "err", err)
			h.metrics.reload("refused")
			return
		}
		h.metrics.reload("applied")
	})
}
