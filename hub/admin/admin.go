// Package admin is the operator's command line for a hub: `hub status`,
// `hub why COLLECTION NAMESPACE/NAME` and `hub whatif`, which read a running hub's admin
// API and print human-readable tables (or the API's JSON with -o json), `hub breaker
// release CLUSTER`, which asks it to apply the deletions a cluster's breaker holds, `hub
// certs issue`, which issues a cluster's, a sink's or an operator's certificate from the
// hub's development CA, and `hub subscribe`, an MCP sink that prints what the hub serves it.
//
// Only `hub breaker release` changes a running hub, and the hub takes it only from an
// authenticated operator: with -cert, an operator's certificate, over the hub's adminTLS
// listener (the hub decides; see package hub/api). This is not the admin API itself
// (package hub serves that); it reads the API's documents as package hub/api defines them,
// and links neither the hub's server nor its replica layer.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Commands lists the subcommands Run knows.
var Commands = []string{"status", "why", "whatif", "breaker", "certs", "subscribe"}

// IsCommand reports whether name is one of Commands.
func IsCommand(name string) bool {
	for _, c := range Commands {
		if c == name {
			return true
		}
	}
	return false
}

type client struct {
	base string
	json bool
	out  io.Writer
	http *http.Client
}

// Run executes one subcommand: args[0] is its name, the rest its flags and arguments.
func Run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || !IsCommand(args[0]) {
		return fmt.Errorf("want one of %s", strings.Join(Commands, ", "))
	}
	switch args[0] {
	case "certs":
		return certs(args[1:], out)
	case "subscribe":
		return subscribe(ctx, args[1:], out)
	}
	name, flags := args[0], args[1:]
	if name == "breaker" {
		if len(flags) == 0 || flags[0] != "release" {
			return errors.New(breakerUsage)
		}
		name, flags = "breaker release", flags[1:]
	}
	fs := flag.NewFlagSet("hub "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	addr := fs.String("admin", "", "the hub's admin address: its http listener (default 127.0.0.1:9990), or with -cert its adminTLS listener (default 127.0.0.1:9991)")
	cert := fs.String("cert", "", "a client certificate: talk to the hub's adminTLS listener (https) with it; actions need an operator's (spiffe://<td>/operator/NAME; hub certs issue -operator NAME)")
	key := fs.String("key", "", "with -cert: its key")
	caFile := fs.String("ca", "", "with -cert: the trust bundle the hub's certificate must chain to")
	serverName := fs.String("server-name", "", "with -cert: the name the hub's certificate must carry, instead of -admin's host")
	format := fs.String("o", "table", "output: table or json")
	identity := fs.String("identity", "", "whatif: the sink's authenticated identity")
	node := fs.String("node", "", "whatif: the sink's SinkNode id")
	config := fs.String("config", "", "whatif: a candidate configuration file to evaluate instead of the running one")
	var annotations multi
	fs.Var(&annotations, "annotation", "whatif: a SinkNode annotation key=value (repeatable)")
	if err := fs.Parse(flags); err != nil {
		return err
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("-o: %q: want table or json", *format)
	}
	c, err := newClient(*addr, meshtls.Config{Files: meshtls.Files{Cert: *cert, Key: *key, CA: *caFile}, ServerName: *serverName})
	if err != nil {
		return err
	}
	c.json, c.out = *format == "json", out
	switch name {
	case "status":
		return c.status(ctx)
	case "breaker release":
		if fs.NArg() != 1 {
			return errors.New(breakerUsage)
		}
		return c.releaseBreaker(ctx, fs.Arg(0))
	case "why":
		if fs.NArg() != 2 {
			return errors.New("usage: hub why COLLECTION NAMESPACE/NAME (COLLECTION as you like: vs, VirtualService, networking.istio.io/v1/VirtualService, istio/networking/v1alpha3/virtualservices)")
		}
		return c.why(ctx, fs.Arg(0), fs.Arg(1))
	default:
		q := url.Values{"identity": {*identity}, "node": {*node}}
		for _, a := range annotations {
			if !strings.Contains(a, "=") {
				return fmt.Errorf("-annotation %q: want key=value", a)
			}
			q.Add("annotation", a)
		}
		var body []byte
		if *config != "" {
			var err error
			if body, err = os.ReadFile(*config); err != nil {
				return err
			}
		}
		return c.whatif(ctx, q, body)
	}
}

const breakerUsage = "usage: hub breaker release [-admin HOST:PORT -cert FILE -key FILE -ca FILE] CLUSTER (flags before CLUSTER; the hub takes it from an operator's certificate over its adminTLS listener, or in development mode from loopback)"

// newClient is a client of the hub's admin API at addr: over http, or with tc's certificate
// over https (the adminTLS listener), verifying the hub's certificate against tc's bundle.
func newClient(addr string, tc meshtls.Config) (*client, error) {
	if tc.Cert == "" {
		if tc.Key != "" || tc.CA != "" || tc.ServerName != "" {
			return nil, errors.New("-key, -ca and -server-name go with -cert (a client certificate, for the hub's adminTLS listener)")
		}
		if addr == "" {
			addr = "127.0.0.1:9990"
		}
		return &client{base: "http://" + addr, http: &http.Client{Timeout: 10 * time.Second}}, nil
	}
	switch {
	case tc.Key == "":
		return nil, errors.New("-key: required with -cert")
	case tc.CA == "":
		return nil, errors.New("-ca: required with -cert (the bundle the hub's certificate must chain to)")
	}
	if addr == "" {
		addr = "127.0.0.1:9991"
	}
	src, err := meshtls.NewSource(tc.Files, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, fmt.Errorf("-cert/-key/-ca: %w", err)
	}
	tr := &http.Transport{TLSClientConfig: src.ClientConfig(tc.ServerName)}
	return &client{base: "https://" + addr, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}, nil
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// get fetches path into v and, with -o json, prints the JSON as the hub sent it.
func (c *client) get(ctx context.Context, method, path string, body []byte, v any) (printed bool, err error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false, fmt.Errorf("the hub's admin API at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		return false, errors.New(strings.TrimSpace(string(b))) // the hub's word on what the request got wrong
	case resp.StatusCode != http.StatusOK:
		return false, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if c.json {
		_, err := c.out.Write(b)
		return true, err
	}
	return false, json.Unmarshal(b, v)
}

func (c *client) status(ctx context.Context) error {
	var clusters []api.ClusterStatus
	var sinks []api.SinkStatus
	if c.json {
		// One JSON document: {"clusters": ..., "sinks": ...}.
		var raw struct {
			Clusters json.RawMessage `json:"clusters"`
			Sinks    json.RawMessage `json:"sinks"`
		}
		c.json = false
		var cl, sk any
		if _, err := c.get(ctx, http.MethodGet, "/api/clusters", nil, &cl); err != nil {
			return err
		}
		if _, err := c.get(ctx, http.MethodGet, "/api/sinks", nil, &sk); err != nil {
			return err
		}
		raw.Clusters, _ = json.Marshal(cl)
		raw.Sinks, _ = json.Marshal(sk)
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(raw)
	}
	if _, err := c.get(ctx, http.MethodGet, "/api/clusters", nil, &clusters); err != nil {
		return err
	}
	if _, err := c.get(ctx, http.MethodGet, "/api/sinks", nil, &sinks); err != nil {
		return err
	}
	w := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	replicated := false // a replica: show which replica holds each cluster
	holding := false    // a breaker holds deletions: show each cluster's
	tenanted := false   // the hub has tenants: show each cluster's
	for _, cl := range clusters {
		replicated = replicated || cl.HeldBy != nil
		holding = holding || cl.Breaker != nil
		tenanted = tenanted || cl.Tenant != "" && cl.Tenant != api.DefaultTenant
	}
	head := "CLUSTER\tCONNECTED\tSYNCED\tRESOURCES\tREJECTED\tLOST CONFLICTS\tLAST CONTACT"
	if tenanted {
		head = "TENANT\t" + head
	}
	if holding {
		head += "\tBREAKER"
	}
	if replicated {
		head += "\tHELD BY"
	}
	fmt.Fprintln(w, head)
	for _, cl := range clusters {
		last := "never"
		if cl.LastContact != nil {
			last = time.Since(*cl.LastContact).Round(time.Second).String() + " ago"
		}
		connected := fmt.Sprint(cl.Connected)
		if !cl.Connected && cl.Restored {
			connected = "false (restored)" // served from the hub's state file since its start
		}
		if tenanted {
			fmt.Fprintf(w, "%s\t", cl.Tenant)
		}
		fmt.Fprintf(w, "%s\t%s\t%v\t%d\t%d\t%d\t%s", cl.Name, connected, cl.Synced, sum(cl.Resources), count(cl.Rejections), count(cl.Conflicts), last)
		if holding {
			fmt.Fprintf(w, "\t%s", breaker(cl.Breaker))
		}
		if replicated {
			held := "-"
			if cl.HeldBy != nil {
				held = fmt.Sprintf("%s (epoch %d)", cl.HeldBy.Replica, cl.HeldBy.Epoch)
			}
			fmt.Fprintf(w, "\t%s", held)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "SINK\tPROTOCOL\tIDENTITY\tNODE\tRULES\tCOLLECTIONS (acked/pushed)\tNACKS")
	for _, s := range sinks {
		var colls []string
		nacks := 0
		for name, st := range s.Collections {
			// name is a collection, or (over xDS) a type URL that resolves to none.
			state := fmt.Sprintf("%d/%d", st.AckedVersion, st.PushedVersion)
			switch {
			case st.Pending:
				state += " pending"
			case st.LastNACK != "" && st.NACKedVersion == st.PushedVersion:
				state += " NACK"
			}
			colls = append(colls, short(name)+" "+state)
			if st.LastNACK != "" {
				nacks++
			}
		}
		sort.Strings(colls)
		identity := dash(s.Identity)
		if s.Unauthenticated {
			identity = "(unauthenticated)" // its node id is only what it claims
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%d\n", s.Stream, protocol(s), identity, dash(s.NodeID), dash(strings.Join(s.Rules, ",")), strings.Join(colls, "; "), nacks)
		for _, d := range s.Downstream { // the sinks a minion's relay serves
			var dc []string
			dn := 0
			for name, st := range d.Collections {
				state := fmt.Sprintf("%d/%d", st.Acked, st.Pushed)
				if st.NACK != "" {
					state += " NACK"
					dn++
				}
				dc = append(dc, short(name)+" "+state)
			}
			sort.Strings(dc)
			fmt.Fprintf(w, "  └ behind %d\t%s\t-\t%s\t-\t%s\t%d\n", s.Stream, d.Protocol, dash(d.NodeID), strings.Join(dc, "; "), dn)
		}
	}
	return w.Flush()
}

// releaseBreaker asks the hub to apply the deletions cluster's breaker holds, and prints
// what it applied. The hub decides who may (its answer says what a refused caller needs).
func (c *client) releaseBreaker(ctx context.Context, cluster string) error {
	var rel api.BreakerRelease
	if printed, err := c.get(ctx, http.MethodPost, "/api/clusters/"+url.PathEscape(cluster)+"/breaker/release", nil, &rel); err != nil || printed {
		return err
	}
	fmt.Fprintf(c.out, "released cluster %s's breaker as %s: %d held deletion(s) applied\n", rel.Cluster, rel.Operator, sum(rel.Deleted))
	colls := make([]string, 0, len(rel.Deleted))
	for coll := range rel.Deleted {
		colls = append(colls, coll)
	}
	sort.Strings(colls)
	for _, coll := range colls {
		fmt.Fprintf(c.out, "  %s: %d\n", coll, rel.Deleted[coll])
	}
	return nil
}

// why asks the hub about collection/name; the hub resolves the collection as typed, against
// its own kinds (built in and configured), and refuses one it does not know or serve.
func (c *client) why(ctx context.Context, collection, name string) error {
	var why api.Why
	q := url.Values{"collection": {collection}, "name": {name}}
	if printed, err := c.get(ctx, http.MethodGet, "/api/why?"+q.Encode(), nil, &why); err != nil || printed {
		return err
	}
	fmt.Fprintf(c.out, "%s %s\n", why.Collection, name)
	switch {
	case why.Served == nil:
		fmt.Fprintln(c.out, "  not served: no cluster's version of it is accepted")
	default:
		fmt.Fprintf(c.out, "  served from cluster %s at version %s\n", why.Served.Cluster, why.Served.Version)
		for _, cand := range why.Candidates[1:] {
			fmt.Fprintf(c.out, "  also published by %s (version %s), held: %s\n", cand.Cluster, cand.Version, cand.HeldBecause)
		}
	}
	for _, r := range why.Rejected {
		fmt.Fprintf(c.out, "  refused from cluster %s: %s\n", r.Cluster, r.Reason)
	}
	if why.Served != nil {
		if len(why.Sinks) == 0 {
			fmt.Fprintln(c.out, "  no connected sink's rules give it")
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
				fmt.Fprintf(c.out, "    behind relay %d:%s node %s: %s\n", s.BehindRelay, over, dash(s.NodeID), state)
				continue
			}
			fmt.Fprintf(c.out, "  sink %d%s (%s, node %s, rules %s): %s\n", s.Stream, over, dash(s.Identity), dash(s.NodeID), strings.Join(s.Rules, ","), state)
		}
	}
	return nil
}

func (c *client) whatif(ctx context.Context, q url.Values, candidate []byte) error {
	var d api.DryRun
	method := http.MethodGet
	if candidate != nil {
		method = http.MethodPost
	}
	if printed, err := c.get(ctx, method, "/api/dryrun?"+q.Encode(), candidate, &d); err != nil || printed {
		return err
	}
	fmt.Fprintf(c.out, "identity %s, node %s: rules [%s]\n", dash(d.Identity), dash(d.NodeID), strings.Join(d.Rules, ","))
	w := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	header := "COLLECTION\tRESOURCES"
	if d.Candidate {
		header += "\tADDED\tREMOVED\tCHANGED"
	}
	fmt.Fprintln(w, header)
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
		fmt.Fprintln(w, line)
	}
	return w.Flush()
}

// breaker is a cluster's breaker for hub status: open (release it with hub breaker
// release), or deletions waiting to see whether it opens.
func breaker(b *api.Breaker) string {
	switch {
	case b == nil:
		return "-"
	case b.Open:
		return fmt.Sprintf("open, %d held", b.Held)
	}
	return fmt.Sprintf("%d settling", b.Held)
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

// certs issues a certificate from the development CA: hub certs issue -cluster NAME|-sink
// NAME|-operator NAME -out DIR.
func certs(args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "issue" {
		return errors.New("usage: hub certs issue (-cluster NAME | -sink NAME | -operator NAME) -out DIR [-state-dir DIR] [-trust-domain TD]")
	}
	fs := flag.NewFlagSet("hub certs issue", flag.ContinueOnError)
	fs.SetOutput(out)
	cluster := fs.String("cluster", "", "issue a minion's certificate for this cluster")
	sink := fs.String("sink", "", "issue a sink's certificate for this name")
	operator := fs.String("operator", "", "issue an operator's certificate for this name (for the admin API's actions, over adminTLS)")
	outDir := fs.String("out", "", "directory to write NAME.crt, NAME.key (0600) and ca.crt into")
	stateDir := fs.String("state-dir", filepath.Join(".meshfed", "hub"), "the hub's state directory (its development CA is in ca/)")
	trustDomain := fs.String("trust-domain", meshtls.DevTrustDomain, "the hub's trust domain")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	var kind, name string
	for _, k := range []struct{ kind, name string }{{meshtls.KindCluster, *cluster}, {meshtls.KindSink, *sink}, {meshtls.KindOperator, *operator}} {
		if k.name == "" {
			continue
		}
		if kind != "" {
			return errors.New("give exactly one of -cluster, -sink and -operator")
		}
		kind, name = k.kind, k.name
	}
	if kind == "" {
		return errors.New("give exactly one of -cluster, -sink and -operator")
	}
	if *outDir == "" {
		return errors.New("-out: required")
	}
	ca, err := meshtls.LoadDevCA(filepath.Join(*stateDir, "ca"))
	if err != nil {
		return err
	}
	id := meshtls.ID(*trustDomain, kind, name)
	files, err := ca.Issue(id, nil, *outDir, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "issued %s\n  certFile: %s\n  keyFile: %s\n  caFile: %s\n", id, files.Cert, files.Key, files.CA)
	return nil
}

// subscribe is a sink that prints what the hub serves it: hub subscribe -serve ADDR
// [-cert F -key F -ca F] [-node ID] [-collections a,b] [-admin ADDR]. It runs until ctx ends.
func subscribe(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("hub subscribe", flag.ContinueOnError)
	fs.SetOutput(out)
	serve := fs.String("serve", "127.0.0.1:9900", "the hub's serve address")
	cert := fs.String("cert", "", "the sink's certificate (mutual TLS); without it, plaintext (a insecure hub)")
	key := fs.String("key", "", "the sink's key")
	caFile := fs.String("ca", "", "the trust bundle")
	node := fs.String("node", "hub-subscribe", "the SinkNode id to send")
	colls := fs.String("collections", "", "collections to request, comma-separated, as you like (vs, VirtualService, networking.istio.io/v1/VirtualService, istio/networking/v1alpha3/virtualservices); default: every built-in one, or with -admin every one the hub serves")
	admin := fs.String("admin", "", "the hub's admin (http) address: resolve -collections against the kinds the hub serves (its configured ones included) rather than the built-in ones")
	if err := fs.Parse(args); err != nil {
		return err
	}
	requested, err := subscribeCollections(ctx, *admin, *colls)
	if err != nil {
		return err
	}
	creds := insecure.NewCredentials()
	if *cert != "" {
		src, err := meshtls.NewSource(meshtls.Files{Cert: *cert, Key: *key, CA: *caFile}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(src.ClientConfig(""))
	}
	p := &printer{out: out, held: map[string]map[string]string{}}
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: requested, Applier: p, FullStateOnly: true,
		Node: &mcppb.SinkNode{Id: *node}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "subscribing to %s as node %q\n", *serve, *node)
	mcp.Redial(ctx, []string{*serve}, creds, mcp.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), func(addr string, err error) {
			fmt.Fprintf(out, "stream to %s ended: %v (retrying)\n", addr, err)
		}, func(ctx context.Context, conn *grpc.ClientConn) error { return sink.PullFrom(ctx, conn) })
	return nil
}

// subscribeCollections resolves subscribe's -collections (typed as users do) to collection
// names: against the kinds the hub at admin serves, when given (a kind it does not serve is
// an error, not an empty subscription), else against the built-in kinds.
func subscribeCollections(ctx context.Context, admin, typed string) ([]string, error) {
	var served []kinds.Kind
	if admin != "" {
		c := &client{base: "http://" + admin, out: io.Discard, http: &http.Client{Timeout: 10 * time.Second}}
		if _, err := c.get(ctx, http.MethodGet, "/api/kinds", nil, &served); err != nil {
			return nil, fmt.Errorf("-admin: %w", err)
		}
	}
	table, err := kinds.NewTable(served)
	if err != nil {
		return nil, fmt.Errorf("-admin: the hub's kinds: %w", err)
	}
	if typed == "" {
		if admin == "" {
			return table.Collections(), nil
		}
		out := make([]string, len(served))
		for i, k := range served {
			out[i] = k.Collection
		}
		return out, nil
	}
	colls, err := table.ResolveAll("-collections", strings.Split(typed, ","))
	if err != nil {
		return nil, err
	}
	for i, coll := range colls {
		if admin != "" && !slices.ContainsFunc(served, func(k kinds.Kind) bool { return k.Collection == coll }) {
			return nil, fmt.Errorf("-collections[%d]: %s is not one of the hub's collections", i, coll)
		}
	}
	return colls, nil
}

// printer prints each collection's state when it changes: one line per resource, with the
// cluster it came from.
type printer struct {
	mu   sync.Mutex
	out  io.Writer
	held map[string]map[string]string // collection -> name -> version
}

func (p *printer) Apply(_ context.Context, c *mcp.Change) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := map[string]string{}
	var lines []string
	for _, r := range c.Resources {
		md := r.GetMetadata()
		now[md.GetName()] = md.GetVersion()
		lines = append(lines, fmt.Sprintf("  %s from %s (version %s)", md.GetName(), dash(md.GetAnnotations()[api.OriginAnnotation]), md.GetVersion()))
	}
	if len(now) == 0 && len(p.held[c.Collection]) == 0 {
		p.held[c.Collection] = now
		return nil // nothing then, nothing now: keep the output short
	}
	p.held[c.Collection] = now
	sort.Strings(lines)
	fmt.Fprintf(p.out, "%s: %d resource(s)\n%s\n", c.Collection, len(lines), strings.Join(lines, "\n"))
	return nil
}
