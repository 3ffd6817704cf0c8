package mcp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// ResourceTypeURL is the type of every resource in an MCP-over-xDS response: the resource
// is an istio.mcp.v1alpha1.Resource whose body is the Istio message.
const ResourceTypeURL = "type.googleapis.com/istio.mcp.v1alpha1.Resource"

// XDSServer serves MCP over xDS, as istiod 1.9+ consumes it from a config source
// (meshConfig.configSources: xds://...): envoy's AggregatedDiscoveryService, state of the
// world. Each type URL the client subscribes to is resolved to a collection of the same
// Watcher the MCP services use, so a sink sees the same subset whichever protocol it
// speaks. Every response is the full state of its type (a deletion is an omission); a type
// that does not resolve, or is not served to this client, is answered with an empty state
// (istiod is not ready until every type it subscribed to was answered once).
//
// Per type: one response outstanding at a time, changes while it is outstanding coalesced
// into the next; a NACKed version is not resent until the collection changes; stale
// nonces are ignored (the first request for a type may carry one, and is a subscription
// whatever its nonce).
//
// Streams are observed like the MCP services' (XDSOptions.Hooks): a StreamInfo with Role
// "source", Transport "server" and Protocol "xds"; a push and its ACK or NACK (a request
// with the response's nonce, with or without error_detail) reported by the type's
// collection, or by the type URL for a type that resolves to none (istiod's MeshConfig).
//
// Like the MCP services, each response body is encoded once per snapshot version and type URL
// and shared by every stream, the nonce appended by this package's codec: the gRPC server
// must be built with ServerOptions.
type XDSServer struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	w       Watcher
	resolve func(typeURL string) (collection string, ok bool)
	adm     *admission
	opts    XDSOptions
}

// XDSOptions configure an XDSServer.
type XDSOptions struct {
	// Resolve maps a type URL (istiod's group/version/Kind, e.g.
	// networking.istio.io/v1/VirtualService) to a collection. Required.
	Resolve func(typeURL string) (collection string, ok bool)
	// MaxMessageSize is the largest response sent; a larger full state is not sent (logged,
	// counted) until it changes. Default DefaultMaxMessageSize.
	MaxMessageSize int
	// Server admits streams (authentication, rate limit, readiness, the per-peer cap, the
	// idle timeout), logs and counts (Server.Metrics).
	Server ServerConfig
	// Hooks observe stream events as they do for the MCP services. Optional.
	Hooks Hooks
}

// NewXDSServer returns an ADS server over w.
func NewXDSServer(w Watcher, opts XDSOptions) (*XDSServer, error) {
	if w == nil || opts.Resolve == nil {
		return nil, errors.New("mcp: NewXDSServer needs a Watcher and XDSOptions.Resolve")
	}
	if opts.MaxMessageSize <= 0 {
		opts.MaxMessageSize = DefaultMaxMessageSize
	}
	return &XDSServer{w: w, resolve: opts.Resolve, adm: newAdmission(opts.Server), opts: opts}, nil
}

// Register registers the AggregatedDiscoveryService on r.
func (s *XDSServer) Register(r grpc.ServiceRegistrar) {
	discoverypb.RegisterAggregatedDiscoveryServiceServer(r, s)
}

// xdsType is the state of one subscribed type URL on one stream.
type xdsType struct {
	typeURL    string
	collection string
	coll       Collection // nil: answered with an empty state
	cancel     func()

	sent         bool
	sentVersion  uint64
	sentAt       time.Time
	pendingNonce string
	// inFlight mirrors pendingNonce != "" for the watcher's notify: a change while a
	// response is outstanding does not wake the stream, whose loop looks at every type
	// after the ACK anyway (see sourceCollection.inFlight).
	inFlight      atomic.Bool
	failed        bool
	failedVersion uint64
	resend        bool // the client asked again (empty nonce) with nothing outstanding
}

// key is what hooks report t by: its collection, or its type URL when it resolves to none.
func (t *xdsType) key() string {
	if t.collection == "" {
		return t.typeURL
	}
	return t.collection
}

func (t *xdsType) version() uint64 {
	if t.coll == nil {
		return 0
	}
	return t.coll.Version()
}

// StreamAggregatedResources implements the ADS state-of-the-world stream.
func (s *XDSServer) StreamAggregatedResources(stream discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	st, err := s.adm.admit(stream, "source")
	if err != nil {
		return err
	}
	return st.end(s.serve(st.ctx, adsStream{st}, st.info))
}

// adsStream is an admitted stream as the ADS service's typed stream.
type adsStream struct{ grpc.ServerStream }

func (s adsStream) Send(m *discoverypb.DiscoveryResponse) error { return s.SendMsg(m) }

func (s adsStream) Recv() (*discoverypb.DiscoveryRequest, error) {
	m := new(discoverypb.DiscoveryRequest)
	if err := s.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// serve runs one admitted ADS stream until it ends.
func (s *XDSServer) serve(parent context.Context, stream discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesServer, info *StreamInfo) (err error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	info.Protocol = "xds"
	info.setCancel(cancel)
	log := s.adm.cfg.Logger.With(logStream, info.ID, logPeer, info.Peer, logIdentity, info.Identity, logRole, "source", logTransport, info.Transport, "protocol", "xds")
	m := s.adm.cfg.Metrics
	m.streamOpened(info)
	s.opts.Hooks.streamOpened(info)
	types := map[string]*xdsType{}
	defer func() {
		for _, t := range types {
			t.cancel()
		}
		m.streamClosed(info)
		s.opts.Hooks.streamClosed(info, err)
		log.Debug("xds stream closed", logError, err)
	}()
	wake := make(chan struct{}, 1)
	notify := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	reqs := make(chan *discoverypb.DiscoveryRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	var nonce uint64
	for {
		select {
		case <-ctx.Done():
			return serverError(ctx, ctx.Err())
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case req := <-reqs:
			m.addBytesReceived("source", proto.Size(req))
			s.handle(info, log, types, req, notify)
		case <-wake:
		}
		for _, t := range types {
			if t.pendingNonce != "" {
				continue
			}
			v := t.version()
			if t.sent && v == t.sentVersion && !t.resend {
				continue
			}
			if t.failed && v == t.failedVersion {
				continue
			}
			nonce++
			if err := s.push(stream, info, log, t, strconv.FormatUint(nonce, 10)); err != nil {
				return streamEnd(ctx, err, recvErr, reqs)
			}
		}
	}
}

// handle processes one request: a subscription to a new type, an ACK, a NACK, a stale
// nonce, or a re-request.
func (s *XDSServer) handle(info *StreamInfo, log *slog.Logger, types map[string]*xdsType, req *discoverypb.DiscoveryRequest, notify func()) {
	m := s.adm.cfg.Metrics
	if n := req.GetNode(); n != nil {
		info.setNodeOnce(sinkNode(n))
	}
	url := req.GetTypeUrl()
	t := types[url]
	if t == nil {
		t = &xdsType{typeURL: url, cancel: func() {}}
		types[url] = t
		if coll, ok := s.resolve(url); ok {
			t.collection = coll
			c, cancel, served := s.w.Watch(info, coll, func() {
				if !t.inFlight.Load() {
					notify()
				}
			})
			t.cancel = cancel
			if served {
				t.coll = c
			}
		}
		if t.coll == nil {
			log.Debug("type not served to this client; answering with an empty state", "type_url", url, logCollection, t.collection)
		}
		return // a subscription, whatever nonce it carries
	}
	switch {
	case req.GetResponseNonce() == "":
		t.resend = t.pendingNonce == ""
	case req.GetResponseNonce() != t.pendingNonce:
		m.ignored("stale_nonce")
		log.Debug("ignoring a request with a stale nonce", "type_url", url, logNonce, req.GetResponseNonce())
	case req.GetErrorDetail() != nil:
		ev := s.answered(info, t, req.GetErrorDetail())
		t.failed, t.failedVersion = true, t.sentVersion
		log.Warn("xds client rejected a response; not resending it until the collection changes",
			"type_url", url, logVersion, t.sentVersion, "code", ev.Code.String(), "message", ev.Message)
	default:
		s.answered(info, t, nil)
		t.failed = false
	}
}

// answered completes t's outstanding response with an ACK (detail nil) or a NACK: it counts
// it, tells the hooks, and returns what they were told.
func (s *XDSServer) answered(info *StreamInfo, t *xdsType, detail *rpcstatus.Status) AckEvent {
	ev := AckEvent{Collection: t.key(), TypeURL: t.typeURL, Nonce: t.pendingNonce, Version: t.sentVersion, Latency: time.Since(t.sentAt)}
	if detail != nil {
		ev.Code, ev.Message, ev.Detail = codes.Code(detail.GetCode()), detail.GetMessage(), detail
	}
	t.pendingNonce = ""
	t.inFlight.Store(false)
	s.adm.cfg.Metrics.sinkAckAs("source", t.collection, ev.Code)
	s.opts.Hooks.acked(info, ev)
	return ev
}

// push sends the full state of t: the snapshot's body for this type URL, encoded once and
// shared by every stream, and this stream's nonce (see frame).
func (s *XDSServer) push(stream discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesServer, info *StreamInfo, log *slog.Logger, t *xdsType, nonce string) error {
	var body []byte
	var v uint64
	resources := 0
	if t.coll != nil {
		snap := t.coll.Snapshot()
		body, v, resources = snap.xdsEncoded(t.typeURL), snap.Version, len(snap.Entries)
	} else {
		body = encodeXDSBody(t.typeURL, 0, nil)
	}
	f := &frame{body: body, nonce: nonce}
	t.sent, t.sentVersion, t.resend = true, v, false
	size := f.size()
	if size > s.opts.MaxMessageSize {
		s.adm.cfg.Metrics.pushError(t.collection, "too_large")
		log.Error("full state too large for one xds response; not sent until it changes",
			"type_url", t.typeURL, "bytes", size, "limit", s.opts.MaxMessageSize)
		return nil
	}
	if err := stream.SendMsg(f); err != nil {
		return err
	}
	t.pendingNonce, t.sentAt = nonce, time.Now()
	t.inFlight.Store(true)
	s.adm.cfg.Metrics.xdsPushed(t.collection, size)
	s.opts.Hooks.pushed(info, PushEvent{Collection: t.key(), TypeURL: t.typeURL, Nonce: nonce, Version: v, Resources: resources, Bytes: size})
	return nil
}

// sinkNode reads an xDS client's node as a SinkNode: its id, and its metadata's string
// fields as annotations.
func sinkNode(n *corepb.Node) *mcppb.SinkNode {
	sn := &mcppb.SinkNode{Id: n.GetId()}
	if md := n.GetMetadata(); md != nil {
		sn.Annotations = map[string]string{}
		for k, v := range md.GetFields() {
			if s := v.GetStringValue(); s != "" {
				sn.Annotations[k] = s
			}
		}
	}
	return sn
}
