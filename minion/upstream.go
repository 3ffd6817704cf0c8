package minion

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshfed/meshfed/internal/ops"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// UpstreamSource follows an upstream MCP source (ResourceSource) as a sink and re-publishes
// what it receives: configuration forwarding.
type UpstreamSource struct {
	name    string
	addr    string
	sink    *mcp.Sink
	backoff ops.Backoff
	creds   credentials.TransportCredentials
	log     *slog.Logger
}

// NewUpstreamSource returns a source for the mcp://host:port URL in cfg.
func NewUpstreamSource(cfg SourceConfig, cluster string, kinds []Kind, store *Store, creds credentials.TransportCredentials, backoff ops.Backoff, log *slog.Logger, mm *mcp.Metrics) (*UpstreamSource, error) {
	u, err := parseSourceURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if err := backoff.Check("backoff"); err != nil {
		return nil, err
	}
	colls := make([]string, 0, len(kinds))
	for _, k := range kinds {
		colls = append(colls, k.Collection)
	}
	s := &UpstreamSource{name: cfg.URL, addr: u.addr, backoff: backoff, creds: creds, log: log.With("source", cfg.URL)}
	s.sink, err = mcp.NewSink(mcp.SinkOptions{
		Collections:   colls,
		FullStateOnly: cfg.FullState,
		Node:          &mcppb.SinkNode{Id: "meshfed-minion/" + cluster},
		Logger:        s.log,
		Metrics:       mm,
		Applier: mcp.ApplierFunc(func(_ context.Context, c *mcp.Change) error {
			if c.Incremental {
				store.Apply(s.name, c.Collection, c.Entries, c.Removed)
			} else {
				store.Replace(s.name, c.Collection, c.Entries)
			}
			return nil
		}),
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Name returns the source's URL.
func (s *UpstreamSource) Name() string { return s.name }

// Synced reports whether every collection the upstream serves has been received once.
func (s *UpstreamSource) Synced() bool { return s.sink.Synced() }

// Refused returns the collections the upstream said it does not serve, with how it said so.
func (s *UpstreamSource) Refused() map[string]string { return s.sink.Refused() }

// Run follows the upstream until ctx ends, reconnecting with backoff and resuming by
// versions. What was received stays published while disconnected.
func (s *UpstreamSource) Run(ctx context.Context) error {
	mcp.Redial(ctx, []string{s.addr}, s.creds, backoff(s.backoff), s.log, nil, func(ctx context.Context, conn *grpc.ClientConn) error {
		return s.sink.PullFrom(ctx, conn)
	})
	return nil
}
