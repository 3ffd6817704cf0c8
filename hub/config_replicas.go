package hub

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/meshfed/meshfed/internal/ops"
	meshtls "github.com/meshfed/meshfed/tls"
)

// The replicas section of the configuration file. The core only carries it: the replica
// layer (package hub/replicas) is what reads it.

// ReplicasConfig makes a hub one replica of several that act as one hub: any minion and any
// sink may use any replica. Every replica must run the same configuration otherwise.
//
// Membership and failure detection are hashicorp/memberlist's (gossip); a cluster's
// resources travel between replicas over MCP, on the ingest listener, from the replica
// holding the cluster's newest minion session to every other one. DefaultReplicas holds
// the defaults.
type ReplicasConfig struct {
	// Name is this replica's unique name; its identity is spiffe://<trustDomain>/hub/<name>
	// (the certificate it presents to its peers).
	Name string `json:"name,omitempty"`
	// Gossip is the memberlist address (UDP and TCP).
	Gossip string `json:"gossip,omitempty"`
	// Advertise is the address (host:port) peers dial to reach this replica's ingest
	// listener. Empty: the ingest listener's address; when it listens on every interface,
	// the host's first private IPv4 address (a pod's IP) with its port.
	Advertise string `json:"advertise,omitempty"`
	// Seeds are other replicas' gossip addresses; SeedDNS a name:port resolving to them
	// (a Kubernetes headless Service). Unreachable seeds are not an error: the first
	// replica has none to join.
	Seeds   []string `json:"seeds,omitempty"`
	SeedDNS string   `json:"seedDNS,omitempty"`
	// KeyFile holds the gossip encryption key, base64 of 16, 24 or 32 bytes, the same on
	// every replica. Without it gossip is plaintext (logged).
	KeyFile string `json:"keyFile,omitempty"`
	// Profile picks memberlist's defaults: "lan" (1 s probes, ~5 s to declare a silent
	// replica dead) or "local" (one machine or a fast network).
	Profile string `json:"profile,omitempty"`
	// ProbeInterval, ProbeTimeout, SuspicionMult, GossipInterval and PushPullInterval
	// override the profile's failure detection and gossip timing (zero: the profile's).
	ProbeInterval    Duration `json:"probeInterval,omitempty"`
	ProbeTimeout     Duration `json:"probeTimeout,omitempty"`
	SuspicionMult    int      `json:"suspicionMult,omitempty"`
	GossipInterval   Duration `json:"gossipInterval,omitempty"`
	PushPullInterval Duration `json:"pushPullInterval,omitempty"`
	// RejoinInterval between attempts to join the seeds and the replicas that left or
	// died while they are not members (how a network split heals).
	RejoinInterval Duration `json:"rejoinInterval,omitempty"`
}

// UnmarshalJSON reads a replicas section on top of DefaultReplicas (not on top of what r
// held before).
func (r *ReplicasConfig) UnmarshalJSON(b []byte) error {
	type plain ReplicasConfig // without this method
	p := plain(*DefaultReplicas())
	if err := ops.DecodeJSONStrict(b, &p); err != nil {
		return ops.InSection("replicas", err)
	}
	*r = ReplicasConfig(p)
	return nil
}

func (r *ReplicasConfig) check(c *Config) error {
	if err := meshtls.CheckName(r.Name); err != nil {
		return fmt.Errorf("replicas.name: %q is not a valid replica name (it becomes spiffe://<trustDomain>/hub/<name>): %v", r.Name, err)
	}
	if c.SPIFFETrustDomain() == "" && !c.Insecure {
		return errors.New("replicas: trustDomain is required: replicas authenticate each other as spiffe://<trustDomain>/hub/<name>")
	}
	if r.Gossip == "" {
		return errors.New("replicas.gossip: required")
	}
	addrs := map[string]string{"replicas.gossip": r.Gossip, "replicas.advertise": r.Advertise, "replicas.seedDNS": r.SeedDNS}
	for i, s := range r.Seeds {
		addrs[fmt.Sprintf("replicas.seeds[%d]", i)] = s
	}
	for field, a := range addrs {
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("%s: %v", field, err)
		}
	}
	switch r.Profile {
	case "lan", "local":
	default:
		return fmt.Errorf("replicas.profile: %q: want lan or local", r.Profile)
	}
	for field, d := range map[string]*Duration{"replicas.probeInterval": &r.ProbeInterval, "replicas.probeTimeout": &r.ProbeTimeout,
		"replicas.gossipInterval": &r.GossipInterval, "replicas.pushPullInterval": &r.PushPullInterval, "replicas.rejoinInterval": &r.RejoinInterval} {
		if err := d.Check(field); err != nil {
			return err
		}
	}
	if r.RejoinInterval.Duration <= 0 {
		return errors.New("replicas.rejoinInterval: must be positive")
	}
	if r.SuspicionMult < 0 {
		return fmt.Errorf("replicas.suspicionMult: %d is negative", r.SuspicionMult)
	}
	return nil
}

// DefaultReplicas returns every default of the replicas section, in one literal: a file's
// replicas section is read on top of it.
func DefaultReplicas() *ReplicasConfig {
	name, _ := os.Hostname() // a pod's name: unique per replica of a StatefulSet
	return &ReplicasConfig{
		Name:    name,
		Gossip:  "0.0.0.0:7946", // memberlist's port
		Profile: "lan",
		// How fast a healed network split rejoins, against a few packets per interval.
		RejoinInterval: ops.D(10 * time.Second),
	}
}
