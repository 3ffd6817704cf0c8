// Package hub is meshfed's central control plane. Minions dial in over MCP ResourceSink
// and push their cluster's configuration; the hub identifies each cluster by its
// authenticated transport identity (never by what the peer says), checks every resource
// against the ownership ACL (package hub/acl), keeps the accepted ones per cluster, merges
// the clusters' collections (one winner per collection/namespace/name, by a deterministic
// conflict policy), and serves each sink the subset its routing rules give it (package
// routing) over MCP ResourceSource, MCP over xDS (istiod 1.9+) and dial-out to sinks that
// only listen. Sinks with the same subset share one view, encoded once. Clusters whose
// minion only listens are polled. The configuration reloads without a restart; warm-up and
// staleness keep sinks from seeing a cluster's objects vanish because a process restarted
// or a minion disconnected. An admin API explains clusters, sinks, conflicts, owners and
// what a sink would receive.
//
// With a replicas section, several hubs act as one (replication.go): membership by
// package hub/replicas (memberlist); each replica holds the clusters whose minion sessions
// it has (the newest session's epoch wins), serves them as received to its peers over MCP
// on the ingest listener, and follows the clusters the others hold, handing over without a
// gap when a cluster's session moves; a replica that starts while a cluster's minion is
// away takes a peer's copy of it; each listening sink and polled minion is dialed by one
// replica at a time.
//
// It does not watch Kubernetes or files (the minion does). Its only certificates are those
// of its optional development CA (package tls).
package hub
