package mcp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"
)

// Field numbers of istio.mcp.v1alpha1.Resources, Resource and Metadata, as on the wire.
const (
	fieldResourcesSystemVersion = 1
	fieldResourcesCollection    = 2
	fieldResourcesResources     = 3
	fieldResourcesRemoved       = 4
	fieldResourcesNonce         = 5
	fieldResourcesIncremental   = 6

	fieldResourceMetadata = 1
	fieldMetadataName     = 1
	fieldMetadataVersion  = 3
)

var (
	resourceEncodes atomic.Uint64 // resources marshaled by NewEntry
	bodyEncodes     atomic.Uint64 // push bodies assembled by encodeBody
)

// ResourceEncodes reports how many resources this process has marshaled into Entries. The
// engine never marshals a resource itself, so this grows with changes, not with streams.
func ResourceEncodes() uint64 { return resourceEncodes.Load() }

// BodyEncodes reports how many push bodies this process has assembled from Entries. Streams
// that need the same push share one body, so this grows with distinct pushes, not streams.
func BodyEncodes() uint64 { return bodyEncodes.Load() }

// Entry is one resource of a collection, marshaled once. Entries are immutable and shared by
// every stream and snapshot that holds them.
type Entry struct {
	// Name is the resource's Metadata.name: "namespace/name", or "name" if cluster-scoped.
	Name string
	// Version is the resource's Metadata.version. It changes exactly when the content does.
	Version string
	// Encoded is the wire form of the istio.mcp.v1alpha1.Resource. Never modify it.
	Encoded []byte
}

// NewEntry validates r and marshals it once (deterministically) into an Entry.
func NewEntry(r *mcpapi.Resource) (*Entry, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil resource", ErrInvalidResource)
	}
	md := r.GetMetadata()
	if md.GetName() == "" {
		return nil, fmt.Errorf("%w: metadata.name is empty", ErrInvalidResource)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("%w: resource %q: %v", ErrInvalidResource, md.GetName(), err)
	}
	resourceEncodes.Add(1)
	return &Entry{Name: md.GetName(), Version: md.GetVersion(), Encoded: b}, nil
}

// EntryFromBytes wraps an already encoded istio.mcp.v1alpha1.Resource without re-marshaling
// it: only metadata.name and metadata.version are read. b is kept, not copied.
func EntryFromBytes(b []byte) (*Entry, error) {
	name, version, err := scanResourceMeta(b)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, fmt.Errorf("%w: metadata.name is empty", ErrInvalidResource)
	}
	return &Entry{Name: name, Version: version, Encoded: b}, nil
}

// Decode unmarshals the entry into a new Resource.
func (e *Entry) Decode() (*mcpapi.Resource, error) {
	r := new(mcpapi.Resource)
	if err := proto.Unmarshal(e.Encoded, r); err != nil {
		return nil, fmt.Errorf("%w: resource %q: %v", ErrInvalidResource, e.Name, err)
	}
	return r, nil
}

// DecodeEntry checks an encoded Resource as one received from a peer is checked (wire
// format, UTF-8, metadata.name) and returns it as an Entry that keeps b: for a Resource read
// back from where it was kept as received.
func DecodeEntry(b []byte) (*Entry, error) {
	e, _, err := decodeEntry(b)
	return e, err
}

// decodeEntry fully validates an encoded Resource received from a peer (wire format, UTF-8,
// metadata.name) and returns it as an Entry that keeps b, and decoded.
func decodeEntry(b []byte) (*Entry, *mcpapi.Resource, error) {
	r := new(mcpapi.Resource)
	if err := proto.Unmarshal(b, r); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrInvalidResource, err)
	}
	md := r.GetMetadata()
	if md == nil {
		return nil, nil, fmt.Errorf("%w: metadata is missing", ErrInvalidResource)
	}
	if md.GetName() == "" {
		return nil, nil, fmt.Errorf("%w: metadata.name is empty", ErrInvalidResource)
	}
	return &Entry{Name: md.GetName(), Version: md.GetVersion(), Encoded: b}, r, nil
}

// scanResourceMeta reads metadata.name and metadata.version from an encoded Resource.
func scanResourceMeta(b []byte) (name, version string, err error) {
	var md []byte
	if err := forEachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num == fieldResourceMetadata {
			if typ != protowire.BytesType {
				return errors.New("metadata has the wrong wire type")
			}
			md = v // the last occurrence wins, as in proto3 (merging is not needed for strings)
		}
		return nil
	}); err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrInvalidResource, err)
	}
	if md == nil {
		return "", "", fmt.Errorf("%w: metadata is missing", ErrInvalidResource)
	}
	if err := forEachField(md, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch num {
		case fieldMetadataName, fieldMetadataVersion:
			if typ != protowire.BytesType {
				return fmt.Errorf("metadata field %d has the wrong wire type", num)
			}
			if !utf8.Valid(v) {
				return fmt.Errorf("metadata field %d is not valid UTF-8", num)
			}
			if num == fieldMetadataName {
				name = string(v)
			} else {
				version = string(v)
			}
		}
		return nil
	}); err != nil {
		return "", "", fmt.Errorf("%w: metadata: %v", ErrInvalidResource, err)
	}
	return name, version, nil
}

// forEachField walks the top-level fields of an encoded message. For length-delimited fields
// v is the payload; for others it is the raw value bytes.
func forEachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("bad field tag: %v", protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("field number %d out of range", num)
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			payload, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return fmt.Errorf("field %d: %v", num, protowire.ParseError(m))
			}
			v, n = payload, m
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("field %d: %v", num, protowire.ParseError(n))
			}
			v = b[:n]
		}
		if err := fn(num, typ, v); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// bodySize is the encoded size of a push body holding entries and removed.
func entryFieldSize(e *Entry) int {
	return protowire.SizeTag(fieldResourcesResources) + protowire.SizeBytes(len(e.Encoded))
}

func removedFieldSize(name string) int {
	return protowire.SizeTag(fieldResourcesRemoved) + protowire.SizeBytes(len(name))
}

// encodeBody assembles a Resources message without its nonce: the nonce is appended per
// stream when the frame is sent (field order does not matter on the wire).
func encodeBody(collection string, version uint64, entries []*Entry, removed []string, incremental bool) []byte {
	return encodeBodyAs(collection, strconv.FormatUint(version, 10), entries, removed, incremental)
}

// chunkMarker follows the version in the system_version_info of each chunk of a split
// push: "<version>;chunk=<i>/<n>". MCP has no field for it and sinks treat the field as
// informative (Istio's log it), so it is where a sink of this engine learns that more
// chunks of the same version follow (Change.More).
const chunkMarker = ";chunk="

// chunkVersion is the system_version_info of chunk i (1-based) of n.
func chunkVersion(version uint64, i, n int) string {
	return strconv.FormatUint(version, 10) + chunkMarker + strconv.Itoa(i) + "/" + strconv.Itoa(n)
}

// moreChunks reports whether a push's system_version_info says it is a chunk that more
// chunks of the same version follow. Anything else (a plain version, another source's
// text, a malformed marker) is a whole push.
func moreChunks(sysVersion string) bool {
	_, marker, ok := strings.Cut(sysVersion, chunkMarker)
	if !ok {
		return false
	}
	is, ns, ok := strings.Cut(marker, "/")
	if !ok {
		return false
	}
	i, err1 := strconv.Atoi(is)
	n, err2 := strconv.Atoi(ns)
	return err1 == nil && err2 == nil && i >= 1 && i < n
}

func encodeBodyAs(collection, sysVersion string, entries []*Entry, removed []string, incremental bool) []byte {
	size := protowire.SizeTag(fieldResourcesSystemVersion) + protowire.SizeBytes(len(sysVersion)) +
		protowire.SizeTag(fieldResourcesCollection) + protowire.SizeBytes(len(collection))
	for _, e := range entries {
		size += entryFieldSize(e)
	}
	for _, r := range removed {
		size += removedFieldSize(r)
	}
	if incremental {
		size += protowire.SizeTag(fieldResourcesIncremental) + 1
	}
	b := make([]byte, 0, size)
	b = protowire.AppendTag(b, fieldResourcesSystemVersion, protowire.BytesType)
	b = protowire.AppendString(b, sysVersion)
	b = protowire.AppendTag(b, fieldResourcesCollection, protowire.BytesType)
	b = protowire.AppendString(b, collection)
	for _, e := range entries {
		b = protowire.AppendTag(b, fieldResourcesResources, protowire.BytesType)
		b = protowire.AppendBytes(b, e.Encoded)
	}
	for _, r := range removed {
		b = protowire.AppendTag(b, fieldResourcesRemoved, protowire.BytesType)
		b = protowire.AppendString(b, r)
	}
	if incremental {
		b = protowire.AppendTag(b, fieldResourcesIncremental, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	bodyEncodes.Add(1)
	return b
}

// nonceField encodes the nonce field that completes a body into a Resources message.
// Fields of envoy.service.discovery.v3.DiscoveryResponse and google.protobuf.Any. The
// response's nonce is field 5, as in Resources, so one frame type carries both.
const (
	fieldXDSVersionInfo = 1
	fieldXDSResources   = 2
	fieldXDSTypeURL     = 4
	fieldAnyTypeURL     = 1
	fieldAnyValue       = 2
)

// encodeXDSBody encodes a DiscoveryResponse of typeURL holding entries as Any values of
// istio.mcp.v1alpha1.Resource (the entries' bytes, copied once), without a nonce.
func encodeXDSBody(typeURL string, version uint64, entries []*Entry) []byte {
	ver := strconv.FormatUint(version, 10)
	anySize := func(e *Entry) int {
		return protowire.SizeTag(fieldAnyTypeURL) + protowire.SizeBytes(len(ResourceTypeURL)) +
			protowire.SizeTag(fieldAnyValue) + protowire.SizeBytes(len(e.Encoded))
	}
	size := protowire.SizeTag(fieldXDSVersionInfo) + protowire.SizeBytes(len(ver)) +
		protowire.SizeTag(fieldXDSTypeURL) + protowire.SizeBytes(len(typeURL))
	for _, e := range entries {
		size += protowire.SizeTag(fieldXDSResources) + protowire.SizeBytes(anySize(e))
	}
	b := make([]byte, 0, size)
	b = protowire.AppendTag(b, fieldXDSVersionInfo, protowire.BytesType)
	b = protowire.AppendString(b, ver)
	for _, e := range entries {
		b = protowire.AppendTag(b, fieldXDSResources, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(anySize(e)))
		b = protowire.AppendTag(b, fieldAnyTypeURL, protowire.BytesType)
		b = protowire.AppendString(b, ResourceTypeURL)
		b = protowire.AppendTag(b, fieldAnyValue, protowire.BytesType)
		b = protowire.AppendBytes(b, e.Encoded)
	}
	b = protowire.AppendTag(b, fieldXDSTypeURL, protowire.BytesType)
	b = protowire.AppendString(b, typeURL)
	bodyEncodes.Add(1)
	return b
}

func nonceField(nonce string) []byte {
	b := make([]byte, 0, protowire.SizeTag(fieldResourcesNonce)+protowire.SizeBytes(len(nonce)))
	b = protowire.AppendTag(b, fieldResourcesNonce, protowire.BytesType)
	return protowire.AppendString(b, nonce)
}

// push is one decoded Resources message as a sink receives it. Resources keep the bytes they
// arrived in.
type push struct {
	SystemVersionInfo string
	Collection        string
	Entries           []*Entry
	Resources         []*mcpapi.Resource // Entries decoded, same order
	Removed           []string
	Nonce             string
	Incremental       bool
}

// parsePush decodes a Resources message. Each resource is checked only for what the engine
// needs (metadata.name, metadata.version); its bytes are kept as received. Errors name the
// field and, for resources, their index.
func parsePush(b []byte) (*push, error) {
	p := new(push)
	idx := 0
	var resErr error // the first bad resource; parsing goes on so the nonce is still found
	err := forEachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num >= fieldResourcesSystemVersion && num <= fieldResourcesNonce {
			if typ != protowire.BytesType {
				return fmt.Errorf("field %d has wire type %d, want bytes", num, typ)
			}
			if num != fieldResourcesResources && !utf8.Valid(v) {
				return fmt.Errorf("field %d is not valid UTF-8", num)
			}
		}
		switch num {
		case fieldResourcesSystemVersion:
			p.SystemVersionInfo = string(v)
		case fieldResourcesCollection:
			p.Collection = string(v)
		case fieldResourcesResources:
			e, r, err := decodeEntry(v)
			if err != nil {
				if resErr == nil {
					resErr = fmt.Errorf("resources[%d]: %w", idx, err)
				}
			} else {
				p.Entries = append(p.Entries, e)
				p.Resources = append(p.Resources, r)
			}
			idx++
		case fieldResourcesRemoved:
			p.Removed = append(p.Removed, string(v))
		case fieldResourcesNonce:
			p.Nonce = string(v)
		case fieldResourcesIncremental:
			if typ != protowire.VarintType {
				return fmt.Errorf("field incremental has wire type %d, want varint", typ)
			}
			x, _ := protowire.ConsumeVarint(v)
			p.Incremental = x != 0
		}
		return nil
	})
	if err != nil {
		return p, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return p, resErr
}
