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
	// Applier applies pushes. Required.
	Applier Applier
	// InitialVersions, when set, supplies the versions declared in initial requests (for a
	// caller that keeps its own store, like the hub). Otherwise the Sink tracks the versions
	// it has applied and declares those, so a new stream resumes where the last one ended.
	InitialVersions func(collection string) map[string]string
	// MaxMessageSize is the largest push accepted on streams the Sink opens (PullFrom).
	// Default 4 MiB, gRPC's. Servers set theirs with grpc.MaxRecvMsgSize.
	MaxMessageSize int
	// Logger for stream events. Default slog.Default().
	Logger *slog.Logger
	// Metrics, or nil for none.
	Metrics *Metrics
	// Hooks observe stream events. Optional.
	Hooks Hooks
}

// Sink is the sink role of MCP: it requests collections, applies each push through its
// Applier, and ACKs or NACKs it. One Sink may serve successive streams (reconnects); it keeps
// per-resource versions between them so a new stream resumes instead of starting over.
type Sink struct {
	opts SinkOptions

	mu       sync.Mutex // guards the following fields
	versions map[string]map[string]string
	synced   map[string]bool
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
	return &Sink{opts: opts, versions: make(map[string]map[string]string), synced: make(map[string]bool)}, nil
}

// Synced reports whether every collection has received at least one push.
func (k *Sink) Synced() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.synced) == len(k.opts.Collections)
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

	requested := make(map[string]bool, len(k.opts.Collections))
	for _, c := range k.opts.Collections {
		requested[c] = true
		req := &mcppb.RequestResources{
			SinkNode:                k.opts.Node,
			Collection:              c,
			InitialResourceVersions: k.initialVersions(c),
			Incremental:             !k.opts.FullStateOnly,
		}
		if err := k.send(st, req); err != nil {
			return fmt.Errorf("send request for %s: %w", c, streamEnd(ctx, err, recvErr))
		}
	}

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case b := <-frames:
			if err := k.handle(ctx, st, info, log, requested, b); err != nil {
				return streamEnd(ctx, err, recvErr)
			}
		}
	}
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
func (k *Sink) handle(ctx context.Context, st MsgStream, info *StreamInfo, log *slog.Logger, requested map[string]bool, b []byte) error {
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
	if err == nil && !requested[p.Collection] {
		err = fmt.Errorf("%w: %q", ErrUnknownCollection, p.Collection)
	}
	if err == nil {
		err = checkDuplicates(p)
	}
	if err == nil {
		c := &Change{Stream: info, Collection: p.Collection, Incremental: p.Incremental, Entries: p.Entries, Resources: p.Resources, Removed: p.Removed, SystemVersionInfo: p.SystemVersionInfo,
			More: moreChunks(p.SystemVersionInfo)}
		if aerr := k.opts.Applier.Apply(ctx, c); aerr != nil {
			err = aerr
			if StatusCode(aerr) == codes.Unknown {
				err = fmt.Errorf("%w: %w", ErrRejected, aerr)
			}
		} else {
			k.record(c)
		}
	}
	req := &mcppb.RequestResources{SinkNode: k.opts.Node, Collection: p.Collection, ResponseNonce: p.Nonce, Incremental: !k.opts.FullStateOnly}
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
	return nil
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
	k.synced[c.Collection] = true
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
