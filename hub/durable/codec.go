package durable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/mcp"
)

// The file's layout. Three top-level buckets and nothing else, so a file that is not this
// package's (a relay's state file, another program's bbolt file) is refused, not misread:
//
//	format   → "version" → FormatVersion in decimal
//	clusters → cluster → collection → resource name → the Resource as received
//	meta     → cluster → Meta (encodeMeta)
var (
	formatBucket   = []byte("format")
	formatKey      = []byte("version")
	clustersBucket = []byte("clusters")
	metaBucket     = []byte("meta")
)

// FormatVersion is the version of the file's layout this package writes and reads. A change
// of layout or of an encoding increments it, and a file of another version is refused
// (OpenOrReset moves it aside) rather than read as if it were this one; a migration, when one
// is written, is an explicit step from a named older version.
const FormatVersion = 1

// encodeFormat is the format marker's value.
func encodeFormat(v uint64) []byte { return strconv.AppendUint(nil, v, 10) }

// decodeFormat reads the format marker: a positive decimal number in its one canonical
// spelling (no sign, no leading zero, no space), so that what decodes re-encodes to the same
// bytes.
func decodeFormat(b []byte) (uint64, error) {
	if len(b) == 0 {
		return 0, errors.New("the format marker is empty")
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("the format marker %q is not a decimal number", b)
		}
	}
	if b[0] == '0' {
		return 0, fmt.Errorf("the format marker %q is not a positive number in canonical form", b)
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the format marker %q is out of range", b)
	}
	return v, nil
}

// checkFormat refuses every version but FormatVersion, saying which side is newer.
func checkFormat(v uint64) error {
	switch {
	case v == FormatVersion:
		return nil
	case v > FormatVersion:
		return fmt.Errorf("format version %d is newer than this hub's (%d): the file was written by a newer meshfed, and is not read as if it were this version", v, FormatVersion)
	default:
		return fmt.Errorf("format version %d is older than this hub's (%d) and there is no migration from it", v, FormatVersion)
	}
}

// Meta is what the hub keeps of a cluster besides its resources.
type Meta struct {
	// LastContact is when a session of the cluster was last open (stored to the nanosecond,
	// in UTC; its year must lie in 0–9999).
	LastContact time.Time
	// Synced: the state is complete (a session had delivered every collection).
	Synced bool
	// Epoch is the epoch of the session that wrote the state, with replicas (0 on a single
	// hub).
	Epoch uint64
	// Tenant is the tenant the cluster belonged to ("" without tenants): a restart whose
	// configuration no longer has the cluster keeps it under that tenant until an operator
	// confirms its removal.
	Tenant string
	// Connected: a session of the cluster was open when this was written. A restart after
	// an unclean stop (State.Unclean) cannot tell whether the cluster's last changes, made
	// while it was connected, reached the file.
	Connected bool
}

// metaVersion is the version of Meta's encoding, inside the record itself so that a record
// can be told from another encoding without trusting the file's marker alone. Version 1
// (before Tenant and Connected) is still read.
const metaVersion = 2

// metaRecord is Meta's encoding: JSON, so that a file can be read with bbolt's own tool when
// something goes wrong; small enough that its cost does not matter (a cluster's metadata is
// written when a session opens, delivers or closes, not per resource).
type metaRecord struct {
	V           int       `json:"v"`
	LastContact time.Time `json:"lastContact,omitzero"`
	Synced      bool      `json:"synced,omitempty"`
	Epoch       uint64    `json:"epoch,omitempty"`
	Tenant      string    `json:"tenant,omitempty"`
	Connected   bool      `json:"connected,omitempty"`
}

// encodeMeta encodes m; it fails only for a LastContact whose year is outside 0–9999.
func encodeMeta(m Meta) ([]byte, error) {
	r := metaRecord{V: metaVersion, Synced: m.Synced, Epoch: m.Epoch, Tenant: m.Tenant, Connected: m.Connected}
	if !m.LastContact.IsZero() {
		r.LastContact = m.LastContact.UTC()
		if y := r.LastContact.Year(); y < 0 || y > 9999 {
			return nil, fmt.Errorf("lastContact %s is outside the years 0–9999", m.LastContact)
		}
	}
	return json.Marshal(r)
}

// decodeMeta reads a cluster's metadata strictly: its version must be this package's, and
// unknown fields or trailing bytes are refused (a newer encoding changes the version).
func decodeMeta(b []byte) (Meta, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r metaRecord
	if err := dec.Decode(&r); err != nil {
		return Meta{}, fmt.Errorf("the metadata is not its JSON encoding: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Meta{}, errors.New("the metadata has bytes after its JSON value")
	}
	switch {
	case r.V != 1 && r.V != metaVersion:
		return Meta{}, fmt.Errorf("the metadata's encoding is version %d; this hub reads versions 1 to %d", r.V, metaVersion)
	case r.V == 1 && (r.Tenant != "" || r.Connected):
		return Meta{}, errors.New("the metadata's encoding is version 1, which has no tenant nor connected")
	}
	m := Meta{Synced: r.Synced, Epoch: r.Epoch, Tenant: r.Tenant, Connected: r.Connected}
	if !r.LastContact.IsZero() {
		m.LastContact = r.LastContact.UTC()
		if y := m.LastContact.Year(); y < 0 || y > 9999 {
			return Meta{}, fmt.Errorf("the metadata's lastContact %s is outside the years 0–9999", r.LastContact)
		}
	}
	return m, nil
}

// decodeRecord checks a stored resource as the hub checks one received at ingest
// (mcp's decodeEntry): the bytes decode as an MCP Resource (wire format, UTF-8), with
// metadata and a name, and the name is the key it is stored under. Its Entry keeps b. r is
// scratch space, reused between records.
func decodeRecord(name string, b []byte, r *mcpapi.Resource) (*mcp.Entry, error) {
	if err := proto.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%w: %v", mcp.ErrInvalidResource, err)
	}
	md := r.GetMetadata()
	switch {
	case md == nil:
		return nil, fmt.Errorf("%w: metadata is missing", mcp.ErrInvalidResource)
	case md.GetName() != name:
		return nil, fmt.Errorf("the resource stored under this name is named %q", md.GetName())
	}
	return &mcp.Entry{Name: name, Version: md.GetVersion(), Encoded: b}, nil
}
