package mcp

// Structured log field keys, shared by every log line of the engine.
const (
	logStream     = "stream"
	logPeer       = "peer"
	logIdentity   = "identity"
	logRole       = "role"
	logTransport  = "transport"
	logCollection = "collection"
	logNonce      = "nonce"
	logVersion    = "version"
	logResource   = "resource"
	logError      = "err"
)
