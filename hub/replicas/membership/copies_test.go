package membership

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Copies spread like holdings, and their epochs count among those seen: a session held
// after a peer advertised a copy of epoch 3 is of epoch 4.
func TestCopiesSpread(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	b := start(t, "b", key, a.Addr())
	c := start(t, "c", key, a.Addr())
	allJoined(t, []*Members{a, b, c})
	a.SetCopy("east", "", 3, true)
	copies := func(m *Members) string { return fmt.Sprint(m.Copies("east")) }
	want := fmt.Sprint([]Copy{{Replica: "a", MCPAddr: "127.0.0.1:1a", Epoch: 3, Restored: true}})
	for _, m := range []*Members{b, c} {
		eventually(t, m.cfg.Name+" sees a's restored copy", func() bool { return copies(m) == want })
	}
	if got := a.Copies("east"); len(got) != 0 {
		t.Errorf("a lists its own copy among the peers': %v", got)
	}
	a.SetCopy("east", "acme", 3, false) // with its tenant: a replica that does not know east keeps it there
	want = fmt.Sprint([]Copy{{Replica: "a", MCPAddr: "127.0.0.1:1a", Epoch: 3, Tenant: "acme"}})
	eventually(t, "b sees a's copy confirmed", func() bool { return copies(b) == want })
	if got := fmt.Sprint(c.CopiedClusters()); got != "[east]" {
		t.Errorf("c's peers have copies of %s, want [east]", got)
	}
	if e := b.Hold("east"); e != 4 {
		t.Errorf("b's session after a's copy of epoch 3: epoch %d, want 4", e)
	}
	a.SetCopy("east", "", 0, false)
	eventually(t, "c sees a's copy gone", func() bool { return copies(c) == "[]" })
	if _, ok := a.Authorities()["east"]; !ok {
		t.Error("a copy's change hid b's holding (a broadcast of one replaced the other)")
	}
}

// Copy deltas and full states merge in any order, as holdings do, and a replica's holding
// and copy of one cluster are separate entries.
func TestCopiesMergeOrder(t *testing.T) {
	enc := func(m message) []byte {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	copy1 := enc(message{Name: "b", Inc: 5, Ver: 1, Copies: map[string]hold{"east": {Epoch: 2, Ver: 1, Restored: true}}})
	hold2 := enc(message{Name: "b", Inc: 5, Ver: 2, Holding: map[string]hold{"east": {Epoch: 3, Ver: 2}}})
	copy3 := enc(message{Name: "b", Inc: 5, Ver: 3, Copies: map[string]hold{"east": {Epoch: 3, Ver: 3}}})
	full3 := enc(message{Name: "b", Inc: 5, Ver: 3, Full: true, Holding: map[string]hold{"east": {Epoch: 3, Ver: 2}}, Copies: map[string]hold{"east": {Epoch: 3, Ver: 3}}})
	withdraw4 := enc(message{Name: "b", Inc: 5, Ver: 4, Copies: map[string]hold{"west": {Ver: 4}}})
	for i, order := range [][][]byte{
		{copy1, hold2, copy3, withdraw4},
		{copy3, copy1, hold2},
		{full3, copy1},
		{copy1, full3, withdraw4},
	} {
		m := offline()
		for _, b := range order {
			m.merge(b)
		}
		if got, want := fmt.Sprint(m.Copies("east")), fmt.Sprint([]Copy{{Replica: "b", Epoch: 3}}); got != want {
			t.Errorf("order %d: copies %s, want %s", i, got, want)
		}
		if got := authority(m, "east"); got != "b@3" {
			t.Errorf("order %d: authority %s, want b@3", i, got)
		}
	}
	if _, err := decode([]byte(`{"n":"b","v":1,"h":{"x":{"e":1,"v":1}},"c":{"x":{"e":1,"v":1}}}`)); err == nil || !strings.Contains(err.Error(), "changes 2 clusters") {
		t.Errorf("a delta of a holding and a copy: %v", err)
	}
	if _, err := decode([]byte(`{"n":"b","v":1,"f":true,"c":{"x":{"e":0,"v":1}}}`)); err == nil || !strings.Contains(err.Error(), "epoch 0") {
		t.Errorf("a full state with a copy of epoch 0: %v", err)
	}
}

// Synced: false for a replica alone (it cannot tell a group of one from peers it cannot
// reach yet), true once it has heard the full state of every peer it knows.
func TestSynced(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	if a.Synced() {
		t.Error("a replica alone says it knows what the group has")
	}
	b := start(t, "b", key, a.Addr())
	eventually(t, "b has heard a", b.Synced)
	eventually(t, "a has heard b", a.Synced)
	c := start(t, "c", key, a.Addr())
	eventually(t, "c has heard a and b", func() bool { return c.Synced() && len(c.Replicas()) == 3 })
}

// A replica's restored copies are in its state from the join on: a peer that has heard its
// full state, and so counts itself synced, knows them at that moment, and cannot confirm an
// older copy of its own meanwhile.
func TestRestoredCopiesKnownFromTheJoin(t *testing.T) {
	key := keyFile(t)
	a := start(t, "a", key)
	startWith(t, Config{Name: "b", Bind: "127.0.0.1:0", MCPAddr: "127.0.0.1:1b", Seeds: []string{a.Addr()}, KeyFile: key, Local: true,
		Tuning: Tuning{ProbeInterval: 200 * time.Millisecond}, RestoredCopies: map[string]uint64{"east": 7}})
	var known []Copy
	eventually(t, "a synced with b", func() bool {
		if !a.Synced() {
			return false
		}
		known = a.Copies("east") // at the first moment a counts itself synced
		return true
	})
	if len(known) != 1 || known[0].Epoch != 7 || !known[0].Restored {
		t.Fatalf("a synced knowing b's copies %+v, want east@7 restored", known)
	}
}
