package kinds

import (
	"reflect"
	"strings"
	"testing"
)

func TestBuiltin(t *testing.T) {
	all := Builtin()
	if len(all) != 15 || len(Collections()) != 15 {
		t.Fatalf("%d built-in kinds, want 15", len(all))
	}
	for i, k := range all {
		if err := k.Validate(); err != nil {
			t.Errorf("%s: %v", k.Collection, err)
		}
		if got, ok := Lookup(k.Collection); !ok || !reflect.DeepEqual(got, k) {
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
	te, _ := Lookup("istio/extensions/v1alpha1/trafficextensions")
	if te.GVK().String() != "extensions.istio.io/v1alpha1, Kind=TrafficExtension" || te.MessageType != "istio.extensions.v1alpha1.TrafficExtension" {
		t.Errorf("trafficextensions = %+v", te)
	}
	if err := (Kind{Collection: "c", Version: "v1", Resource: "r", Kind: "K", MessageType: "no.Such"}).Validate(); err == nil {
		t.Error("an unknown message type validated")
	}
}

// istiodTypeURLs are the type URLs istiod 1.31 requests over MCP-over-xDS: Istio's
// collections.Pilot (pkg/adsc ConfigInitialRequests), each at the version of its schema, and
// core/v1alpha1/MeshConfig. 1.28 and 1.29 request the same but TrafficExtension.
var istiodTypeURLs = []string{
	"security.istio.io/v1/AuthorizationPolicy",
	"networking.istio.io/v1/DestinationRule",
	"networking.istio.io/v1alpha3/EnvoyFilter",
	"networking.istio.io/v1/Gateway",
	"security.istio.io/v1/PeerAuthentication",
	"networking.istio.io/v1beta1/ProxyConfig",
	"security.istio.io/v1/RequestAuthentication",
	"networking.istio.io/v1/ServiceEntry",
	"networking.istio.io/v1/Sidecar",
	"telemetry.istio.io/v1/Telemetry",
	"extensions.istio.io/v1alpha1/TrafficExtension",
	"networking.istio.io/v1/VirtualService",
	"extensions.istio.io/v1alpha1/WasmPlugin",
	"networking.istio.io/v1/WorkloadEntry",
	"networking.istio.io/v1/WorkloadGroup",
}

// Every kind istiod requests is built in; MeshConfig is no collection (answered empty).
func TestEveryKindIstiodRequestsIsBuiltIn(t *testing.T) {
	seen := map[string]bool{}
	for _, url := range istiodTypeURLs {
		k, ok := ForTypeURL(url)
		if !ok {
			t.Errorf("%s: not built in", url)
			continue
		}
		if !strings.HasSuffix(url, "/"+k.Kind) || !strings.HasPrefix(url, k.Group+"/") {
			t.Errorf("%s resolves to %s", url, k.Collection)
		}
		seen[k.Collection] = true
	}
	if len(seen) != len(Builtin()) {
		t.Errorf("istiod requests %d built-in kinds of %d", len(seen), len(Builtin()))
	}
	for _, url := range []string{"core/v1alpha1/MeshConfig", "networking.istio.io//VirtualService", "networking.istio.io/v1/virtualservice", "vs", "a/b/c/d"} {
		if k, ok := ForTypeURL(url); ok {
			t.Errorf("ForTypeURL(%q) = %s", url, k.Collection)
		}
	}
	for _, k := range Builtin() {
		if got, ok := ForTypeURL(k.TypeURL()); !ok || got.Collection != k.Collection {
			t.Errorf("ForTypeURL(%s) = %s, %v", k.TypeURL(), got.Collection, ok)
		}
	}
}

// extra is a kind a configuration adds, in the core group, with a short name.
var extra = Kind{Collection: "k8s/core/v1/configmaps", Version: "v1", Resource: "configmaps", Kind: "ConfigMap", ShortNames: []string{"cm"}}

func TestResolve(t *testing.T) {
	const vs, te = "istio/networking/v1alpha3/virtualservices", "istio/extensions/v1alpha1/trafficextensions"
	tbl, err := NewTable([]Kind{extra})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{
		{vs, vs},
		{"Istio/Networking/V1alpha3/VirtualServices", vs},
		{"networking.istio.io/v1/VirtualService", vs},
		{"networking.istio.io/v1alpha3/VirtualService", vs},
		{"networking.istio.io/v1beta1/virtualservices", vs},
		{"networking.istio.io/v2/VirtualService", vs}, // any version: one schema per kind
		{"VirtualService", vs},
		{"virtualService", vs},
		{"VIRTUALSERVICE", vs},
		{"virtualservices", vs},
		{"virtualservice", vs},
		{"vs", vs},
		{"VS", vs},
		{" vs ", vs},
		{"virtualservices.networking.istio.io", vs},
		{"VirtualService.networking.istio.io", vs},
		{"vs.networking.istio.io", vs},
		{"dr", "istio/networking/v1alpha3/destinationrules"},
		{"gw", "istio/networking/v1alpha3/gateways"},
		{"Gateway", "istio/networking/v1alpha3/gateways"},
		{"se", "istio/networking/v1alpha3/serviceentries"},
		{"we", "istio/networking/v1alpha3/workloadentries"},
		{"wg", "istio/networking/v1alpha3/workloadgroups"},
		{"ap", "istio/security/v1beta1/authorizationpolicies"},
		{"pa", "istio/security/v1beta1/peerauthentications"},
		{"ra", "istio/security/v1beta1/requestauthentications"},
		{"telemetry", "istio/telemetry/v1alpha1/telemetries"},
		{"security.istio.io/v1/AuthorizationPolicy", "istio/security/v1beta1/authorizationpolicies"},
		{"TrafficExtension", te},
		{"trafficextensions", te},
		{"extensions.istio.io/v1alpha1/TrafficExtension", te},
		{"trafficextension.extensions.istio.io", te},
		{"k8s/core/v1/configmaps", extra.Collection},
		{"ConfigMap", extra.Collection},
		{"cm", extra.Collection},
		{"core/v1/ConfigMap", extra.Collection},
		{"configmaps", extra.Collection},
	} {
		k, err := tbl.Resolve(tc.name)
		if err != nil || k.Collection != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %s", tc.name, k.Collection, err, tc.want)
		}
	}
	for _, tc := range []struct{ name, want string }{
		{"vss", `unknown collection "vss": known: istio/extensions/v1alpha1/trafficextensions (TrafficExtension); `},
		{"vss", `istio/networking/v1alpha3/virtualservices (VirtualService, vs); `},
		{"vss", `k8s/core/v1/configmaps (ConfigMap, cm)`},
		{"", "empty collection name: known: "},
		{"networking.istio.io/v1", `unknown collection "networking.istio.io/v1"`},
		{"networking.istio.io//VirtualService", "unknown collection"},
		{"gateway.networking.k8s.io/v1/Gateway", "unknown collection"},
		{"istio/networking/v1alpha3/virtualservice", "unknown collection"},
		{"vs.security.istio.io", "unknown collection"},
	} {
		if _, err := tbl.Resolve(tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Resolve(%q): %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
	// Without the extra kind, its names are unknown.
	if _, err := Resolve("cm"); err == nil || strings.Contains(err.Error(), "configmaps") {
		t.Errorf("built-in Resolve(cm): %v", err)
	}
}

// Two kinds answering to one name: the name is an error naming both; their collections
// and Kind.group still resolve.
func TestResolveAmbiguous(t *testing.T) {
	k8sGateway := Kind{Collection: "k8s/gateway.networking.k8s.io/v1/gateways", Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways", Kind: "Gateway"}
	tbl, err := NewTable([]Kind{k8sGateway})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Gateway", "gateways", "gateway"} {
		_, err := tbl.Resolve(name)
		if err == nil || !strings.Contains(err.Error(), "is ambiguous") ||
			!strings.Contains(err.Error(), "istio/networking/v1alpha3/gateways (Gateway.networking.istio.io)") ||
			!strings.Contains(err.Error(), "k8s/gateway.networking.k8s.io/v1/gateways (Gateway.gateway.networking.k8s.io)") {
			t.Errorf("Resolve(%q): %v", name, err)
		}
	}
	for name, want := range map[string]string{
		"gw":                                   "istio/networking/v1alpha3/gateways",
		"Gateway.networking.istio.io":          "istio/networking/v1alpha3/gateways",
		"networking.istio.io/v1/Gateway":       "istio/networking/v1alpha3/gateways",
		"gateways.gateway.networking.k8s.io":   k8sGateway.Collection,
		"gateway.networking.k8s.io/v1/Gateway": k8sGateway.Collection,
		k8sGateway.Collection:                  k8sGateway.Collection,
	} {
		if k, err := tbl.Resolve(name); err != nil || k.Collection != want {
			t.Errorf("Resolve(%q) = %s, %v; want %s", name, k.Collection, err, want)
		}
	}
	if k, ok := tbl.ForTypeURL("gateway.networking.k8s.io/v1beta1/Gateway"); !ok || k.Collection != k8sGateway.Collection {
		t.Errorf("ForTypeURL = %s, %v", k.Collection, ok)
	}
}

func TestResolveAll(t *testing.T) {
	got, err := mustTable(t).ResolveAll("collections", []string{"vs", "networking.istio.io/v1/DestinationRule", "istio/networking/v1alpha3/gateways"})
	if err != nil || strings.Join(got, ",") != "istio/networking/v1alpha3/virtualservices,istio/networking/v1alpha3/destinationrules,istio/networking/v1alpha3/gateways" {
		t.Errorf("ResolveAll = %v, %v", got, err)
	}
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"vs", "dr", "vss"}, `collections[2]: unknown collection "vss": known: `},
		{[]string{"vs", "VirtualService"}, `collections[1]: "VirtualService" is istio/networking/v1alpha3/virtualservices, already listed as collections[0] ("vs")`},
	} {
		if _, err := mustTable(t).ResolveAll("collections", tc.names); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ResolveAll(%q): %v, want %q", tc.names, err, tc.want)
		}
	}
	tbl := mustTable(t)
	if err := tbl.CheckCanonical("collections", Collections()); err != nil {
		t.Error(err)
	}
	if err := tbl.CheckCanonical("collections", []string{"istio/networking/v1alpha3/gateways", "vs"}); err == nil ||
		err.Error() != `collections[1]: "vs": want the collection name, istio/networking/v1alpha3/virtualservices` {
		t.Errorf("CheckCanonical: %v", err)
	}
}

func mustTable(t *testing.T, extra ...Kind) *Table {
	t.Helper()
	tbl, err := NewTable(extra)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func TestNewTable(t *testing.T) {
	// An extra kind with a built-in collection replaces it.
	wasm := Kind{Collection: "istio/extensions/v1alpha1/wasmplugins", Group: "extensions.istio.io", Version: "v1alpha1", Resource: "wasmplugins", Kind: "WasmPlugin", ShortNames: []string{"wp"}}
	tbl := mustTable(t, wasm, extra)
	if got := tbl.Kinds(); len(got) != 16 || len(tbl.Collections()) != 16 {
		t.Errorf("%d kinds", len(got))
	}
	if k, err := tbl.Resolve("wp"); err != nil || k.MessageType != "" {
		t.Errorf("replaced built-in: %+v, %v", k, err)
	}
	if k, ok := tbl.Lookup(extra.Collection); !ok || k.Kind != "ConfigMap" {
		t.Errorf("Lookup(extra) = %+v", k)
	}
	for _, tc := range []struct {
		extra []Kind
		want  string
	}{
		{[]Kind{extra, {Collection: "c", Version: "v1", Resource: "r"}}, "kinds[1]: collection c: version, resource and kind are required"},
		{[]Kind{extra, extra}, `kinds[1]: collection "k8s/core/v1/configmaps" is also kinds[0]'s`},
		{[]Kind{{Collection: "istio/networking/v1/virtualservices", Group: "networking.istio.io", Version: "v1", Resource: "virtualservices", Kind: "VirtualService"}},
			"kinds[0]: VirtualService.networking.istio.io is both collection istio/networking/v1/virtualservices and istio/networking/v1alpha3/virtualservices"},
		{[]Kind{{Collection: "vs", Version: "v1", Resource: "things", Kind: "Thing"}}, `kinds[0]: collection "vs" is also a name of istio/networking/v1alpha3/virtualservices (VirtualService.networking.istio.io)`},
		{[]Kind{{Collection: "Istio/Networking/V1alpha3/VirtualServices", Version: "v1", Resource: "things", Kind: "Thing"}}, "kinds[0]: collection"},
		{[]Kind{{Collection: "networking.istio.io/v1/virtualservices", Version: "v1", Resource: "things", Kind: "Thing"}}, "is also a name of istio/networking/v1alpha3/virtualservices"},
		{[]Kind{{Collection: "a,b", Version: "v1", Resource: "r", Kind: "K"}}, "kinds[0]: collection \"a,b\": no spaces or commas"},
		{[]Kind{{Collection: "c", Version: "v1", Resource: "r", Kind: "K", ShortNames: []string{"C"}}}, "kinds[0]: collection c: shortNames[0]"},
	} {
		if _, err := NewTable(tc.extra); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewTable(%+v): %v, want %q", tc.extra, err, tc.want)
		}
	}
}

// FuzzResolve: any input resolves to one of the table's kinds or is an error that quotes it
// (or lists the known names); a collection resolves to itself.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"vs", "VirtualService", "networking.istio.io/v1/VirtualService", "virtualservices.networking.istio.io",
		"istio/networking/v1alpha3/virtualservices", "vss", "", "a/b/c", "//", "cm", "Gateway", "core/v1/ConfigMap", " gw "} {
		f.Add(s)
	}
	k8sGateway := Kind{Collection: "k8s/gateway.networking.k8s.io/v1/gateways", Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways", Kind: "Gateway"}
	tbl, err := NewTable([]Kind{extra, k8sGateway})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k, err := tbl.Resolve(name)
		if err != nil {
			if !strings.Contains(err.Error(), "known: ") && !strings.Contains(err.Error(), "ambiguous") {
				t.Fatalf("Resolve(%q): %v", name, err)
			}
			return
		}
		got, ok := tbl.Lookup(k.Collection)
		if !ok || !reflect.DeepEqual(got, k) {
			t.Fatalf("Resolve(%q) = %+v, not in the table", name, k)
		}
		if again, err := tbl.Resolve(k.Collection); err != nil || again.Collection != k.Collection {
			t.Fatalf("Resolve(%q) = %s, but its collection resolves to %s, %v", name, k.Collection, again.Collection, err)
		}
		if u, ok := tbl.ForTypeURL(name); ok && u.Collection != k.Collection {
			t.Fatalf("%q: Resolve says %s, ForTypeURL %s", name, k.Collection, u.Collection)
		}
	})
}
