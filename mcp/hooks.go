package mcp

import (
	"time"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"google.golang.org/grpc/codes"
)

// Hooks let the caller observe the engine (for status APIs, tests, tracing). Every field is
// optional. Hooks are called synchronously on the stream's goroutine: they must be quick and
// must not call back into the stream.
type Hooks struct {
	// StreamOpened is called when a stream starts, in either role and either protocol
	// (StreamInfo.Protocol).
	StreamOpened func(*StreamInfo)
	// StreamClosed is called when a stream ends, with the error that ended it (nil for a clean
	// close by the peer).
	StreamClosed func(*StreamInfo, error)
	// Pushed is called after a source sent a push, and after a sink received one.
	Pushed func(*StreamInfo, PushEvent)
	// Acked is called when a source got an ACK or NACK, and after a sink sent one.
	Acked func(*StreamInfo, AckEvent)
}

// PushEvent describes one Resources message, or one MCP-over-xDS response.
type PushEvent struct {
	// Collection is the pushed collection; over xDS, the type URL's collection, or the type
	// URL itself when it resolves to none.
	Collection string
	// TypeURL is the xDS type URL the client subscribed with (MCP over xDS only).
	TypeURL     string
	Nonce       string
	Version     uint64 // the source's collection version (0 on the sink side)
	Incremental bool
	Resources   int
	Removed     int
	Bytes       int
}

// AckEvent describes one ACK (Code OK) or NACK.
type AckEvent struct {
	Collection string // as in PushEvent
	TypeURL    string // as in PushEvent
	Nonce      string
	Version    uint64        // source side: the version acknowledged
	Latency    time.Duration // source side: push to ACK
	Code       codes.Code
	Message    string
	// Detail is the NACK's full error_detail (nil for an ACK); Rejections reads the
	// per-resource rejections from it.
	Detail *rpcstatus.Status
}

func (h *Hooks) streamOpened(i *StreamInfo) {
	if h.StreamOpened != nil {
		h.StreamOpened(i)
	}
}

func (h *Hooks) streamClosed(i *StreamInfo, err error) {
	if h.StreamClosed != nil {
		h.StreamClosed(i, err)
	}
}

func (h *Hooks) pushed(i *StreamInfo, e PushEvent) {
	if h.Pushed != nil {
		h.Pushed(i, e)
	}
}

func (h *Hooks) acked(i *StreamInfo, e AckEvent) {
	if h.Acked != nil {
		h.Acked(i, e)
	}
}
