package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
)

// A minion's relay subscribes on the ingest listener it already pushes to, with its
// cluster's identity, and receives what routing gives that identity (here: east gets west's
// objects, as an export); the ingest listener's ResourceSource admits only clusters (and a
// replica layer's peers).
func TestRelaySubscribesOnIngest(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Routing = routing.Config{
		Rules: []routing.Rule{
			{Name: "east-gets-west", Relays: true, Identities: []string{hub.ClusterIdentity(td, "east")}, Clusters: []string{"west"}},
			{Name: "sink-named-east", NodeIDs: []string{"east"}, Clusters: []string{"east"}}, // for a sink called east: not the relay
			{Name: "every-sink", Identities: []string{"*"}, Clusters: []string{"east"}},      // a rule for sinks: not for relays
		},
		Default: &routing.Rule{Name: "everything"}, // not for relays either
	}
	h := tlsEastWest(t, p, cfg)
	ingest, _, _ := h.Addrs()

	relay, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs}, Node: &mcppb.SinkNode{Id: "east"},
		Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error { return nil }), Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, ingest, p.creds(t, "relay-east", hub.ClusterIdentity(td, "east")), relay)
	waitFor(t, 10*time.Second, "east's relay holding west's VirtualService only", func() bool {
		v := relay.Versions(vs)
		return len(v) == 1 && v["pay/api"] != ""
	})

	// A sink's identity is no relay.
	err = openStream(t, ingest, p.creds(t, "sink-x", hub.SinkIdentity(td, "x")), true)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not a cluster identity") {
		t.Errorf("a sink subscribing on ingest: %v, want PermissionDenied naming the identity kind", err)
	}
}

// The minion's relay re-serves in its cluster what routing gives the cluster: istiod (a
// stand-in sink here; test/istiod runs the real one) follows it over plaintext inside the
// cluster. It keeps serving the last state while the hub is down and, from its state file,
// after a restart of the minion while the hub is still down; a relay that never had a state
// serves nothing rather than an empty one.
func TestMinionRelay(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Routing = routing.Config{Rules: []routing.Rule{
		{Name: "east-relay", Relays: true, Identities: []string{hub.ClusterIdentity(td, "east")}, Clusters: []string{"east", "west"}},
	}}
	cfg.Ingest, cfg.Serve, cfg.HTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.StateDir = t.TempDir()
	h, err := hub.New(cfg, logger(t).With("side", "hub"), hub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stopHub := testrun.Start(t, "hub Run", h.Run)
	waitFor(t, 10*time.Second, "hub listening", func() bool { i, _, _ := h.Addrs(); return i != "" })
	ingest, _, _ := h.Addrs()
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "west", west, ingest)

	state := filepath.Join(t.TempDir(), "relay.db")
	eastCfg := func() *minion.Config {
		c, k, _ := p.ca.Issue(t, p.dir, "minion-east", hub.ClusterIdentity(td, "east"))
		mc := minionConfig("east", "fs://"+east, ingest)
		mc.TLS, mc.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: c, Key: k, CA: p.bundle}}, false
		mc.Relay = &minion.RelayConfig{Listen: "127.0.0.1:0", StateFile: state, Collections: []string{vs, dr}}
		return mc
	}
	m, stopEast := startMinion(t, eastCfg())
	waitFor(t, 20*time.Second, "hub ready", h.Ready)
	waitFor(t, 10*time.Second, "the relay listening and whole", func() bool { return m.Relay().Ready() && m.Relay().Addr() != "" })

	both := func(s *mcp.Sink) func() bool {
		return func() bool { v := s.Versions(vs); return len(v) == 2 && v["shop/cart"] != "" && v["pay/api"] != "" }
	}
	istiod := relayedTo(t, m.Relay().Addr())
	waitFor(t, 10*time.Second, "istiod holding east's and west's VirtualServices through the relay", both(istiod))
	if st := m.Status().Relay; st == nil || !st.Serving || !st.FromHub || !st.HubConnected || st.LastSynced == nil || st.Objects[vs] != 2 || st.Streams != 1 {
		t.Errorf("relay status = %+v, want serving from the connected hub, synced, 2 VirtualServices, 1 stream", st)
	}
	// The hub's tools show the relay's istiod under the relay.
	_, _, admin := h.Addrs()
	waitFor(t, 10*time.Second, "/api/sinks listing the istiod behind east's relay", func() bool {
		var sinks []api.SinkStatus
		getJSON(t, "http://"+admin+"/api/sinks", &sinks)
		for _, s := range sinks {
			for _, d := range s.Downstream {
				if c := d.Collections[vs]; d.NodeID == "istiod" && c != nil && c.Acked > 0 && c.Acked == c.Pushed {
					return true
				}
			}
		}
		return false
	})
	if out := hubCLI(t, admin)("why", "vs", "pay/api"); !strings.Contains(out, "behind relay") || !strings.Contains(out, "node istiod: up to date") {
		t.Errorf("hub why vs pay/api does not show the istiod behind the relay:\n%s", out)
	}
	writeFile(t, west, "api.yaml", vsYAML("api", "pay", "", "api.pay.example.com", "api2.pay.example.com"))
	before := istiod.Versions(vs)["pay/api"]
	waitFor(t, 10*time.Second, "west's update relayed", func() bool { return istiod.Versions(vs)["pay/api"] != before })

	// The hub goes away: the relay keeps serving what it had, to a new subscriber too.
	stopHub()
	held := istiod.Versions(vs)
	waitFor(t, 10*time.Second, "a new istiod served while the hub is down", both(relayedTo(t, m.Relay().Addr())))
	if got := istiod.Versions(vs); !maps.Equal(got, held) {
		t.Errorf("istiod's state changed while the hub was down: %v -> %v", held, got)
	}

	// The minion restarts while the hub is still down: its relay serves the kept state.
	stopEast()
	m2, _ := startMinion(t, eastCfg())
	waitFor(t, 10*time.Second, "the restarted relay listening", func() bool { return m2.Relay().Addr() != "" })
	// The relay takes its file beside its start (a damaged or locked one never stops it).
	waitFor(t, 10*time.Second, "the restarted relay serving its file", func() bool { return m2.Status().Relay.Serving })
	if st := m2.Status().Relay; !st.Serving || st.FromHub || st.HubConnected || st.LastSynced != nil || st.Objects[vs] != 2 {
		t.Fatalf("restarted relay status = %+v, want serving its kept 2 VirtualServices, the hub not connected", st)
	}
	waitFor(t, 10*time.Second, "istiod served by the restarted relay", both(relayedTo(t, m2.Relay().Addr())))

	// A relay that never had a whole state answers nothing rather than an empty state.
	fresh := eastCfg()
	fresh.Relay.StateFile = filepath.Join(t.TempDir(), "new.db")
	m3, _ := startMinion(t, fresh)
	waitFor(t, 10*time.Second, "the fresh relay listening", func() bool { return m3.Relay().Addr() != "" })
	if err := openStream(t, m3.Relay().Addr(), insecure.NewCredentials(), true); status.Code(err) != codes.Unavailable {
		t.Errorf("a relay without a state: %v, want Unavailable", err)
	}
}

// A damaged relay state file stops neither the minion nor its relay, here one that bbolt,
// unguarded, faults on (it is shorter than its pages say, and bbolt reads past its end): the
// minion publishes to the hub, and the relay moves the file aside, serves istiod the hub's
// state once the hub answers, and keeps it in a new file, which a restart serves while the
// hub is down.
func TestRelayDamagedStateFile(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.Routing = routing.Config{Rules: []routing.Rule{
		{Name: "east-relay", Relays: true, Identities: []string{hub.ClusterIdentity(td, "east")}, Clusters: []string{"east", "west"}},
	}}
	cfg.Ingest, cfg.Serve, cfg.HTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.StateDir = t.TempDir()
	h, err := hub.New(cfg, logger(t).With("side", "hub"), hub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stopHub := testrun.Start(t, "hub Run", h.Run)
	waitFor(t, 10*time.Second, "hub listening", func() bool { i, _, _ := h.Addrs(); return i != "" })
	ingest, _, _ := h.Addrs()
	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, west, "api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "west", west, ingest)

	state := filepath.Join(t.TempDir(), "relay.db")
	truncatedBoltFile(t, state)
	eastCfg := func() *minion.Config {
		c, k, _ := p.ca.Issue(t, p.dir, "minion-east", hub.ClusterIdentity(td, "east"))
		mc := minionConfig("east", "fs://"+east, ingest)
		mc.TLS, mc.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: c, Key: k, CA: p.bundle}}, false
		mc.Relay = &minion.RelayConfig{Listen: "127.0.0.1:0", StateFile: state, Collections: []string{vs, dr}}
		return mc
	}
	m, stopEast := startMinion(t, eastCfg())
	// The hub is ready once both clusters have published: east's minion publishes.
	waitFor(t, 20*time.Second, "hub ready", h.Ready)
	waitFor(t, 10*time.Second, "the relay listening and whole", func() bool { return m.Relay().Ready() && m.Relay().Addr() != "" })
	both := func(s *mcp.Sink) func() bool {
		return func() bool { v := s.Versions(vs); return len(v) == 2 && v["shop/cart"] != "" && v["pay/api"] != "" }
	}
	waitFor(t, 10*time.Second, "istiod holding east's and west's VirtualServices through the relay", both(relayedTo(t, m.Relay().Addr())))
	if moved, _ := filepath.Glob(state + ".corrupt-*"); len(moved) != 1 {
		t.Errorf("files moved aside: %v, want the damaged one", moved)
	}
	waitFor(t, 10*time.Second, "the new state file kept", func() bool {
		st := m.Status().Relay.StateFile
		return st != nil && st.Kept
	})

	stopHub()
	stopEast()
	m2, _ := startMinion(t, eastCfg())
	waitFor(t, 10*time.Second, "the restarted relay listening", func() bool { return m2.Relay().Addr() != "" })
	waitFor(t, 10*time.Second, "istiod served the kept state by the restarted relay while the hub is down", both(relayedTo(t, m2.Relay().Addr())))
}

// truncatedBoltFile writes a bbolt file at path and cuts it one page short of what it holds.
func truncatedBoltFile(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("collection/" + vs))
		for i := 0; err == nil && i < 100; i++ {
			err = b.Put(fmt.Appendf(nil, "shop/r%d", i), bytes.Repeat([]byte{'x'}, 500))
		}
		return err
	})
	var used int64
	_ = db.View(func(tx *bolt.Tx) error { used = tx.Size(); return nil })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, used-int64(os.Getpagesize())); err != nil {
		t.Fatal(err)
	}
}

// relayedTo follows a relay as istiod does (full states), until the test ends.
func relayedTo(t *testing.T, addr string) *mcp.Sink {
	t.Helper()
	sink, err := mcp.NewSink(mcp.SinkOptions{Collections: []string{vs, dr}, Node: &mcppb.SinkNode{Id: "istiod"}, FullStateOnly: true,
		Applier: mcp.ApplierFunc(func(context.Context, *mcp.Change) error { return nil }), Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pullOnce(t, addr, insecure.NewCredentials(), sink)
	return sink
}

// The relay does not wait for its minion's own sources: with a source that never syncs
// (an upstream that is not there), east publishes nothing, yet its relay follows the hub
// and serves east's istiod what routing gives east.
func TestRelayServesBeforeItsMinionSyncs(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	cfg.WarmUp = hub.Duration{Duration: time.Second} // east never syncs
	cfg.Routing = routing.Config{Rules: []routing.Rule{
		{Name: "east-gets-west", Relays: true, Identities: []string{hub.ClusterIdentity(td, "east")}, Clusters: []string{"west"}},
	}}
	h := runHub(t, cfg)
	ingest, _, _ := h.Addrs()
	west := t.TempDir()
	writeFile(t, west, "api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	tlsMinion(t, p, "west", west, ingest)

	c, k, _ := p.ca.Issue(t, p.dir, "minion-east", hub.ClusterIdentity(td, "east"))
	mc := minionConfig("east", "mcp://127.0.0.1:1", ingest)
	mc.TLS, mc.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: c, Key: k, CA: p.bundle}}, false
	mc.Relay = &minion.RelayConfig{Listen: "127.0.0.1:0", Collections: []string{vs, dr}}
	m, _ := startMinion(t, mc)
	waitFor(t, 20*time.Second, "east's relay serving west's VirtualService", func() bool {
		st := m.Status().Relay
		return st != nil && st.Serving && st.Objects[vs] == 1
	})
	if m.Ready() {
		t.Error("east's minion is ready: its source never synced")
	}
}
