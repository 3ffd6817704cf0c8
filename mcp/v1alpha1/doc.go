// Package mcpv1alpha1 holds the generated Go code for meshfed's copy of Istio's MCP stream
// messages and services (package istio.mcp.v1alpha1: SinkNode, RequestResources, Resources,
// ResourceSource, ResourceSink). Resource and Metadata live in istio.io/api/mcp/v1alpha1.
//
// It is generated code only; the stream engine is package mcp. Regenerate with `make proto`.
package mcpv1alpha1
