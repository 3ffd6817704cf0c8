package durable

import (
	"bytes"
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshfed/meshfed/internal/testkit/testwait"
	"github.com/meshfed/meshfed/mcp"
)

func TestRoundTrip(t *testing.T) {
	path := statePath(t)
	s := openT(t, path, nil, testConfig())
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the file's mode: %v %v, want 0600", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("the directory's mode: %v %v, want 0700", st.Mode(), err)
	}
	if got := load(t, s); len(got) != 0 {
		t.Fatalf("a new file loads %v, want nothing", got)
	}

	t0 := time.Date(2026, 3, 4, 5, 6, 7, 890123456, time.FixedZone("X", 3600))
	a2 := entry(t, "shop/a", "2", 100)
	s.Put("east", vs, "shop/a", entry(t, "shop/a", "1", 100).Encoded)
	s.Apply("east", vs, []*mcp.Entry{entry(t, "shop/b", "1", 10), entry(t, "shop/c", "1", 10)}, nil)
	s.Apply("east", vs, []*mcp.Entry{a2}, []string{"shop/c"}) // an update and a removal, one unit
	s.Put("east", dr, "shop/d", entry(t, "shop/d", "1", 10).Encoded)
	s.SetMeta("east", Meta{LastContact: t0, Synced: true, Epoch: 3})
	s.Put("west", vs, "web/x", entry(t, "web/x", "7", 10).Encoded)
	s.SetMeta("west", Meta{LastContact: t0.Add(time.Hour)})
	s.Put("gone", vs, "x/y", entry(t, "x/y", "1", 10).Encoded)
	s.SetMeta("gone", Meta{Synced: true})
	flush(t, s)
	s.Remove("east", dr, "shop/d") // the collection is empty now: it is not in the file
	s.DropCluster("gone")
	s.SetMeta("metaonly", Meta{Synced: true, Epoch: 1})
	flush(t, s)
	if st := s.Stats(); st.Queued != 0 || st.Batches < 2 || st.Failing || st.LastCommit.IsZero() || st.FileSize == 0 {
		t.Errorf("stats after the flushes: %+v", st)
	}

	got := reload(t, s)
	res, meta := flat(got)
	wantRes := map[string]string{"east|" + vs + "|shop/a": "2", "east|" + vs + "|shop/b": "1", "west|" + vs + "|web/x": "7"}
	if !maps.Equal(res, wantRes) {
		t.Errorf("resources: %v, want %v", res, wantRes)
	}
	wantMeta := map[string]Meta{"east": {LastContact: t0, Synced: true, Epoch: 3}, "west": {LastContact: t0.Add(time.Hour)}, "metaonly": {Synced: true, Epoch: 1}}
	if !maps.EqualFunc(meta, wantMeta, func(a, b Meta) bool {
		return a.LastContact.Equal(b.LastContact) && a.Synced == b.Synced && a.Epoch == b.Epoch
	}) {
		t.Errorf("metadata: %v, want %v", meta, wantMeta)
	}
	if _, ok := got["east"].Collections[dr]; ok {
		t.Errorf("east's emptied collection is still in the file")
	}
	e := got["east"].Collections[vs]["shop/a"]
	if e.Name != "shop/a" || e.Version != "2" || !bytes.Equal(e.Encoded, a2.Encoded) {
		t.Errorf("east's shop/a loads as %s/%s (%d bytes), want the bytes put", e.Name, e.Version, len(e.Encoded))
	}
	if got["east"].LastContact.Location() != time.UTC {
		t.Errorf("lastContact loads in %v, want UTC", got["east"].LastContact.Location())
	}
}

// gate blocks the writer inside its transaction while closed: a slow disk.
type gate struct {
	mu      sync.Mutex
	release chan struct{} // nil: open
	waiting atomic.Int32
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release == nil {
		g.release = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release != nil {
		close(g.release)
		g.release = nil
	}
}

func (g *gate) wait() error {
	g.mu.Lock()
	ch := g.release
	g.mu.Unlock()
	if ch != nil {
		g.waiting.Add(1)
		<-ch
		g.waiting.Add(-1)
	}
	return nil
}

// blockWriter closes g and waits until the writer is held in a commit (it writes a key of
// its own to get there), so that what the test enqueues next is one batch.
func blockWriter(t *testing.T, s *Store, g *gate) {
	t.Helper()
	g.close()
	s.SetMeta("trigger", Meta{})
	testwait.For(t, 5*time.Second, "the writer held in its commit", func() bool { return g.waiting.Load() == 1 })
}

func TestDropInABatch(t *testing.T) {
	g := &gate{}
	cfg := testConfig()
	cfg.beforeCommit = g.wait
	s := openT(t, statePath(t), nil, cfg)
	s.Put("c", vs, "n1", entry(t, "n1", "1", 10).Encoded)
	s.Put("c", dr, "n4", entry(t, "n4", "1", 10).Encoded)
	s.SetMeta("c", Meta{Epoch: 1})
	flush(t, s)

	blockWriter(t, s, g)
	s.Put("c", vs, "n3", entry(t, "n3", "1", 10).Encoded) // superseded by the drop
	s.DropCluster("c")
	s.Put("c", vs, "n2", entry(t, "n2", "1", 10).Encoded) // after the drop: kept
	s.SetMeta("c", Meta{Epoch: 9})
	s.Put("d", vs, "n", entry(t, "n", "1", 10).Encoded) // put, then dropped in the same batch
	s.SetMeta("d", Meta{Epoch: 2})
	s.DropCluster("d")
	g.open()
	flush(t, s)

	res, meta := flat(reload(t, s))
	if want := map[string]string{"c|" + vs + "|n2": "1"}; !maps.Equal(res, want) {
		t.Errorf("resources: %v, want %v", res, want)
	}
	if _, ok := meta["d"]; ok || meta["c"].Epoch != 9 {
		t.Errorf("metadata: %v, want c's epoch 9 and no d", meta)
	}
}

func TestRefusedWrites(t *testing.T) {
	log, logs := newLogs(t)
	s := openT(t, statePath(t), log, testConfig())
	good := entry(t, "ns/n", "1", 10).Encoded
	s.Put("east", vs, "", good)
	s.Put("east", vs, "ns/empty", nil)
	s.Put(strings.Repeat("c", bolt.MaxKeySize+1), vs, "ns/n", good)
	s.Apply("east", vs, []*mcp.Entry{{Name: "", Encoded: good}}, nil)
	s.SetMeta("east", Meta{LastContact: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	s.DropCluster("")
	s.Put("east", vs, "ns/n", good) // the batch is not poisoned by the refused ones
	flush(t, s)
	if st := s.Stats(); st.Refused != 6 || st.Failures != 0 {
		t.Errorf("stats: %+v, want 6 refused and no failure", st)
	}
	if res, _ := flat(load(t, s)); len(res) != 1 {
		t.Errorf("loaded %v, want the one good write", res)
	}
	if n := logs.count("refused"); n != 4 {
		t.Errorf("%d refusal lines logged, want one per kind (4)", n)
	}
}

func TestClosed(t *testing.T) {
	s := openT(t, statePath(t), nil, testConfig())
	s.Put("east", vs, "ns/n", entry(t, "ns/n", "1", 10).Encoded)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Put("east", vs, "ns/m", entry(t, "ns/m", "1", 10).Encoded)
	if st := s.Stats(); st.Dropped != 1 || st.Queued != 0 || st.Written != 1 {
		t.Errorf("stats after Close: %+v, want the write before it written and the one after dropped", st)
	}
	if _, err := s.Load(); !errors.Is(err, ErrClosed) {
		t.Errorf("Load after Close: %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

func TestLocked(t *testing.T) {
	path := statePath(t)
	openT(t, path, nil, testConfig())
	// It returns (the test would hang otherwise) and says it gave up after the configured
	// lock timeout: that the timeout is the one applied is behaviour, how long it took is not.
	_, err := open(path, nil, testConfig())
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), path) {
		t.Fatalf("a second Open: %v, want ErrLocked naming %s", err, path)
	}
	if want := "gave up after " + testConfig().lockTimeout.String(); !strings.Contains(err.Error(), want) {
		t.Errorf("a second Open: %v, want it to say %q", err, want)
	}
	if _, _, reset, err := openOrReset(path, nil, testConfig()); !errors.Is(err, ErrLocked) || reset != nil {
		t.Errorf("OpenOrReset on a locked file: %v, %v; want ErrLocked and no reset", reset, err)
	}
	assertNoCorruptCopies(t, path)
}

func TestNotAFile(t *testing.T) {
	path := statePath(t)
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := open(path, nil, testConfig())
	var ce *CorruptError
	if err == nil || errors.As(err, &ce) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open on a directory: %v, want an error naming it that is not a CorruptError", err)
	}
	if _, _, reset, err := openOrReset(path, nil, testConfig()); err == nil || reset != nil {
		t.Errorf("OpenOrReset on a directory: %v, %v; want the error and no reset", reset, err)
	}
	assertNoCorruptCopies(t, path)
}

func assertNoCorruptCopies(t *testing.T, path string) {
	t.Helper()
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
		t.Errorf("moved aside although not corrupt: %v", m)
	}
}

// goodFile writes a state file holding a few resources of cluster east, and returns its path.
func goodFile(t *testing.T, resources int) string {
	t.Helper()
	path := statePath(t)
	s := openT(t, path, nil, testConfig())
	for i := range resources {
		n := "ns/r" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		s.Put("east", vs, n, entry(t, n, "1", 1000).Encoded)
	}
	s.SetMeta("east", Meta{Synced: true})
	flush(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// edit changes a state file with bbolt itself, as something other than this package.
func edit(t testing.TB, path string, f func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(f); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func putRaw(path []string, v []byte) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(path[0]))
		if err != nil {
			return err
		}
		for _, p := range path[1 : len(path)-1] {
			if b, err = b.CreateBucketIfNotExists([]byte(p)); err != nil {
				return err
			}
		}
		return b.Put([]byte(path[len(path)-1]), v)
	}
}

func TestCorruptFiles(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T) string
		want []string // in the error, besides the path
	}{
		{"garbage", func(t *testing.T) string {
			path := statePath(t)
			b := make([]byte, 64<<10)
			r := rand.New(rand.NewPCG(1, 2))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			writeFile(t, path, b)
			return path
		}, []string{"not a bbolt file"}},
		{"a few bytes", func(t *testing.T) string {
			path := statePath(t)
			writeFile(t, path, []byte("hello"))
			return path
		}, []string{"5 bytes", "truncated"}},
		{"truncated", func(t *testing.T) string {
			path := goodFile(t, 300)
			st, _ := os.Stat(path)
			if err := os.Truncate(path, st.Size()/2); err != nil {
				t.Fatal(err)
			}
			return path
		}, []string{"truncated", "its metadata says"}},
		{"pages overwritten", func(t *testing.T) string {
			path := goodFile(t, 300)
			b, _ := os.ReadFile(path)
			for i := 4 * 4096; i < len(b); i++ { // the tree's pages, not the meta pages
				b[i] = 0xa5
			}
			writeFile(t, path, b)
			return path
		}, []string{"the freelist's, is not a freelist page"}},
		{"the root page overwritten", func(t *testing.T) string {
			path := goodFile(t, 300)
			var page uint64
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = db.View(func(tx *bolt.Tx) error {
				page = uint64(tx.Cursor().Bucket().Root()) // the root bucket's page: the meta page's root
				return nil
			})
			ps := db.Info().PageSize
			db.Close()
			overwritePage(t, path, int64(page), int64(ps))
			return path
		}, []string{"the root bucket's tree", "says it is page"}}, // walkTree, before bbolt reads it
		{"a collection's page overwritten", func(t *testing.T) string {
			path := goodFile(t, 300)
			var page uint64
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = db.View(func(tx *bolt.Tx) error {
				page = uint64(tx.Bucket(clustersBucket).Bucket([]byte("east")).Bucket([]byte(vs)).Root())
				return nil
			})
			ps := db.Info().PageSize
			db.Close()
			overwritePage(t, path, int64(page), int64(ps))
			return path
		}, []string{`cluster "east", collection "` + vs + `": unreadable: its tree is damaged`}},
		{"a record that is not a resource", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"clusters", "east", vs, "ns/bad"}, []byte("not a resource")))
			return path
		}, []string{`cluster "east", collection "` + vs + `", resource "ns/bad"`, "invalid resource"}},
		{"a record under another name", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"clusters", "east", vs, "ns/bad"}, entry(t, "ns/other", "1", 10).Encoded))
			return path
		}, []string{`resource "ns/bad"`, `named "ns/other"`}},
		{"bad metadata", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"meta", "east"}, []byte(`{"v":1,"epoch":"x"}`)))
			return path
		}, []string{`cluster "east": metadata`, "JSON"}},
		{"metadata of a newer encoding", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"meta", "east"}, []byte(`{"v":3}`)))
			return path
		}, []string{`cluster "east": metadata`, "version 3"}},
		{"a newer format", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"format", "version"}, []byte("2")))
			return path
		}, []string{"format version 2 is newer than this hub's (1)"}},
		{"a bad format marker", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"format", "version"}, []byte("1.0")))
			return path
		}, []string{`format marker "1.0"`}},
		{"another program's bbolt file", func(t *testing.T) string { // a relay's state file
			path := statePath(t)
			_ = os.MkdirAll(filepath.Dir(path), 0o700)
			edit(t, path, putRaw([]string{"collection/" + vs, "ns/n"}, entry(t, "ns/n", "1", 10).Encoded))
			return path
		}, []string{"not a meshfed hub state file"}},
		{"an unexpected bucket", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"tenants", "x"}, []byte("y")))
			return path
		}, []string{`unexpected top-level bucket "tenants"`}},
		{"a value where a collection belongs", func(t *testing.T) string {
			path := goodFile(t, 3)
			edit(t, path, putRaw([]string{"clusters", "east", "odd"}, []byte("y")))
			return path
		}, []string{`cluster "east", collection "odd": a value where a collection's bucket belongs`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.make(t)
			orig, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := open(path, nil, testConfig())
			if err == nil {
				_, err = s.Load()
				_ = s.Close()
			}
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("Open and Load: %v, want a CorruptError", err)
			}
			for _, w := range append([]string{"state file " + path + ": "}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error %q does not say %q", err, w)
				}
			}

			log, logs := newLogs(t)
			s, state, reset, err := openOrReset(path, log, testConfig())
			if err != nil {
				t.Fatalf("OpenOrReset: %v", err)
			}
			defer s.Close()
			var re *ResetError
			if !errors.As(reset, &re) || !strings.Contains(reset.Error(), re.MovedTo) || !strings.Contains(reset.Error(), tc.want[0]) {
				t.Fatalf("OpenOrReset's reset: %v, want a ResetError saying why and where the file went", reset)
			}
			if !strings.HasPrefix(re.MovedTo, path+".corrupt-") {
				t.Errorf("moved to %s, want %s.corrupt-<time>", re.MovedTo, path)
			}
			if kept, err := os.ReadFile(re.MovedTo); err != nil || !bytes.Equal(kept, orig) {
				t.Errorf("the file moved aside is not the corrupt file as it was (%v)", err)
			}
			if len(state) != 0 || logs.count("moved aside", re.MovedTo) != 1 {
				t.Errorf("after a reset: state %v, and the reset logged %d times (want empty, once)", state, logs.count("moved aside"))
			}
			s.Put("east", vs, "ns/n", entry(t, "ns/n", "1", 10).Encoded)
			flush(t, s)
			if res, _ := flat(reload(t, s)); len(res) != 1 {
				t.Errorf("the new file holds %v, want the one write", res)
			}
		})
	}
}

func overwritePage(t *testing.T, path string, page, size int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := page * size; i < (page+1)*size; i++ {
		b[i] = 0xa5
	}
	writeFile(t, path, b)
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestOpenOrResetKeepsAGoodFile(t *testing.T) {
	path := goodFile(t, 5)
	s, state, reset, err := openOrReset(path, nil, testConfig())
	if err != nil || reset != nil {
		t.Fatalf("OpenOrReset on a good file: %v, %v", reset, err)
	}
	defer s.Close()
	if res, _ := flat(state); len(res) != 5 || !state["east"].Synced {
		t.Errorf("loaded %v, want the 5 resources and east synced", res)
	}
	assertNoCorruptCopies(t, path)
}
