package durable

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	mcpapi "istio.io/api/mcp/v1alpha1"
)

// The decoders of what the file holds: the format marker, a cluster's metadata, a resource
// record. Each must never panic on any bytes, and what it accepts must round-trip.

func FuzzDecodeFormat(f *testing.F) {
	for _, s := range []string{"1", "2", "01", "0", "", "1.0", " 1", "-1", "+1", "18446744073709551615", "18446744073709551616", "1\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeFormat(b)
		if err != nil {
			return
		}
		if v == 0 || !bytes.Equal(encodeFormat(v), b) {
			t.Fatalf("%q decodes as %d, which encodes as %q", b, v, encodeFormat(v))
		}
		if (checkFormat(v) == nil) != (v == FormatVersion) {
			t.Fatalf("checkFormat(%d) = %v", v, checkFormat(v))
		}
	})
}

func metaEqual(a, b Meta) bool {
	return a.LastContact.Equal(b.LastContact) && a.LastContact.Location() == b.LastContact.Location() && a.Synced == b.Synced && a.Epoch == b.Epoch && a.Tenant == b.Tenant && a.Connected == b.Connected
}

func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{{}, {Synced: true}, {Epoch: 1<<64 - 1}, {LastContact: time.Date(2026, 5, 6, 7, 8, 9, 123456789, time.FixedZone("", -7*3600)), Synced: true, Epoch: 42}, {Tenant: "acme"}} {
		b, err := encodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{``, `null`, `{}`, `{"v":3}`, `{"v":1,"tenant":"acme"}`, `{"v":2,"tenant":"acme"}`, `{"v":1} {}`, `{"v":1,"x":1}`, `{"v":1,"epoch":-1}`, `{"v":1,"epoch":1.5}`,
		`{"v":1,"lastContact":"0000-01-01T00:00:00+01:00"}`, `{"v":1,"lastContact":"9999-12-31T23:59:59-01:00"}`,
		`{"v":1,"LASTCONTACT":"2026-01-01T00:00:00Z","v":1}`, `{"v":1,"lastContact":null,"synced":true}`, `{"v":1,"lastContact":"0001-01-01T00:00:00Z"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		if !m.LastContact.IsZero() && m.LastContact.Location() != time.UTC {
			t.Fatalf("%q decodes with lastContact in %v, want UTC", b, m.LastContact.Location())
		}
		enc, err := encodeMeta(m)
		if err != nil {
			t.Fatalf("%q decodes as %+v, which does not encode: %v", b, m, err)
		}
		m2, err := decodeMeta(enc)
		if err != nil || !metaEqual(m, m2) {
			t.Fatalf("%q decodes as %+v, encodes as %q, which decodes as %+v (%v)", b, m, enc, m2, err)
		}
		if enc2, _ := encodeMeta(m2); !bytes.Equal(enc, enc2) {
			t.Fatalf("the encoding is not stable: %q, then %q", enc, enc2)
		}
	})
}

// FuzzEncodeMeta goes the other way: every Meta the hub can set either encodes and reads
// back the same, or is refused for a year outside 0–9999.
func FuzzEncodeMeta(f *testing.F) {
	f.Add(int64(0), int64(0), false, uint64(0), "")
	f.Add(time.Now().Unix(), int64(123456789), true, uint64(7), "acme")
	f.Add(int64(-62167219200), int64(0), false, uint64(1), "") // year 0
	f.Add(int64(253402300800), int64(0), false, uint64(1), "") // year 10000
	f.Fuzz(func(t *testing.T, sec, nsec int64, synced bool, epoch uint64, tenant string) {
		m := Meta{LastContact: time.Unix(sec, nsec), Synced: synced, Epoch: epoch, Tenant: tenant}
		if sec == 0 && nsec == 0 {
			m.LastContact = time.Time{}
		}
		enc, err := encodeMeta(m)
		if err != nil {
			if y := m.LastContact.UTC().Year(); y >= 0 && y <= 9999 {
				t.Fatalf("%+v (year %d) does not encode: %v", m, y, err)
			}
			return
		}
		got, err := decodeMeta(enc)
		if err != nil || !got.LastContact.Equal(m.LastContact) || got.Synced != synced || got.Epoch != epoch || got.Tenant != tenant && utf8.ValidString(tenant) {
			t.Fatalf("%+v encodes as %q, which decodes as %+v (%v)", m, enc, got, err)
		}
	})
}

func FuzzDecodeRecord(f *testing.F) {
	good := func(name string, r *mcpapi.Resource) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	full := good("ns/a", &mcpapi.Resource{
		Metadata: &mcpapi.Metadata{Name: "ns/a", Version: "v1", CreateTime: timestamppb.Now(), Labels: map[string]string{"a": "b"}},
		Body:     &anypb.Any{TypeUrl: "type.googleapis.com/x", Value: []byte("body")},
	})
	f.Add("ns/a", full)
	f.Add("ns/b", full) // stored under another name
	f.Add("ns/a", good("ns/a", &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: "ns/a"}}))
	f.Add("ns/a", good("", &mcpapi.Resource{Body: &anypb.Any{}}))                                                 // no metadata
	f.Add("ns/a", append(full[:len(full):len(full)], full...))                                                    // metadata twice: merged
	f.Add("ns/a", full[:len(full)/2])                                                                             // truncated
	f.Add("ns/\xff", protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\x0a\x04ns/\xff")) // not UTF-8
	f.Add("x", []byte{})
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		e, err := decodeRecord(name, b, new(mcpapi.Resource))
		if err != nil {
			return
		}
		if e.Name != name || len(e.Encoded) != len(b) || (len(b) > 0 && &e.Encoded[0] != &b[0]) {
			t.Fatalf("decodeRecord(%q) = %q, %d bytes: want the name and the bytes themselves", name, e.Name, len(e.Encoded))
		}
		// What Load returns is what the hub reads back: the Entry decodes, to the same name
		// and version, and its bytes are the record's, unchanged.
		r, err := e.Decode()
		if err != nil || r.GetMetadata().GetName() != name || r.GetMetadata().GetVersion() != e.Version {
			t.Fatalf("the entry of %q does not read back: %v, %v", name, r, err)
		}
	})
}

// FuzzOpenState: the loader on any file content — arbitrary bytes, and the fuzzer's
// mutations of a good file — returns an error, a Reset or a State, and never panics, faults
// or hangs; the Store it returns then takes a write and closes (the repair runs).
func FuzzOpenState(f *testing.F) {
	good := smallFile(f)
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte("hello"))
	f.Add(good[:len(good)/2])
	for _, at := range []int{4096*2 + 100, 4096*3 + 50, 4096*4 + 200} { // a bit in each of a few pages
		if at < len(good) {
			b := bytes.Clone(good)
			b[at] ^= 0x10
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "clusters.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig()
		s, st, err := openState(path, nil, cfg)
		if err != nil {
			return
		}
		if st == nil || st.Clusters == nil || st.Damaged == nil {
			t.Fatalf("OpenState returned no error and no state: %+v", st)
		}
		s.Put("east", vs, "ns/after", entryBytes("ns/after"))
		_ = s.Close()
	})
}

func entryBytes(name string) []byte {
	b, err := proto.Marshal(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: "1"}, Body: &anypb.Any{TypeUrl: "type.googleapis.com/x", Value: bytes.Repeat([]byte{'x'}, 300)}})
	if err != nil {
		panic(err)
	}
	return b
}
