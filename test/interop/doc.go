// Package interop is the interoperability test tier between meshfed's MCP engine (package
// github.com/meshfed/meshfed/mcp) and Istio 1.8.0's own MCP implementation.
//
// Istio's side is the istio-mcp-peer command of the separate module test/istio (built and
// cached by internal/testkit/testbin), run as a real child process; meshfed's side runs in the test
// process. The two talk real gRPC over 127.0.0.1, in all four directions:
//
//  1. Istio source-server (ResourceSource) ← meshfed Sink.PullFrom
//  2. Istio source-client → meshfed SinkServer (ResourceSink)
//  3. Istio sink-client → meshfed SourceServer (ResourceSource)
//  4. Istio sink-server (ResourceSink) ← meshfed Source.PushTo
//
// The tests check what a peer observes: the state each sink ends on, ACK/NACK handling,
// incremental pushes, coalescing, unserved collections and reconnects. Beyond the engine,
// federation_test.go runs the hub and the minion, in their default configurations, against
// Istio's sources as users meet them: a Galley-style source dialing the hub and serving
// fewer collections than asked, a minion following such a source server, and an
// incremental source restarted after deletions. The package holds only tests and this
// comment.
//
// It is not a unit or conformance suite of the engine (those are in package mcp, against
// meshfed's own peers), not a benchmark, and not a test of Istio: the peer's documented
// behaviour (test/istio/README.md) is taken as given. It uses no mocks and no fixed ports,
// and it never asserts on wall-clock durations.
package interop
