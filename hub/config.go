package hub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/pattern"
	"github.com/meshfed/meshfed/hub/tenancy"
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
)

// DevTrustDomain is the trust domain of the development CA when none is configured.
const DevTrustDomain = meshtls.DevTrustDomain

// ClusterIdentity is the SPIFFE ID of a cluster's minion in a trust domain.
func ClusterIdentity(trustDomain, cluster string) string {
	return meshtls.ID(trustDomain, meshtls.KindCluster, cluster)
}

// SinkIdentity is the SPIFFE ID of a sink in a trust domain.
func SinkIdentity(trustDomain, sink string) string {
	return meshtls.ID(trustDomain, meshtls.KindSink, sink)
}

// DevIdentityHeader carries a peer's claimed identity in insecure mode (see
// mcp.DevIdentityHeader).
const DevIdentityHeader = mcp.DevIdentityHeader

// MaxIngestMessageSize is the largest message the ingest listener accepts: a cluster's first
// push of a collection is its whole state.
const MaxIngestMessageSize = 64 << 20

// Config is the hub's configuration file (YAML). Defaults holds every default; a file is
// read on top of it, and DefaultConfig is what runs with no file.
type Config struct {
	// Ingest is where minions push (ResourceSink).
	Ingest string `json:"ingest,omitempty"`
	// Serve is where sinks subscribe (ResourceSource, MCP over xDS).
	Serve string `json:"serve,omitempty"`
	// ServeUnauthenticated, if set, is a second serving listener over TLS that
	// authenticates the hub only (no client certificate asked), for istiods that cannot
	// present one (their config source client speaks TLS mode SIMPLE). Its sinks have no
	// identity: only routing rules marked unauthenticated select them, by the node id and
	// annotations they claim. Off by default; needs tls or devCA.
	ServeUnauthenticated string `json:"serveUnauthenticated,omitempty"`
	// HTTP is the admin API, /metrics, /healthz, /readyz and pprof. Empty disables it.
	HTTP string `json:"http,omitempty"`
	// AdminTLS, if set, serves the same endpoints over mutual TLS, and is where the admin
	// API's actions (which change the hub) are accepted: from a verified client certificate
	// whose identity is spiffe://<trustDomain>/operator/<name>. Plain http stays for
	// Prometheus and probes, which present no certificate; without adminTLS the hub accepts
	// no actions, except in development mode (insecure) from a loopback peer on http. Off
	// by default (DefaultConfig: 127.0.0.1:9991); needs tls or devCA, and a trust domain.
	AdminTLS string `json:"adminTLS,omitempty"`

	// TLS makes both gRPC listeners require mutual TLS; a peer's identity is its
	// certificate's URI SAN (a SPIFFE ID; a certificate with several is refused), else its
	// subject common name. Its serverName applies to the connections the hub dials
	// (dialSinks, poll, replicas). Required unless Insecure or DevCA; needs TrustDomain
	// unless every sink is named by its exact identity (see checkSinkTrust).
	TLS *meshtls.Config `json:"tls,omitempty"`
	// DevCA makes the hub its own certificate authority for development: on first start it
	// creates a CA and its serving certificate under StateDir (keys 0600) and reuses them
	// after; `hub certs issue` issues the clusters' and sinks' certificates from it. It is
	// never used unless set, and cannot be combined with tls.
	DevCA bool `json:"devCA,omitempty"`
	// StateDir holds the development CA and, with Persist, the clusters' last-known state
	// (StateFile); relative to the working directory. One hub per directory.
	StateDir string `json:"stateDir,omitempty"`
	// Persist keeps each cluster's accepted state in StateDir, so that a restarted hub
	// serves a cluster whose minion is away its last state (under the staleness policy,
	// counted from the last contact) instead of nothing once the warm-up ends.
	Persist bool `json:"persist"`
	// Insecure serves plaintext and takes a peer's identity from the x-meshfed-dev-identity
	// header, which anyone can set: for a laptop, never for production. Logged loudly.
	Insecure bool `json:"insecure,omitempty"`

	// TrustDomain, when set, is the SPIFFE trust domain of the mesh's identities: minions
	// are spiffe://<trustDomain>/cluster/<name>, sinks spiffe://<trustDomain>/sink/<name>.
	// A cluster without identities gets its SPIFFE ID; a certificate of the wrong kind (a
	// sink's pushing, a cluster's subscribing) is refused; a sink is routed by the name in
	// its certificate, not by a SinkNode id that says otherwise, so routing rules may select
	// by node ids alone. Required with TLS unless every sink is named by its exact
	// identity. With devCA and no trust domain, the development CA's (DevTrustDomain).
	TrustDomain string `json:"trustDomain,omitempty"`
	// Clusters that may publish, each with its identities and what it owns. With tenants,
	// each tenant lists its own (tenants[].clusters) and this stays empty.
	Clusters []ClusterConfig `json:"clusters"`
	// Tenants group clusters and sink fleets by customer (see TenantConfig): each tenant's
	// sinks see only its clusters' objects and what other tenants export to it, and claims
	// of two tenants may not overlap. Absent: clusters, sharedNamespaces and routing are one
	// implicit tenant (DefaultTenant) every sink belongs to.
	Tenants []TenantConfig `json:"tenants,omitempty"`
	// Operators are the names of the vendor's operators (spiffe://<trustDomain>/operator/NAME),
	// who see and act on every tenant over adminTLS. Set, or with tenants, an operator
	// named neither here nor in a tenant's operators reads nothing and acts on nothing (an
	// operator dropped from a tenant, or a tenant removed, loses its access rather than
	// gaining the vendor's). Unset without tenants: every operator is the vendor's.
	Operators []string `json:"operators,omitempty"`
	// TenantLimits bound each tenant's peers, all together (tenants[].limits overrides
	// them per tenant).
	TenantLimits TenantLimits `json:"tenantLimits,omitempty"`
	// SharedNamespaces are namespace patterns (package hub/pattern) several clusters may own
	// at once; outside them, overlapping namespace ownership is a configuration error.
	SharedNamespaces []string `json:"sharedNamespaces,omitempty"`
	// DomainSuffix resolves short host names ("reviews" in namespace "shop" is
	// reviews.shop.svc.<suffix>).
	DomainSuffix string `json:"domainSuffix,omitempty"`
	// Collections the hub requests from clusters, accepts and serves. A file may name each
	// as users do (see kinds.Table: vs, VirtualService, networking.istio.io/v1/VirtualService);
	// ParseConfig stores the collection names, and Validate takes nothing else. A file
	// without it gets every built-in kind and every kind under kinds; Defaults, which knows
	// no kinds, has the built-in ones.
	Collections []string `json:"collections,omitempty"`
	// Kinds adds kinds beyond the built-in table, or replaces a built-in one with the same
	// collection (same fields as the minion's kinds): the hub requests, accepts and serves
	// them like the built-in ones, over MCP by collection and over MCP-over-xDS by
	// group/version/Kind (any version).
	Kinds []kinds.Kind `json:"kinds,omitempty"`
	// Conflicts decides which cluster's resource is served when several publish the same
	// collection/namespace/name.
	Conflicts ConflictConfig `json:"conflicts,omitempty"`
	// Staleness says how long a disconnected cluster's resources stay served.
	Staleness StalenessConfig `json:"staleness,omitempty"`
	// WarmUp: after a start, nothing is served until every configured cluster has synced or
	// this long has passed, so a sink never gets an empty state because the hub restarted.
	WarmUp Duration `json:"warmUp,omitempty"`
	// SinkStaleAfter: a sink that has not answered a push for this long is stale (its
	// state in `hub status`, the dashboard and meshfed_hub_fleet_sinks); before that it
	// is syncing.
	SinkStaleAfter Duration `json:"sinkStaleAfter,omitempty"`
	// Routing gives each sink its subset.
	Routing routing.Config `json:"routing"`
	// MaxMessageSize is the largest push sent to a sink, in bytes.
	MaxMessageSize int `json:"maxMessageSize,omitempty"`
	// DialSinks are sinks that only listen (they serve ResourceSink): the hub dials each and
	// pushes its subset, routed by the identity and node configured here.
	DialSinks []DialSink `json:"dialSinks,omitempty"`
	// Poll lists clusters whose minion serves ResourceSource (its destinations.listen) for
	// the hub to dial, instead of the minion dialing in.
	Poll []PollCluster `json:"poll,omitempty"`
	// Backoff bounds the redial delay of dialSinks, poll and the replicas' streams.
	Backoff ops.Backoff `json:"backoff,omitempty"`
	// Limits on the streams of each peer (authenticated identity, else IP address): how
	// fast it opens them, how many it keeps open, how soon it must speak.
	Limits LimitsConfig `json:"limits,omitempty"`
	// Replicas makes this hub one replica of several acting as one hub (see
	// ReplicasConfig; the layer is package hub/replicas). Absent: a single hub.
	Replicas *ReplicasConfig `json:"replicas,omitempty"`
	// Breaker holds a cluster's deletions that would withdraw too much of what it serves
	// (see BreakerConfig; clusters[].breaker overrides it per cluster).
	Breaker BreakerConfig `json:"breaker,omitempty"`
	// Quotas bound what each cluster may publish (see QuotaConfig; clusters[].quotas
	// overrides them per cluster).
	Quotas QuotaConfig `json:"quotas,omitempty"`
}

// Defaults returns every default of the hub's configuration, in one literal. ParseConfig
// reads a file on top of it (a field the file leaves out keeps its value here, but
// collections, which also defaults to the file's kinds); a program building a
// configuration starts from it too.
func Defaults() *Config {
	return &Config{
		// Loopback: nothing is reachable from elsewhere until the operator says so.
		Ingest: "127.0.0.1:9901",
		Serve:  "127.0.0.1:9900",
		// No admin listener unless asked for (DefaultConfig asks for one).
		HTTP:     "",
		StateDir: filepath.Join(".meshfed", "hub"),
		// A restart must not lose what a cluster whose minion is away last published.
		Persist:      true,
		DomainSuffix: acl.DefaultDomainSuffix,
		Collections:  kinds.Collections(),
		// A disconnected cluster's resources stay served: withdrawing them is the riskier
		// default for the meshes that consume them.
		Staleness: StalenessConfig{Default: "keep"},
		// Long enough for every minion to reconnect after a hub restart.
		WarmUp: ops.D(30 * time.Second),
		// istiod answers a push in milliseconds, and a large one within seconds; a sink
		// silent for half a minute is not keeping up.
		SinkStaleAfter: ops.D(30 * time.Second),
		// Istio Pilot's gRPC receive limit is 4 MiB; the rest is headroom for the envelope.
		MaxMessageSize: mcp.DefaultMaxMessageSize,
		Backoff:        ops.Backoff{Initial: ops.D(100 * time.Millisecond), Max: ops.D(30 * time.Second)},
		// Istio's sinks redial in a tight loop when a stream fails: a few streams a second
		// per peer is plenty for a healthy one. A peer needs one stream per service (a
		// minion one push and one relay stream, an istiod one), but a peer is an identity,
		// and a fleet shares one: every istiod of a service account (tens per cluster under
		// an autoscaler, and every cluster's, where one sink certificate is issued to all),
		// each with up to two streams open while a lost one waits for keepalive to notice
		// it (40 s; a whole fleet redials at once when a network heals). 64 refused such a
		// fleet's 33rd replica for good; 1,024 (the engine's default, so every listener has
		// one) holds 512 replicas through such a heal, and still bounds a leaked or looping
		// identity to about 60 MiB (an idle sink costs 58-64 KiB, ARCHITECTURE.md),
		// reached at streamsPerSecond only after minutes. Every peer speaks at once.
		// A refusal answered at once lets a looping peer make thousands a second; answered
		// after a second, each of its loops makes one (make bench, noisy-tenant row).
		// Before any of that, a connection costs a file descriptor from accept on, whoever
		// its peer is: a TLS handshake takes milliseconds, a second or two from a loaded
		// peer far away, so 10 s closes only connections that are not handshaking; 64 in
		// handshake at once from one address is more than a node's or a NAT's peers
		// reconnecting together need (a refused one redials), and bounds a flooding address
		// to 64 descriptors; 0 derives the cap from the open files limit, keeping a tenth
		// (at least 64) for the state file, the log and the hub's own dials, and
		// connlimit.HTTPReserve for the http listener.
		Limits: LimitsConfig{StreamsPerSecond: 5, StreamBurst: 20, MaxStreamsPerPeer: mcp.DefaultMaxStreamsPerPeer, IdleTimeout: ops.D(30 * time.Second), RefusalDelay: ops.D(mcp.DefaultRefusalDelay),
			Connections: ops.Connections{HandshakeTimeout: ops.D(10 * time.Second), MaxPendingPerIP: 64, MaxConnections: 0}},
		// An emptied source trips it (everything withdrawn); an ordinary rollout, which
		// deletes a few objects or fewer than half of a collection, does not. Settling two
		// seconds covers a source pushing each of its collections in turn.
		// The window: a source that loses its objects a little at a time (an informer losing
		// its RBAC namespace by namespace, a rollout deleting in batches) is judged on what it
		// withdrew over ten minutes, as one losing them at once is; an ordinary rollout deletes
		// far less than half of a cluster in that time.
		Breaker: BreakerConfig{MaxDeleteShare: 0.5, MinDeletes: 10, Settle: ops.D(2 * time.Second), Window: ops.D(10 * time.Minute)},
		// Far above a large cluster's mesh configuration (thousands of objects of a few KB),
		// far below what would starve the others; maxObjectBytes 0 is what a sink can
		// receive in one push. Each push of a cluster goes to every sink of its collection,
		// and a sink takes one push of a collection at a time: at 100 pushes/s a flooding
		// cluster put another's p99 at 1.5x on the bench's 2 cores, at 20/s at 1.0x (make
		// bench, noisy-neighbour row). A push carries every change since the last, so 20/s
		// loses no change; the burst covers a minion's initial sync (a push per collection).
		Quotas: QuotaConfig{MaxObjects: 200_000, MaxBytes: 512 << 20, PushesPerSecond: 20, PushBurst: 300},
		// A tenant of many clusters and sink fleets: its fleets may all reconnect at once
		// after a hub restart (the burst), a few clusters may push at their quota together,
		// and no tenant alone can fill the hub's memory or stream table. They bound each
		// tenant, and the peers of none together; a hub without tenants has no other tenant
		// to keep apart from, and its clusters' quotas and per-peer limits bound it alone.
		TenantLimits: TenantLimits{MaxStreams: 20_000, StreamsPerSecond: 200, StreamBurst: 2_000, PushesPerSecond: 100, PushBurst: 1_000,
			MaxObjects: 1_000_000, MaxBytes: 2 << 30},
	}
}

// DefaultConfig is what runs with no file: development mode on one machine (its own CA in
// StateDir, the admin API on 127.0.0.1:9990, and over mutual TLS, for operators' actions, on
// 127.0.0.1:9991), one cluster "dev" (what a minion with its
// default configuration calls itself) owning everything, every sink receiving everything.
func DefaultConfig() *Config {
	c := Defaults()
	c.DevCA = true
	c.HTTP = api.DefaultHTTPAddr
	c.AdminTLS = api.DefaultAdminTLSAddr // so that an operator's certificate has somewhere to act
	c.Clusters = []ClusterConfig{{Name: "dev", Namespaces: []string{"*"}, Hosts: []string{"*"}}}
	c.Routing = routing.Config{Default: &routing.Rule{Name: "everything"}}
	c.WarmUp = ops.D(5 * time.Second) // one local minion: no need to wait long
	return c
}

// LimitsConfig bounds the streams of one peer (authenticated identity, else IP address) on
// each service of the hub's listeners (MCP, MCP over xDS; ingest and serve alike): how fast
// it opens them (Istio's sinks redial in a tight loop when a stream fails), how many it
// keeps open and how soon a new one must speak. Streams between hub replicas are admitted
// by the replica layer, one per cluster, and not counted here. Every refusal is counted in
// meshfed_mcp_streams_rejected_total by its reason.
//
// Its Connections fields (handshakeTimeout, maxPendingPerIP, maxConnections) come first in
// time: they bound the connections of every listener (ingest, serve, serveUnauthenticated,
// http, adminTLS) before a peer has completed its TLS handshake, when its identity is not
// known yet (package connlimit). Each connection refused or closed is counted in
// meshfed_hub_connections_refused_total{listener,reason}.
type LimitsConfig struct {
	ops.Connections
	// StreamsPerSecond per peer; excess streams are refused with ResourceExhausted
	// (rate_limited).
	StreamsPerSecond float64 `json:"streamsPerSecond,omitempty"`
	// StreamBurst is how many a peer may open at once.
	StreamBurst int `json:"streamBurst,omitempty"`
	// MaxStreamsPerPeer is how many streams a peer (an identity: a fleet sharing one
	// certificate is one peer) may keep open at once on each service; one more is refused
	// with ResourceExhausted (too_many_streams), logged at WARN once per identity per
	// minute naming this field. 0: no cap.
	MaxStreamsPerPeer int `json:"maxStreamsPerPeer,omitempty"`
	// IdleTimeout closes a new stream whose peer sends nothing within it (idle). Only the
	// first message is awaited: a subscribed sink may then be quiet for as long as nothing
	// changes. 0: none.
	IdleTimeout Duration `json:"idleTimeout,omitempty"`
	// RefusalDelay is how long a stream refused for exceeding a limit (a peer's or its
	// tenant's rate or cap) waits for its answer: a peer opening streams in a tight loop
	// then waits instead of spinning, and its refusals cost neither it nor the hub the CPU
	// other peers need. 0: answered at once.
	RefusalDelay Duration `json:"refusalDelay,omitempty"`
}

// DialSink is a sink the hub dials.
type DialSink struct {
	// Name identifies it in logs.
	Name string `json:"name"`
	// Addr is its ResourceSink address (host:port).
	Addr string `json:"addr"`
	// Identity, NodeID and Annotations are what routing sees for it.
	Identity    string            `json:"identity,omitempty"`
	NodeID      string            `json:"nodeId,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PollCluster is a cluster whose minion the hub dials.
type PollCluster struct {
	// Cluster is the configured cluster's name; the stream is that cluster's.
	Cluster string `json:"cluster"`
	// Addr is the minion's ResourceSource address (host:port).
	Addr string `json:"addr"`
	// FullState asks the source for full-state pushes rather than incremental ones. Not
	// needed for correctness (see ClusterConfig.FullState).
	FullState bool `json:"fullState,omitempty"`
}

// ClusterConfig is one cluster allowed to publish.
type ClusterConfig struct {
	// Name is the cluster's name in the hub (routing rules, the origin annotation, the API).
	Name string `json:"name"`
	// Identities are the authenticated identities that are this cluster, exactly (e.g.
	// spiffe://mesh.example.com/cluster/east). Default with a trust domain: its SPIFFE ID.
	Identities []string `json:"identities"`
	// Namespaces it owns (namespace patterns, package hub/pattern): "shop", "team-*", "*".
	Namespaces []string `json:"namespaces,omitempty"`
	// Hosts it owns (host patterns): "api.example.com", "*.shop.example.com", "*".
	Hosts []string `json:"hosts,omitempty"`
	// ClusterScoped lists the collections whose cluster-scoped resources it may publish.
	ClusterScoped []string `json:"clusterScoped,omitempty"`
	// Collections the hub asks the cluster's source for, of those it serves. Default: all.
	// A source that does not serve one (an older Istio's knows no WasmPlugin) is asked
	// without it anyway once it has refused it; listing them here saves that exchange.
	Collections []string `json:"collections,omitempty"`
	// FullState asks the cluster's source (dialing in) for full-state pushes rather than
	// incremental ones. Not needed for correctness: a source that does not say it resumes
	// from the versions the hub declares (any but a minion) is taken at its first push of
	// each collection on a stream as the full state, so deletions made while it was away
	// are seen. It trades bandwidth for a source whose incremental pushes are not trusted.
	FullState bool `json:"fullState,omitempty"`
	// Breaker overrides the hub's breaker fields it sets for this cluster.
	Breaker *BreakerConfig `json:"breaker,omitempty"`
	// Quotas overrides the hub's quota fields it sets for this cluster.
	Quotas *QuotaConfig `json:"quotas,omitempty"`

	// departed: not in the configuration file; the hub keeps the cluster after it left it
	// (departure.go). It owns nothing and no identity is it. A file cannot set it.
	departed bool
}

// ConflictConfig is the conflict policy.
type ConflictConfig struct {
	// Priority lists cluster names, highest first; unlisted clusters come after. Without
	// it, the resource with the oldest create_time wins, ties by cluster name.
	Priority []string `json:"priority,omitempty"`
}

// StalenessConfig says how long a disconnected cluster's resources stay served.
type StalenessConfig struct {
	// Default applies to collections not listed: "keep" (forever) or a duration ("10m")
	// after which they are dropped.
	Default string `json:"default,omitempty"`
	// Collections overrides Default per collection: its keys, typed as users do, are stored
	// as collection names by ParseConfig (like Config.Collections).
	Collections map[string]string `json:"collections,omitempty"`
}

// ttl returns how long a disconnected cluster's resources of collection stay (0: forever).
func (s StalenessConfig) ttl(collection string) time.Duration {
	v, ok := s.Collections[collection]
	if !ok {
		v = s.Default
	}
	d, _ := parseStaleness(v)
	return d
}

func parseStaleness(v string) (time.Duration, error) {
	if v == "keep" || v == "" { // an empty value has always meant keep
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want \"keep\" or a positive duration like \"10m\"", v)
	}
	return d, nil
}

// Duration is a time.Duration written as "30s"; a value that does not parse is reported
// by Validate with the field's name.
type Duration = ops.Duration

// LoadConfig reads and validates a configuration file.
func LoadConfig(path string) (*Config, error) { return ops.LoadFile(path, ParseConfig) }

// ParseConfig reads a configuration on top of Defaults, stores the collections it names as
// collection names (canonicalCollections), and validates it. Unknown fields are errors.
func ParseConfig(data []byte) (*Config, error) {
	cfg, err := decodeConfig(data)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// decodeConfig is ParseConfig but the validation: a dry run validates its candidate once,
// by compiling it under the request's deadline.
func decodeConfig(data []byte) (*Config, error) {
	cfg := Defaults()
	cfg.Collections = nil // the file's, else every kind: only the file says which kinds exist
	if err := ops.DecodeStrict(data, cfg); err != nil {
		return nil, err
	}
	if err := cfg.canonicalCollections(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// canonicalCollections resolves the collections a file names (collections, each cluster's
// collections and clusterScoped, the routing rules' names, and the keys of
// staleness.collections), typed as users do, to collection names through the table of the
// built-in and configured kinds, so that everything after sees collection names only.
// Collections unset are every kind of the table.
func (c *Config) canonicalCollections() error {
	table, err := kinds.NewTable(c.Kinds)
	if err != nil {
		return err
	}
	if c.Collections == nil {
		c.Collections = table.Collections()
	} else if c.Collections, err = table.ResolveAll("collections", c.Collections); err != nil {
		return err
	}
	for _, g := range c.tenantGroups() {
		for i := range g.Clusters {
			cl := &g.Clusters[i]
			if len(cl.Collections) > 0 {
				if cl.Collections, err = table.ResolveAll(fmt.Sprintf("%sclusters[%d] (%q).collections", g.field, i, cl.Name), cl.Collections); err != nil {
					return err
				}
			}
			if len(cl.ClusterScoped) > 0 {
				if cl.ClusterScoped, err = table.ResolveAll(fmt.Sprintf("%sclusters[%d] (%q).clusterScoped", g.field, i, cl.Name), cl.ClusterScoped); err != nil {
					return err
				}
			}
		}
		// A routing rule's collections are patterns; one without a wildcard is a name, typed
		// like any other.
		for i := range g.Routing.Rules {
			r := &g.Routing.Rules[i]
			for j, p := range r.Collections {
				if strings.ContainsAny(p, "*?[") {
					continue
				}
				k, err := table.Resolve(p)
				if err != nil {
					return fmt.Errorf("%srouting.rules[%d].collections[%d]: %w", g.field, i, j, err)
				}
				r.Collections[j] = k.Collection
			}
		}
		// An export's collections likewise (a prefix ending in "*" is kept as written).
		for i := range g.Exports {
			e := &g.Exports[i]
			for j, p := range e.Collections {
				if strings.Contains(p, "*") {
					continue
				}
				k, err := table.Resolve(p)
				if err != nil {
					return fmt.Errorf("%sexports[%d] (%q).collections[%d]: %w", g.field, i, e.Name, j, err)
				}
				e.Collections[j] = k.Collection
			}
		}
	}
	if len(c.Staleness.Collections) == 0 {
		return nil
	}
	typed := make([]string, 0, len(c.Staleness.Collections))
	for name := range c.Staleness.Collections {
		typed = append(typed, name)
	}
	sort.Strings(typed) // the first error is the same on every run
	canon := make(map[string]string, len(typed))
	as := map[string]string{} // collection -> the name it was given as
	for _, name := range typed {
		k, err := table.Resolve(name)
		if err != nil {
			return fmt.Errorf("staleness.collections[%s]: %w", name, err)
		}
		if prev, dup := as[k.Collection]; dup {
			return fmt.Errorf("staleness.collections[%s]: %q is %s, already listed as %q", name, name, k.Collection, prev)
		}
		as[k.Collection] = name
		canon[k.Collection] = c.Staleness.Collections[name]
	}
	c.Staleness.Collections = canon
	return nil
}

// SPIFFETrustDomain is the trust domain identities are checked against: TrustDomain, or,
// with devCA and none set, the development CA's.
func (c *Config) SPIFFETrustDomain() string {
	if c.TrustDomain == "" && c.DevCA {
		return DevTrustDomain
	}
	return c.TrustDomain
}

// compiled is what a valid Config means: built by compile, never changed after.
type compiled struct {
	tenants     *tenancy.Set
	vendorOps   map[string]bool          // Config.Operators; nil: every operator no tenant names
	tenant      map[string]*tenantComp   // by name: each tenant's ownership and routing
	identity    map[string]string        // identity -> cluster
	clusters    map[string]ClusterConfig // the file's, and the departed ones the hub keeps
	departed    map[string]bool          // clusters that left the configuration (departure.go)
	served      []string                 // Config.Collections
	ownership   ownership                // what the tenants' policies are built from
	trustDomain string                   // SPIFFETrustDomain
	insecure    bool
	kindTable   *kinds.Table // the built-in and configured kinds
	breaker     BreakerConfig
	quotas      QuotaConfig
	guards      map[string]*quotaGuard   // by cluster: quotaFor
	shares      map[string]split         // by tenant: how its collection bound is shared (shareOf)
	breakers    map[string]BreakerConfig // by cluster: breakerFor
	maxMessage  int                      // maxMessageSize: what a sink can receive in one push
	staleAfter  time.Duration            // sinkStaleAfter
}

// quotaFor is cluster's bounds (built once per configuration, by compile).
func (c *compiled) quotaFor(cluster string) *quotaGuard {
	if g := c.guards[cluster]; g != nil {
		return g
	}
	return c.newQuotaGuard(cluster)
}

// newQuotaGuard is cluster's bounds: the hub's quotas with the cluster's overrides, what a
// sink can receive of a collection, and its tenant's limits (none without tenants).
func (c *compiled) newQuotaGuard(cluster string) *quotaGuard {
	q := c.quotas.over(c.clusters[cluster].Quotas)
	if q.MaxObjectBytes == 0 {
		q.MaxObjectBytes = maxServedObject(c.maxMessage)
	}
	budget := c.quotas.MaxCollectionBytes // hub-wide
	if budget == 0 {
		budget = int64(c.maxMessage - pushEnvelope)
	}
	g := &quotaGuard{q: q, collectionBudget: budget, collectionShare: -1, tenanted: !c.tenants.Single()}
	if t := c.tenant[c.tenants.OfCluster(cluster)]; t != nil && g.tenanted {
		g.tenant = t.limits
	}
	if share, of := c.shareOf(cluster); budget >= 0 {
		g.collectionShare, g.shareOf = int64(share*float64(budget)), of
	}
	return g
}

// shareOf is cluster's share of each collection's bound (quotas.collectionShare): its own,
// or an even split of what the shares its tenant's other clusters set leave; and how it was
// set, in words. Departed clusters take none (they do not grow). checkShares has refused
// shares that add up to more than 1.
func (c *compiled) shareOf(cluster string) (float64, string) {
	if q := c.clusters[cluster].Quotas; q != nil && q.CollectionShare > 0 {
		return q.CollectionShare, fmt.Sprintf("its quotas.collectionShare, %g", q.CollectionShare)
	}
	sp := c.shares[c.tenants.OfCluster(cluster)]
	switch {
	case sp.even == 0 || sp.left <= 0:
		return 0, "nothing: the other clusters' quotas.collectionShare take it all"
	case sp.even == 1 && sp.left == 1:
		return 1, "all of it: the tenant's only cluster"
	}
	return sp.left / float64(sp.even), fmt.Sprintf("an even split of %.3g between %d clusters", sp.left, sp.even)
}

// split is how a tenant's collection bound is shared: what the explicit shares leave, and
// between how many clusters without one.
type split struct {
	left float64
	even int
}

// splitShares sums each tenant's clusters' explicit shares (quotas.collectionShare),
// refusing the hub-level field (it is a cluster's) and shares adding up to more than 1.
func (c *compiled) splitShares(hub QuotaConfig) error {
	if hub.CollectionShare != 0 {
		return errors.New("quotas.collectionShare: a cluster's share of a collection's bound: set it under clusters[].quotas")
	}
	c.shares = map[string]split{}
	for name, cl := range c.clusters {
		if c.departed[name] {
			continue
		}
		t := c.tenants.OfCluster(name)
		sp, ok := c.shares[t]
		if !ok {
			sp.left = 1
		}
		if cl.Quotas != nil && cl.Quotas.CollectionShare > 0 {
			sp.left -= cl.Quotas.CollectionShare
		} else {
			sp.even++
		}
		c.shares[t] = sp
	}
	for tenant, sp := range c.shares {
		if sp.left < -1e-9 {
			return fmt.Errorf("clusters[].quotas.collectionShare: tenant %q's clusters' shares add up to %g, more than the whole bound (1)", tenant, 1-sp.left)
		}
	}
	return nil
}

// breakerFor is cluster's breaker: the hub's, with the cluster's overrides (built once
// per configuration, by compile).
func (c *compiled) breakerFor(cluster string) BreakerConfig {
	if b, ok := c.breakers[cluster]; ok {
		return b
	}
	return c.breaker // not configured: no override
}

// ownership is what the tenants' ownership policies are built from: two equal ones refuse
// the same resources.
type ownership struct {
	owners       map[string][]acl.Cluster // by tenant
	domainSuffix string
}

// check decides whether cluster may publish o, under its tenant's ownership: a refusal
// names only clusters of the same tenant.
func (c *compiled) check(cluster string, o acl.Object) error {
	t := c.tenant[c.tenants.OfCluster(cluster)]
	if t == nil {
		return &acl.Rejection{Reason: fmt.Sprintf("cluster %q is not in the hub's configuration", cluster)}
	}
	return t.policy.Check(cluster, o)
}

// collections returns the collections the hub asks cluster's source for: its own, else
// every one the hub serves.
func (c *compiled) collections(cluster string) []string {
	if colls := c.clusters[cluster].Collections; len(colls) > 0 {
		return colls
	}
	return c.served
}

// configured reports whether a cluster is in the configuration file (not one that left
// it, which the hub keeps: known).
func (c *compiled) configured(cluster string) bool {
	_, ok := c.clusters[cluster]
	return ok && !c.departed[cluster]
}

// known reports whether the hub keeps a cluster: configured, or departed.
func (c *compiled) known(cluster string) bool {
	_, ok := c.clusters[cluster]
	return ok
}

// Validate checks the configuration and reports the first problem, naming its field. It
// changes nothing.
func (c *Config) Validate() error {
	_, err := c.compile()
	return err
}

func (c *Config) compile() (*compiled, error) { return c.compileCtx(context.Background()) }

// compileCtx is compile until ctx ends (a dry run's request gone or out of time): its
// loops over clusters, tenants and patterns return ctx's error once it has.
func (c *Config) compileCtx(ctx context.Context) (*compiled, error) {
	for field, addr := range map[string]string{"ingest": c.Ingest, "serve": c.Serve} {
		if addr == "" {
			return nil, fmt.Errorf("%s: required", field)
		}
	}
	for field, addr := range map[string]string{"ingest": c.Ingest, "serve": c.Serve, "http": c.HTTP, "serveUnauthenticated": c.ServeUnauthenticated, "adminTLS": c.AdminTLS} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%s: %v", field, err)
		}
	}
	switch {
	case c.DevCA && (c.TLS != nil || c.Insecure):
		return nil, errors.New("devCA: cannot be combined with tls or insecure")
	case c.DevCA && c.StateDir == "":
		return nil, errors.New("stateDir: required with devCA")
	case c.Persist && c.StateDir == "":
		return nil, errors.New("stateDir: required with persist (the clusters' last-known state is kept there)")
	case c.TLS == nil && !c.Insecure && !c.DevCA:
		return nil, errors.New("tls: required unless devCA or insecure is true")
	case c.TLS != nil && c.Insecure:
		return nil, errors.New("insecure: cannot be combined with tls")
	case c.ServeUnauthenticated != "" && c.Insecure:
		return nil, errors.New("serveUnauthenticated: needs tls or devCA (it is a TLS listener that authenticates the hub only)")
	case c.AdminTLS != "" && c.Insecure:
		return nil, errors.New("adminTLS: needs tls or devCA (it is a mutual TLS listener: operators are known by their certificates; in development mode, actions are taken from loopback on http)")
	case c.AdminTLS != "" && c.SPIFFETrustDomain() == "":
		// An operator is a kind of identity in a trust domain; without one, a cluster's or a
		// sink's certificate could not be told from an operator's.
		return nil, errors.New("adminTLS: needs trustDomain (an operator is spiffe://<trustDomain>/operator/NAME)")
	case c.TLS != nil:
		if err := c.TLS.Files.Validate(); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
	}
	td := c.SPIFFETrustDomain()
	if td != "" {
		if err := meshtls.CheckTrustDomain(td); err != nil {
			return nil, fmt.Errorf("trustDomain: %q is not a SPIFFE trust domain: %w", td, err)
		}
	}
	if err := c.WarmUp.Check("warmUp"); err != nil {
		return nil, err
	}
	if err := c.SinkStaleAfter.Check("sinkStaleAfter"); err != nil {
		return nil, err
	}
	if c.SinkStaleAfter.Duration <= 0 {
		return nil, fmt.Errorf("sinkStaleAfter: %s is not positive", c.SinkStaleAfter.Duration)
	}
	if c.MaxMessageSize <= 0 {
		return nil, fmt.Errorf("maxMessageSize: %d is not positive", c.MaxMessageSize)
	}
	if c.Limits.StreamsPerSecond <= 0 || c.Limits.StreamBurst <= 0 {
		return nil, errors.New("limits: streamsPerSecond and streamBurst must be positive")
	}
	if c.Limits.MaxStreamsPerPeer < 0 {
		return nil, fmt.Errorf("limits.maxStreamsPerPeer: %d is negative (0 is no cap)", c.Limits.MaxStreamsPerPeer)
	}
	if err := c.Limits.IdleTimeout.Check("limits.idleTimeout"); err != nil {
		return nil, err
	}
	if err := c.Limits.RefusalDelay.Check("limits.refusalDelay"); err != nil {
		return nil, err
	}
	if err := c.Limits.Connections.Check("limits"); err != nil {
		return nil, err
	}
	if err := c.Backoff.Check("backoff"); err != nil {
		return nil, err
	}
	kindTable, kerr := kinds.NewTable(c.Kinds)
	if kerr != nil {
		return nil, kerr
	}
	if len(c.Collections) == 0 {
		return nil, errors.New("collections: at least one collection is required")
	}
	if err := kindTable.CheckCanonical("collections", c.Collections); err != nil {
		return nil, err
	}
	seenColl := map[string]bool{}
	for _, coll := range c.Collections {
		seenColl[coll] = true
	}
	if _, err := parseStaleness(c.Staleness.Default); err != nil {
		return nil, fmt.Errorf("staleness.default: %w", err)
	}
	for coll, v := range c.Staleness.Collections {
		if !seenColl[coll] {
			return nil, fmt.Errorf("staleness.collections: %q is not a served collection", coll)
		}
		if _, err := parseStaleness(v); err != nil {
			return nil, fmt.Errorf("staleness.collections[%s]: %w", coll, err)
		}
	}
	if err := c.Breaker.check("breaker"); err != nil {
		return nil, err
	}
	if err := c.Quotas.check("quotas", c.MaxMessageSize); err != nil {
		return nil, err
	}
	if c.Breaker.MaxDeleteShare == 0 {
		return nil, errors.New("breaker.maxDeleteShare: required (0.5 holds deletions of more than half of what a cluster serves)")
	}
	if err := c.checkTenantsShape(); err != nil {
		return nil, err
	}
	if err := c.TenantLimits.check("tenantLimits"); err != nil {
		return nil, err
	}
	if len(c.allClusters()) == 0 {
		return nil, errors.New("clusters: at least one cluster is required")
	}
	out := &compiled{identity: map[string]string{}, clusters: map[string]ClusterConfig{}, departed: map[string]bool{}, served: c.Collections, trustDomain: td, insecure: c.Insecure, breaker: c.Breaker, staleAfter: c.SinkStaleAfter.Duration,
		quotas: c.Quotas, maxMessage: c.MaxMessageSize, ownership: ownership{owners: map[string][]acl.Cluster{}, domainSuffix: c.DomainSuffix}}
	groups := c.tenantGroups()
	for _, g := range groups {
		if err := out.addClusters(ctx, c, g, kindTable, seenColl, td); err != nil {
			return nil, err
		}
	}
	seenSinks := map[string]bool{}
	for i, d := range c.DialSinks {
		field := fmt.Sprintf("dialSinks[%d]", i)
		if d.Name == "" || seenSinks[d.Name] {
			return nil, fmt.Errorf("%s.name: %q is empty or used twice", field, d.Name)
		}
		seenSinks[d.Name] = true
		if _, _, err := net.SplitHostPort(d.Addr); err != nil {
			return nil, fmt.Errorf("%s (%q).addr: %v", field, d.Name, err)
		}
	}
	for i, p := range c.Poll {
		field := fmt.Sprintf("poll[%d]", i)
		if !out.configured(p.Cluster) {
			return nil, fmt.Errorf("%s.cluster: %q is not a configured cluster", field, p.Cluster)
		}
		if _, _, err := net.SplitHostPort(p.Addr); err != nil {
			return nil, fmt.Errorf("%s (%q).addr: %v", field, p.Cluster, err)
		}
	}
	for i, p := range c.Conflicts.Priority {
		if !out.configured(p) {
			return nil, fmt.Errorf("conflicts.priority[%d]: %q is not a configured cluster", i, p)
		}
	}
	if c.Replicas != nil {
		if err := c.Replicas.check(c); err != nil {
			return nil, err
		}
	}
	if err := c.compileTenants(ctx, out, groups); err != nil {
		return nil, err
	}
	if err := out.splitShares(c.Quotas); err != nil {
		return nil, err
	}
	// Each push is judged by its cluster's bounds and breaker: built here once, not per push.
	out.guards = make(map[string]*quotaGuard, len(out.clusters))
	out.breakers = make(map[string]BreakerConfig, len(out.clusters))
	for name, cl := range out.clusters {
		out.guards[name] = out.newQuotaGuard(name)
		out.breakers[name] = out.breaker.over(cl.Breaker)
	}
	if err := c.checkDialSinkTrust(out); err != nil {
		return nil, err
	}
	out.kindTable = kindTable
	return out, nil
}

// addClusters checks a tenant's clusters and adds them, with their identities, to out.
func (out *compiled) addClusters(ctx context.Context, c *Config, g tenantGroup, kindTable *kinds.Table, seenColl map[string]bool, td string) error {
	for i, cl := range g.Clusters {
		if err := ctx.Err(); err != nil {
			return err
		}
		field := fmt.Sprintf("%sclusters[%d]", g.field, i)
		if cl.Name == "" {
			return fmt.Errorf("%s.name: required", field)
		}
		if _, dup := out.clusters[cl.Name]; dup {
			return fmt.Errorf("%s.name: %q is used twice", field, cl.Name)
		}
		if err := kindTable.CheckCanonical(field+".clusterScoped", cl.ClusterScoped); err != nil {
			return err
		}
		if err := cl.Breaker.check(fmt.Sprintf("%s (%q).breaker", field, cl.Name)); err != nil {
			return err
		}
		if err := cl.Quotas.check(fmt.Sprintf("%s (%q).quotas", field, cl.Name), c.MaxMessageSize); err != nil {
			return err
		}
		if cl.Quotas != nil && cl.Quotas.MaxCollectionBytes != 0 {
			return fmt.Errorf("%s (%q).quotas.maxCollectionBytes: a bound of the hub (all clusters together): set it under quotas", field, cl.Name)
		}
		out.clusters[cl.Name] = cl
		if cl.departed {
			out.departed[cl.Name] = true
			continue // no identity is it any more
		}
		seen := map[string]bool{}
		for j, coll := range cl.Collections {
			if !seenColl[coll] || seen[coll] {
				return fmt.Errorf("%s (%q).collections[%d]: %q is not one of the hub's collections, or is listed twice", field, cl.Name, j, coll)
			}
			seen[coll] = true
		}
		ids := cl.Identities
		if len(ids) == 0 && td != "" {
			ids = []string{ClusterIdentity(td, cl.Name)}
		}
		if len(ids) == 0 {
			return fmt.Errorf("%s (%q).identities: at least one identity is required (or set trustDomain)", field, cl.Name)
		}
		for j, id := range ids {
			if kind, _, err := meshtls.CheckID(td, id); td != "" && (err != nil || kind != meshtls.KindCluster) {
				why := fmt.Sprintf("its kind is %q", kind)
				if err != nil {
					why = err.Error()
				}
				return fmt.Errorf("%s (%q).identities[%d]: %q is not a cluster identity of trust domain %q (spiffe://%s/cluster/NAME): %s",
					field, cl.Name, j, id, td, td, why)
			}
			if other, dup := out.identity[id]; dup || id == "" {
				return fmt.Errorf("%s (%q).identities[%d]: %q is empty or already cluster %q's", field, cl.Name, j, id, other)
			}
			out.identity[id] = cl.Name
		}
	}
	return nil
}

// checkNamespaceOverlap refuses two clusters owning a common namespace outside the shared
// namespaces: two clusters publishing the same name there would be a conflict. The
// clusters' patterns are valid (acl.New has checked them). Of several such pairs, the
// error names the first in configuration order (clusters i < j, then i's pattern, then
// j's), as comparing every pair in that order would.
//
// Comparing every pair is O(clusters² × patterns²): seconds for a configuration of a few
// hundred clusters, on every load, reload and dry run. Instead: a pattern a shared one
// covers can be in no refused pair (what it overlaps is within it, so covered too), and
// any overlap between two uncovered patterns is refused (their overlap is one of them), so
// it suffices to find, in a pattern.Index of the uncovered patterns, the first of a later
// cluster overlapping each pattern: O(n log n) plus the patterns' length.
func checkNamespaceOverlap(ctx context.Context, clusters []ClusterConfig, shared []pattern.Namespace) error {
	covered := newCoverSet(shared)
	var terms []pattern.Term
	var pats []pattern.Namespace
	var owner []int                       // term -> cluster
	first := make([]int, len(clusters)+1) // cluster -> its first term (terms are in order)
	for i, c := range clusters {
		first[i] = len(terms)
		ps, _ := pattern.ParseNamespaces("", c.Namespaces)
		for _, p := range ps {
			if !covered.covers(p) {
				terms, pats, owner = append(terms, p.Term()), append(pats, p), append(owner, i)
			}
		}
	}
	first[len(clusters)] = len(terms)
	// From the last cluster to the first, the index holds the later clusters' patterns:
	// for cluster i, the first pair is the one with the earliest other cluster, then the
	// earliest pattern of i, then of the other (terms are numbered in that order).
	x := pattern.NewIndex(terms)
	fa, fb := -1, -1 // the pair of the earliest cluster so far
	for i := len(clusters) - 1; i >= 0; i-- {
		ia, ib := -1, -1
		for a := first[i]; a < first[i+1]; a++ {
			if err := checkEvery(ctx, a); err != nil {
				return err
			}
			if b, ok := x.First(a); ok && (ia < 0 || owner[b] < owner[ib]) {
				ia, ib = a, b
			}
		}
		if ia >= 0 {
			fa, fb = ia, ib
		}
		for a := first[i]; a < first[i+1]; a++ {
			x.Add(a)
		}
	}
	if fa < 0 {
		return nil
	}
	a, b := pats[fa], pats[fb]
	ov, _ := a.Overlap(b)
	return fmt.Errorf("clusters %q and %q both own namespaces %q (%q, %q): list it under sharedNamespaces if that is intended",
		clusters[owner[fa]].Name, clusters[owner[fb]].Name, ov, a, b)
}

// coverSet answers whether one of the shared patterns covers a pattern (Namespace.Covers)
// in O(the pattern's length), however many shared patterns there are.
type coverSet struct {
	any           bool            // "*" is shared: it covers everything
	prefix, exact map[string]bool // the shared prefixes' bodies; the shared exact names
}

func newCoverSet(shared []pattern.Namespace) coverSet {
	c := coverSet{prefix: map[string]bool{}, exact: map[string]bool{}}
	for _, s := range shared {
		switch s.Kind() {
		case pattern.Any:
			c.any = true
		case pattern.Prefix:
			c.prefix[s.Body()] = true
		default:
			c.exact[s.Body()] = true
		}
	}
	return c
}

// covers is Covers of the shared patterns: "*" covers all; a prefix covers every pattern
// but "*" whose body starts with it; an exact name covers itself only.
func (c coverSet) covers(p pattern.Namespace) bool {
	switch {
	case c.any:
		return true
	case p.Kind() == pattern.Any:
		return false
	case p.Kind() == pattern.Exact && c.exact[p.Body()]:
		return true
	}
	body := p.Body()
	for n := 1; n <= len(body); n++ { // a namespace is at most 63 characters
		if c.prefix[body[:n]] {
			return true
		}
	}
	return false
}

// checkEvery returns ctx's error every 1,024th i: often enough that a configuration's check
// stops within microseconds of its caller giving up, rarely enough to cost nothing.
func checkEvery(ctx context.Context, i int) error {
	if i&1023 != 0 {
		return nil
	}
	return ctx.Err()
}
