package kinds

import "testing"

func TestBuiltin(t *testing.T) {
	all := Builtin()
	if len(all) != 14 || len(Collections()) != 14 {
		t.Fatalf("%d built-in kinds, want 14", len(all))
	}
	for i, k := range all {
		if err := k.Validate(); err != nil {
			t.Errorf("%s: %v", k.Collection, err)
		}
		if got, ok := Lookup(k.Collection); !ok || got != k {
			t.Errorf("Lookup(%s) = %+v, %v", k.Collection, got, ok)
		}
		if i > 0 && all[i-1].Collection >= k.Collection {
			t.Errorf("not sorted at %s", k.Collection)
		}
	}
	vs, _ := Lookup("istio/networking/v1alpha3/virtualservices")
	if vs.GVR().String() != "networking.istio.io/v1alpha3, Resource=virtualservices" || vs.MessageType != "istio.networking.v1alpha3.VirtualService" {
		t.Errorf("virtualservices = %+v", vs)
	}
	if err := (Kind{Collection: "c", Version: "v1", Resource: "r", Kind: "K", MessageType: "no.Such"}).Validate(); err == nil {
		t.Error("an unknown message type validated")
	}
}
