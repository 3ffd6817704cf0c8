package minion

import (
	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
)

// backoff converts the configuration's backoff for mcp.Redial.
func backoff(b ops.Backoff) mcp.Backoff {
	return mcp.Backoff{Initial: b.Initial.Duration, Max: b.Max.Duration}
}
