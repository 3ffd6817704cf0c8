package minion

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/mcp"
)

// ErrInvalidSpec marks an object whose content does not decode into its kind's message.
var ErrInvalidSpec = errors.New("invalid spec")

// droppedAnnotations are not published: they repeat the object (kubectl's last applied
// configuration) and would only make every resource bigger.
var droppedAnnotations = map[string]bool{
	lastApplied: true,
}

const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// Object is a configuration object as read from Kubernetes or a file.
type Object struct {
	Namespace   string
	Name        string
	Created     time.Time
	Labels      map[string]string
	Annotations map[string]string
	// Content is the object's top-level fields other than apiVersion, kind and metadata,
	// as decoded from JSON or YAML (map[string]any, []any, string, float64/int64, bool, nil).
	Content map[string]any
}

// ResourceName is the MCP resource name: "namespace/name", or "name" without a namespace.
func (o *Object) ResourceName() string {
	if o.Namespace == "" {
		return o.Name
	}
	return o.Namespace + "/" + o.Name
}

// Convert turns an object of kind k into an MCP Entry: the body is decoded strictly into the
// kind's message (or a Struct) and marshaled once, deterministically; the version is a hash
// of everything published, so it changes exactly when the published content does.
func Convert(k Kind, o *Object) (*mcp.Entry, error) {
	if o.Name == "" {
		return nil, fmt.Errorf("%s: metadata.name is empty", k.Kind)
	}
	if !k.ClusterScoped && o.Namespace == "" {
		return nil, fmt.Errorf("%s %s: namespace is empty", k.Kind, o.Name)
	}
	msg, err := decodeContent(k, o.Content)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", k.Kind, o.ResourceName(), err)
	}
	body := new(anypb.Any)
	if err := anypb.MarshalFrom(body, msg, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, fmt.Errorf("%s %s: marshal body: %w", k.Kind, o.ResourceName(), err)
	}
	annotations := make(map[string]string, len(o.Annotations))
	for key, v := range o.Annotations {
		if !droppedAnnotations[key] {
			annotations[key] = v
		}
	}
	md := &mcpapi.Metadata{
		Name:        o.ResourceName(),
		Labels:      o.Labels,
		Annotations: annotations,
	}
	if !o.Created.IsZero() {
		md.CreateTime = timestamppb.New(o.Created)
	}
	md.Version = contentVersion(body, md.CreateTime, o.Labels, annotations)
	return mcp.NewEntry(&mcpapi.Resource{Metadata: md, Body: body})
}

// decodeContent decodes an object's content into its kind's message: the spec, strictly
// (unknown fields and wrong types are errors), or the whole content as a Struct.
func decodeContent(k Kind, content map[string]any) (proto.Message, error) {
	if k.MessageType == "" {
		s, err := structpb.NewStruct(withoutStatus(content))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
		}
		return s, nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(k.MessageType))
	if err != nil {
		return nil, fmt.Errorf("message type %s: %w", k.MessageType, err)
	}
	msg := mt.New().Interface()
	spec, ok := content["spec"]
	if !ok || spec == nil {
		return msg, nil // an empty spec is valid for every Istio kind
	}
	if _, isMap := spec.(map[string]any); !isMap {
		return nil, fmt.Errorf("%w: spec is a %T, want an object", ErrInvalidSpec, spec)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, msg); err != nil {
		// Only now, on the error path, one value per line: the error's line names a path.
		indented, _ := json.MarshalIndent(spec, "", " ")
		if err2 := (protojson.UnmarshalOptions{}).Unmarshal(indented, mt.New().Interface()); err2 != nil {
			err = err2
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalidSpec, explainJSONError("spec", indented, err.Error()))
	}
	return msg, nil
}

func withoutStatus(content map[string]any) map[string]any {
	if _, ok := content["status"]; !ok {
		return content
	}
	out := make(map[string]any, len(content))
	for k, v := range content {
		if k != "status" {
			out[k] = v
		}
	}
	return out
}

// contentVersion hashes the published content: body, creation time, labels and annotations.
// A recreated object therefore gets a new version even with the same spec.
func contentVersion(body *anypb.Any, created *timestamppb.Timestamp, labels, annotations map[string]string) string {
	h := sha256.New()
	h.Write([]byte(body.GetTypeUrl()))
	h.Write([]byte{0})
	h.Write(body.GetValue())
	fmt.Fprintf(h, "\x00%d.%d", created.GetSeconds(), created.GetNanos())
	for _, m := range []map[string]string{labels, annotations} {
		h.Write([]byte{1})
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(m[k]), m[k])
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
