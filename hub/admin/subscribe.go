package admin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/cli"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/mcp/kinds"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	meshtls "github.com/meshfed/meshfed/tls"
)

func subscribeCommand() *cobra.Command {
	var serve, cert, key, caFile, node, colls, admin string
	cmd := &cobra.Command{
		Use:   "subscribe",
		Short: "Subscribe as an MCP sink and print what the hub serves (runs until Ctrl-C)",
		Long: "Subscribe to the hub's serve listener as an MCP sink and print each collection's objects\n" +
			"whenever they change, with the cluster each came from. Runs until interrupted.",
		Example: "  hub subscribe --cert certs/me.crt --key certs/me.key --ca certs/ca.crt\n  hub subscribe --collections vs,dr --admin 127.0.0.1:9990",
		Args:    cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return subscribe(cmd.Context(), cmd.OutOrStdout(), serve, cert, key, caFile, node, colls, admin)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&serve, "serve", "127.0.0.1:9900", "the hub's serve address")
	fs.StringVar(&cert, "cert", "", "the sink's certificate (mutual TLS); without it, plaintext (an insecure hub)")
	fs.StringVar(&key, "key", "", "the sink's key")
	fs.StringVar(&caFile, "ca", "", "the trust bundle")
	fs.StringVar(&node, "node", "hub-subscribe", "the SinkNode id to send")
	fs.StringVar(&colls, "collections", "", "collections to request, comma-separated, as you like (vs, VirtualService, networking.istio.io/v1/VirtualService, istio/networking/v1alpha3/virtualservices); default: every built-in one, or with --admin every one the hub serves")
	fs.StringVar(&admin, "admin", "", "the hub's admin (http) address: resolve --collections against the kinds the hub serves (its configured ones included) rather than the built-in ones")
	return cmd
}

// subscribe is a sink that prints what the hub serves it. It runs until ctx ends.
func subscribe(ctx context.Context, out io.Writer, serve, cert, key, caFile, node, colls, admin string) error {
	requested, err := subscribeCollections(ctx, admin, colls)
	if err != nil {
		return err
	}
	creds := insecure.NewCredentials()
	if cert != "" {
		src, err := meshtls.NewSource(meshtls.Files{Cert: cert, Key: key, CA: caFile}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(src.ClientConfig(""))
	}
	p := &printer{out: out, held: map[string]map[string]string{}}
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: requested, Applier: p, FullStateOnly: true,
		Node: &mcppb.SinkNode{Id: node}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "subscribing to %s as node %q\n", serve, node)
	mcp.Redial(ctx, []string{serve}, creds, mcp.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), func(addr string, err error) {
			hint := ""
			if cert == "" && strings.Contains(err.Error(), "error reading server preface") {
				// A plaintext client of a TLS listener reads the server's TLS alert as garbage.
				hint = "; the hub may speak TLS: give --cert, --key and --ca (hub certs issue --sink NAME --out DIR)"
			}
			fmt.Fprintf(out, "stream to %s ended: %v (retrying%s)\n", addr, err, hint)
		}, func(ctx context.Context, conn *grpc.ClientConn) error { return sink.PullFrom(ctx, conn) })
	return nil
}

// subscribeCollections resolves subscribe's --collections (typed as users do) to collection
// names: against the kinds the hub at admin serves, when given (a kind it does not serve is
// an error, not an empty subscription), else against the built-in kinds.
func subscribeCollections(ctx context.Context, admin, typed string) ([]string, error) {
	var served []kinds.Kind
	if admin != "" {
		c := &client{base: "http://" + admin, http: &http.Client{Timeout: 10 * time.Second}}
		if _, err := c.call(ctx, http.MethodGet, "/api/kinds", nil, &served); err != nil {
			return nil, fmt.Errorf("--admin: %w", err)
		}
	}
	table, err := kinds.NewTable(served)
	if err != nil {
		return nil, fmt.Errorf("--admin: the hub's kinds: %w", err)
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
	colls, err := table.ResolveAll("--collections", strings.Split(typed, ","))
	if err != nil {
		return nil, err
	}
	for i, coll := range colls {
		if admin != "" && !slices.ContainsFunc(served, func(k kinds.Kind) bool { return k.Collection == coll }) {
			return nil, fmt.Errorf("--collections[%d]: %s is not one of the hub's collections", i, coll)
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
