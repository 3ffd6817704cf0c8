package kinds

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
)

// FuzzCheck feeds Check what a publisher controls: the collection (an index into checkTable,
// which has a Struct kind, a cluster-scoped kind, a message with an Any and a proto2
// message besides the built-in ones), the name, the body's bytes and its type URL (empty:
// the kind's own, so the fuzzer spends its time on bodies past the type check). Check never
// panics, and whatever it accepts is what a sink can take: the resource marshals, the body
// decodes as the kind's message, and that message re-marshaled is accepted again and equal.
func FuzzCheck(f *testing.F) {
	tbl := checkTable(f)
	index := func(coll string) uint8 {
		i, ok := tbl.byColl[coll]
		if !ok {
			f.Fatalf("no %s", coll)
		}
		return uint8(i)
	}
	vs := mustAny(f, typicalVS())
	pa := mustAny(f, &security.PeerAuthentication{Mtls: &security.PeerAuthentication_MutualTLS{Mode: security.PeerAuthentication_MutualTLS_STRICT},
		PortLevelMtls: map[uint32]*security.PeerAuthentication_MutualTLS{8080: {Mode: 1}}})
	st, _ := structpb.NewStruct(map[string]any{"data": map[string]any{"a": "1", "l": []any{1.5, true, nil}}})
	wrapped := mustAny(f, &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "in"}, Body: vs})
	unknown := append(append([]byte(nil), vs.Value...), protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "x")...)

	f.Add(index(vsColl), "shop/cart", vs.Value, "")
	f.Add(index(vsColl), "shop/cart", vs.Value, "type.googleapis.com/istio.networking.v1alpha3.DestinationRule")
	f.Add(index(vsColl), "lab/..", vs.Value, "")
	f.Add(index(vsColl), "a/b/c", vs.Value, "")
	f.Add(index(vsColl), "lab/"+strings.Repeat("a", 300), vs.Value, "")
	f.Add(index(vsColl), "shop/cart", unknown, "")
	f.Add(index(vsColl), "shop/cart", vs.Value[:len(vs.Value)-2], "")
	f.Add(index(paColl), "shop/pa", pa.Value, "")
	f.Add(index(paColl), "shop/pa", []byte("\xff\xff garbage"), "")
	f.Add(index(cmColl), "shop/cm", mustAny(f, st).Value, "")
	f.Add(index(cgwColl), "gw", mustAny(f, &networking.Gateway{Servers: []*networking.Server{{Hosts: []string{"*"}}}}).Value, "")
	f.Add(index(anyColl), "ns/w", wrapped.Value, "")
	f.Add(index(proto2Col), "d", []byte("\x0a\x03a\xffb"), "")
	f.Add(uint8(200), "x", []byte{}, "type.googleapis.com/google.protobuf.Struct")

	f.Fuzz(func(t *testing.T, coll uint8, name string, body []byte, typeURL string) {
		i := int(coll) % len(tbl.kinds)
		k, bt := tbl.kinds[i], tbl.bodies[i]
		if typeURL == "" {
			typeURL = bt.typeURL
		}
		r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name}, Body: &anypb.Any{TypeUrl: typeURL, Value: body}}
		if err := tbl.Check(k.Collection, r); err != nil {
			if err.Error() == "" {
				t.Fatal("an error without text")
			}
			return
		}
		if want := map[bool]int{false: 1, true: 0}[k.ClusterScoped]; strings.Count(name, "/") != want {
			t.Fatalf("%s: name %q accepted", k.Collection, name)
		}
		if _, err := proto.Marshal(r); err != nil {
			t.Fatalf("accepted, but the resource does not marshal: %v", err)
		}
		m := bt.mt.New().Interface()
		if err := proto.Unmarshal(body, m); err != nil {
			t.Fatalf("accepted, but the body does not decode: %v", err)
		}
		again, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatalf("accepted, but the body does not re-marshal: %v", err)
		}
		r.Body.Value = again
		if err := tbl.Check(k.Collection, r); err != nil {
			t.Fatalf("accepted, but not once re-marshaled: %v", err)
		}
		m2 := bt.mt.New().Interface()
		if err := proto.Unmarshal(again, m2); err != nil || !proto.Equal(m, m2) {
			t.Fatalf("re-marshaled body differs: %v", err)
		}
	})
}
