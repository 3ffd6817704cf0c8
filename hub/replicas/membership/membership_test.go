package membership

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"

	"github.com/meshfed/meshfed/internal/testkit/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func keyFile(t *testing.T) string {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	p := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(k)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func start(t *testing.T, name, key string, seeds ...string) *Members {
	t.Helper()
	// Short probes: memberlist's last probe goroutine outlives Shutdown by up to a probe
	// interval, and goleak checks for it at the end of the package.
	return startWith(t, Config{Name: name, Bind: "127.0.0.1:0", MCPAddr: "127.0.0.1:1" + name, Seeds: seeds, KeyFile: key, Local: true,
		Tuning: Tuning{ProbeInterval: 200 * time.Millisecond}})
}

func startWith(t *testing.T, cfg Config) *Members {
	t.Helper()
	m, err := Start(cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// eventually polls cond for up to 15 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, 15*time.Second, what, cond)
}

// allJoined waits until every member sees all of them.
func allJoined(t *testing.T, all []*Members) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d replicas", len(all)), func() bool {
		for _, m := range all {
			if len(m.Replicas()) != len(all) {
				return false
			}
		}
		return true
	})
}

func authority(m *Members, cluster string) string {
	r, e, ok := m.Authority(cluster)
	if !ok {
		return "none"
	}
	return fmt.Sprintf("%s@%d", r, e)
}

func TestHoldingsAndEpochs(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	b := start(t, "b", key, a.Addr())
	c := start(t, "c", key, a.Addr())
	all := []*Members{a, b, c}
	allJoined(t, all)
	if got := b.Replicas()[0].MCPAddr; got != "127.0.0.1:1a" {
		t.Errorf("a's MCP address as b sees it: %q", got)
	}

	// East connects to a: everyone sees a as east's authority.
	e1 := a.Hold("east")
	same := func(want string) func() bool {
		return func() bool {
			for _, m := range all {
				if authority(m, "east") != want {
					return false
				}
			}
			return true
		}
	}
	eventually(t, "a holds east", same(fmt.Sprintf("a@%d", e1)))
	// East's minion moves to b: a newer session, so b is authoritative even before a
	// notices its stream ended.
	e2 := b.Hold("east")
	if e2 <= e1 {
		t.Fatalf("epoch %d after %d", e2, e1)
	}
	eventually(t, "b holds east", same(fmt.Sprintf("b@%d", e2)))
	a.Release("east", e1)
	b.Release("east", e1) // not b's epoch: nothing happens
	eventually(t, "still b", same(fmt.Sprintf("b@%d", e2)))

	// b leaves: its holdings go with it.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b gone", func() bool {
		return len(a.Replicas()) == 2 && len(c.Replicas()) == 2 && authority(a, "east") == "none" && authority(c, "east") == "none"
	})
}

func TestWrongKeyCannotJoin(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	intruder := start(t, "x", keyFile(t), a.Addr()) // its join has returned (and failed)
	c := start(t, "c", key, a.Addr())
	eventually(t, "the replica with the right key joined", func() bool { return len(c.Replicas()) == 2 && len(a.Replicas()) == 2 })
	for _, r := range a.Replicas() {
		if r.Name == "x" {
			t.Fatalf("a replica with another key joined: %v", a.Replicas())
		}
	}
	if n := len(intruder.Replicas()); n != 1 {
		t.Fatalf("the intruder sees %d replicas", n)
	}
}

func TestKeyFileErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "k")
	if err := os.WriteFile(bad, []byte(base64.StdEncoding.EncodeToString([]byte("short"))), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(Config{Name: "a", Bind: "127.0.0.1:0", KeyFile: bad}, quiet())
	if err == nil || !strings.Contains(err.Error(), "want 16, 24 or 32") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Start(Config{Bind: "127.0.0.1:0"}, quiet()); err == nil {
		t.Fatal("no name accepted")
	}
}

// A replica that restarts under the same name (and address) before its death is noticed
// starts its versions again from 1: its new incarnation must still replace what it said in
// its earlier life.
func TestRestartUnderTheSameName(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	b1 := startWith(t, Config{Name: "b", Bind: "127.0.0.1:0", MCPAddr: "b1", Seeds: []string{a.Addr()}, KeyFile: key, Local: true, Incarnation: 1})
	for _, c := range []string{"east", "west", "north"} {
		b1.Hold(c)
	}
	eventually(t, "a sees b hold three clusters", func() bool { return len(a.Authorities()) == 3 })
	addr := b1.Addr()
	b1.Crash() // dies without leaving
	b2 := startWith(t, Config{Name: "b", Bind: addr, MCPAddr: "b2", Seeds: []string{a.Addr()}, KeyFile: key, Local: true, Incarnation: 2})
	e := b2.Hold("south") // version 1 of the new life: lower than the old life's 3
	eventually(t, "a sees only b's new life", func() bool {
		auth := a.Authorities()
		return len(auth) == 1 && auth["south"] == Authority{Replica: "b", MCPAddr: "b2", Epoch: e}
	})
}

// A peer's Node changes while this replica sends it holdings: memberlist rewrites a member's
// Node in place whenever it hears a newer incarnation of it (a replica restarted under its
// name refuting its death, a suspicion refuted, an update), so the sends must not read the
// Nodes memberlist hands out (go test -race caught it in test/invariant's replica world;
// hashicorp/memberlist#306).
func TestSendsWhilePeersChange(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	b := start(t, "b", key, a.Addr())
	allJoined(t, []*Members{a, b})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // a sends deltas to every member all the time
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			a.Release("x", a.Hold("x"))
			runtime.Gosched()
		}
	}()
	for range 10 { // each a new incarnation of b, which a writes into its Node of b
		if err := b.ml.UpdateNode(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
}

// Deltas may arrive out of order and full states may be older or newer than them: the view
// is the same whatever the order.
func TestMergeOrder(t *testing.T) {
	enc := func(m message) []byte {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	hold1 := enc(message{Name: "b", Inc: 5, Ver: 1, Holding: map[string]hold{"east": {Epoch: 3, Ver: 1}}})
	release2 := enc(message{Name: "b", Inc: 5, Ver: 2, Holding: map[string]hold{"east": {Ver: 2}}})
	hold3 := enc(message{Name: "b", Inc: 5, Ver: 3, Holding: map[string]hold{"west": {Epoch: 1, Ver: 3}}})
	full3 := enc(message{Name: "b", Inc: 5, Ver: 3, Full: true, Holding: map[string]hold{"west": {Epoch: 1, Ver: 3}}})
	full1 := enc(message{Name: "b", Inc: 5, Ver: 1, Full: true, Holding: map[string]hold{"east": {Epoch: 3, Ver: 1}}})
	oldLife := enc(message{Name: "b", Inc: 4, Ver: 9, Full: true, Holding: map[string]hold{"north": {Epoch: 7, Ver: 9}}})
	orders := [][][]byte{
		{hold1, release2, hold3},
		{hold3, release2, hold1},
		{release2, hold1, hold3, oldLife},
		{full1, hold3, release2},
		{full3, hold1},
		{oldLife, hold1, full3},
		{hold1, full1, full3, release2, hold1},
	}
	for i, order := range orders {
		m := offline()
		for _, b := range order {
			m.merge(b)
		}
		got := fmt.Sprint(m.Authorities())
		if want := fmt.Sprint(map[string]Authority{"west": {Replica: "b", Epoch: 1}}); got != want {
			t.Errorf("order %d: %s, want %s", i, got, want)
		}
		// Whatever it saw, a's next session of east is newer than b's 3 (north's 7 was seen
		// only in an older life when that message came first).
		if e := m.Hold("east"); e != 4 {
			t.Errorf("order %d: east epoch %d, want 4", i, e)
		}
	}
}

func TestDecodeRefusesMalformed(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{`, "gossip message"},
		{`{"i":1}`, "without a replica name"},
		{`{"n":"b","v":1}`, "changes 0 clusters"},
		{`{"n":"b","v":1,"h":{"":{"e":1,"v":1}}}`, "without a name"},
		{`{"n":"b","v":1,"f":true,"h":{"x":{"e":0,"v":1}}}`, "epoch 0"},
		{`{"n":"b","v":1,"h":{"x":{"e":1,"v":2}}}`, "after the message's 1"},
	} {
		if _, err := decode([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("decode(%s) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func FuzzMerge(f *testing.F) {
	f.Add([]byte(`{"n":"b","i":1,"v":2,"f":true,"h":{"east":{"e":3,"v":2}}}`))
	f.Add([]byte(`{"n":"b","i":1,"v":3,"h":{"east":{"e":0,"v":3}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := offline()
		m.merge(b)
		for c, a := range m.Authorities() {
			if a.Epoch == 0 || c == "" {
				t.Fatalf("authority %+v for %q", a, c)
			}
			if e := m.Hold(c); e <= a.Epoch {
				t.Fatalf("new epoch %d not above %d", e, a.Epoch)
			}
		}
	})
}

// offline is a Members without memberlist, for merge tests.
func offline() *Members {
	m := &Members{cfg: Config{Name: "a"}, log: quiet(), peers: map[string]*peer{}, gone: map[string]departed{}, maxEpoch: map[string]uint64{},
		changed: make(chan struct{}, 1), self: message{Name: "a", Full: true, Holding: map[string]hold{}},
		queue: &memberlist.TransmitLimitedQueue{NumNodes: func() int { return 1 }, RetransmitMult: 1}, sends: make(chan outgoing, 1024)}
	m.watchers = map[chan struct{}]bool{m.changed: true}
	return m
}

// Holdings spread by broadcast alone (push/pull is an hour away).
func TestBroadcastSpreads(t *testing.T) {
	key := keyFile(t)
	cfg := func(name string, seeds ...string) Config {
		return Config{Name: name, Bind: "127.0.0.1:0", MCPAddr: name, Seeds: seeds, KeyFile: key, Local: true,
			Tuning: Tuning{PushPullInterval: time.Hour, GossipInterval: 50 * time.Millisecond}, broadcastOnly: true}
	}
	a := startWith(t, cfg("a"))
	b := startWith(t, cfg("b", a.Addr()))
	c := startWith(t, cfg("c", a.Addr()))
	all := []*Members{a, b, c}
	allJoined(t, all)
	for round := 0; round < 5; round++ {
		for i, m := range all {
			m.Hold(fmt.Sprintf("c%d-%d", i, round))
		}
		for _, m := range all {
			eventually(t, fmt.Sprintf("round %d: %s sees every holding", round, m.cfg.Name), func() bool { return len(m.Authorities()) == 3*(round+1) })
		}
	}
}

// Holding changes right after the joins reach everyone over TCP, without waiting for a
// push/pull (an hour away) — broadcasts alone may all be piggybacked on packets to one peer.
func TestChangesRightAfterJoin(t *testing.T) {
	key := keyFile(t)
	cfg := func(name string, seeds ...string) Config {
		return Config{Name: name, Bind: "127.0.0.1:0", MCPAddr: name, Seeds: seeds, KeyFile: key, Local: true,
			Tuning: Tuning{PushPullInterval: time.Hour, GossipInterval: 50 * time.Millisecond, ProbeInterval: 200 * time.Millisecond}}
	}
	a := startWith(t, cfg("a"))
	b := startWith(t, cfg("b", a.Addr()))
	c := startWith(t, cfg("c", a.Addr()))
	time.Sleep(300 * time.Millisecond)
	a.Hold("c1")
	b.Hold("c2")
	c.Hold("c3")
	for _, m := range []*Members{a, b, c} {
		eventually(t, m.cfg.Name+" sees every holding", func() bool { return len(m.Authorities()) == 3 })
	}
}

// A full state that asks is answered with this replica's full state, even from a replica
// still counted as gone (it has accepted this one, or it would not ask).
func TestAskIsAnswered(t *testing.T) {
	m := offline()
	m.Hold("east")
	for len(m.sends) > 0 {
		<-m.sends
	}
	m.gone["b"] = departed{addr: "127.0.0.1:1", at: time.Now()}
	m.merge([]byte(`{"n":"b","i":1,"v":1,"f":true,"q":true,"h":{"west":{"e":1,"v":1}}}`))
	if len(m.sends) != 1 {
		t.Fatalf("%d messages queued, want the answer", len(m.sends))
	}
	o := <-m.sends
	got, err := decode(o.msg)
	if err != nil || o.to != "b" || !got.Full || got.Ask || got.Holding["east"].Epoch != 1 {
		t.Fatalf("answer to %q: %+v, %v", o.to, got, err)
	}
	if len(m.Authorities()) != 1 {
		t.Fatalf("a gone replica's state was merged: %v", m.Authorities())
	}
}

// A replica finds the others through a DNS name (a headless Service in Kubernetes; here
// localhost, which resolves to the first replica's loopback address).
func TestSeedDNS(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	_, port, _ := net.SplitHostPort(a.Addr())
	b := startWith(t, Config{Name: "b", Bind: "127.0.0.1:0", MCPAddr: "b", SeedDNS: "localhost:" + port, KeyFile: key, Local: true})
	eventually(t, "b joined a through DNS", func() bool { return len(a.Replicas()) == 2 && len(b.Replicas()) == 2 })
	if _, err := Start(Config{Name: "c", Bind: "127.0.0.1:0", SeedDNS: "no-port"}, quiet()); err == nil || !strings.Contains(err.Error(), "seedDNS") {
		t.Fatalf("a seedDNS without a port: %v", err)
	}
}
