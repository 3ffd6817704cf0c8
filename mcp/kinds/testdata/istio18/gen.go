//go:build ignore

// gen writes bodies.json: one resource of every kind Istio 1.8.0 has, each spec decoded
// from JSON into Istio 1.8's own (gogo-generated) types and encoded by gogo's MarshalAny, as
// Istio 1.8's MCP sources encode bodies. TestCheckAcceptsIstio18Bodies checks that the hub
// accepts what they send. It needs Istio 1.8's module graph, which only test/istio has:
//
//	cd test/istio && go run ../../mcp/kinds/testdata/istio18/gen.go > ../../mcp/kinds/testdata/istio18/bodies.json
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/gogo/protobuf/jsonpb"
	"github.com/gogo/protobuf/proto"
	"github.com/gogo/protobuf/types"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
)

type resource struct {
	Collection string `json:"collection"`
	Name       string `json:"name"`
	TypeURL    string `json:"typeUrl"`
	Value      []byte `json:"value"`
}

// specs are as full as Istio 1.8's API allows: enums, durations, wrappers, maps, oneofs,
// Structs (EnvoyFilter), deprecated fields still in the protos.
var specs = []struct {
	collection, name string
	msg              proto.Message
	json             string
}{
	{"istio/networking/v1alpha3/virtualservices", "shop/cart", &networking.VirtualService{}, `{
		"hosts": ["cart.shop.svc.cluster.local", "cart.example.com"],
		"gateways": ["istio-system/gw", "mesh"],
		"exportTo": ["."],
		"http": [{
			"name": "v2",
			"match": [{"uri": {"prefix": "/api/v2"}, "headers": {"x-user": {"exact": "beta"}}, "ignoreUriCase": true}],
			"route": [{"destination": {"host": "cart", "subset": "v2", "port": {"number": 8080}}, "weight": 10,
			           "headers": {"request": {"set": {"x-a": "1"}, "remove": ["x-b"]}}},
			          {"destination": {"host": "cart", "subset": "v1"}, "weight": 90}],
			"timeout": "3s",
			"retries": {"attempts": 3, "perTryTimeout": "1s", "retryOn": "5xx"},
			"fault": {"delay": {"fixedDelay": "0.5s", "percentage": {"value": 0.1}}, "abort": {"httpStatus": 503, "percentage": {"value": 1.5}}},
			"mirror": {"host": "cart-shadow"},
			"mirrorPercentage": {"value": 12.5},
			"corsPolicy": {"allowOrigins": [{"exact": "https://example.com"}], "allowMethods": ["GET"], "maxAge": "24h", "allowCredentials": true},
			"rewrite": {"uri": "/v2"}
		}, {
			"redirect": {"uri": "/new", "authority": "x.example.com", "redirectCode": 301}
		}],
		"tls": [{"match": [{"sniHosts": ["cart.example.com"], "port": 443}], "route": [{"destination": {"host": "cart"}}]}],
		"tcp": [{"match": [{"port": 5432, "sourceLabels": {"app": "db"}}], "route": [{"destination": {"host": "db"}}]}]
	}`},
	{"istio/networking/v1alpha3/destinationrules", "shop/cart", &networking.DestinationRule{}, `{
		"host": "cart.shop.svc.cluster.local",
		"trafficPolicy": {
			"connectionPool": {"tcp": {"maxConnections": 100, "connectTimeout": "30ms", "tcpKeepalive": {"time": "7200s", "interval": "75s"}},
			                   "http": {"http2MaxRequests": 1000, "maxRequestsPerConnection": 10, "h2UpgradePolicy": "UPGRADE"}},
			"loadBalancer": {"simple": "LEAST_CONN", "localityLbSetting": {"enabled": true, "failover": [{"from": "us-east", "to": "us-west"}]}},
			"outlierDetection": {"consecutiveErrors": 7, "consecutive5xxErrors": 5, "interval": "5m", "baseEjectionTime": "15m", "maxEjectionPercent": 50},
			"tls": {"mode": "ISTIO_MUTUAL", "sni": "cart.example.com"},
			"portLevelSettings": [{"port": {"number": 80}, "loadBalancer": {"consistentHash": {"httpCookie": {"name": "u", "ttl": "0s"}}}}]
		},
		"subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}],
		"exportTo": ["*"]
	}`},
	{"istio/networking/v1alpha3/gateways", "istio-system/gw", &networking.Gateway{}, `{
		"selector": {"istio": "ingressgateway"},
		"servers": [
			{"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["shop/cart.example.com"],
			 "tls": {"mode": "SIMPLE", "credentialName": "cart-cert", "minProtocolVersion": "TLSV1_2"}},
			{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"], "tls": {"httpsRedirect": true}, "name": "plain"}
		]
	}`},
	{"istio/networking/v1alpha3/serviceentries", "shop/payments", &networking.ServiceEntry{}, `{
		"hosts": ["payments.example.com"],
		"addresses": ["10.0.0.1/32"],
		"ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
		"location": "MESH_EXTERNAL",
		"resolution": "STATIC",
		"endpoints": [{"address": "10.0.0.1", "ports": {"tls": 8443}, "labels": {"zone": "a"}, "weight": 2, "locality": "us-east/a", "network": "n1"}],
		"exportTo": ["."],
		"subjectAltNames": ["spiffe://example.com/payments"]
	}`},
	{"istio/networking/v1alpha3/sidecars", "shop/default", &networking.Sidecar{}, `{
		"workloadSelector": {"labels": {"app": "cart"}},
		"ingress": [{"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:8080", "captureMode": "NONE"}],
		"egress": [{"hosts": ["./*", "istio-system/*"], "captureMode": "IPTABLES"}],
		"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}
	}`},
	{"istio/networking/v1alpha3/workloadentries", "shop/vm-1", &networking.WorkloadEntry{}, `{
		"address": "10.1.2.3", "ports": {"http": 8080}, "labels": {"app": "cart"},
		"network": "vm-net", "locality": "us-east/a", "weight": 1, "serviceAccount": "cart"
	}`},
	{"istio/networking/v1alpha3/workloadgroups", "shop/vms", &networking.WorkloadGroup{}, `{
		"metadata": {"labels": {"app": "cart"}, "annotations": {"a": "b"}},
		"template": {"ports": {"http": 8080}, "serviceAccount": "cart", "network": "vm-net"},
		"probe": {"initialDelaySeconds": 5, "periodSeconds": 10, "httpGet": {"path": "/ready", "port": 8080, "httpHeaders": [{"name": "x", "value": "y"}]}}
	}`},
	{"istio/networking/v1alpha3/envoyfilters", "istio-system/lua", &networking.EnvoyFilter{}, `{
		"workloadSelector": {"labels": {"app": "cart"}},
		"configPatches": [{
			"applyTo": "HTTP_FILTER",
			"match": {"context": "SIDECAR_INBOUND", "proxy": {"proxyVersion": "^1\\.8.*"},
			          "listener": {"portNumber": 8080, "filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager", "subFilter": {"name": "envoy.filters.http.router"}}}}},
			"patch": {"operation": "INSERT_BEFORE", "value": {"name": "envoy.lua", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "inlineCode": "function envoy_on_request(h) end", "n": 1.5, "list": [true, null, "x"]}}}
		}]
	}`},
	{"istio/security/v1beta1/authorizationpolicies", "shop/allow", &security.AuthorizationPolicy{}, `{
		"selector": {"matchLabels": {"app": "cart"}},
		"action": "ALLOW",
		"rules": [{
			"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/web"], "notNamespaces": ["dev"], "ipBlocks": ["10.0.0.0/8"]}}],
			"to": [{"operation": {"methods": ["GET", "POST"], "paths": ["/api/*"], "ports": ["8080"]}}],
			"when": [{"key": "request.auth.claims[iss]", "values": ["https://accounts.example.com"]}]
		}]
	}`},
	{"istio/security/v1beta1/peerauthentications", "shop/strict", &security.PeerAuthentication{}, `{
		"selector": {"matchLabels": {"app": "cart"}},
		"mtls": {"mode": "STRICT"},
		"portLevelMtls": {"8080": {"mode": "PERMISSIVE"}}
	}`},
	{"istio/security/v1beta1/requestauthentications", "shop/jwt", &security.RequestAuthentication{}, `{
		"selector": {"matchLabels": {"app": "cart"}},
		"jwtRules": [{"issuer": "https://accounts.example.com", "audiences": ["cart"], "jwksUri": "https://accounts.example.com/jwks",
		              "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}], "fromParams": ["token"], "outputPayloadToHeader": "x-payload", "forwardOriginalToken": true}]
	}`},
}

func main() {
	var out []resource
	for _, s := range specs {
		if err := (&jsonpb.Unmarshaler{}).Unmarshal(strings.NewReader(s.json), s.msg); err != nil {
			fail(fmt.Errorf("%s: %v", s.collection, err))
		}
		body, err := types.MarshalAny(s.msg)
		if err != nil {
			fail(err)
		}
		out = append(out, resource{Collection: s.collection, Name: s.name, TypeURL: body.TypeUrl, Value: body.Value})
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		fail(err)
	}
	os.Stdout.Write(append(b, '\n'))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gen:", err)
	os.Exit(1)
}
