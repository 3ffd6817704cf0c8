// Package minion is meshfed's per-cluster agent: it watches configuration in its cluster —
// Kubernetes objects through client-go informers (k8s://), a directory of YAML/JSON files
// (fs://), or an upstream MCP source (mcp://) — converts each object once into an MCP
// Resource, and publishes the result to the hub by dialing out over the MCP ResourceSink
// service (push://), optionally also serving ResourceSource locally for a hub that polls.
// Rejections the hub reports come back as Warning Events on the source objects. Every
// connection to the hub is mutual TLS unless the configuration says insecure; the
// configuration file is watched and reloaded in-process.
//
// Optionally it relays (RelayConfig): over its connection to the hub it subscribes, with its
// cluster's identity, to what the hub's routing gives its cluster, and re-serves that to the
// cluster's istiod over MCP-over-xDS and MCP ResourceSource, keeping the last state received
// in a state file so that istiod is served while the hub is unreachable and after a restart.
// The relay runs beside the publishing and never stops it: a damaged state file is moved
// aside, and one that cannot be written is given up for memory (relayfile.go says why).
//
// It does not decide who may publish what (that is the hub's ownership ACL). What it
// publishes it holds only as it watches it: a restart resyncs from the sources; the relay's
// state file is the one state it keeps.
package minion
