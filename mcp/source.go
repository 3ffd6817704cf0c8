package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// DefaultMaxMessageSize is the largest push sent by default: Istio Pilot's gRPC receive
// limit (4 MiB) less a margin for gRPC framing.
const DefaultMaxMessageSize = 4<<20 - 1024

// DefaultMaxCollections bounds how many collections one stream may subscribe to.
const DefaultMaxCollections = 256

// SourceOptions configure a Source.
type SourceOptions struct {
	// Watcher supplies the collections. Required.
	Watcher Watcher
	// MaxMessageSize is the largest Resources message sent. A full state larger than this is
	// not sent (the collection is reported as too large until it changes); incremental pushes
	// are split into several pushes. Default DefaultMaxMessageSize.
	MaxMessageSize int
	// MaxCollections bounds the collections one stream may subscribe to; requests beyond it
	// are ignored with an error log. Default DefaultMaxCollections.
	MaxCollections int
	// Logger for stream events. Default slog.Default().
	Logger *slog.Logger
	// Metrics, or nil for none.
	Metrics *Metrics
	// Hooks observe stream events. Optional.
	Hooks Hooks
	// Now is the clock, for tests. Default time.Now.
	Now func() time.Time
}

// Source is the source role of MCP: it answers RequestResources with Resources pushes from
// its Watcher, on any number of streams, over either gRPC direction (see SourceServer and
// Source.PushTo). It is safe for concurrent use.
type Source struct {
	opts SourceOptions
}

// NewSource validates opts and returns a Source.
func NewSource(opts SourceOptions) (*Source, error) {
	if opts.Watcher == nil {
		return nil, errors.New("mcp: SourceOptions.Watcher is required")
	}
	if opts.MaxMessageSize < 0 {
		return nil, fmt.Errorf("mcp: SourceOptions.MaxMessageSize %d is negative", opts.MaxMessageSize)
	}
	if opts.MaxMessageSize == 0 {
		opts.MaxMessageSize = DefaultMaxMessageSize
	}
	if opts.MaxCollections <= 0 {
		opts.MaxCollections = DefaultMaxCollections
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Source{opts: opts}, nil
}

// MsgStream is the part of a gRPC stream the engine uses; grpc.ServerStream and
// grpc.ClientStream both satisfy it.
type MsgStream interface {
	Context() context.Context
	SendMsg(m any) error
	RecvMsg(m any) error
}

var streamIDs atomic.Uint64

func newStreamInfo(role, transport, peer, identity string) *StreamInfo {
	return &StreamInfo{ID: streamIDs.Add(1), Role: role, Transport: transport, Protocol: "mcp", Peer: peer, Identity: identity}
}

// Serve runs the source role on an established stream until the stream ends or ctx is done.
// The stream must use this package's codec (see ServerOptions); SourceServer and PushTo
// arrange that. It returns nil when the peer closed the stream cleanly.
func (s *Source) Serve(ctx context.Context, st MsgStream, info *StreamInfo) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	info.setCancel(cancel)
	log := s.opts.Logger.With(logStream, info.ID, logPeer, info.Peer, logIdentity, info.Identity, logRole, "source")
	m := s.opts.Metrics
	m.streamOpened(info)
	s.opts.Hooks.streamOpened(info)
	log.Debug("stream opened", logTransport, info.Transport)
	ss := &sourceStream{
		ctx:   ctx,
		src:   s,
		st:    st,
		info:  info,
		log:   log,
		colls: make(map[string]*sourceCollection),
		wake:  make(chan struct{}, 1),
	}
	defer func() {
		ss.closeWatches()
		m.streamClosed(info)
		s.opts.Hooks.streamClosed(info, err)
		log.Debug("stream closed", logError, err)
	}()

	// Requests are handled on the receiving goroutine, under ss.mu, and a push they make
	// possible (an ACK while changes were coalescing) goes out from there too: an ACK costs
	// no hand-off to another goroutine. Store notifications wake this goroutine, which
	// pushes under the same lock, so sends stay serialized.
	recvErr := make(chan error, 1)
	go func() {
		for {
			req := new(mcppb.RequestResources)
			if err := st.RecvMsg(req); err != nil {
				recvErr <- err
				return
			}
			m.addBytesReceived("source", proto.Size(req))
			ss.mu.Lock()
			err := ss.handle(req)
			if err == nil {
				err = ss.pushReady()
			}
			ss.mu.Unlock()
			if err != nil && !errors.Is(err, io.EOF) {
				recvErr <- err
				return
			}
			// A send that failed with io.EOF: the next receive returns the real reason.
		}
	}()

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ss.wake:
		}
		ss.mu.Lock()
		err := ss.pushReady()
		ss.mu.Unlock()
		if err != nil {
			return streamEnd[struct{}](ctx, err, recvErr, nil) // requests are handled on the receiving goroutine
		}
	}
}

// sourceStream is the state of one stream in the source role. Its two goroutines (receive
// and serve) share it under mu, which is also held while sending so that sends are
// serialized; store notifications touch only the dirty flags and the wake channel.
type sourceStream struct {
	// ctx ends with the stream: once StreamInfo.Close has returned, nothing more is sent,
	// not even a change made right after it (a replica ends the streams following a copy
	// before an operator's decision changes the copy; the change must not reach them).
	ctx  context.Context
	src  *Source
	st   MsgStream
	info *StreamInfo
	log  *slog.Logger
	wake chan struct{}

	mu     sync.Mutex // guards the following fields and every sourceCollection's state
	colls  map[string]*sourceCollection
	order  []string // collection names, sorted, for deterministic push order
	nonce  uint64
	closed bool // the watches are cancelled: no new subscription
}

// sourceCollection is one subscribed collection of a stream.
type sourceCollection struct {
	name        string
	log         *slog.Logger
	metrics     *sourceCollectionMetrics
	coll        Collection // nil when the collection is not served: the sink gets empty state
	cancel      func()
	dirty       atomic.Bool // set by the watcher's notify
	incremental bool        // the sink asked for incremental pushes

	// What the sink holds: nothing, the versions it declared (resume), or version acked.
	hasAcked bool
	acked    uint64
	resume   map[string]string
	pushed   bool // at least one push completed (ACK or NACK) on this stream

	pending *pendingPush
	// inFlight mirrors pending != nil for the watcher's notify, which runs under the
	// store's lock and must not take mu: a change to a collection with a push in flight
	// only marks it dirty, since the push it needs goes out when the ACK arrives (the
	// receiving goroutine pushes what is dirty after each request). A sink that stopped
	// ACKing then costs a change nothing but the flag, instead of a goroutine woken for
	// nothing on every change (1,000 such sinks: 100,000 wake-ups a second at 100 changes
	// a second, in the noisy-tenant bench).
	inFlight atomic.Bool
	// A version the sink NACKed or that could not be sent: not retried until it changes.
	failed    bool
	failedVer uint64
}

// setPending sets c's outstanding push (nil: none), and inFlight with it.
func (c *sourceCollection) setPending(p *pendingPush) {
	c.pending = p
	c.inFlight.Store(p != nil)
}

type pendingPush struct {
	nonce       string
	version     uint64
	incremental bool
	sentAt      time.Time
	rest        [][]byte // further chunks of a split incremental push
	resources   int
}

func (ss *sourceStream) closeWatches() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closed = true
	for _, c := range ss.colls {
		c.cancel()
	}
}

func (ss *sourceStream) handle(req *mcppb.RequestResources) error {
	m := ss.src.opts.Metrics
	name := req.GetCollection()
	if name == "" {
		ss.log.Warn("ignoring request without a collection", logNonce, req.GetResponseNonce())
		m.ignored("no_collection")
		return nil
	}
	if name == TriggerCollection {
		// Istio's sink NACKs the trigger message PushTo sends first; nothing to do.
		m.ignored("trigger")
		return nil
	}
	ss.info.setNodeOnce(req.GetSinkNode())
	if req.GetResponseNonce() == StatusNonce {
		return nil // a report carried by its SinkNode (see StatusNonce), nothing else
	}
	c := ss.colls[name]
	if c == nil && ss.closed {
		return nil // the stream is ending
	}
	if c == nil {
		// A new subscription. Its nonce, if any, belongs to an earlier stream (istiod sends one).
		if len(ss.colls) >= ss.src.opts.MaxCollections {
			ss.log.Error("ignoring request: too many collections on one stream", logCollection, name, "limit", ss.src.opts.MaxCollections)
			m.ignored("too_many_collections")
			return nil
		}
		if cw, ok := ss.src.opts.Watcher.(CheckingWatcher); ok {
			if err := cw.Check(ss.info, name); err != nil {
				ss.log.Warn("subscription refused", logCollection, name, logError, err)
				return err
			}
		}
		ss.subscribe(name, req)
		return nil
	}
	// The incremental flag follows subscriptions and ACKs, not NACKs: Istio's sink leaves it
	// unset on NACKs, which must not switch the stream to full state.
	if req.GetErrorDetail() == nil {
		c.incremental = req.GetIncremental()
	}
	nonce := req.GetResponseNonce()
	switch {
	case nonce == "" && c.pending != nil:
		// Istio's sink re-requests with an empty nonce while a push is outstanding: it has
		// processed that push, so it counts as its ACK (or NACK, with an error detail).
		return ss.ack(c, req.GetErrorDetail())
	case nonce == "":
		// A re-subscription. New declared versions replace what we believed the sink holds.
		if v := req.GetInitialResourceVersions(); len(v) > 0 {
			c.hasAcked, c.resume = false, v
			c.failed = false
			c.dirty.Store(true)
		}
		c.log.Debug("re-request without nonce")
	case c.pending != nil && nonce == c.pending.nonce:
		return ss.ack(c, req.GetErrorDetail())
	default:
		c.log.Debug("ignoring stale or unknown nonce", logNonce, nonce)
		m.ignored("stale_nonce")
	}
	return nil
}

func (ss *sourceStream) subscribe(name string, req *mcppb.RequestResources) {
	c := &sourceCollection{
		name:        name,
		log:         ss.log.With(logCollection, name),
		metrics:     ss.src.opts.Metrics.sourceCollection(name),
		incremental: req.GetIncremental(),
		resume:      req.GetInitialResourceVersions(),
	}
	if len(c.resume) == 0 {
		c.resume = nil
	}
	coll, cancel, ok := ss.src.opts.Watcher.Watch(ss.info, name, func() {
		// dirty, then inFlight; ack clears inFlight, then reads dirty (pushReady): one of
		// the two sees the other's write, so a change is never left unpushed.
		c.dirty.Store(true)
		if c.inFlight.Load() {
			return
		}
		select {
		case ss.wake <- struct{}{}:
		default:
		}
	})
	c.cancel = cancel
	if ok {
		c.coll = coll
	} else {
		c.log.Warn("collection not served to this stream; answering with an empty state")
		ss.src.opts.Metrics.ignored("unknown_collection")
	}
	c.dirty.Store(true)
	ss.colls[name] = c
	ss.order = append(ss.order, name)
	sort.Strings(ss.order)
	c.log.Debug("subscribed", "incremental", c.incremental, "resume_versions", len(c.resume))
}

// ack completes the pending push of c with an ACK (detail nil) or a NACK.
func (ss *sourceStream) ack(c *sourceCollection, detail *rpcstatus.Status) error {
	p := c.pending
	latency := ss.src.opts.Now().Sub(p.sentAt)
	ev := AckEvent{Collection: c.name, Nonce: p.nonce, Version: p.version, Latency: latency}
	if detail != nil {
		ev.Code, ev.Message, ev.Detail = codes.Code(detail.GetCode()), detail.GetMessage(), detail
		c.metrics.nack(ev.Code, latency)
	} else {
		c.metrics.ack(latency)
	}
	ss.src.opts.Hooks.acked(ss.info, ev)
	switch {
	case detail == nil:
	case PartiallyApplied(detail):
		// Applied but for the resources it names: the version counts as held (see
		// RejectionError), and the refused ones are sent again only when they change.
		c.log.Debug("sink applied push except some resources", logNonce, p.nonce, logVersion, p.version, "message", ev.Message)
	default:
		c.setPending(nil)
		c.pushed = true
		c.failed, c.failedVer = true, p.version
		c.log.Warn("sink rejected push (NACK); not resending until the collection changes",
			logNonce, p.nonce, logVersion, p.version, "code", ev.Code.String(), "message", ev.Message)
		return nil
	}
	if len(p.rest) > 0 {
		next := p.rest[0]
		p.rest = p.rest[1:]
		// The sink holds a partial step; only the last chunk's ACK completes the version.
		c.setPending(nil)
		return ss.send(c, next, p.version, true, p.resources, p.rest)
	}
	c.setPending(nil)
	c.pushed = true
	c.hasAcked, c.acked, c.resume = true, p.version, nil
	c.failed = false
	return nil
}

// pushReady pushes every collection that has no outstanding push and whose state the sink
// does not hold yet. A send error ends the stream.
func (ss *sourceStream) pushReady() error {
	if ss.closed || ss.ctx.Err() != nil {
		return nil
	}
	for _, name := range ss.order {
		c := ss.colls[name]
		if c.pending != nil || !c.dirty.Load() {
			continue
		}
		if err := ss.pushCollection(c); err != nil {
			return err
		}
	}
	return nil
}

func (ss *sourceStream) pushCollection(c *sourceCollection) error {
	c.dirty.Store(false) // clear first: a change racing with this push sets it again
	if c.coll == nil {
		if c.pushed || c.pending != nil {
			return nil
		}
		return ss.send(c, encodeBody(c.name, 0, nil, nil, false), 0, false, 0, nil)
	}
	version := c.coll.Version()
	if c.hasAcked && c.acked == version {
		return nil
	}
	if c.failed && c.failedVer == version {
		return nil
	}
	maxSize := ss.src.opts.MaxMessageSize
	if c.incremental && c.hasAcked {
		if d, ok := c.coll.Delta(c.acked); ok {
			if d.Empty() {
				c.acked = d.To
				return nil
			}
			return ss.sendIncremental(c, d.To, d.encoded, d.Updated, d.Removed, maxSize)
		}
	}
	snap := c.coll.Snapshot()
	if c.incremental && c.resume != nil {
		updated, removed := diffDeclared(snap.Entries, c.resume)
		if len(updated) == 0 && len(removed) == 0 && c.pushed {
			c.hasAcked, c.acked, c.resume = true, snap.Version, nil
			return nil
		}
		return ss.sendIncremental(c, snap.Version, func() []byte {
			return encodeBody(c.name, snap.Version, updated, removed, true)
		}, updated, removed, maxSize)
	}
	body := snap.encoded()
	if len(body)+maxNonceFieldSize <= maxSize {
		return ss.send(c, body, snap.Version, false, len(snap.Entries), nil)
	}
	if c.incremental && !c.hasAcked && c.resume == nil {
		// The sink holds nothing and accepts incremental pushes: deliver the full state as
		// additions, split to fit.
		return ss.sendIncremental(c, snap.Version, snap.encoded, snap.Entries, nil, maxSize)
	}
	ss.tooLarge(c, snap.Version, len(body))
	return nil
}

// maxNonceFieldSize bounds the encoded nonce field (tag, length, up to 20 digits).
const maxNonceFieldSize = 1 + 1 + 20

// sendIncremental sends an incremental push, split into chunks of at most maxSize.
func (ss *sourceStream) sendIncremental(c *sourceCollection, version uint64, whole func() []byte, updated []*Entry, removed []string, maxSize int) error {
	size := 0
	for _, e := range updated {
		size += entryFieldSize(e)
	}
	for _, r := range removed {
		size += removedFieldSize(r)
	}
	if size+len(c.name)+64 <= maxSize {
		return ss.send(c, whole(), version, true, len(updated), nil)
	}
	chunks := ss.split(c, version, updated, removed, maxSize)
	if len(chunks) == 0 {
		ss.tooLarge(c, version, size)
		return nil
	}
	c.log.Info("splitting incremental push", logVersion, version, "chunks", len(chunks), "bytes", size)
	return ss.send(c, chunks[0], version, true, len(updated), chunks[1:])
}

// split cuts an incremental change into bodies of at most maxSize, each marked as chunk i
// of n in its system_version_info (see chunkVersion). Entries that alone exceed maxSize are
// left out and reported.
func (ss *sourceStream) split(c *sourceCollection, version uint64, updated []*Entry, removed []string, maxSize int) [][]byte {
	// The marker's digits are part of the overhead: at most 20 + 2×10 more bytes.
	overhead := len(c.name) + 64 + len(chunkMarker) + 21
	type part struct {
		entries []*Entry
		removed []string
	}
	var parts []part
	var cur []*Entry
	curSize := overhead
	for _, e := range updated {
		sz := entryFieldSize(e)
		if sz+overhead > maxSize {
			c.log.Error("resource exceeds the maximum message size; not sent", logResource, e.Name, "bytes", len(e.Encoded), "limit", maxSize)
			ss.src.opts.Metrics.pushError(c.name, "too_large")
			continue
		}
		if curSize+sz > maxSize {
			parts = append(parts, part{entries: cur})
			cur, curSize = nil, overhead
		}
		cur = append(cur, e)
		curSize += sz
	}
	var rem []string
	for _, r := range removed {
		sz := removedFieldSize(r)
		if curSize+sz > maxSize {
			parts = append(parts, part{entries: cur, removed: rem})
			cur, rem, curSize = nil, nil, overhead
		}
		rem = append(rem, r)
		curSize += sz
	}
	if len(cur) > 0 || len(rem) > 0 {
		parts = append(parts, part{entries: cur, removed: rem})
	}
	chunks := make([][]byte, len(parts))
	for i, p := range parts {
		chunks[i] = encodeBodyAs(c.name, chunkVersion(version, i+1, len(parts)), p.entries, p.removed, true)
	}
	return chunks
}

func (ss *sourceStream) tooLarge(c *sourceCollection, version uint64, size int) {
	c.failed, c.failedVer = true, version
	c.log.Error("full state exceeds the maximum message size and the sink does not accept incremental pushes; not sent until it changes",
		logVersion, version, "bytes", size, "limit", ss.src.opts.MaxMessageSize)
	ss.src.opts.Metrics.pushError(c.name, "too_large")
}

// send writes one push and makes it the collection's pending push.
func (ss *sourceStream) send(c *sourceCollection, body []byte, version uint64, incremental bool, resources int, rest [][]byte) error {
	ss.nonce++
	nonce := strconv.FormatUint(ss.nonce, 10)
	f := &frame{body: body, nonce: nonce}
	c.setPending(&pendingPush{nonce: nonce, version: version, incremental: incremental, sentAt: ss.src.opts.Now(), rest: rest, resources: resources})
	if err := ss.st.SendMsg(f); err != nil {
		return fmt.Errorf("send push of %s: %w", c.name, err)
	}
	n := f.size()
	c.metrics.push(incremental, n)
	ss.src.opts.Hooks.pushed(ss.info, PushEvent{Collection: c.name, Nonce: nonce, Version: version, Incremental: incremental, Resources: resources, Bytes: n})
	if c.log.Enabled(context.Background(), slog.LevelDebug) { // the hot path: skip boxing the args
		c.log.Debug("pushed", logNonce, nonce, logVersion, version, "incremental", incremental, "resources", resources, "bytes", n)
	}
	return nil
}

// diffDeclared compares a snapshot with the versions a sink declared: entries it lacks or
// holds at another version, and names it holds that no longer exist.
func diffDeclared(entries []*Entry, declared map[string]string) (updated []*Entry, removed []string) {
	seen := 0
	for _, e := range entries {
		v, ok := declared[e.Name]
		if ok {
			seen++
		}
		if !ok || v != e.Version || e.Version == "" {
			updated = append(updated, e)
		}
	}
	if seen < len(declared) {
		have := make(map[string]struct{}, len(entries))
		for _, e := range entries {
			have[e.Name] = struct{}{}
		}
		for name := range declared {
			if _, ok := have[name]; !ok {
				removed = append(removed, name)
			}
		}
		sort.Strings(removed)
	}
	return updated, removed
}

// streamEnd returns the real reason a send failed. gRPC reports a bare io.EOF from SendMsg
// once the stream has ended; the status (PermissionDenied, Unavailable, an Istio source's
// unsupported collection, ...) comes from RecvMsg, which the stream's receive goroutine
// reports on recvErr. A receive goroutine that hands messages over on a channel (pending)
// may be holding one when the send fails: those are dropped, so it gets to the end.
func streamEnd[T any](ctx context.Context, sendErr error, recvErr <-chan error, pending <-chan T) error {
	if !errors.Is(sendErr, io.EOF) {
		return sendErr
	}
	for {
		select {
		case err := <-recvErr:
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("%w (%w)", err, sendErr)
			}
			return sendErr
		case <-pending:
		case <-ctx.Done():
			return sendErr
		}
	}
}
