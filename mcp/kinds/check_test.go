package kinds

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
)

const (
	vsColl = "istio/networking/v1alpha3/virtualservices"
	paColl = "istio/security/v1beta1/peerauthentications"
	cmColl = "k8s/core/v1/configmaps"
	// Configured kinds of checkTable, each for one thing no built-in kind has.
	cgwColl   = "example/v1/clustergateways" // cluster-scoped, with a message type
	anyColl   = "example/v1/wrapped"         // a message with an Any inside: istio.mcp.v1alpha1.Resource
	proto2Col = "example/v1/descriptors"     // a proto2 message: google.protobuf.FileDescriptorProto
)

// checkTable is the built-in kinds and configured ones: a Struct kind, a cluster-scoped kind
// with a message, a message holding an Any, a proto2 message.
func checkTable(t testing.TB) *Table {
	t.Helper()
	tbl, err := NewTable([]Kind{
		{Collection: cmColl, Version: "v1", Resource: "configmaps", Kind: "ConfigMap"},
		{Collection: cgwColl, Group: "example.com", Version: "v1", Resource: "clustergateways", Kind: "ClusterGateway",
			ClusterScoped: true, MessageType: "istio.networking.v1alpha3.Gateway"},
		{Collection: anyColl, Group: "example.com", Version: "v1", Resource: "wrappeds", Kind: "Wrapped",
			MessageType: "istio.mcp.v1alpha1.Resource"},
		{Collection: proto2Col, Group: "example.com", Version: "v1", Resource: "descriptors", Kind: "Descriptor",
			ClusterScoped: true, MessageType: "google.protobuf.FileDescriptorProto"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a := new(anypb.Any)
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		t.Fatal(err)
	}
	return a
}

func resource(name string, body *anypb.Any) *mcpapi.Resource {
	return &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: "1"}, Body: body}
}

// typicalVS is the VirtualService of the minion's BenchmarkConvert.
func typicalVS() *networking.VirtualService {
	return &networking.VirtualService{
		Hosts:    []string{"cart.shop.svc.cluster.local", "cart.example.com"},
		Gateways: []string{"istio-system/gw", "mesh"},
		Http: []*networking.HTTPRoute{{
			Match: []*networking.HTTPMatchRequest{{Uri: &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: "/api/v2"}}}},
			Route: []*networking.HTTPRouteDestination{
				{Destination: &networking.Destination{Host: "cart", Subset: "v2"}, Weight: 10},
				{Destination: &networking.Destination{Host: "cart", Subset: "v1"}, Weight: 90},
			},
			Timeout: durationpb.New(3e9),
			Retries: &networking.HTTPRetry{Attempts: 3, PerTryTimeout: durationpb.New(1e9)},
		}},
	}
}

// withField appends a field, encoded by hand, to a body: how a publisher with a newer or
// different schema would send it.
func withField(a *anypb.Any, b []byte) *anypb.Any {
	return &anypb.Any{TypeUrl: a.TypeUrl, Value: append(append([]byte(nil), a.Value...), b...)}
}

func unknownBytesField(num protowire.Number, v string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

// Every built-in kind accepts its empty spec (the minion publishes one for an object without
// spec), and every configured kind its empty message.
func TestCheckAcceptsEmptyBodies(t *testing.T) {
	tbl := checkTable(t)
	for i, k := range tbl.Kinds() {
		name := "ns/x"
		if k.ClusterScoped {
			name = "x"
		}
		mt := tbl.bodies[i].mt
		if err := tbl.Check(k.Collection, resource(name, mustAny(t, mt.New().Interface()))); err != nil {
			t.Errorf("%s: empty %s: %v", k.Collection, mt.Descriptor().FullName(), err)
		}
	}
}

// What each refusal says, exactly: the object's problem and the rule.
func TestCheckRefuses(t *testing.T) {
	tbl := checkTable(t)
	vs := mustAny(t, typicalVS())
	const subdomainRule = `a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`
	const labelRule = `a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`

	badEnum := mustAny(t, &security.PeerAuthentication{Mtls: &security.PeerAuthentication_MutualTLS{Mode: 99}})
	badMapEnum := mustAny(t, &security.PeerAuthentication{PortLevelMtls: map[uint32]*security.PeerAuthentication_MutualTLS{
		8080: {Mode: security.PeerAuthentication_MutualTLS_STRICT}, 9090: {Mode: 7}, 9443: {Mode: 8}}})
	nanVS := typicalVS()
	nanVS.Http[0].MirrorPercentage = &networking.Percent{Value: math.NaN()}
	longTimeout := typicalVS()
	longTimeout.Http[0].Timeout = &durationpb.Duration{Seconds: 1e12}
	badNanos := typicalVS()
	badNanos.Http[0].Retries.PerTryTimeout = &durationpb.Duration{Seconds: 1, Nanos: -1}
	// http[0].route[1].destination gets field 99.
	nested := typicalVS()
	nested.Http[0].Route[1].Destination.ProtoReflect().SetUnknown(unknownBytesField(99, "x"))
	nestedUnknown := mustAny(t, nested)
	infStruct, _ := structpb.NewStruct(map[string]any{"data": map[string]any{"n": math.Inf(1)}})
	innerUnknown := withField(mustAny(t, typicalVS()), protowire.AppendVarint(protowire.AppendTag(nil, 1000, protowire.VarintType), 1))
	wrapped := func(body *anypb.Any) *anypb.Any {
		return mustAny(t, &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "inner"}, Body: body})
	}
	bigNanos := typicalVS()
	bigNanos.Http[0].Timeout = &durationpb.Duration{Nanos: 1e9}
	var sixUnknown []byte
	for n := range protowire.Number(6) {
		sixUnknown = append(sixUnknown, unknownBytesField(91+n, "x")...)
	}
	badExtension := fileWithFieldBehavior(t, 99)
	badProto2 := &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.FileDescriptorProto",
		Value: protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "a\xffb")}
	withMeta := func(f func(*mcpapi.Metadata)) *mcpapi.Resource {
		r := resource("shop/cart", vs)
		f(r.Metadata)
		return r
	}
	unknownEnvelope := resource("shop/cart", vs)
	unknownEnvelope.ProtoReflect().SetUnknown(unknownBytesField(9, "x"))

	for _, tc := range []struct {
		what, collection string
		r                *mcpapi.Resource
		want             string
	}{
		{"unknown collection", "istio/networking/v1alpha3/virtualservice", resource("shop/cart", vs),
			`collection "istio/networking/v1alpha3/virtualservice" is not in the kinds table`},
		{"nil resource", vsColl, nil, `resource is nil`},
		{"no metadata", vsColl, &mcpapi.Resource{Body: vs}, `metadata is missing`},

		// Names.
		{"empty name", vsColl, resource("", vs), `name "": empty: every resource has a name`},
		{"dot-dot", vsColl, resource("lab/..", vs), `name "lab/..": name ".." is not a DNS-1123 subdomain: ` + subdomainRule},
		{"no name part", vsColl, resource("lab/", vs), `name "lab/": name is empty`},
		{"no namespace part", vsColl, resource("/x", vs), `name "/x": namespace is empty`},
		{"control character", vsColl, resource("lab/a\x00b", vs), `name "lab/a\x00b": name "a\x00b" is not a DNS-1123 subdomain: ` + subdomainRule},
		{"newline in namespace", vsColl, resource("la\nb/x", vs), `name "la\nb/x": namespace "la\nb" is not a DNS-1123 label: ` + labelRule},
		{"300 characters", vsColl, resource("lab/"+strings.Repeat("a", 300), vs),
			`name "lab/` + strings.Repeat("a", 96) + `"... (304 bytes): name "` + strings.Repeat("a", 100) + `"... (300 bytes) is not a DNS-1123 subdomain: must be no more than 253 characters`},
		{"64-character namespace", vsColl, resource(strings.Repeat("n", 64)+"/x", vs),
			`name "` + strings.Repeat("n", 64) + `/x": namespace "` + strings.Repeat("n", 64) + `" is not a DNS-1123 label: must be no more than 63 characters`},
		{"upper case namespace", vsColl, resource("Lab/x", vs), `name "Lab/x": namespace "Lab" is not a DNS-1123 label: ` + labelRule},
		{"dots in namespace", vsColl, resource("a.b/x", vs), `name "a.b/x": namespace "a.b" is not a DNS-1123 label: must not contain dots`},
		{"two slashes", vsColl, resource("a/b/c", vs), `name "a/b/c": more than one "/": VirtualService.networking.istio.io is namespaced, want "namespace/name"`},
		{"no namespace", vsColl, resource("cart", vs), `name "cart": VirtualService.networking.istio.io is namespaced: want "namespace/name"`},
		{"namespace on a cluster-scoped kind", cgwColl, resource("ns/gw", mustAny(t, &networking.Gateway{})),
			`name "ns/gw": ClusterGateway.example.com is cluster-scoped: a name without a namespace, not "namespace/name"`},
		{"not UTF-8", vsColl, resource("lab/\xff", vs), `name "lab/\xff": name "\xff" is not a DNS-1123 subdomain: ` + subdomainRule},

		// The envelope.
		{"unknown resource field", vsColl, unknownEnvelope,
			`resource: unknown field 9 (bytes): not a field of istio.mcp.v1alpha1.Resource`},
		{"unknown metadata field", vsColl, withMeta(func(m *mcpapi.Metadata) {
			m.ProtoReflect().SetUnknown(append(unknownBytesField(7, "x"), unknownBytesField(8, "y")...))
		}), `metadata: unknown fields 7 (bytes), 8 (bytes): not a field of istio.mcp.v1alpha1.Metadata`},
		{"creation time out of range", vsColl, withMeta(func(m *mcpapi.Metadata) { m.CreateTime = &timestamppb.Timestamp{Seconds: -1e12} }),
			`metadata.createTime: timestamp of -1000000000000 seconds: google.protobuf.Timestamp holds years 0001 to 9999 (-62135596800 to 253402300799)`},
		{"label not UTF-8", vsColl, withMeta(func(m *mcpapi.Metadata) { m.Labels = map[string]string{"app": "a\xffb"} }),
			`metadata.labels["app"]: not valid UTF-8`},

		// Bodies.
		{"no body", vsColl, resource("shop/cart", nil),
			`body: missing: a VirtualService resource carries istio.networking.v1alpha3.VirtualService (the message of VirtualService.networking.istio.io)`},
		{"unknown type URL", vsColl, resource("shop/cart", &anypb.Any{TypeUrl: "type.googleapis.com/foo", Value: vs.Value}),
			`body: type URL "type.googleapis.com/foo" is not istio.networking.v1alpha3.VirtualService (the message of VirtualService.networking.istio.io)`},
		{"empty type URL", vsColl, resource("shop/cart", &anypb.Any{}),
			`body: type URL "" is not istio.networking.v1alpha3.VirtualService (the message of VirtualService.networking.istio.io)`},
		{"another kind's message", vsColl, resource("shop/cart", mustAny(t, &networking.DestinationRule{Host: "a"})),
			`body: type URL "type.googleapis.com/istio.networking.v1alpha3.DestinationRule" is not istio.networking.v1alpha3.VirtualService (the message of VirtualService.networking.istio.io)`},
		{"another prefix", vsColl, resource("shop/cart", &anypb.Any{TypeUrl: "example.com/istio.networking.v1alpha3.VirtualService", Value: vs.Value}),
			`body: type URL "example.com/istio.networking.v1alpha3.VirtualService" is not istio.networking.v1alpha3.VirtualService (the message of VirtualService.networking.istio.io)`},
		{"a Struct for a kind with a message", vsColl, resource("shop/cart", mustAny(t, &structpb.Struct{})),
			`body: type URL "type.googleapis.com/google.protobuf.Struct" is not istio.networking.v1alpha3.VirtualService (the message of VirtualService.networking.istio.io)`},
		{"a message for a Struct kind", cmColl, resource("ns/cm", vs),
			`body: type URL "type.googleapis.com/istio.networking.v1alpha3.VirtualService" is not google.protobuf.Struct (ConfigMap has no message type: its content travels as a Struct)`},
		{"garbage", paColl, resource("shop/pa", &anypb.Any{TypeUrl: "type.googleapis.com/istio.security.v1beta1.PeerAuthentication", Value: []byte("\xff\xff\xff garbage")}),
			`body: does not decode as istio.security.v1beta1.PeerAuthentication: proto: cannot parse invalid wire-format data`},
		{"truncated", vsColl, resource("shop/cart", &anypb.Any{TypeUrl: vs.TypeUrl, Value: vs.Value[:len(vs.Value)-3]}),
			`body: does not decode as istio.networking.v1alpha3.VirtualService: proto: cannot parse invalid wire-format data`},
		{"string not UTF-8", vsColl, resource("shop/cart", withField(vs, unknownBytesField(1, "a\xffb"))),
			`body: does not decode as istio.networking.v1alpha3.VirtualService: string field contains invalid UTF-8`},
		{"unknown top-level field", vsColl, resource("shop/cart", withField(vs, unknownBytesField(99, "x"))),
			`body: unknown field 99 (bytes): not a field of istio.networking.v1alpha3.VirtualService`},
		{"unknown nested field", vsColl, resource("shop/cart", nestedUnknown),
			`body: http[0].route[1].destination: unknown field 99 (bytes): not a field of istio.networking.v1alpha3.Destination`},
		{"undeclared enum number", paColl, resource("shop/pa", badEnum),
			`body: mtls.mode: 99 is not a value of enum istio.security.v1beta1.PeerAuthentication.MutualTLS.Mode`},
		{"undeclared enum number in a map, the least key", paColl, resource("shop/pa", badMapEnum),
			`body: portLevelMtls["9090"].mode: 7 is not a value of enum istio.security.v1beta1.PeerAuthentication.MutualTLS.Mode`},
		{"NaN", vsColl, resource("shop/cart", mustAny(t, nanVS)),
			`body: http[0].mirrorPercentage.value: NaN is not a number a Kubernetes object can hold`},
		{"duration out of range", vsColl, resource("shop/cart", mustAny(t, longTimeout)),
			`body: http[0].timeout: duration of 1000000000000 seconds: google.protobuf.Duration holds at most 10,000 years either way (±315576000000)`},
		{"duration of mixed signs", vsColl, resource("shop/cart", mustAny(t, badNanos)),
			`body: http[0].retries.perTryTimeout: duration of 1 seconds and -1 nanos: google.protobuf.Duration's seconds and nanos have one sign`},
		{"duration nanos out of range", vsColl, resource("shop/cart", mustAny(t, bigNanos)),
			`body: http[0].timeout: duration nanos 1000000000: not within ±999,999,999`},
		{"creation time nanos out of range", vsColl, withMeta(func(m *mcpapi.Metadata) { m.CreateTime = &timestamppb.Timestamp{Seconds: 1, Nanos: -1} }),
			`metadata.createTime: timestamp nanos -1: not within 0 to 999,999,999`},
		{"a known field with the wrong wire type", vsColl, resource("shop/cart", withField(vs, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7))),
			`body: field 1 (hosts) sent as varint, not as its type (string) is in istio.networking.v1alpha3.VirtualService`},
		{"six unknown fields", vsColl, resource("shop/cart", withField(vs, sixUnknown)),
			`body: unknown fields 91 (bytes), 92 (bytes), 93 (bytes), 94 (bytes), 95 (bytes), ...: not a field of istio.networking.v1alpha3.VirtualService`},
		{"undeclared enum number in a proto2 extension", proto2Col, resource("d", mustAny(t, badExtension)),
			`body: messageType[0].field[0].options[google.api.field_behavior][0]: 99 is not a value of enum google.api.FieldBehavior`},
		{"infinity in a Struct", cmColl, resource("ns/cm", mustAny(t, infStruct)),
			`body: fields["data"].structValue.fields["n"].numberValue: +Inf is not a number a Kubernetes object can hold`},
		{"Any of an unknown type inside", anyColl, resource("ns/w", wrapped(&anypb.Any{TypeUrl: "type.googleapis.com/no.Such"})),
			`body: body: type URL "type.googleapis.com/no.Such": not a message this program knows, so its content cannot be checked`},
		{"Any with another prefix inside", anyColl, resource("ns/w", wrapped(&anypb.Any{TypeUrl: "example.com/google.protobuf.Struct"})),
			`body: body: type URL "example.com/google.protobuf.Struct" does not start with type.googleapis.com/`},
		{"unknown field in an Any's content", anyColl, resource("ns/w", wrapped(innerUnknown)),
			`body: body: unknown field 1000 (varint): not a field of istio.networking.v1alpha3.VirtualService`},
		{"garbage in an Any's content", anyColl, resource("ns/w", wrapped(&anypb.Any{TypeUrl: vs.TypeUrl, Value: []byte{0xff}})),
			`body: body: does not decode as istio.networking.v1alpha3.VirtualService: proto: cannot parse invalid wire-format data`},
		{"proto2 string not UTF-8", proto2Col, resource("d", badProto2), `body: name: not valid UTF-8`},
	} {
		err := tbl.Check(tc.collection, tc.r)
		if err == nil {
			t.Errorf("%s: accepted", tc.what)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.what, err, tc.want)
		}
	}
}

// What a well-formed resource of each shape passes: a full VirtualService, any valid
// encoding of it, a cluster-scoped kind's bare name, a Struct, an Any whose content is right,
// names at their limits.
func TestCheckAccepts(t *testing.T) {
	tbl := checkTable(t)
	vs := mustAny(t, typicalVS())
	st, err := structpb.NewStruct(map[string]any{"data": map[string]any{"a": "1", "n": 2.5, "l": []any{true, nil, "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	full := typicalVS()
	full.Http[0].MirrorPercentage = &networking.Percent{Value: 12.5}
	full.Http[0].Fault = &networking.HTTPFaultInjection{Abort: &networking.HTTPFaultInjection_Abort{
		ErrorType: &networking.HTTPFaultInjection_Abort_HttpStatus{HttpStatus: 503}, Percentage: &networking.Percent{Value: 0.1}}}
	full.Http[0].Timeout = &durationpb.Duration{Seconds: 315576000000} // the documented maximum
	reordered := mustAny(t, typicalVS())
	// The same VirtualService with its fields in reverse order and hosts repeated one by one:
	// a valid encoding the hub serves as it came.
	var rev []byte
	b := reordered.Value
	var fields [][]byte
	for len(b) > 0 {
		_, _, n := protowire.ConsumeField(b)
		fields = append(fields, b[:n])
		b = b[n:]
	}
	for i := len(fields) - 1; i >= 0; i-- {
		rev = append(rev, fields[i]...)
	}
	reordered.Value = rev
	meta := resource("shop/cart", vs)
	meta.Metadata.CreateTime = timestamppb.Now()
	meta.Metadata.Labels = map[string]string{"app": "cart"}
	meta.Metadata.Annotations = map[string]string{"note": "ü"}

	for _, tc := range []struct {
		what, collection string
		r                *mcpapi.Resource
	}{
		{"typical VirtualService", vsColl, resource("shop/cart", vs)},
		{"full VirtualService", vsColl, resource("shop/cart", mustAny(t, full))},
		{"fields in another order", vsColl, resource("shop/cart", reordered)},
		{"metadata", vsColl, meta},
		{"dotted name", vsColl, resource("shop/cart.v2-x", vs)},
		{"longest names", vsColl, resource(strings.Repeat("n", 63)+"/"+strings.Repeat("a", 63)+"."+strings.Repeat("b", 63)+"."+strings.Repeat("c", 63)+"."+strings.Repeat("d", 61), vs)},
		{"cluster-scoped", cgwColl, resource("gw", mustAny(t, &networking.Gateway{Servers: []*networking.Server{{Hosts: []string{"*"}}}}))},
		{"Struct", cmColl, resource("ns/cm", mustAny(t, st))},
		{"Any inside", anyColl, resource("ns/w", mustAny(t, &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "x"}, Body: vs}))},
		{"proto2", proto2Col, resource("d", mustAny(t, &descriptorpb.FileDescriptorProto{Name: proto.String("a.proto")}))},
		{"proto2 extension", proto2Col, resource("d", mustAny(t, fileWithFieldBehavior(t, 2 /* REQUIRED */)))},
		{"PeerAuthentication", paColl, resource("shop/pa", mustAny(t, &security.PeerAuthentication{
			Mtls: &security.PeerAuthentication_MutualTLS{Mode: security.PeerAuthentication_MutualTLS_STRICT}}))},
	} {
		if err := tbl.Check(tc.collection, tc.r); err != nil {
			t.Errorf("%s: %v", tc.what, err)
		}
	}
}

// fileWithFieldBehavior is a proto2 message with a registered extension set: a field's
// google.api.field_behavior option (registered by Istio's protos, which use it; set through
// protoreflect so that this test imports no module go.mod has as indirect).
func fileWithFieldBehavior(t testing.TB, b protoreflect.EnumNumber) *descriptorpb.FileDescriptorProto {
	t.Helper()
	xt, err := protoregistry.GlobalTypes.FindExtensionByName("google.api.field_behavior")
	if err != nil {
		t.Fatal(err)
	}
	v := xt.New()
	v.List().Append(protoreflect.ValueOfEnum(b))
	opts := &descriptorpb.FieldOptions{}
	opts.ProtoReflect().Set(xt.TypeDescriptor(), v)
	return &descriptorpb.FileDescriptorProto{Name: proto.String("a.proto"), MessageType: []*descriptorpb.DescriptorProto{{
		Name: proto.String("M"), Field: []*descriptorpb.FieldDescriptorProto{{Name: proto.String("f"), Number: proto.Int32(1), Options: opts}}}}}
}

// Anys nested in Anys: at most maxAnys, since each level is decoded (and copied) again
// from its parent's bytes; and at most maxDepth messages in all, though each level's own
// Unmarshal sees only its part.
func TestCheckDepthAcrossAnys(t *testing.T) {
	tbl := checkTable(t)
	nest := func(n int, bottom *anypb.Any) *anypb.Any {
		body := bottom
		for range n {
			body = mustAny(t, &mcpapi.Resource{Body: body})
		}
		return body
	}
	str := mustAny(t, &wrapperspb.StringValue{Value: "bottom"})
	// The body is one Resource; each level of nest adds an Any and a Resource inside it.
	if err := tbl.Check(anyColl, resource("ns/deep", nest(maxAnys, str))); err != nil {
		t.Errorf("%d Anys: %v", maxAnys, err)
	}
	want := "body: body" + strings.Repeat(".body", maxAnys) + ": more than 16 Any values nested"
	if err := tbl.Check(anyColl, resource("ns/deep", nest(maxAnys+1, str))); err == nil || err.Error() != want {
		t.Errorf("%d Anys: %v, want %s", maxAnys+1, err, want)
	}
	// A google.protobuf.Value nested n deep in lists (2 messages per level), inside Anys.
	deepValue := func(n int) *anypb.Any {
		var v []byte // an empty Value
		for range n {
			lv := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), v) // ListValue.values
			v = protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType), lv)  // Value.list_value
		}
		return &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.Value", Value: v}
	}
	// Under one Any, 4,990 levels (9,981 messages) decode; under 14 (28 more messages)
	// they pass 10,000 in all.
	if err := tbl.Check(anyColl, resource("ns/deep", nest(1, deepValue(4990)))); err != nil {
		t.Errorf("deep Value: %.200v", err)
	}
	err := tbl.Check(anyColl, resource("ns/deep", nest(14, deepValue(4990))))
	if err == nil || !strings.Contains(err.Error(), "does not decode as google.protobuf.Value: proto: exceeded maximum recursion depth") {
		t.Errorf("deep Value under 14 Anys: %.300v", err)
	}
}

// Check is called from every cluster's ingest at once: plans are built on first use, from
// whichever goroutine gets there first (run with -race).
func TestCheckConcurrent(t *testing.T) {
	tbl := checkTable(t)
	st, _ := structpb.NewStruct(map[string]any{"a": []any{map[string]any{"b": 1.0}}})
	cases := []struct {
		coll, name string
		body       *anypb.Any
	}{
		{vsColl, "shop/cart", mustAny(t, typicalVS())},
		{cmColl, "shop/cm", mustAny(t, st)},
		{anyColl, "ns/w", mustAny(t, &mcpapi.Resource{Body: mustAny(t, st)})},
		{proto2Col, "d", mustAny(t, fileWithFieldBehavior(t, 2))},
	}
	done := make(chan error)
	for range 4 {
		go func() {
			var err error
			for _, c := range cases {
				if e := tbl.Check(c.coll, resource(c.name, c.body)); e != nil && err == nil {
					err = e
				}
			}
			done <- err
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// istio18Resource is one line of testdata/istio18/bodies.json (see gen.go there).
type istio18Resource struct {
	Collection string `json:"collection"`
	Name       string `json:"name"`
	TypeURL    string `json:"typeUrl"`
	Value      []byte `json:"value"`
}

// Istio 1.8.0's own encoding of one full resource of every kind it has (gogo-generated
// types, gogo's MarshalAny, as its MCP sources send them; testdata/istio18/gen.go) passes:
// the hub accepts what Istio's publishers send, including fields since deprecated.
func TestCheckAcceptsIstio18Bodies(t *testing.T) {
	b, err := os.ReadFile("testdata/istio18/bodies.json")
	if err != nil {
		t.Fatal(err)
	}
	var rs []istio18Resource
	if err := json.Unmarshal(b, &rs); err != nil {
		t.Fatal(err)
	}
	if len(rs) != 11 {
		t.Fatalf("%d resources, want Istio 1.8's 11 kinds", len(rs))
	}
	for _, r := range rs {
		if err := builtin.Check(r.Collection, resource(r.Name, &anypb.Any{TypeUrl: r.TypeURL, Value: r.Value})); err != nil {
			t.Errorf("%s %s: %v", r.Collection, r.Name, err)
		}
		// They are not empty: the fixture really has content of each kind.
		k, _ := Lookup(r.Collection)
		mt, _ := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(k.MessageType))
		m := mt.New().Interface()
		if err := proto.Unmarshal(r.Value, m); err != nil || proto.Size(m) < 20 {
			t.Errorf("%s: %d bytes decoded, %v", r.Collection, proto.Size(m), err)
		}
	}
}

// BenchmarkCheck is the per-resource cost at ingest: a typical VirtualService (the minion's
// BenchmarkConvert's) as it comes off the wire. "unmarshal" is the same body's bare decode,
// what the hub pays already to read hosts for the ACL: the difference is the checks' own.
func BenchmarkCheck(b *testing.B) {
	r := resource("shop/cart", mustAny(b, typicalVS()))
	r.Metadata.Labels = map[string]string{"app": "cart", "team": "checkout"}
	r.Metadata.CreateTime = timestamppb.Now()
	b.Run("check", func(b *testing.B) {
		b.SetBytes(int64(len(r.Body.Value)))
		b.ReportAllocs()
		for b.Loop() {
			if err := builtin.Check(vsColl, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(r.Body.Value)))
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(r.Body.Value, new(networking.VirtualService)); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A kind without an Istio message: its content as a Struct (the minion's, the bench's).
	tbl := checkTable(b)
	spec, err := structpb.NewStruct(map[string]any{"data": map[string]any{"a": strings.Repeat("x", 256), "n": 3.0}})
	if err != nil {
		b.Fatal(err)
	}
	cm := resource("shop/cm", mustAny(b, spec))
	b.Run("check-struct", func(b *testing.B) {
		b.SetBytes(int64(len(cm.Body.Value)))
		b.ReportAllocs()
		for b.Loop() {
			if err := tbl.Check(cmColl, cm); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal-struct", func(b *testing.B) {
		b.SetBytes(int64(len(cm.Body.Value)))
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(cm.Body.Value, new(structpb.Struct)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
