package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/cli"
)

func breakerCommand() *cobra.Command {
	group := cli.Group(&cobra.Command{Use: "breaker", Short: "Act on a cluster's mass-deletion breaker"})
	var c conn
	var out cli.Output
	var digest string
	release := &cobra.Command{
		Use:   "release CLUSTER",
		Short: "Apply the deletions a cluster's breaker holds (an operator's action)",
		Long: "Ask the hub to apply the deletions CLUSTER's breaker holds. The hub applies exactly the\n" +
			"deletions reviewed, named by the breaker's digest (hub status -o json shows it): with\n" +
			"--digest, those; without, the ones held now, which this command prints first. If they\n" +
			"changed meanwhile (deletions held since, or objects the cluster published again), the\n" +
			"hub refuses and nothing is deleted. The hub takes it from an operator's certificate\n" +
			"(--cert, over its adminTLS listener), or in development mode from loopback on http.",
		Example: "  hub breaker release east --cert certs/alice.crt --key certs/alice.key --ca certs/ca.crt\n" +
			"  hub breaker release east --digest 3f2a9c0e51d7b864 --cert certs/alice.crt --key certs/alice.key --ca certs/ca.crt",
		Args: cli.Args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			reviewed := digest
			if reviewed == "" {
				b, err := heldBy(cmd.Context(), cl, args[0])
				if err != nil {
					return err
				}
				if out.Format == "table" {
					printHeld(w, args[0], b)
				}
				reviewed = b.Digest
			}
			body, _ := json.Marshal(api.BreakerReleaseRequest{Digest: reviewed})
			var rel api.BreakerRelease
			doc, err := cl.call(cmd.Context(), http.MethodPost, "/api/clusters/"+url.PathEscape(args[0])+"/breaker/release", body, &rel)
			if err != nil {
				return err
			}
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
				if rel.NotDurable != "" {
					fmt.Fprintf(w, "warning: %s\n", rel.NotDurable)
				}
				return nil
			})
		},
	}
	c.addFlags(release)
	out.AddFlag(release, "table", "table", "json", "yaml")
	release.Flags().StringVar(&digest, "digest", "", "the digest of the held deletions you reviewed (hub status -o json); default: those held now, printed first")
	group.AddCommand(release)
	return group
}

// heldBy returns what cluster's breaker holds.
func heldBy(ctx context.Context, cl *client, cluster string) (*api.Breaker, error) {
	var cs []api.ClusterStatus
	if _, err := cl.call(ctx, http.MethodGet, "/api/clusters", nil, &cs); err != nil {
		return nil, err
	}
	for _, c := range cs {
		if c.Name == cluster {
			if c.Breaker == nil {
				return nil, fmt.Errorf("cluster %s's breaker holds no deletions", cluster)
			}
			return c.Breaker, nil
		}
	}
	return nil, &NotFoundError{fmt.Sprintf("no such cluster: %q", cluster)}
}

// printHeld says which deletions a release is about to apply.
func printHeld(w io.Writer, cluster string, b *api.Breaker) {
	fmt.Fprintf(w, "cluster %s's breaker holds %d deletion(s) (digest %s):\n", cluster, b.Held, b.Digest)
	for _, coll := range slices.Sorted(maps.Keys(b.Pending)) {
		names := b.Pending[coll]
		more := ""
		if n := b.Held; len(names) < n && len(b.Pending) == 1 {
			more = fmt.Sprintf(" (and %d more)", n-len(names))
		}
		fmt.Fprintf(w, "  %s: %s%s\n", coll, strings.Join(names, ", "), more)
	}
}
