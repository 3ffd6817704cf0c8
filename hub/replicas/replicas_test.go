package replicas

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
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
	m, err := Start(Config{Name: name, Bind: "127.0.0.1:0", MCPAddr: "127.0.0.1:1" + name, Seeds: seeds, KeyFile: key, Local: true}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	eventually(t, "three replicas", func() bool {
		for _, m := range all {
			if len(m.Replicas()) != 3 {
				return false
			}
		}
		return true
	})
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
