package admin

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/cli"
)

func getCommand() *cobra.Command {
	var c conn
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "get COLLECTION [NAMESPACE/NAME]",
		Short: "Show what the hub serves: a collection's objects, or one object's content and every cluster's copy",
		Long: "Without a name, list the objects of a collection the hub serves (to your tenant, with an\n" +
			"operator's certificate): the cluster each served copy comes from, its version and age.\n" +
			"With a name, show that object: -o yaml|json prints the served content (the body decoded\n" +
			"from its protobuf message, as Kubernetes writes objects) and every cluster's copy; the\n" +
			"table shows the copies. " + collectionHelp + ".\n" +
			"An object no cluster published is an error (NotFound, exit 1).",
		Example:           "  hub get vs\n  hub get vs shop/cart -o yaml\n  hub get VirtualService -o wide",
		Args:              cli.Args(cobra.RangeArgs(1, 2)),
		ValidArgsFunction: completeCollection(&c),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				if err := checkName(cmd, args[1]); err != nil {
					return err
				}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				return getList(cmd.Context(), cl, &out, cmd.OutOrStdout(), args[0], time.Now())
			}
			return getObject(cmd.Context(), cl, &out, cmd.OutOrStdout(), args[0], args[1])
		},
	}
	c.addFlags(cmd)
	out.AddFlag(cmd, "table", "table", "wide", "json", "yaml")
	return cmd
}

func getList(ctx context.Context, c *client, out *cli.Output, w io.Writer, collection string, now time.Time) error {
	var list api.ObjectList
	doc, err := c.call(ctx, http.MethodGet, "/api/object?"+url.Values{"collection": {collection}}.Encode(), nil, &list)
	if err != nil {
		return err
	}
	return out.Print(w, doc, func(wide bool) error {
		if len(list.Items) == 0 {
			_, err := fmt.Fprintf(w, "No %s served.\n", list.Collection)
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := "NAMESPACE/NAME\tORIGIN CLUSTER\tVERSION\tAGE"
		if wide {
			head += "\tCANDIDATES\tKIND"
		}
		fmt.Fprintln(tw, head)
		for _, it := range list.Items {
			created := "-"
			if it.Created != nil {
				created = age(now.Sub(*it.Created))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s", it.Name, it.Cluster, it.Version, created)
			if wide {
				fmt.Fprintf(tw, "\t%d\t%s", it.Candidates, list.Kind)
			}
			fmt.Fprintln(tw)
		}
		return tw.Flush()
	})
}

func getObject(ctx context.Context, c *client, out *cli.Output, w io.Writer, collection, name string) error {
	var o api.Object
	q := url.Values{"collection": {collection}, "name": {name}}
	doc, err := c.call(ctx, http.MethodGet, "/api/object?"+q.Encode(), nil, &o)
	if err != nil {
		return err
	}
	return out.Print(w, doc, func(wide bool) error {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := "NAMESPACE/NAME\tCLUSTER\tVERSION\tSERVED\tWHY NOT"
		fmt.Fprintln(tw, head)
		for _, cand := range o.Candidates {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", o.Name, cand.Cluster, cand.Version, yesNo(cand.Served), dash(cand.HeldBecause))
		}
		for _, r := range o.Rejected {
			fmt.Fprintf(tw, "%s\t%s\t-\tno\trefused: %s\n", o.Name, r.Cluster, r.Reason)
		}
		return tw.Flush()
	})
}
