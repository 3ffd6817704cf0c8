// Package mcp is meshfed's Mesh Configuration Protocol engine: the stream state machines of
// the two MCP roles, wire-compatible with Istio 1.4–1.8, usable over either gRPC direction.
//
//   - Source pushes collections to sinks: served as the ResourceSource service (SourceServer;
//     sinks dial in) or dialed out to a ResourceSink service (Source.PushTo).
//   - Sink requests collections and applies each push through an Applier, ACKing or NACKing
//     it: served as the ResourceSink service (SinkServer; sources dial in) or dialed out to a
//     ResourceSource service (Sink.PullFrom).
//
// The source engine reads state through Watcher, a small interface a store implements
// (Cache is an in-memory one); it never copies resources per stream. A resource is marshaled
// once into an Entry; each Snapshot or Delta is encoded once into a push body shared by every
// stream, and the per-stream nonce is appended by this package's gRPC codec without copying.
// Every gRPC server carrying these services must therefore be built with ServerOptions, or
// SourceServerOptions (ServerOptions and a fixed receive window) when its clients are all
// sinks.
//
// Protocol rules implemented here (see ARCHITECTURE.md for the reasoning): a nonce per push;
// at most one outstanding push per collection per stream; changes during a push coalesce
// into the next; stale or unknown nonces are ignored; a NACKed version is not resent until
// the collection changes; incremental pushes only to sinks that asked; resume from
// initial_resource_versions; pushes never exceed the configured message size (incremental
// ones are split); unserved collections get an empty state instead of a dead stream; a NACK
// that says the rest was applied (RejectionError) holds the version. As a sink, with a peer
// that does not say it is this engine (ResumesHeader, StreamInfo.PeerResumes): collections it
// refuses are left out, and a collection's first push on a stream is taken as its full state
// (Negotiation). A sink reports as it goes in its SinkNode (SinkOptions.Annotations,
// Sink.Report, StatusNonce; StreamInfo.LatestNode on the source side).
//
// XDSServer serves the same Watcher over MCP-over-xDS (envoy's ADS, state of the world), as
// istiod 1.9+ consumes it, observed through the same Hooks; Redial keeps a client stream up with backoff. A store ends a
// stream it can no longer serve as it is (after a routing change) with StreamInfo.Close.
//
// It is not a store of record, a router or an ACL: those are the hub's and minion's.
package mcp
