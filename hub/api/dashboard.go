package api

import "time"

// The dashboard's documents (package doc: the endpoints): summaries the hub computes so
// that a page showing 100 clusters and 10,000 sinks receives a few kilobytes per refresh,
// not every sink.

// Overview is what the dashboard refreshes: every cluster the viewer owns, summarized, and
// the viewer's sinks counted by fleet and state.
type Overview struct {
	Clusters []ClusterSummary `json:"clusters"`
	Fleets   []Fleet          `json:"fleets"`
	// Sinks counts every one of the viewer's sinks by state, all fleets together.
	Sinks StateCounts `json:"sinks"`
	// Conflicts is how many collection/names several of the viewer's clusters publish.
	Conflicts int `json:"conflicts"`
	// Refusals is how many objects the viewer's clusters pushed that are not served.
	Refusals int `json:"refusals"`
	// Ready: the hub serves sinks (its warm-up is over).
	Ready bool `json:"ready"`
	// Time is the hub's clock when it answered: the page shows ages against it, not
	// against the browser's clock.
	Time time.Time `json:"time"`
}

// ClusterSummary is one cluster as the dashboard lists it: ClusterStatus with its maps
// counted (GET /api/clusters and /api/why have the names).
type ClusterSummary struct {
	Name      string `json:"name"`
	Tenant    string `json:"tenant"`
	Connected bool   `json:"connected"`
	Streams   int    `json:"streams"`
	Synced    bool   `json:"synced"`
	Restored  bool   `json:"restored,omitempty"`
	// Departed and Unknown are ClusterStatus's: it left the configuration (kept until an
	// operator confirms), or the hub does not know its last state (why).
	Departed    *time.Time `json:"departed,omitempty"`
	Unknown     string     `json:"unknown,omitempty"`
	LastContact *time.Time `json:"lastContact,omitempty"`
	// Objects is how many objects the hub holds of it, all collections together;
	// MaxObjects its quota's bound on them (0: none).
	Objects    int `json:"objects"`
	MaxObjects int `json:"maxObjects,omitempty"`
	// Refusals counts its objects that are not served (ClusterStatus.Rejections), and
	// RefusedCollections the collections its source does not serve.
	Refusals           int `json:"refusals"`
	RefusedCollections int `json:"refusedCollections,omitempty"`
	// Conflicts counts its objects held because another cluster's copy wins.
	Conflicts int `json:"conflicts"`
	// Breaker, while it holds deletions: open, since when and why, and how many it holds.
	Breaker *BreakerSummary `json:"breaker,omitempty"`
	HeldBy  *Holder         `json:"heldBy,omitempty"`
}

// BreakerSummary is Breaker without the names it holds (Digest names them: a release
// from the dashboard applies what was shown).
type BreakerSummary struct {
	Open   bool       `json:"open"`
	Since  *time.Time `json:"since,omitempty"`
	Reason string     `json:"reason,omitempty"`
	Held   int        `json:"held"`
	Digest string     `json:"digest"`
}

// Fleet is the sinks of one tenant that the same routing rules select: they receive the
// same objects, so they are counted together.
type Fleet struct {
	// Key names the fleet in /api/sinks?fleet=KEY (the hub's name for the route of its
	// tenant and rules: pass it back as it is).
	Key    string   `json:"key"`
	Tenant string   `json:"tenant"`
	Rules  []string `json:"rules"`
	StateCounts
	// OldestBehind is the earliest BehindSince of its sinks: how long the slowest has
	// left a push unanswered.
	OldestBehind *time.Time `json:"oldestBehind,omitempty"`
}

// StateCounts counts sinks by SinkStatus.State.
type StateCounts struct {
	Total   int `json:"total"`
	Synced  int `json:"synced"`
	Syncing int `json:"syncing"`
	Stale   int `json:"stale"`
	NACKed  int `json:"nacked"`
}

// SinkPage is one page of the sinks a query selects, in stream order.
type SinkPage struct {
	// Total is how many sinks the query selects, all pages together.
	Total  int          `json:"total"`
	Offset int          `json:"offset"`
	Limit  int          `json:"limit"`
	Sinks  []SinkStatus `json:"sinks"`
}

// Refusal is one object a cluster pushed that the hub does not serve, with why.
type Refusal struct {
	Cluster    string `json:"cluster"`
	Tenant     string `json:"tenant"`
	Collection string `json:"collection"`
	Name       string `json:"name"`
	Reason     string `json:"reason"`
}

// RefusalPage is one page of the refusals a query selects, by cluster, collection and
// name.
type RefusalPage struct {
	Total    int       `json:"total"`
	Offset   int       `json:"offset"`
	Limit    int       `json:"limit"`
	Refusals []Refusal `json:"refusals"`
}

// WhoAmI is who the admin API answers a request for, and whether the request may act
// (the same decision an action's request gets).
type WhoAmI struct {
	// Operator is the identity the request presented (or what stands for none: "none (the
	// http listener carries no certificate)", "loopback (development mode)").
	Operator string `json:"operator"`
	// Tenant is the tenant whose data it is shown; "" for the vendor's view, every tenant.
	Tenant string `json:"tenant"`
	// CanAct: an action sent the same way would be taken; Why, when it would not, says
	// what an action needs.
	CanAct bool   `json:"canAct"`
	Why    string `json:"why,omitempty"`
}
