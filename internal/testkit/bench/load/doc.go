// Package load is the separate load process of the versus table (`make bench`, cmd/mcpbench
// -only versus): N sinks, one TCP connection (grpc.ClientConn) and one
// EstablishResourceStream each, that ACK every response at once and report, per change the
// controller arms, when each sink had it; and a bare-gRPC ResourceSource that sends
// pre-encoded Resources messages, the baseline. cmd/mcpload runs either as a process,
// driven by JSON lines on stdin and answering on stdout (protocol.go).
//
// It is neutral: its sinks speak MCP through the generated gRPC service description and
// protowire only, never meshfed's engine, so the same process drives meshfed's hub, Istio's
// own source and the bare server. The bare server takes the transport settings of
// meshfed's servers of sinks (mcp.SourceWindowOptions) and nothing else of meshfed, so that
// the meshfed / bare ratio is the hub's own work. Arrival times and the change's start are both taken in
// this process (the controller says "start" on stdin right before it makes the change), so
// no clock is shared between processes.
//
// It is test tooling; nothing in the product imports it.
package load
