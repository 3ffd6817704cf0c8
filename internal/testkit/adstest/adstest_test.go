package adstest

import (
	"net"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
)

// echoServer answers every subscription (a request without a nonce) with one resource
// named after the node, and passes every request it gets to reqs; a stream's end closes
// ended.
type echoServer struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	reqs  chan *discoverypb.DiscoveryRequest
	ended chan struct{}
}

func (s *echoServer) StreamAggregatedResources(st discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	defer close(s.ended)
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		s.reqs <- req
		if req.GetResponseNonce() != "" {
			continue
		}
		b, _ := proto.Marshal(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "ns/" + req.GetNode().GetId()}})
		if err := st.Send(&discoverypb.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), VersionInfo: "v1", Nonce: "n1",
			Resources: []*anypb.Any{{TypeUrl: "type.googleapis.com/istio.mcp.v1alpha1.Resource", Value: b}}}); err != nil {
			return nil
		}
	}
}

func TestClient(t *testing.T) {
	s := &echoServer{reqs: make(chan *discoverypb.DiscoveryRequest, 10), ended: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(srv, s)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-served }()

	c := Dial(t, lis.Addr().String(), nil, &corepb.Node{Id: "istiod-1"})
	c.Subscribe("example.com/v1/Widget")
	r := c.Recv()
	if res := Resources(t, r); r.GetTypeUrl() != "example.com/v1/Widget" || len(res) != 1 || res[0].GetMetadata().GetName() != "ns/istiod-1" {
		t.Fatalf("response %v", r)
	}
	c.ACK(r)
	c.NACK(r, "bad widget")
	want := []string{
		`node:{id:"istiod-1"} type_url:"example.com/v1/Widget"`,
		`version_info:"v1" type_url:"example.com/v1/Widget" response_nonce:"n1"`,
		`type_url:"example.com/v1/Widget" response_nonce:"n1" error_detail:{code:3 message:"bad widget"}`,
	}
	for _, w := range want {
		var got *discoverypb.DiscoveryRequest
		select {
		case got = <-s.reqs:
		case <-time.After(10 * time.Second):
			t.Fatalf("no request, want %s", w)
		}
		wantReq := &discoverypb.DiscoveryRequest{}
		if err := prototext.Unmarshal([]byte(w), wantReq); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, wantReq) {
			t.Errorf("request %v, want %v", got, wantReq)
		}
	}
	c.Close()
	select {
	case <-s.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's stream did not end after Close")
	}
	c.Close()
}
