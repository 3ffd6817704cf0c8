package mcp

import (
	"sync"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// Watcher is all the source engine needs from a store. The store decides what a stream may
// see (it gets the StreamInfo); the engine decides when and how to push it.
type Watcher interface {
	// Watch subscribes a stream to a collection. notify is called, possibly from any goroutine,
	// each time the collection's version advances; it never blocks. ok is false when the
	// collection is not served to this stream: the engine then answers with an empty state.
	// cancel ends the subscription and is safe to call more than once.
	Watch(info *StreamInfo, collection string, notify func()) (c Collection, cancel func(), ok bool)
}

// CheckingWatcher is a Watcher that may refuse a stream's subscription to a collection:
// when Check returns an error the stream ends with it (its gRPC status, if it carries one)
// and nothing is sent for the collection. For a store that must answer "not here" rather
// than an empty state a sink would apply as deletions (a hub replica asked for a cluster it
// does not hold).
type CheckingWatcher interface {
	Watcher
	Check(info *StreamInfo, collection string) error
}

// Collection is the live, versioned state of one collection as one stream sees it.
// Implementations must be safe for concurrent use.
type Collection interface {
	// Version is the current version. It increases on every change and is never 0 once the
	// collection holds data; 0 means "never changed".
	Version() uint64
	// Snapshot returns the full current state. Implementations return the same *Snapshot for
	// the same version, so streams share its encoded form.
	Snapshot() *Snapshot
	// Delta returns what changed after version from, up to the current version. ok is false
	// when from is unknown (too old, or from the future): the engine then sends full state.
	// Implementations return the same *Delta for the same (from, current) pair when they can.
	Delta(from uint64) (d *Delta, ok bool)
}

// Snapshot is an immutable full state of a collection.
type Snapshot struct {
	Collection string
	Version    uint64
	// Entries sorted by Name, no duplicates.
	Entries []*Entry

	body lazyBody

	xdsMu     sync.Mutex        // guards xdsBodies
	xdsBodies map[string][]byte // MCP-over-xDS response bodies, by type URL
}

// Delta is an immutable change set between two versions of a collection.
type Delta struct {
	Collection string
	From, To   uint64
	// Updated holds added or changed entries, sorted by name.
	Updated []*Entry
	// Removed holds names of deleted entries, sorted.
	Removed []string

	body lazyBody
}

// Empty reports whether the delta changes nothing.
func (d *Delta) Empty() bool { return len(d.Updated) == 0 && len(d.Removed) == 0 }

// lazyBody caches the encoded push body of a Snapshot or Delta, shared by all streams.
type lazyBody struct {
	once sync.Once
	b    []byte
}

func (l *lazyBody) get(build func() []byte) []byte {
	l.once.Do(func() { l.b = build() })
	return l.b
}

func (s *Snapshot) encoded() []byte {
	return s.body.get(func() []byte { return encodeBody(s.Collection, s.Version, s.Entries, nil, false) })
}

// xdsEncoded returns the snapshot as an MCP-over-xDS DiscoveryResponse of typeURL, without
// its nonce: encoded once per type URL and shared by every xDS stream.
func (s *Snapshot) xdsEncoded(typeURL string) []byte {
	s.xdsMu.Lock()
	defer s.xdsMu.Unlock()
	if b, ok := s.xdsBodies[typeURL]; ok {
		return b
	}
	if s.xdsBodies == nil {
		s.xdsBodies = map[string][]byte{}
	}
	b := encodeXDSBody(typeURL, s.Version, s.Entries)
	s.xdsBodies[typeURL] = b
	return b
}

func (d *Delta) encoded() []byte {
	return d.body.get(func() []byte { return encodeBody(d.Collection, d.To, d.Updated, d.Removed, true) })
}

// StreamInfo describes one MCP stream (or MCP-over-xDS stream) to stores, hooks and logs.
type StreamInfo struct {
	// ID is unique per process.
	ID uint64
	// Role is "source" or "sink": what this side of the stream does.
	Role string
	// Transport is "server" or "client": which side opened the gRPC stream.
	Transport string
	// Protocol is "mcp" (the MCP services and clients) or "xds" (MCP over xDS, XDSServer):
	// what the stream speaks.
	Protocol string
	// Peer is the remote address.
	Peer string
	// Identity is the authenticated peer identity ("" when unauthenticated). Stores must
	// authorize on this, never on Node.
	Identity string
	// Unauthenticated: the stream was admitted by a server that authenticates no one
	// (ServerConfig.Unauthenticated); Identity is empty and what the peer says of itself is
	// only a claim.
	Unauthenticated bool
	// Listener is the admitting server's ServerConfig.Listener ("" for a stream this side
	// dialed).
	Listener string

	mu      sync.Mutex
	node    *mcppb.SinkNode
	latest  *mcppb.SinkNode
	cancel  func()
	resumes bool
	ended   error // CloseWith's reason: what a served sink stream ends with
}

// PeerResumes reports whether the peer said it is this engine (ResumesHeader): it resumes
// from declared versions and serves every collection asked for. On a stream this side
// dialed, it is known from the first push on.
func (i *StreamInfo) PeerResumes() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.resumes
}

func (i *StreamInfo) setResumes() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.resumes = true
}

// NewStreamInfo describes a stream that the engine does not serve, for a store's tests
// (a fake stream calling the store directly): a peer with identity that sent node; Close
// calls onClose (which may be nil).
func NewStreamInfo(identity string, node *mcppb.SinkNode, onClose func()) *StreamInfo {
	i := newStreamInfo("source", "server", "", identity)
	i.node, i.cancel = node, onClose
	return i
}

// Close ends the stream (its Serve returns, the peer sees the stream end and, being an MCP
// client, reconnects). Stores use it when what a stream may see has changed in a way an
// update cannot express, e.g. a configuration reload that routes the peer elsewhere. Safe to
// call more than once and before the stream is served (then it does nothing).
func (i *StreamInfo) Close() {
	i.mu.Lock()
	c := i.cancel
	i.mu.Unlock()
	if c != nil {
		c()
	}
}

// CloseWith is Close with a reason: a stream in the sink role ends with err (its Serve
// returns it), so a source that dialed in is told that gRPC status, such as a refusal's,
// instead of a bare cancellation, and its log says why it must reconnect. Other roles end
// as with Close.
func (i *StreamInfo) CloseWith(err error) {
	i.mu.Lock()
	if i.ended == nil {
		i.ended = err
	}
	i.mu.Unlock()
	i.Close()
}

// endedWith returns CloseWith's reason, or otherwise (a plain Close, the server stopping).
func (i *StreamInfo) endedWith(otherwise error) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.ended != nil {
		return i.ended
	}
	return otherwise
}

func (i *StreamInfo) setCancel(c func()) {
	i.mu.Lock()
	i.cancel = c
	i.mu.Unlock()
}

// Node returns the SinkNode the peer sent first, or nil. It is informative, not authoritative.
func (i *StreamInfo) Node() *mcppb.SinkNode {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.node
}

// LatestNode is the SinkNode of the newest request that carried one. Node (the first) is
// what routing decides by; this one may carry what the sink reports as it goes (a relay's
// downstream sinks, see StatusNonce).
func (i *StreamInfo) LatestNode() *mcppb.SinkNode {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.latest
}

func (i *StreamInfo) setNodeOnce(n *mcppb.SinkNode) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if n != nil {
		i.latest = n
	}
	if i.node == nil && n != nil {
		i.node = n
	}
}
