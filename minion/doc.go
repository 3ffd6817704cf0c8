// Package minion is meshfed's per-cluster agent: it watches configuration in its cluster —
// Kubernetes objects through client-go informers (k8s://), a directory of YAML/JSON files
// (fs://), or an upstream MCP source (mcp://) — converts each object once into an MCP
// Resource, and publishes the result to the hub by dialing out over the MCP ResourceSink
// service (push://), optionally also serving ResourceSource locally for a hub that polls.
// Rejections the hub reports come back as Warning Events on the source objects. Every
// connection is mutual TLS unless the configuration says insecure; the configuration file
// is watched and reloaded in-process.
//
// It does not decide who may publish what (that is the hub's ownership ACL) and holds no
// state beyond what it watches: a restart resyncs from the sources.
package minion
