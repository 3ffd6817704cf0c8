// Package hub is meshfed's central control plane. Minions dial in over MCP ResourceSink
// and push their cluster's configuration; the hub identifies each cluster by its
// authenticated transport identity (never by what the peer says), checks every resource
// against the ownership ACL (package hub/acl), keeps the accepted ones per cluster, merges
// the clusters' collections (one winner per collection/namespace/name, by a deterministic
// conflict policy), and serves each sink the subset its routing rules give it (package
// routing) over MCP ResourceSource. Sinks with the same subset share one view, encoded
// once.
//
// It does not watch Kubernetes or files (the minion does) and does not issue certificates.
package hub
