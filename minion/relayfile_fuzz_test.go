package minion

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshfed/meshfed/mcp"
)

// FuzzRelayStateFile opens any bytes as the relay's state file. Opening never panics or
// faults, and the relay always ends up holding a file: either it loads what the file holds
// (every record decoded, under its own name, of a relayed collection), or it finds the file
// damaged, moves it aside as it was, and holds a new, empty one. The file held takes a
// write, or is found damaged by it and moved aside in turn.
func FuzzRelayStateFile(f *testing.F) {
	for _, seed := range relayFileSeeds(f) {
		f.Add(seed)
	}
	colls := mcp.NewCache(vsColl, drColl).Collections()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "relay.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		rf := newRelayFile(path, colls, slog.New(slog.DiscardHandler), nil)
		defer rf.close()
		state, whole, ok := rf.open()
		if !ok {
			t.Fatalf("no file held: %+v", rf.status())
		}
		moved, _ := filepath.Glob(path + ".corrupt-*")
		switch {
		case len(moved) > 1:
			t.Fatalf("moved aside %d times", len(moved))
		case len(moved) == 1:
			if kept, err := os.ReadFile(moved[0]); err != nil || !bytes.Equal(kept, b) {
				t.Fatalf("the file moved aside is not the file as it was (%v)", err)
			}
			if len(state) != 0 || whole {
				t.Fatalf("a damaged file loaded %d collections (whole %v)", len(state), whole)
			}
		default:
			for c, entries := range state {
				if !strings.Contains(","+strings.Join(colls, ",")+",", ","+c+",") {
					t.Fatalf("loaded collection %q, which is not relayed", c)
				}
				for _, e := range entries {
					if r, err := e.Decode(); err != nil || r.GetMetadata().GetName() != e.Name || e.Name == "" {
						t.Fatalf("loaded an entry that does not read back: %q, %v", e.Name, err)
					}
				}
			}
		}
		// A write may reach damage the reads did not (pages only a write touches): the file is
		// then moved aside too, and the next open holds a new one.
		push := func(c string) *mcp.Change {
			return &mcp.Change{Collection: c, Entries: []*mcp.Entry{vsEntry(t, "ns/n", "1", "n")}}
		}
		for _, c := range colls {
			if rf.write(push(c)) {
				continue
			}
			if st := rf.status(); st.MovedAside == "" || len(moved) > 0 {
				t.Fatalf("a write failed without finding the file damaged: %+v", st)
			}
			if _, _, ok := rf.open(); !ok || !rf.write(push(c)) {
				t.Fatalf("the file opened after a damaged one was moved aside does not take a write: %+v", rf.status())
			}
		}
	})
}

// relayFileSeeds are files the relay writes, and the same damaged.
func relayFileSeeds(f *testing.F) [][]byte {
	dir := f.TempDir()
	file := func(name string, whole bool) []byte {
		path := filepath.Join(dir, name)
		writeRelayFile(f, path, keptState(f), whole)
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	good := file("whole", true)
	valued := file("valued", true)
	valueWhereABucketBelongs(f, valued)
	flipped := bytes.Clone(good)
	for i := 2 * pageSize; i < int64(len(flipped)); i += 97 {
		flipped[i] ^= 0x10
	}
	return [][]byte{
		good,
		file("partial", false),
		valued,
		flipped,
		good[:len(good)/2],
		good[:2*pageSize+100],
		nil,
		[]byte("not a bbolt file"),
	}
}

// valueWhereABucketBelongs turns the first top-level bucket of the bbolt file b into a plain
// value, as one flipped bit does: the root page's first leaf element loses its bucket flag.
// bbolt reads the file as before, but its buckets' methods fail on that name.
func valueWhereABucketBelongs(tb testing.TB, b []byte) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "f")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		tb.Fatal(err)
	}
	var root int64
	_ = db.View(func(tx *bolt.Tx) error { root = int64(tx.Cursor().Bucket().Root()); return nil })
	db.Close()
	page := b[root*pageSize:]
	const leafPage, bucketLeaf = 0x02, 0x01
	if binary.NativeEndian.Uint16(page[8:]) != leafPage || binary.NativeEndian.Uint32(page[16:]) != bucketLeaf {
		tb.Fatalf("the root page is not a leaf of buckets")
	}
	binary.NativeEndian.PutUint32(page[16:], 0) // the first element's flags, after the page header
}
