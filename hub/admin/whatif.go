package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/cli"
)

func whatifCommand() *cobra.Command {
	var c conn
	var out cli.Output
	var identity, node, config string
	var annotations []string
	cmd := &cobra.Command{
		Use:   "whatif",
		Short: "Show what a sink would receive, now or under a candidate configuration (a dry run)",
		Long: "Show what a sink with an identity and SinkNode would receive from the running hub, or with\n" +
			"--config under a candidate configuration file: what it would gain, lose and see change, and\n" +
			"which changed fields a reload cannot apply (they need a restart of the hub: the running\n" +
			"configuration would stay).\n\n" +
			"Evaluating a candidate is an operator's action, the vendor's: the hub takes it from an\n" +
			"operator's certificate (--cert, over its adminTLS listener; not a tenant's operator), or in\n" +
			"development mode from loopback on http. It takes a file of at most 1 MiB and evaluates one\n" +
			"at a time: while another is evaluated, this command waits as the hub says and asks again.",
		Example: "  hub whatif --node istiod-1\n" +
			"  hub whatif --identity spiffe://meshfed.local/sink/istiod-1 --config new.yaml --cert certs/alice.crt --key certs/alice.key --ca certs/ca.crt",
		Args: cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{"identity": {identity}, "node": {node}}
			for _, a := range annotations {
				if !strings.Contains(a, "=") {
					return cli.Usagef(cmd, "--annotation %q: want key=value", a)
				}
				q.Add("annotation", a)
			}
			var body []byte
			if config != "" {
				var err error
				if body, err = os.ReadFile(config); err != nil {
					return fmt.Errorf("--config: %w", err)
				}
				if len(body) > api.MaxCandidateBytes {
					return fmt.Errorf("--config: %s is %d bytes: a hub dry-runs a file of at most %d bytes (1 MiB)", config, len(body), api.MaxCandidateBytes)
				}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			return whatif(cmd.Context(), cl, &out, cmd.OutOrStdout(), q, body, config != "")
		},
	}
	c.addFlags(cmd)
	out.AddFlag(cmd, "table", "table", "wide", "json", "yaml")
	fs := cmd.Flags()
	fs.StringVar(&identity, "identity", "", "the sink's authenticated identity")
	fs.StringVar(&node, "node", "", "the sink's SinkNode id")
	fs.StringVar(&config, "config", "", "a candidate configuration file to evaluate instead of the running one")
	fs.StringArrayVar(&annotations, "annotation", nil, "a SinkNode annotation key=value (repeatable)")
	return cmd
}

// whatifTries is how many times whatif asks a hub that is busy evaluating another
// candidate (429) before it gives up: each evaluation takes well under a second.
const whatifTries = 5

func whatif(ctx context.Context, c *client, out *cli.Output, w io.Writer, q url.Values, candidate []byte, post bool) error {
	var d api.DryRun
	method := http.MethodGet
	if post {
		method = http.MethodPost
	}
	doc, err := c.call(ctx, method, "/api/dryrun?"+q.Encode(), candidate, &d)
	// The hub evaluates one candidate at a time: wait as it says, a few times, and ask again.
	var busy *BusyError
	for try := 1; errors.As(err, &busy) && try < whatifTries; try++ {
		select {
		case <-time.After(min(busy.RetryAfter, 5*time.Second)):
		case <-ctx.Done():
			return ctx.Err()
		}
		doc, err = c.call(ctx, method, "/api/dryrun?"+q.Encode(), candidate, &d)
	}
	if err != nil {
		return err
	}
	return out.Print(w, doc, func(bool) error {
		fmt.Fprintf(w, "identity %s, node %s: rules [%s]\n", dash(d.Identity), dash(d.NodeID), strings.Join(d.Rules, ","))
		if len(d.NeedsRestart) > 0 {
			fmt.Fprintf(w, "needs a restart: %s changed; a reload refuses the whole file and keeps the running configuration\n", strings.Join(d.NeedsRestart, ", "))
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		header := "COLLECTION\tRESOURCES"
		if d.Candidate {
			header += "\tADDED\tREMOVED\tCHANGED"
		}
		fmt.Fprintln(tw, header)
		colls := make([]string, 0, len(d.Resources))
		for coll := range d.Resources {
			colls = append(colls, coll)
		}
		sort.Strings(colls)
		for _, coll := range colls {
			line := fmt.Sprintf("%s\t%d", coll, len(d.Resources[coll]))
			if d.Candidate {
				line += fmt.Sprintf("\t%s\t%s\t%s", list(d.Added[coll]), list(d.Removed[coll]), list(d.Changed[coll]))
			}
			fmt.Fprintln(tw, line)
		}
		return tw.Flush()
	})
}
