//go:build !unix

package connlimit

// fileLimit is unknown off Unix: MaxConnections must be set.
func fileLimit() int { return 0 }
