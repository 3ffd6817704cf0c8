package hub

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/testkit/golden"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// The golden scenarios (testdata/*.txtar): a hub configuration, the steps of the scenario
// in order, and sinks; out come each push's ACK or NACK with its rejections, what each
// reload, disconnection and passing of time did, the conflicts, the clusters (when the
// scenario has such steps) and what every sink is served. `go test -update` rewrites the
// want sections.
//
// A step is a push (cluster, collection, full, resources, removed; direct: as the cluster's
// own source, so that its quotas and breaker judge it), `reload: SECTION` (the configuration
// in that section replaces the running one), `disconnect: CLUSTER` (the cluster's stream
// ends; its next push opens a new one), `advance: DURATION` (the clock moves on and the hub
// expires what is stale) or `show: true` (what every sink receives at that point). Each
// cluster pushes on one stream, a session of the core, opened at its first push.

type goldenPush struct {
	Cluster    string           `json:"cluster"`
	Collection string           `json:"collection"`
	Full       bool             `json:"full"`
	Resources  []goldenResource `json:"resources"`
	Removed    []string         `json:"removed"`

	// Direct pushes as the cluster's own source does (Hub.Apply): its quotas and breaker
	// judge the push (a session's pushes here are copies, which they do not).
	Direct bool `json:"direct"`

	Show bool `json:"show"` // write what every sink receives now

	Reload     string `json:"reload"`
	Disconnect string `json:"disconnect"`
	Advance    string `json:"advance"`
}

type goldenResource struct {
	Name    string            `json:"name"`
	Version string            `json:"version"`
	Created string            `json:"created"`
	Labels  map[string]string `json:"labels"`
	Hosts   []string          `json:"hosts"` // VirtualService/ServiceEntry hosts, DestinationRule host, Gateway server hosts
}

type goldenSink struct {
	Identity    string            `json:"identity"`
	Node        string            `json:"node"`
	Annotations map[string]string `json:"annotations"`
}

func goldenBody(t *testing.T, collection string, hosts []string) *anypb.Any {
	t.Helper()
	var msg proto.Message
	switch {
	case strings.HasSuffix(collection, "/virtualservices"):
		msg = &networking.VirtualService{Hosts: hosts}
	case strings.HasSuffix(collection, "/serviceentries"):
		msg = &networking.ServiceEntry{Hosts: hosts}
	case strings.HasSuffix(collection, "/destinationrules"):
		h := ""
		if len(hosts) > 0 {
			h = hosts[0]
		}
		msg = &networking.DestinationRule{Host: h}
	case strings.HasSuffix(collection, "/gateways"):
		msg = &networking.Gateway{Servers: []*networking.Server{{Hosts: hosts, Port: &networking.Port{Number: 80, Name: "http", Protocol: "HTTP"}}}}
	default:
		msg = &networking.Sidecar{}
	}
	b, err := anypb.New(msg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txtar")
	if len(files) == 0 {
		t.Fatal("no golden files")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) { runGolden(t, path) })
	}
}

func runGolden(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := golden.Parse(data)
	section := func(name string, v any) {
		text, _ := f.Get(name)
		if err := yaml.UnmarshalStrict([]byte(text), v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var b strings.Builder
	cfgText, _ := f.Get("hub.yaml")
	cfg, err := ParseConfig([]byte(cfgText))
	if err != nil {
		b.WriteString("config refused: " + err.Error() + "\n")
		check(t, path, f, b.String())
		return
	}
	h, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var steps []goldenPush
	var sinks []goldenSink
	section("pushes.yaml", &steps)
	section("sinks.yaml", &sinks)
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h.now = func() time.Time { return clock }

	// Every sink watches its view from the start, through the serving router, so views are
	// also kept up to date incrementally, and a reload closes the streams it routes
	// elsewhere (they reconnect at once, as sinks do).
	type watching struct {
		s      goldenSink
		info   *mcp.StreamInfo
		closed bool
		colls  map[string]mcp.Collection
		cancel []func()
	}
	watch := func(w *watching) {
		w.info = mcp.NewStreamInfo(w.s.Identity, &mcppb.SinkNode{Id: w.s.Node, Annotations: w.s.Annotations}, func() { w.closed = true })
		w.closed, w.colls, w.cancel = false, map[string]mcp.Collection{}, nil
		for _, coll := range cfg.Collections {
			c, cancel, _ := router{h}.Watch(w.info, coll, func() {})
			w.colls[coll], w.cancel = c, append(w.cancel, cancel)
		}
	}
	stop := func(w *watching) {
		for _, c := range w.cancel {
			c()
		}
	}
	var watched []*watching
	for _, s := range sinks {
		w := &watching{s: s}
		watch(w)
		defer stop(w)
		watched = append(watched, w)
	}

	// showSinks writes what every sink receives now, and checks that each view, kept up to
	// date incrementally (and by reloads, which recompute only some), holds what a fresh
	// computation for its route does.
	showSinks := func() {
		live := h.current().cfg
		for _, w := range watched {
			rt := h.current().comp.routeOf(w.s.Identity, w.s.Node, w.s.Annotations)
			tenant := ""
			if !h.current().comp.tenants.Single() {
				tenant = fmt.Sprintf(" tenant %q", rt.tenant)
			}
			fmt.Fprintf(&b, "sink identity=%q node=%q ->%s rules [%s]\n", w.s.Identity, w.s.Node, tenant, rt.sub.Key())
			// What the shared view holds must equal a fresh computation for the route.
			fresh, err := h.store.servedWith(context.Background(), rt, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, coll := range live.Collections {
				var lines []string
				for _, e := range w.colls[coll].Snapshot().Entries {
					lines = append(lines, fmt.Sprintf("  %s %s %s", short(coll), e.Name, e.Version))
					if fresh[coll][e.Name] != e.Version {
						t.Errorf("sink %s: the incrementally kept view has %s %s at %s, a fresh one %q", w.s.Node, coll, e.Name, e.Version, fresh[coll][e.Name])
					}
				}
				if len(lines) != len(fresh[coll]) {
					t.Errorf("sink %s: view has %d %s, a fresh one %d", w.s.Node, len(lines), coll, len(fresh[coll]))
				}
				sort.Strings(lines)
				for _, l := range lines {
					b.WriteString(l + "\n")
				}
			}
		}
	}

	type stream struct {
		s      *Session
		closed bool
	}
	sessions := map[string]*stream{}
	lifecycle := false
	// report writes what a push was answered: its ACK, or its NACK with every rejection.
	report := func(i int, p goldenPush, err error) {
		fmt.Fprintf(&b, "push %d %s %s: ", i, p.Cluster, short(p.Collection))
		if err == nil {
			b.WriteString("ACK\n")
			return
		}
		nack, _ := status.FromError(err)
		fmt.Fprintf(&b, "NACK %s\n", nack.Code())
		rejections := mcp.Rejections(nack.Proto())
		if len(rejections) == 0 {
			fmt.Fprintf(&b, "  %s\n", nack.Message())
			checkNoLeak(t, h, p.Cluster, nack.Message())
		}
		for _, r := range rejections {
			fmt.Fprintf(&b, "  %s: %s\n", r.Resource, r.Reason)
			checkNoLeak(t, h, p.Cluster, r.Reason)
		}
	}
	for i, p := range steps {
		switch {
		case p.Reload != "":
			lifecycle = true
			text, ok := f.Get(p.Reload)
			if !ok {
				t.Fatalf("step %d: no section %q", i, p.Reload)
			}
			next, err := ParseConfig([]byte(text))
			var res ReloadResult
			tenanted := !h.current().comp.tenants.Single()
			if err == nil {
				res, err = h.Reload(next)
			}
			if err != nil {
				fmt.Fprintf(&b, "reload %s refused: %v\n", p.Reload, err)
				continue
			}
			fmt.Fprintf(&b, "reload %s: %d refused, %d ingest and %d sink streams closed", p.Reload, res.Refused, res.ClosedIngest, res.ClosedSinks)
			if tenanted || !h.current().comp.tenants.Single() {
				// Which views a reload recomputes and which sinks it closes is part of the
				// isolation of tenants: a tenant whose sight did not change keeps its views
				// and its streams as they are.
				fmt.Fprintf(&b, ", %d views recomputed", res.Views)
				var closed []string
				for _, w := range watched {
					if w.closed {
						closed = append(closed, w.s.Node)
					}
				}
				if len(closed) > 0 {
					fmt.Fprintf(&b, " (closed: %s)", strings.Join(closed, ", "))
				}
			}
			b.WriteString("\n")
			for _, c := range h.Conflicts() {
				checkConflictTenant(t, h, c)
				fmt.Fprintf(&b, "  conflict %s %s: %s wins over %s (%s)\n", short(c.Collection), c.Name, c.Winner, strings.Join(c.Losers, ","), c.Why)
			}
			for _, w := range watched {
				if w.closed { // the sink reconnects
					stop(w)
					watch(w)
				}
			}
			for c, st := range sessions {
				if st.closed { // the reload closed the cluster's stream: it ends
					h.sessionClosed(st.s)
					delete(sessions, c)
				}
			}
			continue
		case p.Show:
			b.WriteString("show:\n")
			showSinks()
			continue
		case p.Disconnect != "":
			lifecycle = true
			if st := sessions[p.Disconnect]; st != nil {
				h.sessionClosed(st.s)
				delete(sessions, p.Disconnect)
			}
			fmt.Fprintf(&b, "disconnect %s\n", p.Disconnect)
			continue
		case p.Advance != "":
			lifecycle = true
			d, err := time.ParseDuration(p.Advance)
			if err != nil {
				t.Fatalf("step %d: advance: %v", i, err)
			}
			clock = clock.Add(d)
			h.expireStale()
			fmt.Fprintf(&b, "advance %s:", p.Advance)
			for _, c := range h.Clusters() {
				var held []string
				for coll, n := range c.Resources {
					held = append(held, fmt.Sprintf("%s=%d", short(coll), n))
				}
				sort.Strings(held)
				fmt.Fprintf(&b, " %s {%s}", c.Name, strings.Join(held, " "))
			}
			b.WriteString("\n")
			continue
		}
		c := &mcp.Change{Collection: p.Collection, Incremental: !p.Full, Removed: p.Removed}
		for _, r := range p.Resources {
			md := &mcpapi.Metadata{Name: r.Name, Version: r.Version, Labels: r.Labels}
			if md.Version == "" {
				md.Version = "1"
			}
			if r.Created != "" {
				ts, err := time.Parse(time.RFC3339, r.Created)
				if err != nil {
					t.Fatalf("push %d: %s: created: %v", i, r.Name, err)
				}
				md.CreateTime = timestamppb.New(ts)
			}
			res := &mcpapi.Resource{Metadata: md, Body: goldenBody(t, p.Collection, r.Hosts)}
			e, err := mcp.NewEntry(res)
			if err != nil {
				t.Fatal(err)
			}
			c.Entries = append(c.Entries, e)
			c.Resources = append(c.Resources, res)
		}
		if p.Direct {
			report(i, p, h.Apply(p.Cluster, c))
			continue
		}
		st := sessions[p.Cluster]
		if st == nil {
			s, err := h.OpenSession(p.Cluster, SessionOptions{Node: minionNode})
			if err != nil { // a cluster not in the configuration: its stream is refused
				fmt.Fprintf(&b, "push %d %s %s: refused: %v\n", i, p.Cluster, short(p.Collection), err)
				continue
			}
			st = &stream{s: s}
			h.sessionOpened(s, mcp.NewStreamInfo(p.Cluster, nil, func() { st.closed = true }))
			sessions[p.Cluster] = st
		}
		report(i, p, h.apply(st.s, c))
	}
	for _, c := range h.Conflicts() {
		checkConflictTenant(t, h, c)
		fmt.Fprintf(&b, "conflict %s %s: %s wins over %s (%s)\n", short(c.Collection), c.Name, c.Winner, strings.Join(c.Losers, ","), c.Why)
	}
	if lifecycle {
		for _, c := range h.Clusters() {
			n, refused := 0, 0
			for _, k := range c.Resources {
				n += k
			}
			for _, r := range c.Rejections {
				refused += len(r)
			}
			fmt.Fprintf(&b, "cluster %s: connected=%v synced=%v resources=%d refused=%d\n", c.Name, c.Connected, c.Synced, n, refused)
		}
	}
	showSinks()
	check(t, path, f, b.String())
}

// checkNoLeak fails the test if reason, told to cluster, names (as reasons do, quoted) a
// cluster of another tenant: a tenant learns nothing of another's clusters from a refusal.
func checkNoLeak(t *testing.T, h *Hub, cluster, reason string) {
	t.Helper()
	set := h.current().comp.tenants
	if set.Single() {
		return
	}
	own := set.OfCluster(cluster)
	for _, other := range set.Names() {
		if other == own {
			continue
		}
		for _, c := range set.Clusters(other) {
			if strings.Contains(reason, fmt.Sprintf("%q", c)) {
				t.Errorf("a reason told to cluster %q (tenant %q) names cluster %q of tenant %q: %s", cluster, own, c, other, reason)
			}
		}
	}
}

// checkConflictTenant fails the test if a conflict is between clusters of two tenants: their
// claims never overlap, so one tenant's object never competes with another's.
func checkConflictTenant(t *testing.T, h *Hub, c api.Conflict) {
	t.Helper()
	set := h.current().comp.tenants
	for _, l := range c.Losers {
		if a, b := set.OfCluster(c.Winner), set.OfCluster(l); a != b {
			t.Errorf("conflict %s %s between tenants: %s (%q) wins over %s (%q)", short(c.Collection), c.Name, c.Winner, a, l, b)
		}
	}
}

func short(collection string) string { return collection[strings.LastIndex(collection, "/")+1:] }

func check(t *testing.T, path string, f *golden.File, got string) {
	t.Helper()
	diff, err := golden.Check(path, f, got)
	if err != nil {
		t.Fatal(err)
	}
	if diff != "" {
		t.Errorf("%s differs (go test -update rewrites it):\n%s", path, diff)
	}
}
