package mcpv1alpha1

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	mcpapi "istio.io/api/mcp/v1alpha1"
)

// The gRPC paths and field numbers below are Istio's (istio/api mcp/v1alpha1/mcp.proto,
// 2019-2020). Changing any of them breaks wire compatibility with Istio 1.4-1.8.
func TestMethodPaths(t *testing.T) {
	for got, want := range map[string]string{
		ResourceSource_EstablishResourceStream_FullMethodName: "/istio.mcp.v1alpha1.ResourceSource/EstablishResourceStream",
		ResourceSink_EstablishResourceStream_FullMethodName:   "/istio.mcp.v1alpha1.ResourceSink/EstablishResourceStream",
	} {
		if got != want {
			t.Errorf("method path %q, want %q", got, want)
		}
	}
	for _, sd := range []struct {
		want, got string
		streams   int
	}{
		{"istio.mcp.v1alpha1.ResourceSource", ResourceSource_ServiceDesc.ServiceName, len(ResourceSource_ServiceDesc.Streams)},
		{"istio.mcp.v1alpha1.ResourceSink", ResourceSink_ServiceDesc.ServiceName, len(ResourceSink_ServiceDesc.Streams)},
	} {
		if sd.got != sd.want || sd.streams != 1 {
			t.Errorf("service %s: name %s, %d streams", sd.want, sd.got, sd.streams)
		}
	}
	for _, d := range []struct {
		desc   string
		client bool
		server bool
	}{
		{"ResourceSource", ResourceSource_ServiceDesc.Streams[0].ClientStreams, ResourceSource_ServiceDesc.Streams[0].ServerStreams},
		{"ResourceSink", ResourceSink_ServiceDesc.Streams[0].ClientStreams, ResourceSink_ServiceDesc.Streams[0].ServerStreams},
	} {
		if !d.client || !d.server {
			t.Errorf("%s.EstablishResourceStream is not bidirectional", d.desc)
		}
	}
	sfd := File_mcp_v1alpha1_mcp_proto.Services()
	check := func(svc, in, out string) {
		m := sfd.ByName(protoreflect.Name(svc)).Methods().ByName("EstablishResourceStream")
		if m == nil || string(m.Input().FullName()) != in || string(m.Output().FullName()) != out {
			t.Errorf("%s.EstablishResourceStream: %v", svc, m)
		}
	}
	check("ResourceSource", "istio.mcp.v1alpha1.RequestResources", "istio.mcp.v1alpha1.Resources")
	check("ResourceSink", "istio.mcp.v1alpha1.Resources", "istio.mcp.v1alpha1.RequestResources")
}

func TestFieldNumbers(t *testing.T) {
	type field struct {
		name   string
		number protoreflect.FieldNumber
		kind   protoreflect.Kind
		list   bool
		msg    string // full name of the message type, for message fields
	}
	want := map[protoreflect.MessageDescriptor][]field{
		(&SinkNode{}).ProtoReflect().Descriptor(): {
			{"id", 1, protoreflect.StringKind, false, ""},
			{"annotations", 2, protoreflect.MessageKind, false, "istio.mcp.v1alpha1.SinkNode.AnnotationsEntry"},
		},
		(&RequestResources{}).ProtoReflect().Descriptor(): {
			{"sink_node", 1, protoreflect.MessageKind, false, "istio.mcp.v1alpha1.SinkNode"},
			{"collection", 2, protoreflect.StringKind, false, ""},
			{"initial_resource_versions", 3, protoreflect.MessageKind, false, "istio.mcp.v1alpha1.RequestResources.InitialResourceVersionsEntry"},
			{"response_nonce", 4, protoreflect.StringKind, false, ""},
			{"error_detail", 5, protoreflect.MessageKind, false, "google.rpc.Status"},
			{"incremental", 6, protoreflect.BoolKind, false, ""},
		},
		(&Resources{}).ProtoReflect().Descriptor(): {
			{"system_version_info", 1, protoreflect.StringKind, false, ""},
			{"collection", 2, protoreflect.StringKind, false, ""},
			{"resources", 3, protoreflect.MessageKind, true, "istio.mcp.v1alpha1.Resource"},
			{"removed_resources", 4, protoreflect.StringKind, true, ""},
			{"nonce", 5, protoreflect.StringKind, false, ""},
			{"incremental", 6, protoreflect.BoolKind, false, ""},
		},
		(&mcpapi.Resource{}).ProtoReflect().Descriptor(): {
			{"metadata", 1, protoreflect.MessageKind, false, "istio.mcp.v1alpha1.Metadata"},
			{"body", 2, protoreflect.MessageKind, false, "google.protobuf.Any"},
		},
		(&mcpapi.Metadata{}).ProtoReflect().Descriptor(): {
			{"name", 1, protoreflect.StringKind, false, ""},
			{"create_time", 2, protoreflect.MessageKind, false, "google.protobuf.Timestamp"},
			{"version", 3, protoreflect.StringKind, false, ""},
			{"labels", 4, protoreflect.MessageKind, false, "istio.mcp.v1alpha1.Metadata.LabelsEntry"},
			{"annotations", 5, protoreflect.MessageKind, false, "istio.mcp.v1alpha1.Metadata.AnnotationsEntry"},
		},
	}
	for md, fields := range want {
		if md.Fields().Len() != len(fields) {
			t.Errorf("%s has %d fields, want %d", md.FullName(), md.Fields().Len(), len(fields))
		}
		for _, f := range fields {
			fd := md.Fields().ByName(protoreflect.Name(f.name))
			if fd == nil {
				t.Errorf("%s.%s missing", md.FullName(), f.name)
				continue
			}
			if fd.Number() != f.number || fd.Kind() != f.kind || fd.IsList() != f.list {
				t.Errorf("%s.%s = #%d %v list=%v, want #%d %v list=%v", md.FullName(), f.name, fd.Number(), fd.Kind(), fd.IsList(), f.number, f.kind, f.list)
			}
			if f.msg != "" && string(fd.Message().FullName()) != f.msg {
				t.Errorf("%s.%s type %s, want %s", md.FullName(), f.name, fd.Message().FullName(), f.msg)
			}
		}
		if md.ParentFile().Package() != "istio.mcp.v1alpha1" {
			t.Errorf("%s in package %s", md.FullName(), md.ParentFile().Package())
		}
	}
}
