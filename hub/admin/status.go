package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/cli"
)

func statusCommand() *cobra.Command {
	var c conn
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the hub's clusters and sinks",
		Long: `Show the hub's clusters (connected, synced, last contact, objects, refusals, conflicts,
breaker) and its sinks (identity, tenant, rules, state: Synced, Syncing, Stale or NACKed).
-o wide adds each sink's state per collection.`,
		Example: "  hub status\n  hub status -o wide\n  hub status --admin 127.0.0.1:9990 -o json",
		Args:    cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			return status(cmd.Context(), cl, &out, cmd.OutOrStdout(), time.Now())
		},
	}
	c.addFlags(cmd)
	out.AddFlag(cmd, "table", "table", "wide", "json", "yaml")
	return cmd
}

// status prints the hub's clusters and sinks; as a document, {"clusters": ..., "sinks":
// ...}.
func status(ctx context.Context, c *client, out *cli.Output, w io.Writer, now time.Time) error {
	var doc struct {
		Clusters []api.ClusterStatus `json:"clusters"`
		Sinks    []api.SinkStatus    `json:"sinks"`
	}
	var raw struct {
		Clusters json.RawMessage `json:"clusters"`
		Sinks    json.RawMessage `json:"sinks"`
	}
	var err error
	if raw.Clusters, err = c.call(ctx, http.MethodGet, "/api/clusters", nil, &doc.Clusters); err != nil {
		return err
	}
	if raw.Sinks, err = c.call(ctx, http.MethodGet, "/api/sinks", nil, &doc.Sinks); err != nil {
		return err
	}
	b, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return err
	}
	return out.Print(w, b, func(wide bool) error {
		if err := clusterTable(w, doc.Clusters, wide, now); err != nil {
			return err
		}
		fmt.Fprintln(w)
		return sinkTable(w, doc.Sinks, wide, now)
	})
}

// clusterTable prints one row per cluster. SYNCED is whether it is connected and has
// delivered every collection (a cluster that has synced once and left is not in sync);
// LAST CONTACT is "now" while connected, else how long since its last stream closed.
func clusterTable(w io.Writer, clusters []api.ClusterStatus, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	replicated := false
	for _, cl := range clusters {
		replicated = replicated || cl.HeldBy != nil
	}
	head := "NAME\tTENANT\tCONNECTED\tSYNCED\tLAST CONTACT\tOBJECTS\tREFUSED\tCONFLICTS\tBREAKER"
	if wide {
		head += "\tSTREAMS\tREFUSED COLLECTIONS"
	}
	if replicated {
		head += "\tHELD BY"
	}
	fmt.Fprintln(tw, head)
	for _, cl := range clusters {
		connected, last := "no", "never"
		switch {
		case cl.Connected:
			connected, last = "yes", "now"
		case cl.LastContact != nil:
			last = age(now.Sub(*cl.LastContact)) + " ago"
		}
		switch {
		case cl.Departed != nil:
			connected = "no (removed from the configuration)" // kept, held, until an operator confirms
		case !cl.Connected && cl.Restored:
			connected = "no (restored)" // served from the hub's state file since its start
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s", cl.Name, dash(cl.Tenant), connected, yesNo(cl.Connected && cl.Synced), last,
			sum(cl.Resources), count(cl.Rejections), count(cl.Conflicts), breaker(cl.Breaker))
		if wide {
			refused := make([]string, 0, len(cl.RefusedCollections))
			for coll := range cl.RefusedCollections {
				refused = append(refused, short(coll))
			}
			sort.Strings(refused)
			fmt.Fprintf(tw, "\t%d\t%s", cl.Streams, list(refused))
		}
		if replicated {
			held := "-"
			if cl.HeldBy != nil {
				held = fmt.Sprintf("%s (epoch %d)", cl.HeldBy.Replica, cl.HeldBy.Epoch)
			}
			fmt.Fprintf(tw, "\t%s", held)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// sinkTable prints one row per sink (and per sink a relay serves behind it); wide adds
// its protocol and node, and a second table of its state per collection.
func sinkTable(w io.Writer, sinks []api.SinkStatus, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "SINK\tTENANT\tRULES\tSTATE\tCOLLECTIONS\tAGE"
	if wide {
		head += "\tPROTOCOL\tNODE\tPEER"
	}
	fmt.Fprintln(tw, head)
	for _, s := range sinks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s", sinkName(s), dash(s.Tenant), list(s.Rules), sinkState(s), len(s.Collections), age(now.Sub(s.Since)))
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s", protocol(s), dash(s.NodeID), dash(s.Peer))
		}
		fmt.Fprintln(tw)
		for _, d := range s.Downstream { // the sinks a minion's relay serves
			fmt.Fprintf(tw, "  └ %s\t-\t-\t%s\t%d\t-", dash(d.NodeID), relayedState(d), len(d.Collections))
			if wide {
				fmt.Fprintf(tw, "\t%s (relayed)\t%s\t-", d.Protocol, dash(d.NodeID))
			}
			fmt.Fprintln(tw)
		}
	}
	if err := tw.Flush(); err != nil || !wide || len(sinks) == 0 {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SINK\tCOLLECTION\tSTATE\tACKED\tPUSHED\tOBJECTS\tLAST PUSH\tLAST NACK")
	for _, s := range sinks {
		names := make([]string, 0, len(s.Collections))
		for name := range s.Collections {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			st := s.Collections[name]
			last := "-"
			if !st.LastPush.IsZero() {
				last = age(now.Sub(st.LastPush)) + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", sinkName(s), short(name), collectionState(st), st.AckedVersion, st.PushedVersion, st.Resources, last, dash(st.LastNACK))
		}
	}
	return tw.Flush()
}

// sinkName is how an operator knows a sink: its identity, else (no certificate) its node
// id, marked as only claimed.
func sinkName(s api.SinkStatus) string {
	switch {
	case s.Identity != "" && !s.Unauthenticated:
		return s.Identity
	case s.NodeID != "":
		return s.NodeID + " (unauthenticated)"
	}
	return fmt.Sprintf("stream %d", s.Stream)
}

// sinkState is the hub's state of a sink (its worst collection's), upper case as kubectl
// writes states.
func sinkState(s api.SinkStatus) string {
	if s.State != "" {
		return strings.ToUpper(s.State)
	}
	worst := api.SinkSynced // a hub that does not say: derived from the collections
	for _, st := range s.Collections {
		if c := collectionState(st); rank(c) > rank(worst) {
			worst = c
		}
	}
	return strings.ToUpper(worst)
}

func collectionState(st *api.SinkCollection) string {
	switch {
	case st.State != "":
		return st.State
	case st.LastNACK != "" && st.NACKedVersion == st.PushedVersion:
		return api.SinkNACKed
	case st.Pending:
		return api.SinkSyncing
	}
	return api.SinkSynced
}

func rank(state string) int {
	for i, s := range api.SinkStates {
		if strings.EqualFold(s, state) {
			return i
		}
	}
	return 0
}

// relayedState is a relayed sink's state as its relay reported it.
func relayedState(d api.RelayedSink) string {
	state := api.SinkSynced
	for _, c := range d.Collections {
		switch {
		case c.NACK != "":
			return strings.ToUpper(api.SinkNACKed)
		case c.Acked != c.Pushed:
			state = api.SinkSyncing
		}
	}
	return strings.ToUpper(state)
}

// age is a duration as kubectl's AGE column writes it: 45s, 12m, 3h, 5d.
func age(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	case d >= 3*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	case d >= 3*time.Minute:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}

// breaker is a cluster's breaker: open (release it with hub breaker release), or deletions
// waiting to see whether it opens.
func breaker(b *api.Breaker) string {
	switch {
	case b == nil:
		return "-"
	case b.Open:
		return fmt.Sprintf("open, %d held", b.Held)
	}
	return fmt.Sprintf("%d settling", b.Held)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func count(m map[string]map[string]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// protocol is a sink's protocol (mcp, xds) and, when the hub dialed it, "dial-out".
func protocol(s api.SinkStatus) string {
	p := dash(s.Protocol)
	if s.Transport == "client" {
		p += " dial-out"
	}
	return p
}

func short(collection string) string { return collection[strings.LastIndex(collection, "/")+1:] }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
