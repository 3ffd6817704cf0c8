package minion

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
)

// keptState is what the tests' relay state files hold: 40 VirtualServices and a
// DestinationRule, names under kept/.
func keptState(t testing.TB) map[string][]*mcp.Entry {
	t.Helper()
	var vs []*mcp.Entry
	for i := range 40 {
		vs = append(vs, vsEntry(t, fmt.Sprintf("kept/r%02d", i), "1", fmt.Sprintf("r%02d.kept.%s", i, strings.Repeat("x", 150))))
	}
	return map[string][]*mcp.Entry{vsColl: vs, drColl: {drEntry(t, "kept/d", "1")}}
}

// hubState is what the tests' hub gives the cluster: names under hub/.
func hubState(t testing.TB) *mcp.Cache {
	t.Helper()
	c := mcp.NewCache(vsColl, drColl)
	c.Put(vsColl, vsEntry(t, "hub/a", "1", "a.hub"), vsEntry(t, "hub/b", "1", "b.hub"))
	c.Put(drColl, drEntry(t, "hub/d", "1"))
	return c
}

func drEntry(t testing.TB, name, version string) *mcp.Entry {
	t.Helper()
	b, err := anypb.New(&networking.DestinationRule{Host: name})
	if err != nil {
		t.Fatal(err)
	}
	e, err := mcp.NewEntry(&mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: version}, Body: b})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// writeRelayFile writes a relay state file with bbolt itself, in the layout the relay has
// written since its first release: a bucket "collection/<collection>" per collection of
// name → the Resource as received, and, once the state is whole, meta/whole naming the
// collections relayed (sorted, joined by commas). The relay must go on reading such files.
func writeRelayFile(t testing.TB, path string, state map[string][]*mcp.Entry, whole bool) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	colls := mcp.NewCache(vsColl, drColl).Collections()
	err = db.Update(func(tx *bolt.Tx) error {
		for _, c := range colls {
			b, err := tx.CreateBucketIfNotExists([]byte("collection/" + c))
			if err != nil {
				return err
			}
			for _, e := range state[c] {
				if err := b.Put([]byte(e.Name), e.Encoded); err != nil {
					return err
				}
			}
		}
		if !whole {
			return nil
		}
		m, err := tx.CreateBucketIfNotExists([]byte("meta"))
		if err != nil {
			return err
		}
		return m.Put([]byte("whole"), []byte(strings.Join(colls, ",")))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// editFile changes a bbolt file with bbolt itself.
func editFile(t testing.TB, path string, f func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(f); err != nil {
		t.Fatal(err)
	}
}

// flipBits flips n random bits (seeded) in the bytes [from, to) of path.
func flipBits(t testing.TB, path string, from, to int64, n int, seed uint64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	to = min(to, int64(len(b)))
	r := rand.New(rand.NewPCG(seed, 25))
	for range n {
		i := from + r.Int64N(to-from)
		b[i] ^= 1 << r.IntN(8)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func truncateTo(t testing.TB, path string, size func(size int64) int64) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size(st.Size())); err != nil {
		t.Fatal(err)
	}
}

// readOnly makes each path unwritable for this process until writable is called or the test
// ends: by its mode for a user other than root, by its immutable attribute for root, whom
// modes do not stop.
func readOnly(t *testing.T, paths ...string) (writable func()) {
	t.Helper()
	var undo []func()
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() != 0 {
			if err := os.Chmod(p, st.Mode().Perm()&^0o222); err != nil {
				t.Fatal(err)
			}
			undo = append(undo, func() { _ = os.Chmod(p, st.Mode().Perm()) })
		} else if err := setImmutable(p, true); err != nil {
			t.Skipf("cannot make %s read-only for root here (its immutable attribute: %v)", p, err)
		} else {
			undo = append(undo, func() { _ = setImmutable(p, false) })
		}
		t.Cleanup(undo[len(undo)-1]) // before t.TempDir's removal, which registered first
	}
	return func() {
		for _, u := range undo {
			u()
		}
	}
}

// highWater is how much of a bbolt file its pages use (the file may be longer).
func highWater(t testing.TB, path string) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var size int64
	_ = db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil })
	return size
}

// pageSize is the page size of the files bbolt writes here.
var pageSize = int64(os.Getpagesize())

// What the relay does with a state file damaged one way or another. Whatever it is, the
// minion publishes.
type outcome int

const (
	// reset: the file is damaged; it is moved aside, logged and counted, and the relay serves
	// nothing until the hub answers, then keeps the hub's state in a new file.
	reset outcome = iota
	// fresh: the file holds nothing to keep (it is empty); as reset, with nothing moved aside.
	fresh
	// either: reset, or the file loads as it is (damage inside a resource's body, or in
	// unused bytes, which nothing but a checksum would see).
	either
	// held: another process holds the file: it is not touched, and the relay refuses istiod
	// and the hub's pushes until it is released; then it serves what the file holds.
	held
	// noFile: no file can be made at the path: the relay serves the hub's state from memory.
	noFile
	// blocked: a file the relay can neither write nor remove: it refuses the hub's pushes
	// (serving them would leave a restart to serve that file), until the file is writable.
	blocked
)

// A damage is one way a relay state file goes bad: make leaves it at path (and may return a
// function that undoes what keeps the relay from its file).
type damage struct {
	name string
	make func(t *testing.T, path string) (release func())
	want outcome
}

func damages() []damage {
	good := func(t *testing.T, path string) { writeRelayFile(t, path, keptState(t), true) }
	return []damage{
		{"meta pages: bits flipped in both", func(t *testing.T, path string) func() {
			good(t, path)
			for p := range int64(2) { // the meta fields: after the page header, 64 bytes
				flipBits(t, path, p*pageSize+16, p*pageSize+80, 3, uint64(p+1))
			}
			return nil
		}, reset},
		{"data pages: bits flipped", func(t *testing.T, path string) func() {
			good(t, path)
			flipBits(t, path, 2*pageSize, 1<<40, 64, 7)
			return nil
		}, either},
		{"truncated to 100 bytes", func(t *testing.T, path string) func() {
			good(t, path)
			truncateTo(t, path, func(int64) int64 { return 100 })
			return nil
		}, reset},
		{"truncated after the meta pages", func(t *testing.T, path string) func() {
			good(t, path)
			truncateTo(t, path, func(int64) int64 { return 2*pageSize + 100 })
			return nil
		}, reset},
		{"truncated to half", func(t *testing.T, path string) func() {
			good(t, path)
			truncateTo(t, path, func(s int64) int64 { return s / 2 })
			return nil
		}, reset},
		{"truncated by one page of what it holds", func(t *testing.T, path string) func() {
			good(t, path)
			used := highWater(t, path)
			truncateTo(t, path, func(int64) int64 { return used - pageSize })
			return nil
		}, reset},
		{"zero length", func(t *testing.T, path string) func() {
			good(t, path)
			truncateTo(t, path, func(int64) int64 { return 0 })
			return nil
		}, fresh},
		{"garbage", func(t *testing.T, path string) func() {
			b := make([]byte, 64<<10)
			r := rand.New(rand.NewPCG(3, 4))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			return nil
		}, reset},
		{"another program's bbolt file", func(t *testing.T, path string) func() { // the hub's state file
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			editFile(t, path, func(tx *bolt.Tx) error {
				for _, b := range []string{"format", "clusters", "meta"} {
					if _, err := tx.CreateBucket([]byte(b)); err != nil {
						return err
					}
				}
				return tx.Bucket([]byte("format")).Put([]byte("version"), []byte("1"))
			})
			return nil
		}, reset},
		{"a record that does not decode", func(t *testing.T, path string) func() {
			good(t, path)
			editFile(t, path, func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("collection/"+vsColl)).Put([]byte("kept/bad"), []byte("not a resource"))
			})
			return nil
		}, reset},
		{"a record under another name", func(t *testing.T, path string) func() {
			good(t, path)
			editFile(t, path, func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("collection/"+vsColl)).Put([]byte("kept/r00"), vsEntry(t, "kept/other", "1", "x").Encoded)
			})
			return nil
		}, reset},
		{"locked by another process", func(t *testing.T, path string) func() {
			good(t, path)
			// flock conflicts between two open files as between two processes.
			db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return func() { db.Close() }
		}, held},
		{"read-only directory, no file", func(t *testing.T, path string) func() {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			return readOnly(t, filepath.Dir(path))
		}, noFile},
		{"read-only file in a read-only directory", func(t *testing.T, path string) func() {
			good(t, path)
			return readOnly(t, path, filepath.Dir(path))
		}, blocked},
		{"its directory is a file", func(t *testing.T, path string) func() {
			if err := os.WriteFile(filepath.Dir(path), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			return nil
		}, noFile},
	}
}

// TestRelayStateFileDamage runs a minion with a relay on a state file damaged in each way
// of damages: it publishes to the hub as if there were no relay, and its relay serves no
// state that is not whole, moves a damaged file aside, and serves the hub's state once the
// hub answers (a file another process holds, or one it can neither write nor remove, makes
// it refuse the hub until that ends).
func TestRelayStateFileDamage(t *testing.T) {
	for _, d := range damages() {
		t.Run(d.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state", "relay.db")
			release := d.make(t, path)
			damaged, _ := os.ReadFile(path)
			rc := startRelayCase(t, path)
			// Publishing goes on whatever the relay's file: before the hub answers the relay,
			// and whatever the relay does after.
			eventually(t, "the minion publishing to the hub", func() bool { return rc.hub.names(vsColl) == "shop/own" })
			eventually(t, "the relay listening", func() bool { return rc.m.Relay().Addr() != "" })
			rc.settled(t)

			got := d.want
			if got == either {
				got = fresh // loaded: what it holds (whole) is served before the hub answers
				if moved, _ := filepath.Glob(path + ".corrupt-*"); len(moved) > 0 {
					got = reset
				}
				t.Logf("the damage was %s", map[outcome]string{fresh: "not seen: the file loaded", reset: "seen: the file was moved aside"}[got])
			}
			if d.want != either || got == reset {
				rc.refused(t, "before the hub answers")
			}
			switch got {
			case reset:
				rc.movedAside(t, damaged)
			case held:
				rc.refusesTheHub(t, "another process holds the file")
				release()
			case blocked:
				rc.refusesTheHub(t, "the file can be neither written nor removed")
				release()
			}
			rc.hub.Answer()
			eventually(t, "istiod holding the hub's state through the relay", func() bool { return holds(rc.istiod(t), versionsOf(rc.hub.relayed)) })
			if got == noFile {
				rc.notKept(t)
				return
			}
			rc.kept(t)
		})
	}
}

// relayCase is a minion with a relay on a state file, publishing to a hub that does not
// answer its relay until told to.
type relayCase struct {
	path string
	hub  *relayHub
	m    *Minion
	stop func()
	tel  *Telemetry
	logs *logCapture
	sink *mcp.Sink
}

func startRelayCase(t *testing.T, path string) *relayCase {
	t.Helper()
	root := t.TempDir()
	write(t, root, "shop/own.yaml", vsDoc("own", "", "own.shop"))
	rc := &relayCase{path: path, hub: startRelayHub(t, hubState(t)), tel: NewTelemetry()}
	cfg := fsConfig(root, "push://"+rc.hub.Addr)
	cfg.Relay = &RelayConfig{Listen: "127.0.0.1:0", StateFile: path, Collections: []string{vsColl, drColl}}
	var log *slog.Logger
	log, rc.logs = captureLog(t)
	rc.m, rc.stop = startRelayMinion(t, cfg, log, rc.tel)
	return rc
}

// startRelayMinion runs a minion whose relay retries its state file every 20 ms, until stop
// or the test's end.
func startRelayMinion(t *testing.T, cfg *Config, log *slog.Logger, tel *Telemetry) (*Minion, func()) {
	t.Helper()
	m, err := New(cfg, log, tel)
	if err != nil {
		t.Fatal(err)
	}
	m.relay.fileRetry = 20 * time.Millisecond
	return m, testrun.Start(t, "minion Run", m.Run)
}

// settled waits until the relay has opened its state file, or reported why it has not.
func (rc *relayCase) settled(t *testing.T) {
	t.Helper()
	eventually(t, "the relay's state file opened or reported", func() bool {
		st := rc.m.Status().Relay.StateFile
		return st != nil && (st.Kept || st.Problem != "")
	})
}

// istiod follows the relay, from the first call on.
func (rc *relayCase) istiod(t *testing.T) *mcp.Sink {
	t.Helper()
	if rc.sink == nil {
		eventually(t, "the relay listening", func() bool { return rc.m.Relay().Addr() != "" })
		rc.sink = istiod(t, rc.m.Relay().Addr(), vsColl, drColl)
	}
	return rc.sink
}

func (rc *relayCase) metric(t *testing.T, name string) float64 {
	return promtest.Sum(t, rc.tel.Registry, "meshfed_minion_relay_state_file_"+name, nil)
}

// refused checks the relay answers istiod Unavailable: it has no whole state.
func (rc *relayCase) refused(t *testing.T, when string) {
	t.Helper()
	if err := relayAnswer(t, rc.m.Relay().Addr()); status.Code(err) != codes.Unavailable {
		t.Fatalf("the relay %s: %v, want Unavailable", when, err)
	}
	if st := rc.m.Status().Relay; st.Serving {
		t.Fatalf("the relay %s: %+v, want not serving", when, st)
	}
}

// movedAside checks the damaged file went aside as it was, logged and counted.
func (rc *relayCase) movedAside(t *testing.T, damaged []byte) {
	t.Helper()
	moved, _ := filepath.Glob(rc.path + ".corrupt-*")
	if len(moved) != 1 {
		t.Fatalf("files moved aside: %v, want one", moved)
	}
	if b, err := os.ReadFile(moved[0]); err != nil || !bytes.Equal(b, damaged) {
		t.Errorf("the file moved aside is not the damaged file as it was (%v)", err)
	}
	if st := rc.m.Status().Relay.StateFile; st == nil || st.MovedAside != moved[0] {
		t.Errorf("status of the state file: %+v, want it moved aside to %s", st, moved[0])
	}
	if n := rc.logs.count("level=ERROR", "relay state file damaged", moved[0]); n != 1 {
		t.Errorf("the reset logged %d times at ERROR, want once:\n%s", n, rc.logs)
	}
	if n := rc.metric(t, "resets_total"); n != 1 {
		t.Errorf("resets counted: %v, want 1", n)
	}
}

// refusesTheHub checks the relay refuses the hub's pushes, and istiod, while its file is
// not its own to write.
func (rc *relayCase) refusesTheHub(t *testing.T, why string) {
	t.Helper()
	rc.hub.Answer()
	eventually(t, "the relay refusing the hub and subscribing again", func() bool { return rc.hub.relayStreams.Load() >= 2 })
	if st := rc.m.Status().Relay.StateFile; st == nil || !st.RefusingPushes || st.Kept || st.Problem == "" {
		t.Errorf("status of the state file: %+v, want refusing pushes, saying why", st)
	}
	rc.refused(t, "while "+why)
	if moved, _ := filepath.Glob(rc.path + ".corrupt-*"); len(moved) > 0 {
		t.Errorf("moved aside although not damaged: %v", moved)
	}
	if n := rc.logs.count("level=ERROR", "relay state file", "refusing the hub's pushes"); n != 1 {
		t.Errorf("the problem logged %d times at ERROR, want once:\n%s", n, rc.logs)
	}
}

// kept checks the relay's file keeps what it serves: the hub's state, whole, which a restart
// serves before the hub answers.
func (rc *relayCase) kept(t *testing.T) {
	t.Helper()
	eventually(t, "the state file kept", func() bool {
		st := rc.m.Status().Relay.StateFile
		return st != nil && st.Kept && st.Problem == "" && rc.metric(t, "kept") == 1
	})
	rc.restarted(t)
}

// restarted stops the minion and starts another on the same file with the hub refusing
// the relay: it serves the hub's state, kept.
func (rc *relayCase) restarted(t *testing.T) {
	t.Helper()
	rc.hub.answered.Store(false)
	rc.stop()
	log, _ := captureLog(t)
	m, _ := startRelayMinion(t, rc.m.cfg, log, NewTelemetry())
	eventually(t, "the restarted relay listening", func() bool { return m.Relay().Addr() != "" })
	sink := istiod(t, m.Relay().Addr(), vsColl, drColl)
	eventually(t, "istiod served the kept state by the restarted relay before the hub answers", func() bool {
		return holds(sink, versionsOf(rc.hub.relayed))
	})
}

// notKept checks the relay serves from memory without a file.
func (rc *relayCase) notKept(t *testing.T) {
	t.Helper()
	st := rc.m.Status().Relay.StateFile
	if st == nil || st.Kept || st.Problem == "" || st.RefusingPushes || rc.metric(t, "kept") != 0 {
		t.Errorf("status of the state file: %+v, kept gauge %v; want not kept, saying why, not refusing", st, rc.metric(t, "kept"))
	}
	if _, err := os.Lstat(rc.path); err == nil {
		t.Errorf("a file at %s", rc.path)
	}
}
