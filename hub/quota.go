package hub

import (
	"context"
	"fmt"

	"golang.org/x/time/rate"

	"github.com/meshfed/meshfed/internal/ops"
)

// Bounds on what one cluster may publish (and, tenant_limits.go, what all of a tenant's
// clusters may, together). A cluster's flood or mistake must not take memory and CPU from
// the others, and the hub must never accept what it cannot serve: a full-state sink
// (istiod) receives a whole collection in one message of at most maxMessageSize, so an
// object, or a collection, larger than that would stop the whole collection for every such
// sink. Over a bound the object is refused at ingest, by name and with the bound (its last
// accepted version, if any, stays), like an ownership refusal; pushes faster than the
// cluster's rate are not refused but wait, on the cluster's own stream: its source
// coalesces what changes meanwhile, and no other cluster waits.

// QuotaConfig bounds what one cluster may publish.
type QuotaConfig struct {
	// MaxObjects is how many objects the cluster may hold, all collections together.
	MaxObjects int `json:"maxObjects,omitempty"`
	// MaxObjectBytes is the largest object accepted, as served (at most what a sink can
	// receive in one message: maxMessageSize less the envelope).
	MaxObjectBytes int `json:"maxObjectBytes,omitempty"`
	// MaxBytes is the most the cluster's objects may add up to, as served.
	MaxBytes int64 `json:"maxBytes,omitempty"`
	// PushesPerSecond and PushBurst bound how fast the cluster's pushes are applied;
	// faster pushes wait on their stream (the source coalesces changes meanwhile).
	PushesPerSecond float64 `json:"pushesPerSecond,omitempty"`
	PushBurst       int     `json:"pushBurst,omitempty"`
	// MaxCollectionBytes bounds a collection, all of a tenant's clusters together (without
	// tenants, all clusters), as served: what the tenant's sinks receive of its own
	// clusters. Set for the hub, not per cluster; each tenant has its own, so one tenant's
	// objects never make another's refused. 0: what a full-state sink (istiod) can receive
	// in one push, maxMessageSize less the envelope. -1: no bound, for a hub whose sinks
	// all take incremental pushes (which are split); a full-state sink then stops receiving
	// a collection that outgrows one push.
	MaxCollectionBytes int64 `json:"maxCollectionBytes,omitempty"`
	// CollectionShare is a cluster's share of each collection's bound (0 < share <= 1), set
	// per cluster. Each cluster may fill its share and no more, so one cluster's objects
	// never make another's refused: by default the bound is split evenly between a tenant's
	// clusters; shares set explicitly are taken first (adding up to at most 1) and the
	// clusters without one split the rest.
	CollectionShare float64 `json:"collectionShare,omitempty"`
}

// over returns q with the fields o sets.
func (q QuotaConfig) over(o *QuotaConfig) QuotaConfig { return ops.Overlay(q, o) }

// check validates the fields set; maxMessageSize bounds maxObjectBytes.
func (q *QuotaConfig) check(field string, maxMessageSize int) error {
	if q == nil {
		return nil
	}
	switch {
	case q.MaxObjects < 0:
		return fmt.Errorf("%s.maxObjects: %d is negative", field, q.MaxObjects)
	case q.MaxBytes < 0:
		return fmt.Errorf("%s.maxBytes: %d is negative", field, q.MaxBytes)
	case q.MaxObjectBytes < 0 || q.MaxObjectBytes > maxServedObject(maxMessageSize):
		return fmt.Errorf("%s.maxObjectBytes: %d is not between 0 and %d (what a sink can receive in one message of maxMessageSize %d)",
			field, q.MaxObjectBytes, maxServedObject(maxMessageSize), maxMessageSize)
	case q.PushesPerSecond < 0 || q.PushBurst < 0:
		return fmt.Errorf("%s.pushesPerSecond and pushBurst: negative", field)
	case q.CollectionShare < 0 || q.CollectionShare > 1:
		return fmt.Errorf("%s.collectionShare: %g is not a share between 0 and 1", field, q.CollectionShare)
	case q.MaxCollectionBytes < -1:
		return fmt.Errorf("%s.maxCollectionBytes: %d: want a size, 0 (what a sink can receive in one push) or -1 (no bound)", field, q.MaxCollectionBytes)
	}
	return nil
}

// A push's envelope (collection, versions, nonce) and each resource's framing, which over
// MCP-over-xDS includes an Any's type URL: what a served collection costs beyond its
// objects' bytes. Generous, so that the check never passes what the engine then cannot send.
const (
	pushEnvelope     = 1024
	resourceOverhead = 64
)

// maxServedObject is the largest object a sink can receive in one message.
func maxServedObject(maxMessageSize int) int {
	return maxMessageSize - pushEnvelope - resourceOverhead
}

// servedSize is what r costs in a served push.
func servedSize(r *resource) int64 {
	if r == nil {
		return 0
	}
	return int64(len(r.served.Encoded)) + resourceOverhead
}

// quotaGuard is what the store needs to bound a cluster's write.
type quotaGuard struct {
	q QuotaConfig
	// tenant bounds all of the cluster's tenant's clusters together (tenantLimits; zero
	// without tenants), and tenanted says there are tenants, for the reasons' words.
	tenant   TenantLimits
	tenanted bool
	// collectionBudget is the most a collection may add up to, all of the tenant's
	// clusters together (negative: no bound); collectionShare is the most of it this
	// cluster's objects may take (negative: no bound).
	collectionBudget, collectionShare int64
	// shareOf says how collectionShare was set, for the refusal's words.
	shareOf string
}

// pushLimiter paces one cluster's pushes.
type pushLimiter struct{ l *rate.Limiter }

func newPushLimiter(q QuotaConfig) *pushLimiter {
	if q.PushesPerSecond <= 0 {
		return &pushLimiter{}
	}
	return &pushLimiter{l: rate.NewLimiter(rate.Limit(q.PushesPerSecond), max(q.PushBurst, 1))}
}

// wait blocks until the cluster may push again, or ctx ends.
func (p *pushLimiter) wait(ctx context.Context) error {
	if p == nil || p.l == nil {
		return nil
	}
	return p.l.Wait(ctx)
}
