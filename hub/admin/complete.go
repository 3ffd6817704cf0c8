package admin

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/mcp/kinds"
)

// completeCollection completes a COLLECTION argument (the first) with the names of the kinds
// the hub at c serves (short names, then kinds), as kubectl completes resource types; with no
// hub to ask, nothing (the shell then offers no files either).
func completeCollection(c *conn) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, typed string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		cl, err := c.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
		defer cancel()
		var served []kinds.Kind
		if _, err := cl.call(ctx, http.MethodGet, "/api/kinds", nil, &served); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, k := range served {
			for _, name := range append(append([]string{}, k.ShortNames...), k.Kind) {
				if strings.HasPrefix(strings.ToLower(name), strings.ToLower(typed)) {
					out = append(out, name+"\t"+k.Collection)
				}
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
