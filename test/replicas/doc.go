// Package replicas tests hub replicas as they run in production: three hub processes, four
// minion processes and twenty MCP sinks over mutual TLS (package internal/testkit/replicatest), with
// replicas killed (SIGKILL), restarted with an empty state directory, a minion flapping
// between them, and a network split made with blackhole routes in network namespaces the
// test creates (skipped without root or iproute2). The outcomes are those written down in
// ARCHITECTURE.md "Hub replicas".
package replicas
