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

// sinkRegistry follows the hub's MCP sink streams through the engine's hooks. The hooks run
// on every push and ACK of every stream: a lock-free map from stream to its entry, and a
// lock per entry, keep them from contending with each other.
type sinkRegistry struct {
	h     *Hub
	sinks sync.Map // *mcp.StreamInfo -> *sinkEntry
}

type sinkEntry struct {
	mu sync.Mutex // guards st
	st SinkStatus
}

func newSinkRegistry(h *Hub) *sinkRegistry { return &sinkRegistry{h: h} }

func (r *sinkRegistry) hooks() mcp.Hooks {
	return mcp.Hooks{
		StreamOpened: func(i *mcp.StreamInfo) {
			r.sinks.Store(i, &sinkEntry{st: SinkStatus{Stream: i.ID, Peer: i.Peer, Transport: i.Transport, Identity: i.Identity,
				Since: r.h.now(), Collections: map[string]*SinkCollection{}, info: i}})
		},
		StreamClosed: func(i *mcp.StreamInfo, _ error) { r.sinks.Delete(i) },
		Pushed: func(i *mcp.StreamInfo, e mcp.PushEvent) {
			r.update(i, e.Collection, func(c *SinkCollection) {
				c.PushedVersion, c.Pending, c.LastPush = e.Version, true, time.Now()
				if !e.Incremental {
					c.Resources = e.Resources
				}
			})
		},
		Acked: func(i *mcp.StreamInfo, e mcp.AckEvent) {
			r.update(i, e.Collection, func(c *SinkCollection) {
				c.Pending = false
				if e.Code == codes.OK {
					c.AckedVersion = e.Version
				} else {
					c.LastNACK, c.NACKedVersion = e.Code.String()+": "+e.Message, e.Version
				}
			})
		},
	}
}

func (r *sinkRegistry) update(i *mcp.StreamInfo, coll string, f func(*SinkCollection)) {
	v, ok := r.sinks.Load(i)
	if !ok {
		return
	}
	e := v.(*sinkEntry)
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.st.Collections[coll]
	if c == nil {
		c = &SinkCollection{}
		e.st.Collections[coll] = c
	}
	f(c)
}

// list returns the connected sinks, by stream.
func (r *sinkRegistry) list() []SinkStatus {
	routes := r.h.current().comp.routes
	var out []SinkStatus
	r.sinks.Range(func(_, v any) bool {
		e := v.(*sinkEntry)
		e.mu.Lock()
		cp := e.st
		cp.Collections = make(map[string]*SinkCollection, len(e.st.Collections))
		for k, c := range e.st.Collections {
			c := *c
			cp.Collections[k] = &c
		}
		e.mu.Unlock()
		n := cp.info.Node()
		cp.NodeID, cp.Annotations = n.GetId(), n.GetAnnotations()
		cp.Rules = routes.Select(routing.Sink{Identity: cp.Identity, NodeID: cp.NodeID, Annotations: cp.Annotations}).Rules()
		out = append(out, cp)
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}
