package hub

import (
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

	"github.com/meshfed/meshfed/internal/testkit/golden"
	"github.com/meshfed/meshfed/mcp"
	"github.com/meshfed/meshfed/routing"
)

// The golden scenarios (testdata/*.txtar): a hub configuration, the pushes clusters make
// (in order), and sinks; out come each push's ACK or NACK with its rejections, the
// conflicts, and what every sink is served. `go test -update` rewrites the want sections.

type goldenPush struct {
	Cluster    string           `json:"cluster"`
	Collection string           `json:"collection"`
	Full       bool             `json:"full"`
	Resources  []goldenResource `json:"resources"`
	Removed    []string         `json:"removed"`
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
	var pushes []goldenPush
	var sinks []goldenSink
	section("pushes.yaml", &pushes)
	section("sinks.yaml", &sinks)

	// Open every sink's view first, so views are also kept up to date incrementally.
	type opened struct {
		s     goldenSink
		sub   *routing.Subset
		cache *mcp.Cache
	}
	var views []opened
	for _, s := range sinks {
		sub := h.current().comp.routes.Select(routing.Sink{Identity: s.Identity, NodeID: s.Node, Annotations: s.Annotations})
		cache, release := h.store.watch(sub)
		defer release()
		views = append(views, opened{s, sub, cache})
	}

	for i, p := range pushes {
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
		err := h.Apply(p.Cluster, c)
		fmt.Fprintf(&b, "push %d %s %s: ", i, p.Cluster, short(p.Collection))
		if err == nil {
			b.WriteString("ACK\n")
			continue
		}
		st, _ := status.FromError(err)
		fmt.Fprintf(&b, "NACK %s\n", st.Code())
		for _, r := range mcp.Rejections(st.Proto()) {
			fmt.Fprintf(&b, "  %s: %s\n", r.Resource, r.Reason)
		}
	}
	for _, c := range h.Conflicts() {
		fmt.Fprintf(&b, "conflict %s %s: %s wins over %s (%s)\n", short(c.Collection), c.Name, c.Winner, strings.Join(c.Losers, ","), c.Why)
	}
	for _, v := range views {
		fmt.Fprintf(&b, "sink identity=%q node=%q -> rules [%s]\n", v.s.Identity, v.s.Node, v.sub.Key())
		// What the shared view holds must equal a fresh computation for the subset.
		fresh := h.store.served(v.sub)
		for _, coll := range cfg.Collections {
			var lines []string
			for _, e := range v.cache.Entries(coll) {
				lines = append(lines, fmt.Sprintf("  %s %s %s", short(coll), e.Name, e.Version))
				if fresh[coll][e.Name] != e.Version {
					t.Errorf("sink %s: the incrementally kept view has %s %s at %s, a fresh one %q", v.s.Node, coll, e.Name, e.Version, fresh[coll][e.Name])
				}
			}
			if len(lines) != len(fresh[coll]) {
				t.Errorf("sink %s: view has %d %s, a fresh one %d", v.s.Node, len(lines), coll, len(fresh[coll]))
			}
			sort.Strings(lines)
			for _, l := range lines {
				b.WriteString(l + "\n")
			}
		}
	}
	check(t, path, f, b.String())
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
