// Package api is the contract of the hub's admin API: every JSON document its HTTP
// endpoints return, which the operator's commands (package hub/admin) read, and the
// annotation every served resource carries. The hub serves these types; nothing here
// serves, stores or decides anything, so a client links only this package.
//
// Endpoints, all GET unless said, JSON:
//
//	/api/clusters                     []ClusterStatus
//	/api/sinks                        []SinkStatus
//	/api/sinks?fleet=&state=&q=&offset=&limit=   SinkPage: a page of the sinks those select (see dashboard.go)
//	/api/overview                     Overview: every cluster summarized, the sinks counted by fleet and state (dashboard.go)
//	/api/refusals?cluster=&host=&namespace=&q=&offset=&limit=   RefusalPage: objects pushed and not served, with why
//	/api/whoami                       WhoAmI: who a request is answered for, and whether it may act
//	/api/conflicts                    []Conflict
//	/api/why?collection=C&name=N      Why (C as users type it: vs, VirtualService, ...; 400 when no served kind)
//	/api/object?collection=C[&name=N] ObjectList, or Object: what is served of C, or of one object of it (see object.go; 404: no such object)
//	/api/kinds                        []kinds.Kind: the kinds of the hub's collections, to resolve names as the hub does
//	/api/owners?host=H | ?namespace=N Owners
//	/api/dryrun?identity=&node=&annotation=k=v   DryRun: what that sink receives now (POST a candidate: an action, below)
//	/api/replicas                     ReplicaStatus (404 on a single hub)
//	/api/tenants                      []Tenant
//	/api/events?since=SEQ&boot=B&limit=N  Events: what happened recently (refusals, reloads, breakers, clusters, replicas)
//	/api/state                        State: the file keeping the clusters' last-known state
//	/                                 the fleet dashboard (package hub/dashboard), HTML
//
// Who may read them: anyone who reaches the hub's http listener, which carries no identity
// (it serves Prometheus and the probes too; keep it on loopback or a network only they and
// operators reach), and, on the adminTLS listener (the same endpoints over mutual TLS), a
// client certificate the hub's bundle verifies: any, in a hub without tenants or a
// top-level operators list; otherwise an operator's, the vendor's (listed in operators:
// everything) or a tenant's (its tenant's answers only, and only the tenant's paths), and
// nothing for an operator listed nowhere or a certificate that is not an operator's.
// Reading changes nothing.
//
// Actions, which change the hub or spend its CPU at the caller's say, are POST (other
// methods: 405) and need an authenticated operator: on adminTLS, a client certificate
// whose identity is spiffe://<trustDomain>/operator/<name> (the name is recorded); in
// development mode (insecure) only, a request on http from a loopback peer addressed to
// loopback, recorded as "loopback (development mode)". A request that carries no identity
// (plain http) is refused with 401, one whose identity or origin may not act (another kind
// or trust domain, a browser's cross-origin request, a peer off loopback in development
// mode) with 403; the message says what is needed, and the hub logs every accepted or
// refused action with who asked and from where (see the README's "Operators"):
//
//	/api/clusters/{name}/breaker/release   BreakerRelease: apply a cluster's held deletions (404: no such cluster; 409: it holds none)
//	/api/dryrun?identity=&node=&annotation=k=v   DryRun with the diff: the body is a candidate configuration, evaluated, not applied
//
// A dry run of a candidate is the vendor's operators' (a tenant's: 403: the candidate is
// the whole hub's file) and bounded: at most MaxCandidateBytes (413), one evaluated at a
// time (429, with Retry-After, while one is) and a pause as long as it took after each (a
// request then waits for its end), within 5 s (503), stopped when its request ends.
package api

import "time"

// The development hub's admin listeners (hub.DefaultConfig), which the operator's commands
// ask when given no address.
const (
	DefaultHTTPAddr     = "127.0.0.1:9990"
	DefaultAdminTLSAddr = "127.0.0.1:9991"
)

// MaxCandidateBytes is the largest candidate configuration a dry run takes (POST
// /api/dryrun; larger: 413): 1 MiB, the most a Kubernetes ConfigMap holds, where the hub's
// file is deployed (deploy/hub).
const MaxCandidateBytes = 1 << 20

// OriginAnnotation is set on every served resource to the name of the cluster it came from.
const OriginAnnotation = "meshfed.io/origin-cluster"

// ClusterStatus is one configured cluster.
type ClusterStatus struct {
	Name string `json:"name"`
	// Tenant is the tenant the cluster belongs to.
	Tenant string `json:"tenant"`
	// Connected: a stream carrying the cluster's state is open (its minion's, pushed or
	// polled, or, with replicas, one from the replica holding it).
	Connected bool `json:"connected"`
	Streams   int  `json:"streams"`
	// Synced: a stream has delivered every collection since the hub started (or since the
	// cluster was added to the configuration), which ends the warm-up's wait for it; it stays
	// true after a disconnect (hub status's SYNCED is Connected and Synced).
	Synced bool `json:"synced"`
	// LastContact is when the cluster's last stream opened or closed: while it is connected
	// (in contact now), when it connected; once disconnected, when it disconnected. Absent:
	// it never connected since the hub started. (hub status shows "now" and "N ago".)
	LastContact *time.Time     `json:"lastContact,omitempty"`
	Resources   map[string]int `json:"resources"`
	// Rejections are resources refused by the ACL (or malformed), by collection and name,
	// with the reason. They are not stored and never served.
	Rejections map[string]map[string]string `json:"rejections,omitempty"`
	// RefusedCollections are the collections the cluster's source said it does not serve,
	// with how it said so: the hub goes on without them (they count as delivered) and asks
	// again on a later stream or after a configuration change.
	RefusedCollections map[string]string `json:"refusedCollections,omitempty"`
	// Conflicts are resources held but not served because another cluster's resource of
	// the same collection/name wins: collection -> name -> the winning cluster.
	Conflicts map[string]map[string]string `json:"conflicts,omitempty"`
	// Unknown says why the cluster's last state is unknown to the hub (its state file could
	// not be read whole, or its writes were failing when it stopped): the sinks of its
	// tenant are not served until its minion resyncs or an operator releases it (its Breaker
	// says so). Absent: known.
	Unknown string `json:"unknown,omitempty"`
	// Decided says why what this hub holds of the cluster is an operator's decision here
	// (a release of what a reload's ownership withdrew, or of an unknown state) rather than
	// what the cluster's session delivered: with replicas, its peers do not take this copy
	// until the cluster's minion delivers again. Absent: it is the session's.
	Decided string `json:"decided,omitempty"`
	// Departed: the cluster left the configuration then (a reload without it, its entry
	// renamed, a restart with a configuration that lacks it). Its objects stay served, held
	// by its breaker, until an operator confirms the removal (a release) or the
	// configuration has it again; its minion is refused meanwhile.
	Departed *time.Time `json:"departed,omitempty"`
	// Restored: what the hub serves of the cluster is its last-known state, read from the
	// state file at the hub's start; no session (its own, or a replica's copy) has
	// delivered since.
	Restored bool `json:"restored,omitempty"`
	// Breaker is the cluster's mass-deletion breaker: present while it holds deletions
	// (open, or deletions waiting to see whether it opens).
	Breaker *Breaker `json:"breaker,omitempty"`
	// HeldBy is, with replicas, the replica holding the cluster's newest minion session
	// (every other replica follows the cluster from it); absent when none holds it.
	HeldBy *Holder `json:"heldBy,omitempty"`
}

// State is the hub's file of the clusters' last-known state (what a restart serves of a
// cluster whose minion is away).
type State struct {
	// Persist: the hub keeps the state (the persist setting); Open: the file is open.
	Persist bool   `json:"persist"`
	Open    bool   `json:"open"`
	Path    string `json:"path"`
	// Error is why the file could not be opened (the hub then runs without it).
	Error string `json:"error,omitempty"`
	// Queued writes are not on disk yet; Failing: the last write failed (LastError), and is
	// being retried.
	Queued     int        `json:"queued"`
	Failing    bool       `json:"failing"`
	LastError  string     `json:"lastError,omitempty"`
	LastCommit *time.Time `json:"lastCommit,omitempty"`
	FileSize   int64      `json:"fileSize"`
}

// Breaker is what a cluster's mass-deletion breaker holds: deletions its source asked for
// that the hub has not applied (the objects stay served).
type Breaker struct {
	// Open: the deletions exceeded the cluster's limit; they are held until the cluster's
	// state recovers (the objects come back) or an operator releases them.
	Open bool `json:"open"`
	// Since is when it opened; Reason says which limit the deletions exceeded.
	Since  *time.Time `json:"since,omitempty"`
	Reason string     `json:"reason,omitempty"`
	// Held is how many deletions are held, and Pending lists them by collection (at most
	// 100 names per collection; Held counts them all).
	Held    int                 `json:"held"`
	Pending map[string][]string `json:"pending"`
	// Digest names the set of held deletions: a release names the digest its operator
	// reviewed, and is refused if they changed since (BreakerReleaseRequest).
	Digest string `json:"digest"`
}

// BreakerReleaseRequest is the body of a breaker's release: the digest of the held
// deletions the operator reviewed (Breaker.Digest).
type BreakerReleaseRequest struct {
	Digest string `json:"digest"`
}

// BreakerRelease is what releasing a cluster's breaker applied.
type BreakerRelease struct {
	Cluster  string `json:"cluster"`
	Operator string `json:"operator"`
	// Deleted is how many held deletions were applied, by collection.
	Deleted map[string]int `json:"deleted"`
	// NotDurable, when set, says that the release was applied but the state file could
	// not keep it (its writes began to fail meanwhile), and what a restart would undo.
	NotDurable string `json:"notDurable,omitempty"`
}

// Holder is the replica holding a cluster's newest minion session, and that session's
// epoch.
type Holder struct {
	Replica string `json:"replica"`
	MCPAddr string `json:"mcpAddr"`
	Epoch   uint64 `json:"epoch"`
}

// SinkStatus is one connected sink: an MCP stream, or an MCP-over-xDS one (istiod's
// xds:// config source, directly or behind a relay).
type SinkStatus struct {
	Stream uint64 `json:"stream"`
	Peer   string `json:"peer"`
	// Transport is "server" (it dialed in) or "client" (the hub dialed it).
	Transport string `json:"transport"`
	// Protocol is "mcp" (MCP ResourceSource, or the hub's dial-out) or "xds" (MCP over xDS).
	Protocol string `json:"protocol"`
	Identity string `json:"identity"`
	// Tenant is the tenant it belongs to ("" for none: it receives nothing).
	Tenant string `json:"tenant,omitempty"`
	// Unauthenticated: it came in on serveUnauthenticated without a certificate; its node
	// id and annotations, which routed it, are only what it claims.
	Unauthenticated bool `json:"unauthenticated,omitempty"`
	// NodeID and Annotations are what its SinkNode says; over xDS, its envoy node's id and
	// the string fields of its metadata (istiod: GENERATOR, ISTIO_VERSION, ...).
	NodeID      string            `json:"nodeId"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Rules are the routing rules that select it (its identity, and the node id its
	// certificate names when the hub has a trust domain).
	Rules []string  `json:"rules"`
	Since time.Time `json:"since"`
	// State is its worst collection's: NACKed, then Stale, then Syncing, else Synced.
	State string `json:"state"`
	// BehindSince is when the oldest push it has not answered was sent.
	BehindSince *time.Time `json:"behindSince,omitempty"`
	// Collections are by collection; over xDS, a type URL that resolves to no served
	// collection (istiod's core/v1alpha1/MeshConfig) is listed by its type URL, answered
	// with an empty state.
	Collections map[string]*SinkCollection `json:"collections"`
	// Downstream, for a minion's relay, are the sinks it serves in its cluster (its istiods),
	// as it last reported them.
	Downstream []RelayedSink `json:"downstream,omitempty"`
}

// RelayedSinksAnnotation is the SinkNode annotation in which a minion's relay reports the
// sinks it serves, as JSON []RelayedSink.
const RelayedSinksAnnotation = "meshfed.io/relayed-sinks"

// RelayedSink is one sink a minion's relay serves in its cluster.
type RelayedSink struct {
	NodeID   string `json:"nodeId"`
	Protocol string `json:"protocol"`
	// Collections: the relay's versions pushed and ACKed, and the last NACK's message, by
	// collection (or type URL).
	Collections map[string]*RelayedCollection `json:"collections"`
}

// RelayedCollection is a relayed sink's state for one collection.
type RelayedCollection struct {
	Pushed uint64 `json:"pushed"`
	Acked  uint64 `json:"acked"`
	NACK   string `json:"nack,omitempty"`
}

// SinkCollection is a sink's state for one collection.
type SinkCollection struct {
	// TypeURL is the xDS type URL the sink subscribed with (MCP over xDS only).
	TypeURL string `json:"typeUrl,omitempty"`
	// PushedVersion is the view's version last pushed, AckedVersion the last one it ACKed.
	PushedVersion uint64 `json:"pushedVersion"`
	AckedVersion  uint64 `json:"ackedVersion"`
	// Pending: a push awaits its ACK.
	Pending bool `json:"pending"`
	// LastNACK is the reason of the last NACK, if any, and its version.
	LastNACK      string    `json:"lastNack,omitempty"`
	NACKedVersion uint64    `json:"nackedVersion,omitempty"`
	Resources     int       `json:"resources"`
	LastPush      time.Time `json:"lastPush"`
	// State is one of the Sink* states.
	State string `json:"state"`
}

// States of a sink and of each of its collections, from best to worst.
const (
	// SinkSynced: it ACKed the last push.
	SinkSynced = "Synced"
	// SinkSyncing: a push awaits its answer, for less than the hub's sinkStaleAfter.
	SinkSyncing = "Syncing"
	// SinkStale: a push has awaited its answer for sinkStaleAfter or longer.
	SinkStale = "Stale"
	// SinkNACKed: it NACKed the last push (the reason is the collection's LastNACK).
	SinkNACKed = "NACKed"
)

// SinkStates lists the states from best to worst.
var SinkStates = []string{SinkSynced, SinkSyncing, SinkStale, SinkNACKed}

// Conflict is one collection/name published by several clusters.
type Conflict struct {
	Collection string   `json:"collection"`
	Name       string   `json:"name"`
	Winner     string   `json:"winner"`
	Losers     []string `json:"losers"`
	// Why is the rule that picked the winner: "higher priority", "older create_time" or
	// "lower cluster name".
	Why string `json:"why"`
}

// Why explains one resource: who publishes it, which one is served and why, who was
// refused and why, and which connected sinks receive it.
type Why struct {
	Collection string      `json:"collection"`
	Name       string      `json:"name"`
	Served     *Candidate  `json:"served"`
	Candidates []Candidate `json:"candidates"`
	// Conflict is the rule that picked the served one, when several publish it (as in
	// Conflict.Why).
	Conflict string    `json:"conflict,omitempty"`
	Rejected []Refused `json:"rejected"`
	Sinks    []WhySink `json:"sinks"`
}

// Candidate is one cluster's resource for a collection/name.
type Candidate struct {
	Cluster string `json:"cluster"`
	// Version is the served form's: <cluster>/<version as received>.
	Version string     `json:"version"`
	Created *time.Time `json:"created,omitempty"`
	Served  bool       `json:"served"`
	// HeldBecause says, for a candidate that is not served, which cluster's copy is and
	// why, with the values compared.
	HeldBecause string `json:"heldBecause,omitempty"`
	// DeletionHeld says that the cluster's mass-deletion breaker holds this copy's
	// deletion, and why: its source deleted it, or the configuration no longer lets the
	// cluster publish it (or no longer has the cluster), and it stays served until the
	// deletions are settled or released (hub breaker release CLUSTER).
	DeletionHeld string `json:"deletionHeld,omitempty"`
}

// Refused is one cluster's refused version of a resource.
type Refused struct {
	Cluster string `json:"cluster"`
	Reason  string `json:"reason"`
}

// WhySink is a connected sink whose rules give it the resource.
type WhySink struct {
	Stream uint64 `json:"stream"`
	// Protocol is "mcp" or "xds", as in SinkStatus.
	Protocol string   `json:"protocol"`
	Identity string   `json:"identity"`
	NodeID   string   `json:"nodeId"`
	Rules    []string `json:"rules"`
	// UpToDate: the sink has ACKed the latest push of the collection (so it holds the
	// served version).
	UpToDate bool `json:"upToDate"`
	// NACK, when the sink refused the latest push of the collection, is its reason
	// ("code: message"): it does not hold the served version.
	NACK string `json:"nack,omitempty"`
	// BehindRelay, for a sink a minion's relay serves (its cluster's istiod), is the relay's
	// stream: the sink is as its relay reported it (up to date when the relay is and it has
	// ACKed the relay's latest push).
	BehindRelay uint64 `json:"behindRelay,omitempty"`
}

// DryRun is what a sink with a given identity and SinkNode would receive — under the
// running configuration, or under a candidate one, with the difference from what such a
// sink receives now.
type DryRun struct {
	Identity    string            `json:"identity"`
	NodeID      string            `json:"nodeId"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Tenant it belongs to (under the candidate configuration, if one was given).
	Tenant string `json:"tenant,omitempty"`
	// Rules that select it (under the candidate configuration, if one was given).
	Rules []string `json:"rules"`
	// Resources it would receive: collection -> name -> served version.
	Resources map[string]map[string]string `json:"resources"`
	// Candidate is true when a candidate configuration was evaluated; then Added, Removed
	// and Changed compare with what the running configuration gives it now.
	Candidate bool                `json:"candidate"`
	Added     map[string][]string `json:"added,omitempty"`
	Removed   map[string][]string `json:"removed,omitempty"`
	Changed   map[string][]string `json:"changed,omitempty"`
	// NeedsRestart, for a candidate, names the changed fields a reload cannot apply (they
	// shape listeners and streams): a reload of the file refuses it whole and keeps the
	// running configuration, as the hub's reload decides it.
	NeedsRestart []string `json:"needsRestart,omitempty"`
}

// Owners answers "who owns host X" and "what does namespace N belong to".
type Owners struct {
	Host      string   `json:"host,omitempty"`
	Namespace string   `json:"namespace,omitempty"`
	Clusters  []string `json:"clusters"`
	// Tenant owning it, for the vendor's operators.
	Tenant string `json:"tenant,omitempty"`
	// NotYours: asked by a tenant's operator, none of its clusters owns it. Whether another
	// tenant's does is not theirs to know: the answer is the same when nobody does.
	NotYours bool `json:"notYours,omitempty"`
}

// ReplicaStatus is the replica view of one replica.
type ReplicaStatus struct {
	// Self is this replica's name.
	Self string `json:"self"`
	// Replicas are the live replicas and the clusters each holds (with the epoch).
	Replicas []Replica `json:"replicas"`
	// Authorities maps each held cluster to the replica holding its newest session.
	Authorities map[string]Holder `json:"authorities"`
	// Runs are the dial-out tasks this replica runs: dialSink/<name>, poll/<cluster>.
	Runs []string `json:"runs"`
	// Following maps each cluster this replica follows to the replica it follows it from
	// ("copy from a or b" for the copy of a cluster no replica holds).
	Following map[string]string `json:"following"`
}

// Replica is one live replica.
type Replica struct {
	Name    string `json:"name"`
	MCPAddr string `json:"mcpAddr"`
	// Holding maps each cluster whose session it holds to the session's epoch.
	Holding map[string]uint64 `json:"holding"`
}

// DefaultTenant is the tenant of a hub configured without tenants: every cluster and sink
// is its.
const DefaultTenant = "default"

// Tenant is one tenant as the admin API shows it: its clusters, its sinks' identities, and
// the exports that concern it (to a tenant's operator, an export from another tenant names
// only that it is shared with theirs).
type Tenant struct {
	Name     string   `json:"name"`
	Clusters []string `json:"clusters"`
	Sinks    []string `json:"sinks"`
	// ConnectedSinks is how many of its sinks' streams are open.
	ConnectedSinks int      `json:"connectedSinks"`
	Exports        []Export `json:"exports"`
}

// Export is one export: From shares what the conditions select (empty: everything) with
// To.
type Export struct {
	Name        string   `json:"name"`
	From        string   `json:"from"`
	To          []string `json:"to"`
	Clusters    []string `json:"clusters,omitempty"`
	Collections []string `json:"collections,omitempty"`
	Namespaces  []string `json:"namespaces,omitempty"`
	Labels      string   `json:"labels,omitempty"`
}
