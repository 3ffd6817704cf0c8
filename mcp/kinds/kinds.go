// Package kinds is the vocabulary both sides of meshfed share: the MCP collections of
// Istio's configuration kinds, the Kubernetes resources they come from and the protobuf
// messages their bodies hold. The minion reads objects by it; the hub requests, checks and
// serves collections by it.
//
// It holds data and lookups only: no conversion (the minion's) and no policy (the hub's).
package kinds

import (
	"fmt"
	"sort"
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

func istioKind(group, version, kind, resource, pkg string) Kind {
	area := strings.TrimSuffix(group, ".istio.io")
	return Kind{
		Collection:  fmt.Sprintf("istio/%s/%s/%s", area, version, resource),
		Group:       group,
		Version:     version,
		Resource:    resource,
		Kind:        kind,
		MessageType: fmt.Sprintf("istio.%s.%s.%s", pkg, version, kind),
	}
}

// builtinKinds are the Istio kinds known without configuration.
var builtinKinds = []Kind{
	istioKind("networking.istio.io", "v1alpha3", "VirtualService", "virtualservices", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "DestinationRule", "destinationrules", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "Gateway", "gateways", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "ServiceEntry", "serviceentries", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "Sidecar", "sidecars", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "WorkloadEntry", "workloadentries", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "WorkloadGroup", "workloadgroups", "networking"),
	istioKind("networking.istio.io", "v1alpha3", "EnvoyFilter", "envoyfilters", "networking"),
	istioKind("networking.istio.io", "v1beta1", "ProxyConfig", "proxyconfigs", "networking"),
	istioKind("security.istio.io", "v1beta1", "AuthorizationPolicy", "authorizationpolicies", "security"),
	istioKind("security.istio.io", "v1beta1", "PeerAuthentication", "peerauthentications", "security"),
	istioKind("security.istio.io", "v1beta1", "RequestAuthentication", "requestauthentications", "security"),
	istioKind("telemetry.istio.io", "v1alpha1", "Telemetry", "telemetries", "telemetry"),
	istioKind("extensions.istio.io", "v1alpha1", "WasmPlugin", "wasmplugins", "extensions"),
}

// Builtin returns the built-in collection table, sorted by collection.
func Builtin() []Kind {
	out := append([]Kind(nil), builtinKinds...)
	sort.Slice(out, func(i, j int) bool { return out[i].Collection < out[j].Collection })
	return out
}

// Lookup returns the built-in kind of a collection.
func Lookup(collection string) (Kind, bool) {
	for _, k := range builtinKinds {
		if k.Collection == collection {
			return k, true
		}
	}
	return Kind{}, false
}

// Collections returns the built-in collection names, sorted.
func Collections() []string {
	out := make([]string, 0, len(builtinKinds))
	for _, k := range Builtin() {
		out = append(out, k.Collection)
	}
	return out
}

// Validate checks a kind from configuration and resolves its message type.
func (k Kind) Validate() error {
	switch {
	case k.Collection == "":
		return fmt.Errorf("collection is empty")
	case k.Version == "" || k.Resource == "" || k.Kind == "":
		return fmt.Errorf("collection %s: version, resource and kind are required", k.Collection)
	}
	if k.MessageType != "" {
		if _, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(k.MessageType)); err != nil {
			return fmt.Errorf("collection %s: messageType %q is not a known protobuf message", k.Collection, k.MessageType)
		}
	}
	return nil
}

// ForTypeURL resolves an MCP-over-xDS type URL as istiod names them, "group/version/Kind"
// (networking.istio.io/v1/VirtualService), to the built-in collection of that group and
// kind: every served version of a kind shares one schema, so the version does not matter.
func ForTypeURL(typeURL string) (Kind, bool) {
	parts := strings.Split(typeURL, "/")
	if len(parts) != 3 {
		return Kind{}, false
	}
	for _, k := range builtinKinds {
		if k.Group == parts[0] && k.Kind == parts[2] {
			return k, true
		}
	}
	return Kind{}, false
}
