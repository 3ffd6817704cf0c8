package load

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// RawMsg is a message sent or received as bytes: B, then Tail (the nonce field), sent
// without copying: a server sends every stream the same encoded body and only the nonce
// differs (protobuf fields may come in any order).
type RawMsg struct{ B, Tail []byte }

// RawCodec sends a RawMsg as its bytes, receives into a RawMsg as the bytes (copied) and
// into a Frame by scanning them in place; any other message goes through proto.
type RawCodec struct{}

var protoCodec = encoding.GetCodecV2("proto")

func (RawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*RawMsg); ok {
		return mem.BufferSlice{mem.SliceBuffer(r.B), mem.SliceBuffer(r.Tail)}, nil
	}
	return protoCodec.Marshal(v)
}

func (RawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *RawMsg:
		m.B = data.Materialize()
		return nil
	case *Frame:
		// gRPC frees data once Unmarshal returns: scan it now, into a pooled buffer when it
		// came in several pieces, and keep nothing of it.
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		m.scan(buf.ReadOnlyData())
		return nil
	}
	return protoCodec.Unmarshal(data, v)
}

func (RawCodec) Name() string { return "proto" }

// NonceField is the encoded field 5 (nonce) of a Resources message, to send as a RawMsg's
// Tail.
func NonceField(nonce string) []byte {
	b := protowire.AppendTag(nil, 5, protowire.BytesType)
	return protowire.AppendString(b, nonce)
}

// ScanNonce finds field 5 (nonce) of a Resources message without decoding the rest.
func ScanNonce(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return ""
		}
		if num == 5 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			return string(v)
		}
		b = b[m:]
	}
	return ""
}
