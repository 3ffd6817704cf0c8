// Package kinds is the vocabulary both sides of meshfed share: the MCP collections of
// Istio's configuration kinds, the Kubernetes resources they come from and the protobuf
// messages their bodies hold. The minion reads objects by it; the hub requests, checks and
// serves collections by it. Every name a user types for a collection (the programs'
// configuration files, the hub's commands and admin API) and every type URL istiod
// requests resolves through a Table: the built-in kinds and the configured ones.
// Table.Check tells whether a received resource is one of its collection's kind: a
// Kubernetes name of the kind's scope, a body of the kind's message, decoded strictly.
//
// It holds data, lookups and that schema check only: no conversion (the minion's) and no
// policy (the hub's: who may publish what).
package kinds

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"k8s.io/apimachinery/pkg/runtime/schema"

	// Istio's types, registered so specs decode into them by name.
	_ "istio.io/api/extensions/v1alpha1"
	_ "istio.io/api/networking/v1alpha3"
	_ "istio.io/api/networking/v1beta1"
	_ "istio.io/api/security/v1beta1"
	_ "istio.io/api/telemetry/v1alpha1"
)

// Kind maps an MCP collection to the Kubernetes resource it comes from and the protobuf
// message its spec decodes into.
type Kind struct {
	// Collection is the MCP collection name, e.g. istio/networking/v1alpha3/virtualservices.
	Collection string `json:"collection"`
	// Group, Version and Resource name the Kubernetes API resource (plural, lower case).
	Group    string `json:"group"`
	Version  string `json:"version"`
	Resource string `json:"resource"`
	// Kind is the Kubernetes kind, e.g. VirtualService.
	Kind string `json:"kind"`
	// ShortNames are the kind's short names as its CRD declares them (kubectl get vs), lower
	// case; users may type them wherever a collection is asked for.
	ShortNames []string `json:"shortNames,omitempty"`
	// ClusterScoped kinds have no namespace.
	ClusterScoped bool `json:"clusterScoped,omitempty"`
	// MessageType is the full protobuf name the spec decodes into strictly. Empty: the
	// object's content (all top-level fields but apiVersion, kind, metadata and status)
	// travels as google.protobuf.Struct.
	MessageType string `json:"messageType,omitempty"`
}

// GVR returns the Kubernetes group/version/resource.
func (k Kind) GVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: k.Resource}
}

// GVK returns the Kubernetes group/version/kind.
func (k Kind) GVK() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: k.Group, Version: k.Version, Kind: k.Kind}
}

// TypeURL is the MCP-over-xDS type URL istiod requests the kind by: group/version/Kind, with
// "core" for the core group, as Istio writes a GroupVersionKind.
func (k Kind) TypeURL() string {
	return typeURLGroup(k.Group) + "/" + k.Version + "/" + k.Kind
}

// typeURLGroup is how a type URL writes a group: Istio names the empty (core) group "core".
func typeURLGroup(group string) string {
	if group == "" {
		return "core"
	}
	return group
}

func istioKind(group, version, kind, resource, pkg string, shortNames ...string) Kind {
	area := strings.TrimSuffix(group, ".istio.io")
	return Kind{
		Collection:  fmt.Sprintf("istio/%s/%s/%s", area, version, resource),
		Group:       group,
		Version:     version,
		Resource:    resource,
		Kind:        kind,
		ShortNames:  shortNames,
		MessageType: fmt.Sprintf("istio.%s.%s.%s", pkg, version, kind),
	}
}

// builtinKinds are the Istio kinds known without configuration: every kind istiod 1.28-1.31
// requests over MCP-over-xDS (Istio's collections.Pilot; istiod also asks for
// core/v1alpha1/MeshConfig, which no collection carries and is answered empty). Short names
// are those of Istio's CRDs (manifests/charts/base/files/crd-all.gen.yaml); kinds whose CRD
// declares none have none.
var builtinKinds = []Kind{
	istioKind("networking.istio.io", "v1alpha3", "VirtualService", "virtualservices", "networking", "vs"),
	istioKind("networking.istio.io", "v1alpha3", "DestinationRule", "destinationrules", "networking", "dr"),
	istioKind("networking.istio.io", "v1alpha3", "Gateway", "gateways", "networking", "gw"),
	istioKind("networking.istio.io", "v1alpha3", "ServiceEntry", "serviceentries", "networking", "se"),
	istioKind("networking.istio.io", "v1alpha3", "Sidecar", "sidecars", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "WorkloadEntry", "workloadentries", "networking", "we"),
	istioKind("networking.istio.io", "v1alpha3", "WorkloadGroup", "workloadgroups", "networking", "wg"),
	istioKind("networking.istio.io", "v1alpha3", "EnvoyFilter", "envoyfilters", "networking"),
	istioKind("networking.istio.io", "v1beta1", "ProxyConfig", "proxyconfigs", "networking"),
	istioKind("security.istio.io", "v1beta1", "AuthorizationPolicy", "authorizationpolicies", "security", "ap"),
	istioKind("security.istio.io", "v1beta1", "PeerAuthentication", "peerauthentications", "security", "pa"),
	istioKind("security.istio.io", "v1beta1", "RequestAuthentication", "requestauthentications", "security", "ra"),
	istioKind("telemetry.istio.io", "v1alpha1", "Telemetry", "telemetries", "telemetry", "telemetry"),
	istioKind("extensions.istio.io", "v1alpha1", "WasmPlugin", "wasmplugins", "extensions"),
	istioKind("extensions.istio.io", "v1alpha1", "TrafficExtension", "trafficextensions", "extensions"),
}

// builtin is the table of the built-in kinds alone.
var builtin = func() *Table {
	t, err := NewTable(nil)
	if err != nil {
		panic("kinds: the built-in table: " + err.Error())
	}
	return t
}()

// Builtin returns the built-in collection table, sorted by collection.
func Builtin() []Kind { return builtin.Kinds() }

// Lookup returns the built-in kind of a collection.
func Lookup(collection string) (Kind, bool) { return builtin.Lookup(collection) }

// Collections returns the built-in collection names, sorted.
func Collections() []string { return builtin.Collections() }

// Resolve resolves a name a user typed to a built-in kind (see Table.Resolve).
func Resolve(name string) (Kind, error) { return builtin.Resolve(name) }

// ForTypeURL resolves an MCP-over-xDS type URL to a built-in kind (see Table.ForTypeURL).
func ForTypeURL(typeURL string) (Kind, bool) { return builtin.ForTypeURL(typeURL) }

// Validate checks a kind from configuration and resolves its message type.
func (k Kind) Validate() error {
	switch {
	case k.Collection == "":
		return fmt.Errorf("collection is empty")
	case strings.ContainsAny(k.Collection, ", \t\n"):
		return fmt.Errorf("collection %q: no spaces or commas (collections are typed in comma-separated lists)", k.Collection)
	case k.Version == "" || k.Resource == "" || k.Kind == "":
		return fmt.Errorf("collection %s: version, resource and kind are required", k.Collection)
	}
	for i, s := range k.ShortNames {
		if s == "" || s != strings.ToLower(s) || strings.ContainsAny(s, "/., \t\n") {
			return fmt.Errorf("collection %s: shortNames[%d]: %q is not a short name (lower case, no \"/\", \".\", spaces or commas)", k.Collection, i, s)
		}
	}
	if k.MessageType != "" {
		if _, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(k.MessageType)); err != nil {
			return fmt.Errorf("collection %s: messageType %q is not a known protobuf message", k.Collection, k.MessageType)
		}
	}
	return nil
}
