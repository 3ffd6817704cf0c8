package api

import "time"

// Event is one thing an operator may want to know happened: a refused object, a reload,
// a breaker tripping or being released, a cluster connecting or going away, a second
// stream taking a cluster over, a replica joining or leaving. The hub keeps the recent
// ones (GET /api/events); logs and metrics have the rest.
type Event struct {
	// Seq orders events; a client asks for those after the last one it has (see Events).
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Kind is one of the Event* constants.
	Kind string `json:"kind"`
	// Tenant is the tenant the event concerns; "" for the vendor's own (reloads, replicas),
	// which a tenant's operator is not shown.
	Tenant     string `json:"tenant,omitempty"`
	Cluster    string `json:"cluster,omitempty"`
	Collection string `json:"collection,omitempty"`
	Name       string `json:"name,omitempty"`
	// Reason is a class from a short fixed list (the Reason* constants of its kind), fit
	// for a metric's label; Message says the rest in words.
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Events is an answer of GET /api/events?since=SEQ&boot=BOOT: the events after SEQ that
// are still kept, oldest first, and Next, the SEQ to ask with next time, with Boot.
//
// Numbers are the asker's: a tenant's operator sees its tenant's events numbered on their
// own. They start again with the hub's process; Boot names the process, and a client that
// asks with another's Boot, or a SEQ beyond the newest, gets every kept event with Reset
// set (it should drop what it had: the hub restarted, or another replica answered).
type Events struct {
	Events []Event `json:"events"`
	Next   uint64  `json:"next"`
	Boot   string  `json:"boot"`
	Reset  bool    `json:"reset,omitempty"`
	// Dropped: events after SEQ that are no longer kept (the client fell behind).
	Dropped bool `json:"dropped,omitempty"`
}

// Kinds of Event.
const (
	EventRefusal  = "refusal"  // an object a cluster pushed is not served (Reason: RefusalReasons)
	EventReload   = "reload"   // a new configuration was applied or refused (ReasonApplied, ReasonRefused)
	EventBreaker  = "breaker"  // a cluster's mass-deletion breaker (ReasonTripped, ReasonClosed, ReasonReleased)
	EventCluster  = "cluster"  // a cluster's first stream opened or last one closed (ReasonConnected, ReasonDisconnected), or it left the configuration (ReasonDeparted), or took over another's state by a rename (ReasonRenamed), or its last state is unknown at the start (ReasonUnknown)
	EventTakeover = "takeover" // a second stream of a cluster took over from the first (ReasonTakeover), or was refused for competing with a writer that just took over (ReasonCompeting)
	EventReplica  = "replica"  // a replica joined or left, or a cluster's authority moved (ReasonJoined, ReasonLeft, ReasonAuthority)
)

// Reasons an object is refused: the reason label of meshfed_hub_refusals_total.
const (
	// ReasonNotOwned: the cluster may not publish the object's namespace or hosts.
	ReasonNotOwned = "not_owned"
	// ReasonInvalid: the object does not decode as its kind, or names no valid host.
	ReasonInvalid = "invalid"
	// ReasonOverQuota: a bound of the cluster's or its tenant's (objects, bytes, object size).
	ReasonOverQuota = "over_quota"
	// ReasonConflict: another cluster's object of the same name is served; this one is held.
	ReasonConflict = "conflict"
)

// RefusalReasons lists every Reason of an EventRefusal.
var RefusalReasons = []string{ReasonNotOwned, ReasonInvalid, ReasonOverQuota, ReasonConflict}

// Reasons of the other kinds.
const (
	ReasonApplied      = "applied"
	ReasonRefused      = "refused"
	ReasonTripped      = "tripped"
	ReasonClosed       = "closed"
	ReasonReleased     = "released"
	ReasonConnected    = "connected"
	ReasonDisconnected = "disconnected"
	ReasonDeparted     = "departed"
	ReasonRenamed      = "renamed"
	ReasonUnknown      = "unknown"
	ReasonTakeover     = "takeover"
	ReasonCompeting    = "competing"
	ReasonJoined       = "joined"
	ReasonLeft         = "left"
	ReasonAuthority    = "authority"
)
