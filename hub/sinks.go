package hub

import (
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

// SinkStatus is one connected MCP sink as the admin API shows it.
type SinkStatus struct {
	Stream      uint64                     `json:"stream"`
	Peer        string                     `json:"peer"`
	Transport   string                     `json:"transport"` // server: it dialed in; client: the hub dialed it
	Identity    string                     `json:"identity"`
	NodeID      string                     `json:"nodeId"`
	Annotations map[string]string          `json:"annotations,omitempty"`
	Rules       []string                   `json:"rules"`
	Since       time.Time                  `json:"since"`
	Collections map[string]*SinkCollection `json:"collections"`
	info        *mcp.StreamInfo
}

// SinkCollection is a sink's state for one collection.
type SinkCollection struct {
	// PushedVersion is the view's version last pushed, AckedVersion the last one it ACKed.
	PushedVersion uint64 `json:"pushedVersion"`
	AckedVersion  uint64 `json:"ackedVersion"`
	// Pending: a push awaits its ACK.
	Pending bool `json:"pending"`
	// LastNACK is the reason of the last NACK, if any, and its version.
	LastNACK      string    `json:"lastNack,omitempty"`
	NACKedVersion uint64    `json:"nackedVersion,omitempty"`
	Resources     int       `json:"resources"`
	LastPush      time.Time `json:"lastPush"`
}

// sinkRegistry follows the hub's MCP sink streams through the engine's hooks.
type sinkRegistry struct {
	h *Hub

	mu    sync.Mutex // guards sinks
	sinks map[uint64]*SinkStatus
}

func newSinkRegistry(h *Hub) *sinkRegistry {
	return &sinkRegistry{h: h, sinks: map[uint64]*SinkStatus{}}
}

func (r *sinkRegistry) hooks() mcp.Hooks {
	return mcp.Hooks{
		StreamOpened: func(i *mcp.StreamInfo) {
			r.mu.Lock()
			r.sinks[i.ID] = &SinkStatus{Stream: i.ID, Peer: i.Peer, Transport: i.Transport, Identity: i.Identity, Since: r.h.now(),
				Collections: map[string]*SinkCollection{}, info: i}
			r.mu.Unlock()
		},
		StreamClosed: func(i *mcp.StreamInfo, _ error) {
			r.mu.Lock()
			delete(r.sinks, i.ID)
			r.mu.Unlock()
		},
		Pushed: func(i *mcp.StreamInfo, e mcp.PushEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if c := r.collLocked(i, e.Collection); c != nil {
				c.PushedVersion, c.Pending, c.LastPush = e.Version, true, r.h.now()
				if !e.Incremental {
					c.Resources = e.Resources
				}
			}
		},
		Acked: func(i *mcp.StreamInfo, e mcp.AckEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if c := r.collLocked(i, e.Collection); c != nil {
				c.Pending = false
				if e.Code == codes.OK {
					c.AckedVersion = e.Version
				} else {
					c.LastNACK, c.NACKedVersion = e.Code.String()+": "+e.Message, e.Version
				}
			}
		},
	}
}

func (r *sinkRegistry) collLocked(i *mcp.StreamInfo, coll string) *SinkCollection {
	s := r.sinks[i.ID]
	if s == nil {
		return nil
	}
	c := s.Collections[coll]
	if c == nil {
		c = &SinkCollection{}
		s.Collections[coll] = c
	}
	return c
}

// list returns the connected sinks, by stream.
func (r *sinkRegistry) list() []SinkStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]SinkStatus, 0, len(r.sinks))
	for _, s := range r.sinks {
		cp := *s
		n := s.info.Node()
		cp.NodeID, cp.Annotations = n.GetId(), n.GetAnnotations()
		cp.Rules = r.h.current().comp.routes.Select(routing.Sink{Identity: s.Identity, NodeID: cp.NodeID, Annotations: cp.Annotations}).Rules()
		cp.Collections = make(map[string]*SinkCollection, len(s.Collections))
		for k, v := range s.Collections {
			c := *v
			cp.Collections[k] = &c
		}
		out = append(out, cp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}
