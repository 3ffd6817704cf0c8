// Package e2e holds the cross-component tests: real hubs, real minions and real MCP sinks
// talking over gRPC on loopback, so behaviour that spans the hub and the minion (ingest,
// ownership, merge, routing, staleness, resume) is checked the way a user would see it.
// It has no product code.
package e2e
