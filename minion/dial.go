package minion

import "github.com/meshfed/meshfed/mcp"

// backoff converts the configuration's backoff for mcp.Redial.
func (b BackoffConfig) backoff() mcp.Backoff {
	return mcp.Backoff{Initial: b.Initial.Duration, Max: b.Max.Duration}
}
