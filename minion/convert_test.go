package minion

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
)

func obj(t testing.TB, ns, name, content string) *Object {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal([]byte(content), &c); err != nil {
		t.Fatal(err)
	}
	return &Object{Namespace: ns, Name: name, Content: c, Created: time.Unix(1700000000, 0)}
}

func mustKind(t testing.TB, collection string) Kind {
	t.Helper()
	k, ok := LookupBuiltin(collection)
	if !ok {
		t.Fatalf("no builtin %s", collection)
	}
	return k
}

func TestBuiltinKindsResolve(t *testing.T) {
	if n := len(BuiltinKinds()); n != 15 {
		t.Errorf("%d builtin kinds, want 15", n)
	}
	for _, k := range BuiltinKinds() {
		if err := k.Validate(); err != nil {
			t.Errorf("%s: %v", k.Collection, err)
		}
		// An empty spec is valid for every kind.
		if _, err := Convert(k, obj(t, "ns", "x", `{}`)); err != nil {
			t.Errorf("%s: empty spec: %v", k.Collection, err)
		}
	}
	k := mustKind(t, "istio/networking/v1alpha3/virtualservices")
	if k.GVR().String() != "networking.istio.io/v1alpha3, Resource=virtualservices" || k.MessageType != "istio.networking.v1alpha3.VirtualService" {
		t.Errorf("virtualservices = %+v", k)
	}
}

func TestConvertVirtualService(t *testing.T) {
	k := mustKind(t, "istio/networking/v1alpha3/virtualservices")
	o := obj(t, "shop", "cart", `{"spec":{"hosts":["cart.shop.svc.cluster.local"],"http":[{"route":[{"destination":{"host":"cart","port":{"number":8080}},"weight":100}],"timeout":"5s"}]},"status":{"x":1}}`)
	o.Labels = map[string]string{"app": "cart"}
	o.Annotations = map[string]string{"note": "n", "kubectl.kubernetes.io/last-applied-configuration": "{...}"}
	e, err := Convert(k, o)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if r.Metadata.Name != "shop/cart" || e.Name != "shop/cart" || r.Metadata.Version == "" || r.Metadata.CreateTime.AsTime().Unix() != 1700000000 {
		t.Errorf("metadata = %v", r.Metadata)
	}
	if _, ok := r.Metadata.Annotations["kubectl.kubernetes.io/last-applied-configuration"]; ok || r.Metadata.Annotations["note"] != "n" || r.Metadata.Labels["app"] != "cart" {
		t.Errorf("labels/annotations = %v %v", r.Metadata.Labels, r.Metadata.Annotations)
	}
	var vs networking.VirtualService
	if err := r.Body.UnmarshalTo(&vs); err != nil {
		t.Fatal(err)
	}
	if vs.Hosts[0] != "cart.shop.svc.cluster.local" || vs.Http[0].Timeout.AsDuration() != 5*time.Second || vs.Http[0].Route[0].Destination.Port.Number != 8080 {
		t.Errorf("body = %v", &vs)
	}
}

func TestConvertRejectsInvalidSpecs(t *testing.T) {
	k := mustKind(t, "istio/networking/v1alpha3/virtualservices")
	for _, tc := range []struct{ name, content, want string }{
		{"unknown field", `{"spec":{"hosts":["a"],"hostz":["b"]}}`, `spec.hostz: unknown field "hostz"`},
		{"wrong type", `{"spec":{"hosts":"a"}}`, `spec.hosts: unexpected token "a"`},
		{"bad duration", `{"spec":{"http":[{"route":[]},{"timeout":"soon"}]}}`, `spec.http[1].timeout: invalid google.protobuf.Duration value "soon"`},
		{"deep", `{"spec":{"http":[{"route":[{"destination":{"host":"a","port":{"number":"x"}}}]}]}}`, `spec.http[0].route[0].destination.port.number: invalid value for uint32 field number: "x"`},
		{"spec not an object", `{"spec":["a"]}`, "want an object"},
	} {
		_, err := Convert(k, obj(t, "ns", "bad", tc.content))
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "ns/bad") {
			t.Errorf("%s: err = %v, want ErrInvalidSpec naming the object and %q", tc.name, err, tc.want)
		}
	}
	if _, err := Convert(k, obj(t, "", "x", `{}`)); err == nil {
		t.Error("namespaced kind without namespace accepted")
	}
	if _, err := Convert(k, obj(t, "ns", "", `{}`)); err == nil {
		t.Error("object without name accepted")
	}
}

func TestConvertVersionTracksContent(t *testing.T) {
	k := mustKind(t, "istio/networking/v1alpha3/destinationrules")
	version := func(o *Object) string {
		t.Helper()
		e, err := Convert(k, o)
		if err != nil {
			t.Fatal(err)
		}
		return e.Version
	}
	base := `{"spec":{"host":"a","subsets":[{"name":"v1","labels":{"a":"1","b":"2","c":"3","d":"4"}}]}}`
	v0 := version(obj(t, "ns", "dr", base))
	for range 20 { // map order must not matter
		if v := version(obj(t, "ns", "dr", base)); v != v0 {
			t.Fatalf("same content, versions %s and %s", v0, v)
		}
	}
	if v := version(obj(t, "ns", "dr", `{"spec":{"host":"a","subsets":[{"name":"v1","labels":{"a":"1","b":"2","c":"3","d":"4"}}]},"status":{"observedGeneration":7}}`)); v != v0 {
		t.Error("a status change changed the version")
	}
	if v := version(obj(t, "ns", "dr", `{"spec":{"host":"b"}}`)); v == v0 {
		t.Error("a spec change kept the version")
	}
	o := obj(t, "ns", "dr", base)
	o.Labels = map[string]string{"x": "y"}
	if version(o) == v0 {
		t.Error("a label change kept the version")
	}
	o = obj(t, "ns", "dr", base)
	o.Created = o.Created.Add(time.Second)
	if version(o) == v0 {
		t.Error("a recreated object kept the version")
	}
}

func TestConvertUntypedKindAsStruct(t *testing.T) {
	k := Kind{Collection: "k8s/core/v1/configmaps", Version: "v1", Resource: "configmaps", Kind: "ConfigMap"}
	e, err := Convert(k, obj(t, "ns", "cm", `{"data":{"a":"1"},"status":{"ignored":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := e.Decode()
	var s structpb.Struct
	if err := r.Body.UnmarshalTo(&s); err != nil {
		t.Fatal(err)
	}
	if s.Fields["data"].GetStructValue().Fields["a"].GetStringValue() != "1" || s.Fields["status"] != nil {
		t.Errorf("struct = %v", &s)
	}
}

// FuzzConvert: any JSON content either converts or fails with a clear error; never panics.
func FuzzConvert(f *testing.F) {
	f.Add(`{"spec":{"hosts":["a"],"http":[{"route":[{"destination":{"host":"b"}}]}]}}`, true)
	f.Add(`{"spec":{"hosts":1}}`, true)
	f.Add(`{"data":{"a":[1,2,{"b":null}]}}`, false)
	f.Add(`{"spec":{"http":[{"timeout":"1e400s"}]}}`, true)
	f.Fuzz(func(t *testing.T, content string, typed bool) {
		var c map[string]any
		if json.Unmarshal([]byte(content), &c) != nil {
			return
		}
		k := mustKind(t, "istio/networking/v1alpha3/virtualservices")
		if !typed {
			k = Kind{Collection: "x", Version: "v1", Resource: "xs", Kind: "X"}
		}
		e, err := Convert(k, &Object{Namespace: "ns", Name: "n", Content: c})
		if err == nil && (e.Name != "ns/n" || e.Version == "") {
			t.Fatalf("entry %+v", e)
		}
	})
}

func sprintf(format string, a ...any) string { return fmt.Sprintf(format, a...) }

func sortStrings(s []string) { sort.Strings(s) }

// BenchmarkConvert converts one realistic VirtualService per iteration (cmd/mcpbench prints
// the same work next to a baseline).
func BenchmarkConvert(b *testing.B) {
	k := mustKind(b, vsColl)
	o := obj(b, "shop", "cart", `{"spec":{"hosts":["cart.shop.svc.cluster.local","cart.example.com"],"gateways":["istio-system/gw","mesh"],
		"http":[{"match":[{"uri":{"prefix":"/api/v2"}}],"route":[{"destination":{"host":"cart","subset":"v2"},"weight":10},
		{"destination":{"host":"cart","subset":"v1"},"weight":90}],"timeout":"3s","retries":{"attempts":3,"perTryTimeout":"1s"}}]}}`)
	o.Labels = map[string]string{"app": "cart", "team": "checkout"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Convert(k, o); err != nil {
			b.Fatal(err)
		}
	}
}
