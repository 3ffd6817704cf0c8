package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/testkit/bench"
	"github.com/meshfed/meshfed/internal/testkit/bench/load"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// versusFlags size the versus table: meshfed's hub against Istio 1.8's own MCP source and
// bare gRPC, each a process, driven by one load process (cmd/mcpload).
type versusFlags struct {
	rows, servers   string
	sinks, bigSinks int
	idleSinks       int
	changes         int
	size            int
	gap             time.Duration
	istioLog        string
}

// versusRow is one row: what it runs, and how it reads the results.
type versusRow struct {
	key, label string
	cfg        bench.VersusConfig
	// figure is the row's figure for one server, and its text.
	figure func(bench.VersusResult) (float64, string)
}

func latency(r bench.VersusResult) (float64, string) {
	return float64(r.Last()), r.Last().Round(100 * time.Microsecond).String()
}

func storm(r bench.VersusResult) (float64, string) {
	return float64(r.Connect.Last), r.Connect.Last.Round(time.Millisecond).String()
}

func idle(r bench.VersusResult) (float64, string) {
	return r.RSSPerSinkKiB(), fmt.Sprintf("%.1f KiB", r.RSSPerSinkKiB())
}

func versusRows(f versusFlags) []versusRow {
	// A resource as Istio and bare send it: in a Resources message, with its field's tag and length.
	each := proto.Size(&mcppb.Resources{Resources: []*mcpapi.Resource{bench.Resource(0, 0, f.size)}})
	kb := func(n int) string {
		return fmt.Sprintf("%s resources (%.0f KB)", thousands(n), float64(n*each)/1000)
	}
	inc := bench.VersusConfig{Resources: 1000, Size: f.size, Sinks: f.sinks, Changes: f.changes, Incremental: true, Gap: f.gap, IstioLogLevel: f.istioLog}
	full := func(n, changes int) bench.VersusConfig {
		return bench.VersusConfig{Resources: n, Size: f.size, Sinks: f.sinks, Changes: changes, Gap: f.gap, IstioLogLevel: f.istioLog}
	}
	big := inc
	big.Sinks = f.bigSinks
	idleCfg := bench.VersusConfig{Resources: 100, Size: f.size, Sinks: f.idleSinks, IstioLogLevel: f.istioLog}
	return []versusRow{
		{"incremental", fmt.Sprintf("incremental, 1 change in %s, %s sinks: last sink", kb(1000), thousands(f.sinks)), inc, latency},
		{"full100", fmt.Sprintf("full state, %s, %s sinks: last sink", kb(100), thousands(f.sinks)), full(100, f.changes), latency},
		{"full1", fmt.Sprintf("full state, 1 resource, %s sinks: last sink", thousands(f.sinks)), full(1, f.changes), latency},
		{"full1000", fmt.Sprintf("full state, %s, %s sinks: last sink", kb(1000), thousands(f.sinks)), full(1000, max(f.changes/4, 3)), latency},
		{"incremental-big", fmt.Sprintf("incremental, 1 change in %s, %s sinks: last sink", kb(1000), thousands(f.bigSinks)), big, latency},
		{"idle", fmt.Sprintf("server RSS per idle sink (%s sinks, %s, full state)", thousands(f.idleSinks), kb(100)), idleCfg, idle},
		// The storm is the incremental row's connect: 1,000 sinks at once, each until it
		// holds the 1,000 resources.
		{"storm", fmt.Sprintf("connect storm, %s sinks x %s initial state: last sink", thousands(f.sinks), kb(1000)), inc, storm},
	}
}

func versusTable(f versusFlags) {
	fmt.Println()
	servers := strings.Split(f.servers, ",")
	want := map[string]bool{}
	for _, r := range strings.Split(f.rows, ",") {
		want[strings.TrimSpace(r)] = true
	}
	var known []string
	for _, row := range versusRows(f) {
		known = append(known, row.key)
	}
	for r := range want {
		if !slices.Contains(known, r) {
			fail("versus-rows", fmt.Errorf("no row %q (%s)", r, strings.Join(known, ", ")))
		}
	}
	nofile, err := load.RaiseNoFile()
	if err != nil {
		fail("rlimit", err)
	}
	if need := uint64(f.bigSinks + 100); nofile < need {
		fmt.Fprintf(os.Stderr, "open-file limit %d is below %d: the %d-sink row may fail\n", nofile, need, f.bigSinks)
	}
	w := newMarkdown(os.Stdout)
	head := []string{"scenario (processes, insecure gRPC on 127.0.0.1)"}
	head = append(head, servers...)
	head = append(head, ratioHeads(servers)...)
	w.row(append(head, "notes")...)
	done := map[string][]bench.VersusResult{} // results by config, so the storm reuses the incremental row's run
	for _, row := range versusRows(f) {
		if !want[row.key] {
			continue
		}
		key := fmt.Sprintf("%+v", row.cfg)
		rs, ok := done[key]
		if !ok {
			if rs, err = bench.Versus(row.cfg, servers); err != nil {
				fail("versus "+row.key, err)
			}
			done[key] = rs
		}
		cells := []string{row.label}
		vals := map[string]float64{}
		for _, r := range rs {
			v, s := row.figure(r)
			vals[r.Server] = v
			cells = append(cells, s)
		}
		cells = append(cells, ratios(servers, vals)...)
		w.row(append(cells, notes(row, rs))...)
	}
}

// ratioPairs are the ratio columns, each printed when both its servers run: Istio / meshfed
// (above 1: meshfed is faster or smaller) and meshfed / bare (its cost over bare gRPC
// sending the same resources).
var ratioPairs = [][2]string{{"istio", "meshfed"}, {"meshfed", "bare"}}

func ratioHeads(servers []string) []string {
	var h []string
	for _, p := range ratioPairs {
		if slices.Contains(servers, p[0]) && slices.Contains(servers, p[1]) {
			h = append(h, p[0]+" / "+p[1])
		}
	}
	return h
}

func ratios(servers []string, v map[string]float64) []string {
	var c []string
	for _, p := range ratioPairs {
		if slices.Contains(servers, p[0]) && slices.Contains(servers, p[1]) {
			c = append(c, fmt.Sprintf("%.2f", v[p[0]]/v[p[1]]))
		}
	}
	return c
}

// notes are the row's other figures, per server in column order.
func notes(row versusRow, rs []bench.VersusResult) string {
	each := func(f func(bench.VersusResult) string) string {
		var s []string
		for _, r := range rs {
			s = append(s, f(r))
		}
		return strings.Join(s, " / ")
	}
	ms := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	switch row.key {
	case "idle":
		return "RSS before -> after: " + each(func(r bench.VersusResult) string {
			return fmt.Sprintf("%.1f -> %.1f MiB", float64(r.RSSBeforeKiB)/1024, float64(r.RSSAfterKiB)/1024)
		})
	case "storm":
		return "median sink " + each(func(r bench.VersusResult) string { return ms(r.Connect.P50) }) +
			"; initial message " + each(func(r bench.VersusResult) string { return fmt.Sprintf("%d B", r.Connect.Bytes) })
	}
	return fmt.Sprintf("median of %d changes; slowest change ", row.cfg.Changes) + each(func(r bench.VersusResult) string { return ms(r.LastP99()) }) +
		"; median sink " + each(func(r bench.VersusResult) string { return ms(r.SinkP50()) }) +
		"; push " + each(func(r bench.VersusResult) string { return fmt.Sprintf("%d B", r.Bytes()) }) +
		"; server CPU per change " + each(func(r bench.VersusResult) string { return ms(r.CPUPerChange) })
}

// thousands writes n with a comma every three digits: 1,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
