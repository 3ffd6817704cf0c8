package load

import (
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Watch is the change the controller armed: resource Name at Version.
type Watch struct {
	Name, Version string
}

// Frame is what a sink keeps of one received Resources message. The codec scans it where
// gRPC holds it: resources are counted and their bodies skipped by length, and only the
// armed resource's name and version are looked at, so a full state of 1,000 resources to
// 5,000 sinks costs the load process a walk over the fields, not a decode.
type Frame struct {
	// watch is read when the message is scanned (not when RecvMsg is called: a sink
	// blocked in RecvMsg while the controller arms a change must still see it).
	watch *atomic.Pointer[Watch]
	// At is when the message had been received whole (since the process's base time).
	At          time.Duration
	Bytes       int
	Nonce       string
	Incremental bool
	// Added counts the resources it carries, Removed its removed names.
	Added, Removed int
	// Matched is the armed watch when the message carries its resource at its version.
	Matched *Watch
}

var base = time.Now()

// now is the time since the process started, monotonic.
func now() time.Duration { return time.Since(base) }

func (f *Frame) scan(b []byte) {
	f.At, f.Bytes = now(), len(b)
	var w *Watch
	if f.watch != nil {
		w = f.watch.Load()
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		switch {
		case num == 3 && typ == protowire.BytesType:
			f.Added++
			if w != nil && f.Matched == nil {
				if r, _ := protowire.ConsumeBytes(b); carries(r, w) {
					f.Matched = w
				}
			}
		case num == 4:
			f.Removed++
		case num == 5 && typ == protowire.BytesType:
			v, _ := protowire.ConsumeBytes(b)
			f.Nonce = string(v)
		case num == 6 && typ == protowire.VarintType:
			v, _ := protowire.ConsumeVarint(b)
			f.Incremental = v != 0
		}
		b = b[m:]
	}
}

// carries reports whether the encoded Resource r is w's resource at w's version: its
// metadata (field 1) has name (1) and version (3).
func carries(r []byte, w *Watch) bool {
	md := field(r, 1)
	return md != nil && string(field(md, 1)) == w.Name && string(field(md, 3)) == w.Version
}

// field returns the bytes of the first length-delimited field num of message b, nil if
// there is none.
func field(b []byte, num protowire.Number) []byte {
	for len(b) > 0 {
		n0, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if n0 == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			return v
		}
		m := protowire.ConsumeFieldValue(n0, typ, b)
		if m < 0 {
			return nil
		}
		b = b[m:]
	}
	return nil
}
