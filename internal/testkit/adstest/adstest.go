// Package adstest is an MCP-over-xDS client for tests, as istiod's config-source client
// speaks it: one envoy AggregatedDiscoveryService stream (StreamAggregatedResources) from a
// node, a DiscoveryRequest per type URL it subscribes to, and an ACK or NACK of every
// response. The test drives it step by step: Subscribe, Recv, ACK or NACK.
//
// Every Client is closed (its stream cancelled, its connection closed) by the test's
// cleanup if not before. It is test infrastructure: nothing in the product imports it.
package adstest

import (
	"context"
	"sync"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"
)

// RecvTimeout is how long Recv waits for a response.
const RecvTimeout = 20 * time.Second

// Client is one ADS stream. Its methods fail the test it was dialed for, and are to be
// called from that test's goroutine.
type Client struct {
	t      testing.TB
	node   *corepb.Node
	conn   *grpc.ClientConn
	stream discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cancel context.CancelFunc
	close  sync.Once
}

// Dial connects to the xDS server at addr with creds (nil: plaintext) and opens a stream
// whose subscriptions come from node.
func Dial(t testing.TB, addr string, creds credentials.TransportCredentials, node *corepb.Node) *Client {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("adstest: dial %s: %v", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{t: t, node: node, conn: conn, cancel: cancel}
	t.Cleanup(c.Close)
	c.stream, err = discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatalf("adstest: open an ADS stream to %s: %v", addr, err)
	}
	return c
}

// Subscribe asks for typeURL's resources: a DiscoveryRequest with the node and the type.
func (c *Client) Subscribe(typeURL string) {
	c.t.Helper()
	c.send(&discoverypb.DiscoveryRequest{Node: c.node, TypeUrl: typeURL})
}

// Recv returns the next response, failing the test if the stream ends or none comes within
// RecvTimeout (the stream is cancelled then).
func (c *Client) Recv() *discoverypb.DiscoveryResponse {
	c.t.Helper()
	timer := time.AfterFunc(RecvTimeout, c.cancel)
	r, err := c.stream.Recv()
	if !timer.Stop() {
		c.t.Fatalf("adstest: no response within %v", RecvTimeout)
	}
	if err != nil {
		c.t.Fatalf("adstest: receive: %v", err)
	}
	return r
}

// ACK accepts r: a DiscoveryRequest with its type, nonce and version.
func (c *Client) ACK(r *discoverypb.DiscoveryResponse) {
	c.t.Helper()
	c.send(&discoverypb.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()})
}

// NACK refuses r, as istiod does a config it cannot take: a DiscoveryRequest with its type
// and nonce, no version, and an error detail InvalidArgument with msg.
func (c *Client) NACK(r *discoverypb.DiscoveryResponse, msg string) {
	c.t.Helper()
	c.send(&discoverypb.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}})
}

// send sends req as it is.
func (c *Client) send(req *discoverypb.DiscoveryRequest) {
	c.t.Helper()
	if err := c.stream.Send(req); err != nil {
		c.t.Fatalf("adstest: send %s: %v", req.GetTypeUrl(), err)
	}
}

// Close ends the stream and closes the connection: the server sees the client go. Closing
// again is harmless.
func (c *Client) Close() {
	c.close.Do(func() {
		c.cancel()
		_ = c.conn.Close()
	})
}

// Resources decodes r's resources, which MCP-over-xDS sends as MCP Resources.
func Resources(t testing.TB, r *discoverypb.DiscoveryResponse) []*mcpapi.Resource {
	t.Helper()
	out := make([]*mcpapi.Resource, 0, len(r.GetResources()))
	for _, a := range r.GetResources() {
		res := &mcpapi.Resource{}
		if err := proto.Unmarshal(a.GetValue(), res); err != nil {
			t.Fatalf("adstest: %s resource: %v", r.GetTypeUrl(), err)
		}
		out = append(out, res)
	}
	return out
}
