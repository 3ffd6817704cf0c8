package mcp

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec delegated to
	"google.golang.org/grpc/mem"
)

// frame is a Resources message (or an MCP-over-xDS DiscoveryResponse: its nonce is field 5
// too) assembled from a shared, pre-encoded body and the stream's own nonce. Sending one
// copies nothing: the body is handed to gRPC as is.
type frame struct {
	body  []byte
	nonce string
}

func (f *frame) size() int { return len(f.body) + len(nonceField(f.nonce)) }

// rawFrame receives a message's bytes undecoded, so a sink can keep each resource's bytes
// exactly as they arrived.
type rawFrame struct{ b []byte }

// codec is gRPC's proto codec plus the two frame types above. Every MCP stream of this
// package must use it: servers through ServerOptions, clients through the call option the
// engine adds itself.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.body), mem.SliceBuffer(nonceField(f.nonce))}, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawFrame); ok {
		r.b = data.Materialize() // a private copy: gRPC reuses its buffers
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

func (codec) Name() string { return "proto" }

// ServerOptions returns the gRPC server options MCP services of this package need (the codec
// that sends pre-encoded pushes). Pass them to grpc.NewServer for any server that registers a
// SourceServer, SinkServer or XDSServer; other services on that server are unaffected.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(newCodec())}
}

// SourceWindow is the receive window, per stream and per connection, of a server that serves
// sinks. A sink sends that server requests and ACKs only (bytes, not megabytes), so a fixed
// window loses nothing; it also turns off gRPC's bandwidth-delay estimator, which pinged the
// sink and sent a window update after each ACK it received: a write by the server and a read
// and write by the sink per sink and push, a third of the server's syscalls on the push path.
// The other direction, the pushes, is the sink's window, which the sink's gRPC grows.
const SourceWindow = 64 << 10

// SourceServerOptions are ServerOptions for a server whose clients are all sinks (it
// registers a SourceServer or XDSServer): plus SourceWindowOptions. A server that takes
// pushes (a SinkServer), or that mixes them with sinks (the hub's ingest listener, which
// also serves relays and peers), keeps gRPC's growing window, which a large push over a
// long path needs.
func SourceServerOptions() []grpc.ServerOption {
	return append(ServerOptions(), SourceWindowOptions()...)
}

// SourceWindowOptions fix a server's receive window at SourceWindow. The benchmarks' bare
// gRPC baselines take them too, so that a baseline differs from a server of sinks in the
// server's own work only.
func SourceWindowOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(SourceWindow), grpc.StaticConnWindowSize(SourceWindow)}
}

func callOptions() []grpc.CallOption {
	return []grpc.CallOption{grpc.ForceCodecV2(newCodec())}
}
