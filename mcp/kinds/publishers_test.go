package kinds_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/mcp/kinds"
	"github.com/meshfed/meshfed/minion"
)

// minionSpecs are one full object of every built-in kind, as a user writes it: enums,
// durations, wrappers, maps, oneofs, Structs (EnvoyFilter's patch, WasmPlugin's
// configuration), deprecated fields still in the protos.
var minionSpecs = map[string]string{
	"istio/networking/v1alpha3/virtualservices": `{
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
			"corsPolicy": {"allowOrigins": [{"exact": "https://example.com"}], "allowMethods": ["GET"], "maxAge": "86400s", "allowCredentials": true},
			"rewrite": {"uri": "/v2"}
		}, {
			"redirect": {"uri": "/new", "authority": "x.example.com", "redirectCode": 301}
		}],
		"tls": [{"match": [{"sniHosts": ["cart.example.com"], "port": 443}], "route": [{"destination": {"host": "cart"}}]}],
		"tcp": [{"match": [{"port": 5432, "sourceLabels": {"app": "db"}}], "route": [{"destination": {"host": "db"}}]}]
	}`,
	"istio/networking/v1alpha3/destinationrules": `{
		"host": "cart.shop.svc.cluster.local",
		"trafficPolicy": {
			"connectionPool": {"tcp": {"maxConnections": 100, "connectTimeout": "0.030s", "tcpKeepalive": {"time": "7200s", "interval": "75s"}},
			                   "http": {"http2MaxRequests": 1000, "maxRequestsPerConnection": 10, "h2UpgradePolicy": "UPGRADE"}},
			"loadBalancer": {"simple": "LEAST_REQUEST", "localityLbSetting": {"enabled": true, "failover": [{"from": "us-east", "to": "us-west"}]}},
			"outlierDetection": {"consecutiveErrors": 7, "consecutive5xxErrors": 5, "interval": "300s", "baseEjectionTime": "900s", "maxEjectionPercent": 50},
			"tls": {"mode": "ISTIO_MUTUAL", "sni": "cart.example.com"},
			"portLevelSettings": [{"port": {"number": 80}, "loadBalancer": {"consistentHash": {"httpCookie": {"name": "u", "ttl": "0s"}}}}]
		},
		"subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}],
		"exportTo": ["*"]
	}`,
	"istio/networking/v1alpha3/gateways": `{
		"selector": {"istio": "ingressgateway"},
		"servers": [
			{"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["shop/cart.example.com"],
			 "tls": {"mode": "SIMPLE", "credentialName": "cart-cert", "minProtocolVersion": "TLSV1_2"}},
			{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"], "tls": {"httpsRedirect": true}, "name": "plain"}
		]
	}`,
	"istio/networking/v1alpha3/serviceentries": `{
		"hosts": ["payments.example.com"],
		"addresses": ["10.0.0.1/32"],
		"ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
		"location": "MESH_EXTERNAL",
		"resolution": "STATIC",
		"endpoints": [{"address": "10.0.0.1", "ports": {"tls": 8443}, "labels": {"zone": "a"}, "weight": 2, "locality": "us-east/a", "network": "n1"}],
		"exportTo": ["."],
		"subjectAltNames": ["spiffe://example.com/payments"]
	}`,
	"istio/networking/v1alpha3/sidecars": `{
		"workloadSelector": {"labels": {"app": "cart"}},
		"ingress": [{"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:8080", "captureMode": "NONE"}],
		"egress": [{"hosts": ["./*", "istio-system/*"], "captureMode": "IPTABLES"}],
		"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}
	}`,
	"istio/networking/v1alpha3/workloadentries": `{
		"address": "10.1.2.3", "ports": {"http": 8080}, "labels": {"app": "cart"},
		"network": "vm-net", "locality": "us-east/a", "weight": 1, "serviceAccount": "cart"
	}`,
	"istio/networking/v1alpha3/workloadgroups": `{
		"metadata": {"labels": {"app": "cart"}, "annotations": {"a": "b"}},
		"template": {"ports": {"http": 8080}, "serviceAccount": "cart", "network": "vm-net"},
		"probe": {"initialDelaySeconds": 5, "periodSeconds": 10, "httpGet": {"path": "/ready", "port": 8080, "httpHeaders": [{"name": "x", "value": "y"}]}}
	}`,
	"istio/networking/v1alpha3/envoyfilters": `{
		"workloadSelector": {"labels": {"app": "cart"}},
		"priority": -1,
		"configPatches": [{
			"applyTo": "HTTP_FILTER",
			"match": {"context": "SIDECAR_INBOUND", "proxy": {"proxyVersion": "^1\\.2.*"},
			          "listener": {"portNumber": 8080, "filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager", "subFilter": {"name": "envoy.filters.http.router"}}}}},
			"patch": {"operation": "INSERT_BEFORE", "value": {"name": "envoy.lua", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "inlineCode": "function envoy_on_request(h) end", "n": 1.5, "list": [true, null, "x"]}}}
		}]
	}`,
	"istio/networking/v1beta1/proxyconfigs": `{
		"selector": {"matchLabels": {"app": "cart"}},
		"concurrency": 2,
		"environmentVariables": {"A": "1"},
		"image": {"imageType": "distroless"}
	}`,
	"istio/security/v1beta1/authorizationpolicies": `{
		"selector": {"matchLabels": {"app": "cart"}},
		"action": "ALLOW",
		"rules": [{
			"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/web"], "notNamespaces": ["dev"], "ipBlocks": ["10.0.0.0/8"]}}],
			"to": [{"operation": {"methods": ["GET", "POST"], "paths": ["/api/*"], "ports": ["8080"]}}],
			"when": [{"key": "request.auth.claims[iss]", "values": ["https://accounts.example.com"]}]
		}]
	}`,
	"istio/security/v1beta1/peerauthentications": `{
		"selector": {"matchLabels": {"app": "cart"}},
		"mtls": {"mode": "STRICT"},
		"portLevelMtls": {"8080": {"mode": "PERMISSIVE"}}
	}`,
	"istio/security/v1beta1/requestauthentications": `{
		"selector": {"matchLabels": {"app": "cart"}},
		"jwtRules": [{"issuer": "https://accounts.example.com", "audiences": ["cart"], "jwksUri": "https://accounts.example.com/jwks",
		              "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}], "fromParams": ["token"], "outputPayloadToHeader": "x-payload", "forwardOriginalToken": true}]
	}`,
	"istio/telemetry/v1alpha1/telemetries": `{
		"selector": {"matchLabels": {"app": "cart"}},
		"tracing": [{"providers": [{"name": "zipkin"}], "randomSamplingPercentage": 10.5, "customTags": {"team": {"literal": {"value": "checkout"}}}}],
		"metrics": [{"providers": [{"name": "prometheus"}], "overrides": [{"match": {"metric": "REQUEST_COUNT", "mode": "CLIENT_AND_SERVER"}, "tagOverrides": {"response_code": {"operation": "REMOVE"}}}]}],
		"accessLogging": [{"providers": [{"name": "envoy"}], "filter": {"expression": "response.code >= 400"}}]
	}`,
	"istio/extensions/v1alpha1/wasmplugins": `{
		"selector": {"matchLabels": {"app": "cart"}},
		"url": "oci://example.com/filter:v1",
		"imagePullPolicy": "IfNotPresent",
		"phase": "AUTHN",
		"priority": 10,
		"pluginConfig": {"a": 1, "b": ["x", {"c": false}]},
		"match": [{"mode": "SERVER", "ports": [{"number": 8080}]}],
		"failStrategy": "FAIL_OPEN"
	}`,
	"istio/extensions/v1alpha1/trafficextensions": `{
		"selector": {"matchLabels": {"app": "cart"}},
		"phase": "AUTHZ",
		"priority": 5,
		"match": [{"mode": "CLIENT", "ports": [{"number": 80}]}],
		"lua": {"inlineCode": "function envoy_on_request(h) end"}
	}`,
}

// What the minion publishes passes: minion.Convert's output for one full object of every
// built-in kind, for a configured kind without a message type (a Struct) and for a
// cluster-scoped configured kind with one, decoded from the bytes it sends as the hub's sink
// decodes them.
func TestCheckAcceptsMinionOutput(t *testing.T) {
	extra := []kinds.Kind{
		{Collection: "k8s/core/v1/configmaps", Version: "v1", Resource: "configmaps", Kind: "ConfigMap"},
		{Collection: "example/v1/clustergateways", Group: "example.com", Version: "v1", Resource: "clustergateways", Kind: "ClusterGateway",
			ClusterScoped: true, MessageType: "istio.networking.v1alpha3.Gateway"},
	}
	tbl, err := kinds.NewTable(extra)
	if err != nil {
		t.Fatal(err)
	}
	type object struct {
		collection string
		obj        *minion.Object
	}
	var objects []object
	for _, k := range kinds.Builtin() {
		spec, ok := minionSpecs[k.Collection]
		if !ok {
			t.Errorf("%s: no spec to publish", k.Collection)
			continue
		}
		objects = append(objects, object{k.Collection, newObject(t, "shop", "cart.v2", `{"spec":`+spec+`,"status":{"x":1}}`)})
	}
	objects = append(objects,
		object{extra[0].Collection, newObject(t, "shop", "settings", `{"data":{"a":"1","n":"2"},"binaryData":{},"immutable":true}`)},
		object{extra[1].Collection, newObject(t, "", "edge", `{"spec":{"servers":[{"hosts":["*"],"port":{"number":80,"name":"http","protocol":"HTTP"}}]}}`)},
	)
	for _, o := range objects {
		k, _ := tbl.Lookup(o.collection)
		e, err := minion.Convert(k, o.obj)
		if err != nil {
			t.Errorf("%s: the minion refuses it: %v", o.collection, err)
			continue
		}
		r, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.Check(o.collection, r); err != nil {
			t.Errorf("%s: minion output refused: %v", o.collection, err)
		}
		if len(r.GetBody().GetValue()) < 20 {
			t.Errorf("%s: a body of %d bytes: the spec did not make it", o.collection, len(r.GetBody().GetValue()))
		}
	}
}

func newObject(t *testing.T, ns, name, content string) *minion.Object {
	t.Helper()
	var c map[string]any
	d := json.NewDecoder(strings.NewReader(content))
	if err := d.Decode(&c); err != nil {
		t.Fatal(err)
	}
	return &minion.Object{Namespace: ns, Name: name, Content: c, Created: time.Unix(1700000000, 0),
		Labels: map[string]string{"app": "cart"}, Annotations: map[string]string{"note": "n"}}
}
