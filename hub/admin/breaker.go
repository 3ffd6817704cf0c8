package admin

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/cli"
)

func breakerCommand() *cobra.Command {
	group := cli.Group(&cobra.Command{Use: "breaker", Short: "Act on a cluster's mass-deletion breaker"})
	var c conn
	var out cli.Output
	release := &cobra.Command{
		Use:   "release CLUSTER",
		Short: "Apply the deletions a cluster's breaker holds (an operator's action)",
		Long: "Ask the hub to apply the deletions CLUSTER's breaker holds. The hub takes it from an\n" +
			"operator's certificate (--cert, over its adminTLS listener), or in development mode from\n" +
			"loopback on http.",
		Example: "  hub breaker release east --cert certs/alice.crt --key certs/alice.key --ca certs/ca.crt",
		Args:    cli.Args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			var rel api.BreakerRelease
			doc, err := cl.call(cmd.Context(), http.MethodPost, "/api/clusters/"+url.PathEscape(args[0])+"/breaker/release", nil, &rel)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			return out.Print(w, doc, func(bool) error {
				fmt.Fprintf(w, "released cluster %s's breaker as %s: %d held deletion(s) applied\n", rel.Cluster, rel.Operator, sum(rel.Deleted))
				colls := make([]string, 0, len(rel.Deleted))
				for coll := range rel.Deleted {
					colls = append(colls, coll)
				}
				sort.Strings(colls)
				for _, coll := range colls {
					fmt.Fprintf(w, "  %s: %d\n", coll, rel.Deleted[coll])
				}
				return nil
			})
		},
	}
	c.addFlags(release)
	out.AddFlag(release, "table", "table", "json", "yaml")
	group.AddCommand(release)
	return group
}
