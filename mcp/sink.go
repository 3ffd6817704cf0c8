package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// TriggerCollection is the collection name Istio's source sends, without a nonce, as the first
// message when it dials a ResourceSink. Sinks ignore it.
const TriggerCollection = "$triggerCollection"

// Applier applies pushes received by a Sink. Returning an error NACKs the push; if the error
// carries a gRPC status (status.Error, or a type with GRPCStatus), that status and its
// details are sent as the NACK's error_detail, otherwise its message with InvalidArgument.
type Applier interface {
	Apply(ctx context.Context, c *Change) error
}

// ApplierFunc adapts a function to Applier.
type ApplierFunc func(ctx context.Context, c *Change) error

// Apply calls f.
func (f ApplierFunc) Apply(ctx context.Context, c *Change) error { return f(ctx, c) }

// Change is one push as a sink applies it.
type Change struct {
	// Stream is the stream the push arrived on.
	Stream *StreamInfo
	// Collection the push belongs to.
	Collection string
	// Incremental: Entries are added or updated and Removed are deleted. Otherwise Entries is
	// the collection's full state and everything else is to be deleted.
	Incremental bool
	// Entries hold each resource's bytes exactly as received.
	Entries []*Entry
	// Resources are the Entries decoded (already validated), in the same order. Their Any
	// bodies are not unpacked.
	Resources []*mcpapi.Resource
	// Removed names, for incremental pushes.
	Removed []string
	// SystemVersionInfo as sent by the source, for logs.
	SystemVersionInfo string
	// More: this push is one chunk of a version the source split to fit the message size,
	// and more chunks of it follow (said by this engine's sources in SystemVersionInfo;
	// false for any other source). A caller that tracks "this collection has been
	// delivered" waits for the chunk without More.
	More bool
}

// SinkOptions configure a Sink.
type SinkOptions struct {
	// Collections to request. Required.
	Collections []string
	// Node is sent in every request. Informative only.
	Node *mcppb.SinkNode
	// FullStateOnly asks for full-state pushes instead of incremental ones.
	FullStateOnly bool
	// Negotiation remembers what the peer refused across streams (see Negotiation). Callers
	// that build one Sink per stream of a peer share one; nil: the Sink keeps its own.
	Negotiation *Negotiation
	// Applier applies pushes. Required.
	Applier Applier
	// InitialVersions, when set, supplies the versions declared in initial requests (for a
	// caller that keeps its own store, like the hub). Otherwise the Sink tracks the versions
	// it has applied and declares those, so a new stream resumes where the last one ended.
	InitialVersions func(collection string) map[string]string
	// (Versions are declared only to peers that resume from them: see ResumesHeader.)
	// MaxMessageSize is the largest push accepted on streams the Sink opens (PullFrom).
	// Default 4 MiB, gRPC's. Servers set theirs with grpc.MaxRecvMsgSize.
	MaxMessageSize int
	// Logger for stream events. Default slog.Default().
	Logger *slog.Logger
	// Metrics, or nil for none.
	Metrics *Metrics
	// Hooks observe stream events. Optional.
	Hooks Hooks
	// Annotations, if set, are added to Node's in every request: what the sink reports as it
	// goes (a relay: its downstream sinks). Report sends them at once to a peer that resumes.
	Annotations func() map[string]string
}

// StatusNonce is the response_nonce of a request that only carries a report in its
// SinkNode (Sink.Report): this engine's sources record the node and do nothing else; any
// other source sees a stale nonce and ignores it.
const StatusNonce = "meshfed-status"

// Sink is the sink role of MCP: it requests collections, applies each push through its
// Applier, and ACKs or NACKs it. One Sink may serve successive streams (reconnects); it keeps
// per-resource versions between them so a new stream resumes instead of starting over.
type Sink struct {
	opts SinkOptions

	report chan struct{} // Report's wake-up of the stream being served

	mu       sync.Mutex // guards the following fields
	versions map[string]map[string]string
	synced   map[string]bool
}

// Report sends the current Annotations to the peer of the stream being served (if it is
// this engine: see StatusNonce), without waiting for the next ACK.
func (k *Sink) Report() {
	select {
	case k.report <- struct{}{}:
	default:
	}
}

// node is the SinkNode a request carries: Node's, with the current Annotations.
func (k *Sink) node() *mcppb.SinkNode {
	if k.opts.Annotations == nil {
		return k.opts.Node
	}
	n := &mcppb.SinkNode{Id: k.opts.Node.GetId(), Annotations: maps.Clone(k.opts.Node.GetAnnotations())}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	maps.Copy(n.Annotations, k.opts.Annotations())
	return n
}

// NewSink validates opts and returns a Sink.
func NewSink(opts SinkOptions) (*Sink, error) {
	if len(opts.Collections) == 0 {
		return nil, errors.New("mcp: SinkOptions.Collections is empty")
	}
	seen := make(map[string]bool)
	for _, c := range opts.Collections {
		if c == "" {
			return nil, errors.New("mcp: SinkOptions.Collections has an empty name")
		}
		if seen[c] {
			return nil, fmt.Errorf("mcp: SinkOptions.Collections lists %q twice", c)
		}
		seen[c] = true
	}
	if opts.Applier == nil {
		return nil, errors.New("mcp: SinkOptions.Applier is required")
	}
	if opts.MaxMessageSize < 0 {
		return nil, fmt.Errorf("mcp: SinkOptions.MaxMessageSize %d is negative", opts.MaxMessageSize)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Collections = slices.Clone(opts.Collections)
	if opts.Negotiation == nil {
		opts.Negotiation = NewNegotiation(opts.Logger, opts.Metrics)
	}
	return &Sink{opts: opts, report: make(chan struct{}, 1), versions: make(map[string]map[string]string), synced: make(map[string]bool)}, nil
}

// Collections returns the collections the Sink asks for: those configured that the peer has
// not refused.
func (k *Sink) Collections() []string {
	want, _ := k.opts.Negotiation.wanted(k.opts.Collections)
	return want
}

// Refused returns the collections the peer refused, with why.
func (k *Sink) Refused() map[string]string { return k.opts.Negotiation.Refused() }

// Synced reports whether every collection the Sink asks for has been delivered whole (the
// last chunk of a split push included) at least once.
func (k *Sink) Synced() bool {
	want := k.Collections()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range want {
		if !k.synced[c] {
			return false
		}
	}
	return true
}

// Versions returns a copy of the resource versions the Sink has applied for a collection.
func (k *Sink) Versions(collection string) map[string]string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.versions[collection])
}

func (k *Sink) initialVersions(collection string) map[string]string {
	if k.opts.InitialVersions != nil {
		return k.opts.InitialVersions(collection)
	}
	return k.Versions(collection)
}

// Serve runs the sink role on an established stream until the stream ends or ctx is done.
// It returns nil when the peer closed the stream cleanly.
func (k *Sink) Serve(ctx context.Context, st MsgStream, info *StreamInfo) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	info.setCancel(cancel)
	log := k.opts.Logger.With(logStream, info.ID, logPeer, info.Peer, logIdentity, info.Identity, logRole, "sink")
	k.opts.Metrics.streamOpened(info)
	k.opts.Hooks.streamOpened(info)
	log.Debug("stream opened", logTransport, info.Transport)
	defer func() {
		k.opts.Metrics.streamClosed(info)
		k.opts.Hooks.streamClosed(info, err)
		log.Debug("stream closed", logError, err)
	}()

	frames := make(chan []byte)
	recvErr := make(chan error, 1)
	go func() {
		for {
			var f rawFrame
			if err := st.RecvMsg(&f); err != nil {
				recvErr <- err
				return
			}
			select {
			case frames <- f.b:
			case <-ctx.Done():
				return
			}
		}
	}()

	neg := k.opts.Negotiation
	if info.Transport == "server" && !info.PeerResumes() {
		neg.superseded(info)
	}
	want, left := neg.wanted(k.opts.Collections)
	ks := &sinkStream{k: k, st: st, info: info, log: log, queue: want, requested: make(map[string]bool, len(want)),
		firstFull: map[string]bool{}, chunks: map[string]*Change{}, answered: map[string]bool{}}
	defer func() {
		c, named := refusedCollection(err)
		refusal := named && ks.requested[c]
		if refusal {
			neg.refuse(c, status.Convert(err).Message())
		}
		neg.ended(info, left, refusal)
	}()
	switch {
	case info.Transport == "client":
		// Whether the source resumes is known from its response header, which comes with the
		// first push: ask for one collection, then for the rest. That first request may
		// declare versions: a source that ignores them (Istio's) answers the first request
		// of a stream with a full state, and says so.
		err = ks.request(1, true)
	case info.PeerResumes():
		err = ks.request(len(ks.queue), true)
	default:
		err = ks.request(1, false)
	}
	if err != nil {
		return streamEnd(ctx, err, recvErr, frames)
	}

	for {
		select {
		case <-ctx.Done():
			return info.endedWith(ctx.Err())
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case b := <-frames:
			if err := ks.handle(ctx, b); err != nil {
				return streamEnd(ctx, err, recvErr, frames)
			}
		case <-k.report:
			if !info.PeerResumes() || len(ks.requested) == 0 {
				continue // a stock source would take it for a stale nonce: it waits for the next ACK
			}
			req := &mcppb.RequestResources{SinkNode: k.node(), Collection: k.opts.Collections[0], ResponseNonce: StatusNonce}
			if err := st.SendMsg(req); err != nil {
				return streamEnd(ctx, err, recvErr, frames)
			}
		}
	}
}

// sinkStream is the state of one stream in the sink role; only Serve's goroutine uses it.
type sinkStream struct {
	k    *Sink
	st   MsgStream
	info *StreamInfo
	log  *slog.Logger

	queue     []string        // collections not requested yet, in order
	requested map[string]bool // collections requested on this stream
	// firstFull: collections whose next push is taken as their full state, whatever its
	// incremental flag: their request declared no versions (see Negotiation).
	firstFull map[string]bool
	chunks    map[string]*Change // a firstFull push split in chunks, gathered until its last
	answered  map[string]bool    // collections that have had a push on this stream
}

// request sends the requests of the next n queued collections, declaring the versions held
// or not (then their first push is taken as their full state).
func (ks *sinkStream) request(n int, declare bool) error {
	k := ks.k
	for ; n > 0 && len(ks.queue) > 0; n-- {
		c := ks.queue[0]
		ks.queue = ks.queue[1:]
		ks.requested[c] = true
		req := &mcppb.RequestResources{SinkNode: k.node(), Collection: c, Incremental: !k.opts.FullStateOnly}
		if declare {
			req.InitialResourceVersions = k.initialVersions(c)
		} else {
			ks.firstFull[c] = true
		}
		if ks.info.Transport == "server" && !ks.info.PeerResumes() {
			k.opts.Negotiation.wait(ks.info, c)
		}
		if err := k.send(ks.st, req); err != nil {
			return fmt.Errorf("send request for %s: %w", c, err)
		}
	}
	return nil
}

// afterFirstPush asks for what follows a collection's first push on the stream: on a stream
// this side dialed, the rest (the source's header, which says whether it resumes, has come
// with that push); on one a source that does not resume dialed, the next collection.
func (ks *sinkStream) afterFirstPush() error {
	info := ks.info
	switch {
	case info.Transport == "client":
		if h, ok := ks.st.(interface{ Header() (metadata.MD, error) }); ok && !info.PeerResumes() {
			if md, err := h.Header(); err == nil && mdResumes(md) {
				info.setResumes()
			}
		}
		return ks.request(len(ks.queue), info.PeerResumes())
	case info.PeerResumes():
		return nil // every collection was requested at once
	case len(ks.queue) == 0:
		ks.k.opts.Negotiation.wait(info, "")
		return nil
	}
	return ks.request(1, false)
}

// send writes a request. ACKs and NACKs are counted before they leave, so a peer that has
// seen one can rely on the metric.
func (k *Sink) send(st MsgStream, req *mcppb.RequestResources) error {
	if req.ResponseNonce != "" {
		code := codes.OK
		if req.ErrorDetail != nil {
			code = codes.Code(req.ErrorDetail.Code)
		}
		k.opts.Metrics.sinkAck(req.Collection, code, proto.Size(req))
	}
	return st.SendMsg(req)
}

// handle processes one received Resources message. Only a failure to send ends the stream;
// bad input is NACKed or, when it cannot be answered, logged and ignored.
func (ks *sinkStream) handle(ctx context.Context, b []byte) error {
	k, st, info, log := ks.k, ks.st, ks.info, ks.log
	m := k.opts.Metrics
	p, perr := parsePush(b)
	if p.Nonce == "" {
		if p.Collection == TriggerCollection {
			log.Debug("ignoring the source's trigger message")
			m.ignored("trigger")
		} else {
			log.Warn("ignoring a push without a nonce: it cannot be acknowledged", logCollection, p.Collection, logError, perr)
			m.ignored("no_nonce")
		}
		return nil
	}
	clog := log.With(logCollection, p.Collection)
	m.received(p.Collection, p.Incremental, len(b))
	k.opts.Hooks.pushed(info, PushEvent{Collection: p.Collection, Nonce: p.Nonce, Incremental: p.Incremental, Resources: len(p.Entries), Removed: len(p.Removed), Bytes: len(b)})

	err := perr
	if err == nil && !ks.requested[p.Collection] {
		err = fmt.Errorf("%w: %q", ErrUnknownCollection, p.Collection)
	}
	if err == nil {
		err = checkDuplicates(p)
	}
	// The first push of a collection, even one refused, shows the peer serves it.
	first := ks.requested[p.Collection] && !ks.answered[p.Collection]
	if first {
		ks.answered[p.Collection] = true
		k.opts.Negotiation.answered(info, p.Collection)
	}
	if err == nil {
		c := &Change{Stream: info, Collection: p.Collection, Incremental: p.Incremental, Entries: p.Entries, Resources: p.Resources, Removed: p.Removed, SystemVersionInfo: p.SystemVersionInfo,
			More: moreChunks(p.SystemVersionInfo)}
		whole := ks.asFullState(c)
		if whole == nil {
			// A chunk of a full state being gathered: acknowledged, applied with the last.
		} else if aerr := k.opts.Applier.Apply(ctx, whole); aerr != nil {
			err = aerr
			if StatusCode(aerr) == codes.Unknown {
				err = fmt.Errorf("%w: %w", ErrRejected, aerr)
			}
		} else {
			k.record(whole)
		}
		if whole != nil && whole != c && (err == nil || PartiallyApplied(toStatus(err).Proto())) {
			delete(ks.firstFull, p.Collection) // the full state is held: what follows is what it says
		}
	}
	if err != nil {
		delete(ks.chunks, p.Collection) // a refused chunk ends the gathering; the source starts over
	}
	req := &mcppb.RequestResources{SinkNode: k.node(), Collection: p.Collection, ResponseNonce: p.Nonce, Incremental: !k.opts.FullStateOnly}
	ev := AckEvent{Collection: p.Collection, Nonce: p.Nonce}
	if err != nil {
		s := toStatus(err)
		req.ErrorDetail = s.Proto()
		ev.Code, ev.Message = s.Code(), s.Message()
		clog.Warn("rejecting push (NACK)", logNonce, p.Nonce, "code", s.Code().String(), "message", s.Message())
	} else if clog.Enabled(ctx, slog.LevelDebug) {
		clog.Debug("applied push (ACK)", logNonce, p.Nonce, "incremental", p.Incremental, "resources", len(p.Entries), "removed", len(p.Removed))
	}
	if serr := k.send(st, req); serr != nil {
		return fmt.Errorf("send ACK/NACK for %s: %w", p.Collection, serr)
	}
	k.opts.Hooks.acked(info, ev)
	if first {
		return ks.afterFirstPush()
	}
	return nil
}

// asFullState turns the push of a collection whose full state is still awaited (its request
// declared no versions, see Negotiation) into a full-state change, a new one, gathering a
// split push: it returns nil for a chunk with more to come, and c itself for any other push.
func (ks *sinkStream) asFullState(c *Change) *Change {
	if !ks.firstFull[c.Collection] {
		return c
	}
	full := *c
	if g := ks.chunks[c.Collection]; g != nil {
		full.Entries, full.Resources = append(g.Entries, c.Entries...), append(g.Resources, c.Resources...)
	}
	if c.Incremental && c.More {
		ks.chunks[c.Collection] = &full
		return nil
	}
	delete(ks.chunks, c.Collection)
	full.Incremental, full.Removed, full.More = false, nil, false
	return &full
}

func checkDuplicates(p *push) error {
	if len(p.Entries) < 2 {
		return nil
	}
	seen := make(map[string]struct{}, len(p.Entries))
	for i, e := range p.Entries {
		if _, dup := seen[e.Name]; dup {
			return fmt.Errorf("%w: resources[%d]: name %q appears twice in one push", ErrInvalidResource, i, e.Name)
		}
		seen[e.Name] = struct{}{}
	}
	return nil
}

// record notes an applied change: the collection is synced, and (unless the caller keeps its
// own versions) the versions the sink now holds.
func (k *Sink) record(c *Change) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !c.More {
		k.synced[c.Collection] = true
	}
	if k.opts.InitialVersions != nil {
		return
	}
	v := k.versions[c.Collection]
	if !c.Incremental || v == nil {
		v = make(map[string]string, len(c.Entries))
	}
	for _, e := range c.Entries {
		v[e.Name] = e.Version
	}
	for _, name := range c.Removed {
		delete(v, name)
	}
	k.versions[c.Collection] = v
}
