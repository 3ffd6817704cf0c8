package hub

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// Relays: a minion subscribes, over the connection it already has to the ingest listener
// and with the same identity, to what routing gives its cluster (rules select it by its
// cluster identity), and re-serves it inside its cluster to that cluster's istiod. The
// ingest listener's ResourceSource is shared with a Layer's peers (hub replicas follow one
// another there): a stream goes to the layer's server when the layer accepts its peer's
// identity, and is a relay otherwise.

// relayListener marks the relays' streams (mcp.ServerConfig.Listener): routing selects them
// only by rules marked relays: true.
const relayListener = "ingest-relay"

// layerPeers is a Layer's ResourceSource on the ingest listener and the identities it
// takes.
type layerPeers struct {
	srv    *mcp.SourceServer
	accept func(identity string) bool
}

// ingestSource is the ingest listener's ResourceSource.
type ingestSource struct {
	mcppb.UnimplementedResourceSourceServer
	h     *Hub
	relay *mcp.SourceServer
	peers atomic.Pointer[layerPeers]
}

// EstablishResourceStream implements mcppb.ResourceSourceServer.
func (s *ingestSource) EstablishResourceStream(stream grpc.BidiStreamingServer[mcppb.RequestResources, mcppb.Resources]) error {
	if p := s.peers.Load(); p != nil {
		if id, err := PeerIdentity(stream.Context(), s.h.cfg.Insecure); err == nil && p.accept(id) {
			return p.srv.EstablishResourceStream(stream)
		}
	}
	return s.relay.EstablishResourceStream(stream)
}

// authenticateRelay admits a minion's relay stream: only the identity of a configured
// cluster. Like a sink's, the stream is refused until the hub is ready (readyToServe;
// meanwhile a relay keeps serving what it last had).
func (h *Hub) authenticateRelay(ctx context.Context) (string, error) {
	return h.authenticateCluster(ctx)
}

// relayed is what a relay last reported of the sinks it serves (nil if nothing readable).
func relayed(info *mcp.StreamInfo) []api.RelayedSink {
	v := info.LatestNode().GetAnnotations()[api.RelayedSinksAnnotation]
	if v == "" {
		return nil
	}
	var out []api.RelayedSink
	if err := json.Unmarshal([]byte(v), &out); err != nil {
		return nil
	}
	return out
}
