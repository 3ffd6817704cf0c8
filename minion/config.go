package minion

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Config is the minion's configuration file (YAML). Every field is optional except where
// said; DefaultConfig is what runs with no file.
type Config struct {
	// Cluster names this cluster in logs and events. The hub identifies the cluster by its
	// transport identity, never by this name.
	Cluster string `json:"cluster"`
	// Sources are read in this order; on a name clash the first wins. Required.
	Sources []SourceConfig `json:"sources"`
	// Collections to publish. A file may name each as users do (see kinds.Table: vs,
	// VirtualService, networking.istio.io/v1/VirtualService); ParseConfig stores the
	// collection names, and Validate takes nothing else. Default: every built-in kind and
	// every kind under kinds.
	Collections []string `json:"collections,omitempty"`
	// Kinds adds collections beyond the built-in table (or replaces the built-in kind of the
	// same collection).
	Kinds []Kind `json:"kinds,omitempty"`
	// Destinations say where to publish. At least one push destination or a listen
	// address is required.
	Destinations DestinationsConfig `json:"destinations"`
	// Relay, if set, re-serves in this cluster what the hub's routing gives it (over the
	// connection to destinations.push[0]), for the cluster's istiod.
	Relay *RelayConfig `json:"relay,omitempty"`
	// HTTP is the address of /healthz, /readyz, /metrics, /status and /debug/pprof.
	// Empty disables it.
	HTTP string `json:"http,omitempty"`
	// MaxMessageSize is the largest push sent, in bytes.
	MaxMessageSize int `json:"maxMessageSize,omitempty"`
	// TLS, when set, makes every connection mutual TLS: push destinations and mcp:// sources
	// are dialed with this identity and must present a certificate that chains to caFile;
	// the listener requires such a client certificate. The files are re-read when they
	// change (rotation without restart). Unset: plaintext, logged as development mode.
	TLS *meshtls.Config `json:"tls,omitempty"`
	// Insecure allows running without tls: plaintext connections, and a hub that takes the
	// cluster's word for who it is. For a laptop only; logged at start and on every
	// connection. Without tls and without insecure the configuration is refused.
	Insecure bool `json:"insecure,omitempty"`
	// DevCA, for a minion on the same machine as a hub running with its development CA, is
	// that hub's state directory: the minion issues itself a certificate for
	// spiffe://meshfed.local/cluster/<cluster> from the CA there. Never for production.
	DevCA string `json:"devCA,omitempty"`
	// Limits bound the connections of the minion's listeners (destinations.listen, the
	// relay, http) before a peer has completed its handshake.
	Limits LimitsConfig `json:"limits,omitempty"`
}

// LimitsConfig bounds the connections of the minion's listeners: its fields are the
// hub's limits of the same names (package connlimit). Each connection refused or closed is
// counted in meshfed_minion_connections_refused_total{listener,reason}.
type LimitsConfig struct {
	ops.Connections
}

// SourceConfig is one source of configuration objects.
type SourceConfig struct {
	// URL is one of:
	//   k8s://                         in-cluster credentials
	//   k8s:///path/to/kubeconfig[?context=NAME]
	//   fs:///absolute/dir  or fs://relative/dir
	//   mcp://host:port                an upstream MCP source (ResourceSource) to follow
	URL string `json:"url"`
	// Namespaces limits a k8s:// source to these namespaces (default: all).
	Namespaces []string `json:"namespaces,omitempty"`
	// LabelSelector limits a k8s:// source to matching objects, e.g. "mesh=shared".
	LabelSelector string `json:"labelSelector,omitempty"`
	// Resync is a k8s:// source's informer resync period; 0s disables it. Unset:
	// DefaultResync.
	Resync *Duration `json:"resync,omitempty"`
	// Collections this source reads (or follows), of the minion's collections. Default:
	// all. An mcp:// upstream that does not serve one (an older Istio's knows no
	// WasmPlugin) is followed without it anyway once it has refused it.
	Collections []string `json:"collections,omitempty"`
	// FullState asks an mcp:// upstream for full-state pushes rather than incremental ones.
	// Not needed for correctness: an upstream that does not say it resumes from declared
	// versions (any but a meshfed one) is taken at its first push of each collection on a
	// stream as the full state, so deletions made while it was away are seen.
	FullState bool `json:"fullState,omitempty"`
}

// sourceKinds returns, of kinds, those the source reads.
func (s SourceConfig) sourceKinds(kinds []Kind) []Kind {
	if len(s.Collections) == 0 {
		return kinds
	}
	var out []Kind
	for _, k := range kinds {
		if slices.Contains(s.Collections, k.Collection) {
			out = append(out, k)
		}
	}
	return out
}

// DestinationsConfig says where the minion publishes.
type DestinationsConfig struct {
	// Push lists push://host:port URLs of the hub; a URL may list several addresses
	// (push://a:9901,b:9901), tried in turn. The minion dials out and keeps one stream up.
	Push []string `json:"push,omitempty"`
	// Listen, if set, serves ResourceSource on this address for a hub that polls.
	Listen string `json:"listen,omitempty"`
	// Backoff bounds the reconnect delay (and an mcp:// source's): it starts at Initial,
	// doubles to Max, with full jitter.
	Backoff ops.Backoff `json:"backoff,omitempty"`
}

// Duration is a time.Duration written as "10s", "5m"; a value that does not parse is
// reported by Validate with the field's name.
type Duration = ops.Duration

// Defaults returns every default of the minion's configuration, in one literal.
// ParseConfig reads a file on top of it (a field the file leaves out keeps its value here);
// a program building a configuration starts from it too. Per source, an unset resync is
// DefaultResync; unset collections are every built-in kind and those under kinds.
func Defaults() *Config {
	return &Config{
		// Loopback: the operational endpoints are not reachable from elsewhere unless asked.
		HTTP: "127.0.0.1:9902",
		// Istio Pilot's gRPC receive limit is 4 MiB; the rest is headroom for the envelope.
		MaxMessageSize: mcp.DefaultMaxMessageSize,
		Destinations: DestinationsConfig{
			// Fast enough to notice a hub's return at once, slow enough at the top not to
			// hammer a hub that is down.
			Backoff: ops.Backoff{Initial: ops.D(100 * time.Millisecond), Max: ops.D(30 * time.Second)},
		},
		// Its listeners face the cluster's network, where any pod can connect. A TLS
		// handshake takes milliseconds in a cluster: 10 s closes only connections that are
		// not handshaking. Its peers are a few hub replicas, the cluster's istiods and
		// Prometheus, each from an address of its own: 16 in handshake at once from one
		// address is more than any of them needs. 0 derives the cap from the open files
		// limit, keeping a tenth (at least 64) for the relay's state file, the log and the
		// minion's own dials, and connlimit.HTTPReserve for the http listener.
		Limits: LimitsConfig{Connections: ops.Connections{HandshakeTimeout: ops.D(10 * time.Second), MaxPendingPerIP: 16, MaxConnections: 0}},
	}
}

// DefaultResync is a k8s:// source's informer resync period when its resync is unset.
const DefaultResync = 10 * time.Minute

// DefaultConfig is what runs with no file: the example files published as cluster "dev"
// to a hub on this machine, with a certificate from that hub's development CA.
func DefaultConfig() *Config {
	c := Defaults()
	c.Cluster = "dev"
	c.Sources = []SourceConfig{{URL: "fs://examples/clusters/east"}}
	c.Destinations.Push = []string{"push://127.0.0.1:9901"}
	c.DevCA = filepath.Join(".meshfed", "hub")
	return c
}

// LoadConfig reads and validates a configuration file. Unknown fields are errors.
func LoadConfig(path string) (*Config, error) { return ops.LoadFile(path, ParseConfig) }

// ParseConfig reads a configuration on top of Defaults, stores the collections it names as
// collection names, and validates it.
func ParseConfig(data []byte) (*Config, error) {
	cfg := Defaults()
	if err := ops.DecodeStrict(data, cfg); err != nil {
		return nil, err
	}
	if err := cfg.canonicalCollections(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Validate checks the configuration and reports the first problem, naming its field. It
// changes nothing.
func (c *Config) Validate() error {
	if len(c.Sources) == 0 {
		return errors.New("sources: at least one source is required")
	}
	for i, s := range c.Sources {
		if _, err := parseSourceURL(s.URL); err != nil {
			return fmt.Errorf("sources[%d].url: %w", i, err)
		}
		if s.LabelSelector != "" {
			if _, err := labels.Parse(s.LabelSelector); err != nil {
				return fmt.Errorf("sources[%d].labelSelector: %v", i, err)
			}
		}
		if err := s.Resync.Check(fmt.Sprintf("sources[%d].resync", i)); err != nil {
			return err
		}
		if (len(s.Namespaces) > 0 || s.LabelSelector != "" || s.Resync != nil) && !strings.HasPrefix(s.URL, "k8s:") {
			return fmt.Errorf("sources[%d]: namespaces, labelSelector and resync apply to k8s:// sources only", i)
		}
	}
	kinds, err := c.ResolveKinds()
	if err != nil {
		return err
	}
	for i, s := range c.Sources {
		if s.FullState && !strings.HasPrefix(s.URL, "mcp:") {
			return fmt.Errorf("sources[%d].fullState: applies to mcp:// sources only", i)
		}
		for j, coll := range s.Collections {
			if !slices.ContainsFunc(kinds, func(k Kind) bool { return k.Collection == coll }) || slices.Index(s.Collections, coll) != j {
				return fmt.Errorf("sources[%d].collections[%d]: %q is not one of the minion's collections, or is listed twice", i, j, coll)
			}
		}
	}
	if len(c.Destinations.Push) == 0 && c.Destinations.Listen == "" {
		return errors.New("destinations: set push, listen, or both")
	}
	if r := c.Relay; r != nil {
		if len(c.Destinations.Push) == 0 {
			return errors.New("relay: needs destinations.push (it subscribes over the connection to the first)")
		}
		if _, _, err := net.SplitHostPort(r.Listen); err != nil {
			return fmt.Errorf("relay.listen: %v", err)
		}
		if r.TLS != nil {
			if err := r.TLS.Validate(); err != nil {
				return fmt.Errorf("relay.tls: %w", err)
			}
		}
		table, err := c.kindTable()
		if err != nil {
			return err
		}
		if err := table.CheckCanonical("relay.collections", r.Collections); err != nil {
			return err
		}
	}
	for i, p := range c.Destinations.Push {
		if _, err := parsePushURL(p); err != nil {
			return fmt.Errorf("destinations.push[%d]: %w", i, err)
		}
	}
	if l := c.Destinations.Listen; l != "" {
		if _, _, err := net.SplitHostPort(l); err != nil {
			return fmt.Errorf("destinations.listen: %v", err)
		}
	}
	if c.HTTP != "" {
		if _, _, err := net.SplitHostPort(c.HTTP); err != nil {
			return fmt.Errorf("http: %v", err)
		}
	}
	modes := 0
	for _, on := range []bool{c.TLS != nil, c.Insecure, c.DevCA != ""} {
		if on {
			modes++
		}
	}
	switch {
	case modes > 1:
		return errors.New("tls, insecure and devCA: set only one")
	case modes == 0:
		return errors.New("tls: required unless insecure is true (or devCA names a development hub's state directory)")
	case c.TLS != nil:
		if err := c.TLS.Files.Validate(); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
	}
	if c.MaxMessageSize <= 0 {
		return fmt.Errorf("maxMessageSize: %d is not positive", c.MaxMessageSize)
	}
	if err := c.Limits.Connections.Check("limits"); err != nil {
		return err
	}
	return c.Destinations.Backoff.Check("destinations.backoff")
}

// kindTable is the table of the built-in and configured kinds.
func (c *Config) kindTable() (*kinds.Table, error) { return kinds.NewTable(c.Kinds) }

// canonicalCollections resolves the collections a file names (collections, each source's
// and the relay's), typed as users do, to collection names through the table of the
// built-in and configured kinds, so that everything after sees collection names only.
func (c *Config) canonicalCollections() error {
	table, err := c.kindTable()
	if err != nil {
		return err
	}
	if len(c.Collections) > 0 {
		if c.Collections, err = table.ResolveAll("collections", c.Collections); err != nil {
			return err
		}
	}
	for i := range c.Sources {
		s := &c.Sources[i]
		if len(s.Collections) > 0 {
			if s.Collections, err = table.ResolveAll(fmt.Sprintf("sources[%d].collections", i), s.Collections); err != nil {
				return err
			}
		}
	}
	if c.Relay != nil && len(c.Relay.Collections) > 0 {
		if c.Relay.Collections, err = table.ResolveAll("relay.collections", c.Relay.Collections); err != nil {
			return err
		}
	}
	return nil
}

// ResolveKinds returns the kinds of the configured collections: those listed, else every
// built-in kind and every kind under kinds.
func (c *Config) ResolveKinds() ([]Kind, error) {
	table, err := c.kindTable()
	if err != nil {
		return nil, err
	}
	colls := c.Collections
	if len(colls) == 0 {
		colls = table.Collections()
	} else if err := table.CheckCanonical("collections", colls); err != nil {
		return nil, err
	}
	out := make([]Kind, len(colls))
	for i, name := range colls {
		out[i], _ = table.Lookup(name)
	}
	return out, nil
}

// sourceURL is a parsed source URL.
type sourceURL struct {
	scheme    string // k8s, fs, mcp
	path      string // kubeconfig (k8s), directory (fs)
	kubeCtx   string
	addr      string // mcp
	inCluster bool
}

func parseSourceURL(raw string) (sourceURL, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return sourceURL{}, fmt.Errorf("%q: want k8s://, fs://DIR or mcp://HOST:PORT", raw)
	}
	switch scheme {
	case "k8s":
		u, err := url.Parse(raw)
		if err != nil {
			return sourceURL{}, fmt.Errorf("%q: %v", raw, err)
		}
		if u.Host != "" {
			return sourceURL{}, fmt.Errorf("%q: a kubeconfig path must be absolute (k8s:///path), got host %q", raw, u.Host)
		}
		s := sourceURL{scheme: "k8s", path: u.Path, kubeCtx: u.Query().Get("context"), inCluster: u.Path == ""}
		for k := range u.Query() {
			if k != "context" {
				return sourceURL{}, fmt.Errorf("%q: unknown parameter %q (only context)", raw, k)
			}
		}
		return s, nil
	case "fs":
		if rest == "" {
			return sourceURL{}, fmt.Errorf("%q: directory is empty", raw)
		}
		return sourceURL{scheme: "fs", path: rest}, nil
	case "mcp":
		if _, _, err := net.SplitHostPort(rest); err != nil {
			return sourceURL{}, fmt.Errorf("%q: %v", raw, err)
		}
		return sourceURL{scheme: "mcp", addr: rest}, nil
	}
	return sourceURL{}, fmt.Errorf("%q: unknown scheme %q (k8s, fs, mcp)", raw, scheme)
}

// parsePushURL returns the addresses of a push://a:1,b:2 URL.
func parsePushURL(raw string) ([]string, error) {
	rest, ok := strings.CutPrefix(raw, "push://")
	if !ok {
		return nil, fmt.Errorf("%q: want push://HOST:PORT[,HOST:PORT...]", raw)
	}
	var addrs []string
	for _, a := range strings.Split(rest, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("%q: %v", raw, err)
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}
