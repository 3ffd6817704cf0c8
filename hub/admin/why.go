package admin

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/cli"
)

// collectionHelp says how a COLLECTION argument may be typed.
const collectionHelp = "COLLECTION as you like: vs, VirtualService, networking.istio.io/v1/VirtualService, istio/networking/v1alpha3/virtualservices"

func whyCommand() *cobra.Command {
	var c conn
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "why COLLECTION NAMESPACE/NAME",
		Short: "Explain one object: which cluster's copy is served and why, who was refused, which sinks have it",
		Long: "Explain one object: every cluster's copy (the served one, and why the others are held), the\n" +
			"refusals of it, and the connected sinks whose rules give it, with whether each holds the\n" +
			"served version. " + collectionHelp + ".\nAn object no cluster published is an error (NotFound, exit 1).",
		Example:           "  hub why vs shop/cart\n  hub why networking.istio.io/v1/DestinationRule shop/reviews -o yaml",
		Args:              cli.Args(cobra.ExactArgs(2)),
		ValidArgsFunction: completeCollection(&c),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkName(cmd, args[1]); err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			return why(cmd.Context(), cl, &out, cmd.OutOrStdout(), args[0], args[1])
		},
	}
	c.addFlags(cmd)
	out.AddFlag(cmd, "table", "table", "wide", "json", "yaml")
	return cmd
}

// checkName refuses a name that is neither NAMESPACE/NAME nor NAME (a cluster-scoped
// kind's) as Kubernetes names objects, before asking the hub.
func checkName(cmd *cobra.Command, name string) error {
	parts := strings.Split(name, "/")
	var problems []string
	switch len(parts) {
	case 1:
		problems = validation.IsDNS1123Subdomain(parts[0])
	case 2:
		problems = append(validation.IsDNS1123Label(parts[0]), validation.IsDNS1123Subdomain(parts[1])...)
	default:
		problems = []string{"more than one /"}
	}
	if len(problems) > 0 {
		return cli.Usagef(cmd, "name %q: want NAMESPACE/NAME (or NAME, for a cluster-scoped kind) as Kubernetes names objects: %s", name, strings.Join(problems, "; "))
	}
	return nil
}

// why asks the hub about collection/name; the hub resolves the collection as typed, against
// its own kinds (built in and configured), and refuses one it does not know or serve.
func why(ctx context.Context, c *client, out *cli.Output, w io.Writer, collection, name string) error {
	var why api.Why
	q := url.Values{"collection": {collection}, "name": {name}}
	doc, err := c.call(ctx, http.MethodGet, "/api/why?"+q.Encode(), nil, &why)
	if err != nil {
		return err
	}
	if why.Served == nil && len(why.Candidates) == 0 && len(why.Rejected) == 0 {
		// No cluster published it (or none the asker may see): the hub answers alike.
		return &NotFoundError{fmt.Sprintf("%s %q not found", why.Collection, name)}
	}
	return out.Print(w, doc, func(bool) error { printWhy(w, why, name); return nil })
}

func printWhy(w io.Writer, why api.Why, name string) {
	fmt.Fprintf(w, "%s %s\n", why.Collection, name)
	switch {
	case why.Served == nil:
		fmt.Fprintln(w, "  not served: no cluster's copy of it is accepted")
		for _, cand := range why.Candidates {
			fmt.Fprintf(w, "  published by %s (version %s), held: %s\n", cand.Cluster, cand.Version, cand.HeldBecause)
		}
	default:
		fmt.Fprintf(w, "  served from cluster %s at version %s\n", why.Served.Cluster, why.Served.Version)
		for _, cand := range why.Candidates[1:] {
			fmt.Fprintf(w, "  also published by %s (version %s), held: %s\n", cand.Cluster, cand.Version, cand.HeldBecause)
		}
	}
	for _, cand := range why.Candidates {
		if cand.DeletionHeld != "" {
			fmt.Fprintf(w, "  deletion held from cluster %s: %s (hub breaker release %s)\n", cand.Cluster, cand.DeletionHeld, cand.Cluster)
		}
	}
	for _, r := range why.Rejected {
		fmt.Fprintf(w, "  refused from cluster %s: %s\n", r.Cluster, r.Reason)
	}
	if why.Served == nil {
		return
	}
	if len(why.Sinks) == 0 {
		fmt.Fprintln(w, "  no connected sink's rules give it")
	}
	for _, s := range why.Sinks {
		state := "up to date"
		switch {
		case s.NACK != "":
			state = "refused the latest push (NACK " + s.NACK + "): it does not hold the served version"
		case !s.UpToDate:
			state = "not yet acknowledged"
		}
		over := ""
		if s.Protocol != "" {
			over = " over " + s.Protocol
		}
		if s.BehindRelay != 0 {
			fmt.Fprintf(w, "    behind relay %d:%s node %s: %s\n", s.BehindRelay, over, dash(s.NodeID), state)
			continue
		}
		fmt.Fprintf(w, "  sink %d%s (%s, node %s, rules %s): %s\n", s.Stream, over, dash(s.Identity), dash(s.NodeID), strings.Join(s.Rules, ","), state)
	}
}
