// Package hub is meshfed's central control plane, a single hub: the core every hub runs.
//
// One VirtualService's path through it, file by file:
//
//   - ingest.go: a minion's stream (it dials in, or the hub polls it) is admitted by its
//     authenticated transport identity (never by what the peer says) and becomes a Session
//     of its cluster, the one writer of the cluster's state; each push is paced by the
//     cluster's quota, every body checked against its kind (kinds.Table.Decode) and the
//     ownership ACL of the cluster's tenant (package hub/acl; compiled.check), and what is
//     refused is NACKed with the reason and never stored.
//   - store.go: the accepted resources, per cluster; a resource's served form (origin
//     annotation, a version qualified by the cluster) is encoded once. Each write is judged
//     there by the cluster's quotas (quota.go) and its mass-deletion breaker (breaker.go).
//   - merge.go: per collection and name, every cluster's resource is a candidate, ordered
//     by the conflict policy; the first is served.
//   - views.go: one mcp.Cache per distinct route (a tenant and a routing subset of its
//     rules, package routing), kept up to date with the winners it includes, shared and
//     encoded once for all its sinks.
//   - serve.go: each sink's stream (MCP ResourceSource, MCP over xDS for istiod, dial-out
//     to a sink that only listens; on the serve listener, or on serveUnauthenticated for
//     istiods that present no certificate) watches its route's view; sink is the one
//     function that says who a sink is, route the one that says what it receives (what its
//     tenant sees, package hub/tenancy, narrowed by its tenant's rules); the engine
//     (package mcp) pushes and follows ACKs.
//
// Around that path: cluster.go (each cluster's lifecycle from entering to leaving the
// configuration, the warm-up and staleness, one writer per cluster and the damping of two
// writers taking over from each other), departure.go (a cluster a reload removes or
// renames: renamed, its state moves; removed, it departs, held until an operator
// confirms), unknown.go (clusters whose last state the hub does not know, kept and not
// served as empty), nack.go (the gRPC code and details of a refused push), dryrun.go (an
// operator's candidate configuration compiled and compared, bounded), relay.go (a minion subscribing on the ingest
// listener, with its cluster's identity, to re-serve inside its cluster; routing selects it
// only by rules for relays), reload.go (a new configuration applied without a restart),
// http.go (the admin API, whose types are package hub/api; operator.go decides who may take
// its actions; http_object.go what is served of an object, http_dashboard.go the fleet
// dashboard's summaries and pages, package hub/dashboard its page), events.go (the recent
// refusals, reloads, breakers, connections and replica changes, a ring per tenant, which
// the paths that cause them note), metrics.go and metrics_state.go (the metrics counted
// where things happen, and the gauges read from the hub's state at scrape time), persist.go
// (each cluster's last-known state in the state file, package hub/durable, restored at
// start; what the file cannot vouch for is unknown), config.go (the configuration file and its one literal of
// defaults), config_tenants.go (tenants: each a group of clusters and sink fleets, with its
// own ownership and routing; claims of two tenants never overlap), scope.go (whose eyes the
// admin API answers for: the vendor's, or one tenant operator's).
//
// What runs beside the core plugs in through Layer (layer.go), whose single-hub
// implementation does nothing: the replica layer (package hub/replicas) is one, wired in
// by cmd/hub only when the configuration has a replicas section.
//
// It does not watch Kubernetes or resource files (the minion does); the only file it follows
// is its own configuration (RunWithReload), and the only one it writes, beside its optional
// development CA (package tls), is its state file.
package hub
