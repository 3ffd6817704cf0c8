package minion

import "github.com/meshfed/meshfed/mcp/kinds"

// Kind maps an MCP collection to the Kubernetes resource it comes from and the protobuf
// message its spec decodes into (see package kinds).
type Kind = kinds.Kind

// BuiltinKinds returns the built-in collection table, sorted by collection.
func BuiltinKinds() []Kind { return kinds.Builtin() }

// LookupBuiltin returns the built-in kind of a collection.
func LookupBuiltin(collection string) (Kind, bool) { return kinds.Lookup(collection) }
