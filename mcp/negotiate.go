package mcp

import (
	"log/slog"
	"maps"
	"regexp"
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Collection negotiation and resumption with peers that are not this engine.
//
// Istio's source (Galley, and anything built on its pkg/mcp) ends the whole stream when asked
// for a collection it does not serve, and ignores the versions a sink declares on a new
// stream. This engine's peers do neither, and say so with ResumesHeader: a source sends it as
// a response header (SourceServer) or request metadata (PushTo). A Sink therefore:
//   - declares versions only to a peer that sent the header; to any other it declares none
//     and takes the first push of each collection on a stream as the full state, whatever its
//     incremental flag (a source that honours an empty declaration sends everything, and one
//     that ignores it does too), so deletions made while the stream was down are seen;
//   - subscribes a source that dialed in without the header one collection at a time, each
//     after the previous one's first push: Istio's source client then leaves the stream
//     silently and dials again, and a collection two abandoned streams were waiting for is
//     the one it refused (Negotiation.superseded);
//   - on a stream it dialed, learns a refusal from the status the stream ends with
//     (`InvalidArgument: unsupported collection "X"`), and PullFrom opens the next stream at
//     once without it.
// A refused collection is left out of the next streams of that peer, so the rest flow; it is
// asked for again after a stream that ran without it ends for another reason (the peer may
// have been upgraded), or when the caller builds a new Negotiation (a configuration change).

// ResumesHeader is the gRPC metadata key by which this engine's sources tell a sink that
// they resume from declared versions and answer every collection they are asked for.
const ResumesHeader = "x-meshfed-mcp-resumes"

var resumesMD = metadata.Pairs(ResumesHeader, "1")

func mdResumes(md metadata.MD) bool { return len(md.Get(ResumesHeader)) > 0 }

// unsupportedCollection is the status message of Istio's source for a collection it was not
// configured with (pkg/mcp/source: status.Errorf(codes.InvalidArgument, "unsupported
// collection %q", collection)).
var unsupportedCollection = regexp.MustCompile(`unsupported collection ("(?:[^"\\]|\\.)*")`)

// refusedCollection returns the collection a stream's end says the peer refused.
func refusedCollection(err error) (string, bool) {
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.InvalidArgument {
		return "", false
	}
	m := unsupportedCollection.FindStringSubmatch(s.Message())
	if m == nil {
		return "", false
	}
	name, uerr := strconv.Unquote(m[1])
	return name, uerr == nil
}

// Negotiation remembers what one peer refused, across its streams. A caller that builds a
// Sink per stream (one per stream of a cluster, as the hub does) shares one Negotiation
// between them; a Sink without one keeps its own.
type Negotiation struct {
	log     *slog.Logger
	metrics *Metrics

	mu      sync.Mutex // guards the following fields
	refused map[string]string
	logged  map[string]bool
	waiting map[*StreamInfo]string // open streams subscribing one at a time: the collection each waits for
	dropped map[*StreamInfo]bool   // streams closed by superseded, whose end is a refusal
	served  map[string]bool        // collections the peer has answered: never taken as refused
	suspect map[string]bool        // collections a superseded stream waited for once
}

// NewNegotiation returns an empty Negotiation; log and metrics report refusals (nil: none).
func NewNegotiation(log *slog.Logger, metrics *Metrics) *Negotiation {
	if log == nil {
		log = slog.Default()
	}
	return &Negotiation{log: log, metrics: metrics, refused: map[string]string{}, logged: map[string]bool{},
		waiting: map[*StreamInfo]string{}, dropped: map[*StreamInfo]bool{}, served: map[string]bool{}, suspect: map[string]bool{}}
}

// Refused returns the collections the peer refused, with why, as they stand.
func (n *Negotiation) Refused() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.refused)
}

// wanted returns, of collections, those the peer has not refused, and the refusals they
// leave out.
func (n *Negotiation) wanted(collections []string) (want []string, left map[string]bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	left = map[string]bool{}
	for _, c := range collections {
		if _, r := n.refused[c]; r {
			left[c] = true
		} else {
			want = append(want, c)
		}
	}
	return want, left
}

// refuse records that the peer refused collection. The first refusal of a collection is a
// warning; after a retry, the same refusal is only information.
func (n *Negotiation) refuse(collection, reason string) {
	n.mu.Lock()
	_, already := n.refused[collection]
	n.refused[collection] = reason
	first := !n.logged[collection]
	n.logged[collection] = true
	n.mu.Unlock()
	if already {
		return
	}
	n.metrics.refused(collection)
	if first {
		n.log.Warn("the peer does not serve this collection; going on without it", logCollection, collection, "reason", reason)
	} else {
		n.log.Info("the peer still does not serve this collection", logCollection, collection)
	}
}

// ended records how a stream that ran without the refusals left ended. A stream closed as
// superseded, or one whose end named a collection it asked for (refusal), was a refusal;
// any other end forgets left, so the next stream asks for them again.
func (n *Negotiation) ended(info *StreamInfo, left map[string]bool, refusal bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.waiting, info)
	if n.dropped[info] {
		delete(n.dropped, info)
		return
	}
	if refusal {
		return
	}
	for c := range left {
		delete(n.refused, c)
	}
}

// wait records that info's stream, subscribing one collection at a time, waits for the first
// push of collection ("" when it waits for none).
func (n *Negotiation) wait(info *StreamInfo, collection string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if collection == "" || n.dropped[info] {
		delete(n.waiting, info)
	} else {
		n.waiting[info] = collection
	}
}

// answered records that the peer served collection on info's stream.
func (n *Negotiation) answered(info *StreamInfo, collection string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.served[collection] = true
	delete(n.suspect, collection)
	if n.waiting[info] == collection {
		delete(n.waiting, info)
	}
}

// superseded is called when a new stream of a peer that does not resume opens: an older
// stream still waiting for a first push was left by the peer, and is closed. Istio's source
// client leaves a stream so when it refuses the collection asked; a network fault or a
// restart can leave one too. So the collection is taken as refused only when a second
// stream is left waiting for it, and never once the peer has served it: a refusal made in
// error would freeze that collection of the cluster.
func (n *Negotiation) superseded(by *StreamInfo) {
	n.mu.Lock()
	var stale []*StreamInfo
	var refused []string
	for info, c := range n.waiting {
		if info == by {
			continue
		}
		stale = append(stale, info)
		delete(n.waiting, info)
		n.dropped[info] = true
		switch {
		case n.served[c]:
		case n.suspect[c]:
			delete(n.suspect, c)
			refused = append(refused, c)
		default:
			n.suspect[c] = true
			n.log.Info("the peer left a stream waiting for this collection; taken as refused if it does so again", logCollection, c)
		}
	}
	n.mu.Unlock()
	for _, c := range refused {
		n.refuse(c, "the peer left two streams waiting for this collection and opened new ones (as Istio's source does for a collection it does not serve)")
	}
	for _, info := range stale {
		info.Close()
	}
}
