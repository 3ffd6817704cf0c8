// Command mcpbench prints meshfed's benchmark tables, each row next to a baseline run in the
// same process right before it (the machine is noisy: read the ratio):
//   - the MCP engine: fan-out of one change to 1, 100 and 1,000 streams, for incremental and
//     full-state sinks, against raw gRPC sending the same bytes;
//   - the minion: conversion throughput against a bare strict decode + marshal, and the
//     initial sync of 10,000 objects from a real kube-apiserver to a connected sink (time and
//     heap) against one paged LIST of the same objects;
//   - the hub (-hub-rows selects rows): fan-out against bare gRPC, CPU per change by stored
//     resources, idle sink memory, end-to-end latency, and its safety rows: a cluster's
//     latency with another flooding at its push quota against the same with it idle, and the
//     heap with a sink that never ACKs against one that does; and its tenants row: a tenant's
//     latency with another using all its tenant limits admit (pushes, a stream-opening loop,
//     1,000 sinks that never ACK) against the same with it idle; and its dry-run row: a
//     cluster's latency while operators' clients loop dry runs of a 1 MB candidate against
//     the same with none;
//   - versus: meshfed's hub against Istio 1.8's own MCP source (test/istio's peer) and bare
//     gRPC sending pre-encoded messages, each a process, driven by one separate load process
//     (cmd/mcpload, one connection per sink): latency of a change to the last sink,
//     incremental and full state, memory per idle sink and a connect storm.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/bench"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
)

func main() {
	changes := flag.Int("changes", 200, "changes measured per row")
	resources := flag.Int("resources", 100, "resources in the collection")
	size := flag.Int("size", 256, "bytes per resource body")
	only := flag.String("only", "", "run only this table: engine, minion, hub, replicas or versus")
	replicaSinks := flag.Int("replica-sinks", 1000, "sinks of the replica-kill scenario")
	replicaChanges := flag.Int("replica-changes", 300, "changes measured per replica-count row")
	hubSinks := flag.String("hub-sinks", "1000,10000", "sink counts of the hub fan-out rows")
	hubResources := flag.String("hub-resources", "1000,100000,1000000", "stored resources of the hub CPU-per-change rows")
	kubeObjects := flag.Int("kube-objects", 10000, "objects in the minion's initial-sync scenario (0 skips it)")
	hubRows := flag.String("hub-rows", "fanout,store,persist,idle,latency,neighbour,stalled,tenants,dryrun", "rows of the hub table to run")
	var safety safetyFlags
	flag.IntVar(&safety.sinks, "neighbour-sinks", 100, "sinks of the noisy-neighbour rows")
	flag.IntVar(&safety.changes, "neighbour-changes", 1000, "cluster B's changes measured per condition (A idle, A flooding)")
	flag.IntVar(&safety.rounds, "neighbour-rounds", 10, "rounds alternating A idle and A flooding")
	flag.Float64Var(&safety.rate, "neighbour-rate", hub.Defaults().Quotas.PushesPerSecond, "cluster A's pushesPerSecond quota in the noisy-neighbour rows (default: the hub's)")
	flag.IntVar(&safety.burst, "neighbour-burst", hub.Defaults().Quotas.PushBurst, "cluster A's pushBurst quota in the noisy-neighbour rows (default: the hub's)")
	flag.IntVar(&safety.stalledChanges, "stalled-changes", 10000, "changes of the stalled-sink row")
	flag.IntVar(&safety.stalledResources, "stalled-resources", 1000, "resources in the stalled-sink row's collection")
	var tenants tenantFlags
	flag.IntVar(&tenants.aClusters, "tenants-a-clusters", 10, "tenant A's clusters in the noisy-tenant row, each flooding at its own quota")
	flag.IntVar(&tenants.aSinks, "tenants-a-sinks", 1000, "tenant A's sinks that never ACK in the noisy-tenant row")
	flag.IntVar(&tenants.loopWorkers, "tenants-loop-workers", 2, "goroutines opening streams as A's sinks in a tight loop: the most streams it has in flight")
	flag.IntVar(&tenants.loopConns, "tenants-loop-conns", 2, "connections the loop's workers share")
	flag.IntVar(&tenants.loopIdentities, "tenants-loop-identities", 1000, "sink identities of A the loop takes in turn (1: one, which the per-peer limit alone refuses)")
	flag.Float64Var(&tenants.loopRate, "tenants-loop-rate", 0, "cap on the streams the loop opens per second (0: as fast as it can)")
	flag.IntVar(&tenants.bSinks, "tenants-b-sinks", 10, "tenant B's sinks, each timing every change of B")
	flag.IntVar(&tenants.changes, "tenants-changes", 1000, "tenant B's changes measured per condition (A idle, A noisy)")
	flag.IntVar(&tenants.rounds, "tenants-rounds", 10, "rounds alternating A idle and A noisy")
	var versus versusFlags
	flag.StringVar(&versus.rows, "versus-rows", "incremental,full100,full1,full1000,incremental-big,idle,storm", "rows of the versus table to run")
	flag.StringVar(&versus.servers, "versus-servers", strings.Join(bench.VersusServers, ","), "servers of the versus table, in column order")
	flag.IntVar(&versus.sinks, "versus-sinks", 1000, "sinks of the versus table's rows (one connection each)")
	flag.IntVar(&versus.bigSinks, "versus-big-sinks", 5000, "sinks of its large incremental row")
	flag.IntVar(&versus.idleSinks, "versus-idle-sinks", 2000, "sinks of its idle-memory row")
	flag.IntVar(&versus.changes, "versus-changes", 20, "changes measured per versus row (a quarter for the 1,000-resource full state)")
	flag.IntVar(&versus.size, "versus-size", 682, "bytes of a resource's body in the versus table (682: 770 bytes a resource, 770 KB for 1,000)")
	flag.DurationVar(&versus.gap, "versus-gap", 100*time.Millisecond, "pause after each change of the versus table (the last ACKs settle)")
	flag.StringVar(&versus.istioLog, "versus-istio-log", "warn", "level of Istio's mcp log scope in the versus table (info, Galley's default, logs a line per ACK: one per sink per change; meshfed logs none)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail("cpuprofile", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail("cpuprofile", err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if *only == "" || *only == "engine" {
		engineTable(*changes, *resources, *size)
	}
	if *only == "" || *only == "minion" {
		minionTable(*kubeObjects)
	}
	if *only == "" || *only == "hub" {
		rows := map[string]bool{}
		for _, r := range strings.Split(*hubRows, ",") {
			switch r = strings.TrimSpace(r); r {
			case "fanout", "store", "persist", "idle", "latency", "neighbour", "stalled", "tenants", "dryrun":
				rows[r] = true
			default:
				fail("hub-rows", fmt.Errorf("no row %q (fanout, store, persist, idle, latency, neighbour, stalled, tenants, dryrun)", r))
			}
		}
		hubTable(rows, ints(*hubSinks), ints(*hubResources), *resources, *size, safety, tenants)
	}
	if *only == "" || *only == "replicas" {
		replicaTable(*replicaSinks, *replicaChanges)
	}
	if *only == "" || *only == "versus" {
		versusTable(versus)
	}
}

func replicaTable(sinks, changes int) {
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "replica scenario (processes)\treplicas\tbaseline\tratio\tnotes\t")
	k, err := bench.ReplicaKill(sinks)
	if err != nil {
		fail("replica kill", err)
	}
	fmt.Fprintf(w, "kill -9 of a replica, %d sinks: all connected and converged after\t%v\t%v\t%.2f\t%d sinks moved, %d deletions; baseline: the same sinks' first subscription and convergence\t\n",
		k.Sinks, k.Recovery.Round(time.Millisecond), k.Initial.Round(time.Millisecond), float64(k.Recovery)/float64(k.Initial), k.Moved, k.Removals)
	var one bench.CostResult
	for _, n := range []int{1, 2, 3} {
		c, err := bench.ReplicaChangeCost(n, changes)
		if err != nil {
			fail("replica cost", err)
		}
		if n == 1 {
			one = c
		}
		extra := "-"
		if n > 1 {
			extra = fmt.Sprintf("%v per added replica", ((c.CPUPerChange - one.CPUPerChange) / time.Duration(n-1)).Round(10*time.Microsecond))
		}
		fmt.Fprintf(w, "CPU per change, %d replica(s), all processes\t%v\t%v\t%.2f\t%s; change reaches every replica's sink in %v; baseline: 1 replica\t\n",
			n, c.CPUPerChange.Round(10*time.Microsecond), one.CPUPerChange.Round(10*time.Microsecond), float64(c.CPUPerChange)/float64(one.CPUPerChange), extra, c.Latency.Round(10*time.Microsecond))
	}
	w.Flush()
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			fail("flag", err)
		}
		out = append(out, n)
	}
	return out
}

// safetyFlags size the hub's safety rows (issue 14).
type safetyFlags struct {
	sinks, changes, rounds, burst    int
	rate                             float64
	stalledChanges, stalledResources int
}

// tenantFlags size the noisy-tenant row.
type tenantFlags struct {
	aClusters, aSinks, loopWorkers, loopConns, loopIdentities, bSinks, changes, rounds int
	loopRate                                                                           float64
}

func hubTable(rows map[string]bool, sinks, stored []int, resources, size int, safety safetyFlags, tenants tenantFlags) {
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "hub scenario\thub\tbaseline\tratio\tnotes\t")
	if !rows["fanout"] {
		sinks = nil
	}
	if !rows["store"] {
		stored = nil
	}
	for _, n := range sinks {
		changes := 50
		if n >= 10000 {
			changes = 30
		}
		cfg := bench.FanoutConfig{Streams: n, Resources: resources, Changes: changes, Incremental: true, ResourceBytes: size}
		base, err := bench.BaselineFanout(cfg)
		if err != nil {
			fail("baseline", err)
		}
		hr, err := bench.HubFanout(cfg)
		if err != nil {
			fail("hub fan-out", err)
		}
		fmt.Fprintf(w, "one change to %d sinks (per change)\t%v\t%v\t%.2f\tminion push+ACK, ACL, merge, view, fan-out; baseline: bare gRPC, same bytes; %.2f resource / %.2f body encodes per change\t\n",
			n, hr.PerChange.Round(time.Microsecond), base.PerChange.Round(time.Microsecond), float64(hr.PerChange)/float64(base.PerChange), hr.ResourceEncodes, hr.BodyEncodes)
	}
	var first time.Duration
	for _, n := range stored {
		r, err := bench.HubStore(n, 2000, size, nil)
		if err != nil {
			fail("hub store", err)
		}
		if first == 0 {
			first = r.CPUPerChange
		}
		fmt.Fprintf(w, "CPU per change, %d resources stored\t%v\t%v\t%.2f\tbaseline: the same at %d resources; %.0f allocs/change; heap %.0f MiB\t\n",
			n, r.CPUPerChange.Round(100*time.Nanosecond), first.Round(100*time.Nanosecond), float64(r.CPUPerChange)/float64(first), stored[0], r.AllocsPerChange, r.HeapMiB)
		if n == 100000 {
			fmt.Fprintf(w, "memory per 100k resources (MiB)\t%.0f\t-\t-\treceived + served forms, index, one view (%d B bodies)\t\n", r.HeapMiB, size)
		}
	}
	if rows["persist"] {
		// The state file's cost on the push path: the same changes with it and without.
		off, err := bench.HubStore(1000, 2000, size, func(c *hub.Config) { c.Persist = false })
		if err != nil {
			fail("hub store, persist off", err)
		}
		on, err := bench.HubStore(1000, 2000, size, nil)
		if err != nil {
			fail("hub store, persist on", err)
		}
		fmt.Fprintf(w, "CPU per change, state kept on disk (1000 resources)\t%v\t%v\t%.2f\tbaseline: persist off, same run; %.0f vs %.0f allocs/change; includes the writer's commits\t\n",
			on.CPUPerChange.Round(100*time.Nanosecond), off.CPUPerChange.Round(100*time.Nanosecond), float64(on.CPUPerChange)/float64(off.CPUPerChange), on.AllocsPerChange, off.AllocsPerChange)
		// And on the push path itself: minion -> hub -> sink.
		loff, err := bench.HubLatency(10, 100, 200, func(c *hub.Config) { c.Persist = false })
		if err != nil {
			fail("latency, persist off", err)
		}
		lon, err := bench.HubLatency(10, 100, 200, nil)
		if err != nil {
			fail("latency, persist on", err)
		}
		fmt.Fprintf(w, "minion -> hub -> sink p99, state kept on disk (10 clusters, 100 sinks)\t%v\t%v\t%.2f\tbaseline: persist off, same run; p50 %v vs %v\t\n",
			lon.P99.Round(100*time.Microsecond), loff.P99.Round(100*time.Microsecond), float64(lon.P99)/float64(loff.P99), lon.P50.Round(100*time.Microsecond), loff.P50.Round(100*time.Microsecond))
	}
	if rows["idle"] {
		idle, err := bench.IdleSinks(1000)
		if err != nil {
			fail("idle sinks", err)
		}
		fmt.Fprintf(w, "idle sink memory (KiB per sink, 1000 sinks)\t%.1f\t%.1f\t%.2f\tboth include the clients' side, in this process; baseline: bare gRPC stream holding one push\t\n",
			idle.PerSinkKiB, idle.BaselineKiB, idle.PerSinkKiB/idle.BaselineKiB)
	}
	if rows["latency"] {
		lat, err := bench.HubLatency(100, 1000, 50, nil)
		if err != nil {
			fail("latency", err)
		}
		fmt.Fprintf(w, "minion -> hub -> sink latency, 100 clusters, 1000 sinks\tp50 %v\tp99 %v\t-\tmax %v over %d changes x %d sinks\t\n",
			lat.P50.Round(100*time.Microsecond), lat.P99.Round(100*time.Microsecond), lat.Max.Round(100*time.Microsecond), lat.Changes, lat.Sinks)
	}
	if rows["neighbour"] {
		cfg := bench.NeighbourConfig{Sinks: safety.sinks, Changes: safety.changes, Rounds: safety.rounds, Resources: 100, Size: size,
			PushesPerSecond: safety.rate, PushBurst: safety.burst, Gap: 20 * time.Millisecond}
		r, err := bench.NoisyNeighbour(cfg)
		if err != nil {
			fail("noisy neighbour", err)
		}
		us := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
		fmt.Fprintf(w, "cluster B -> %d sinks p99, A flooding at its quota (%.0f/s, burst %d)\t%v\t%v\t%.2f\ttarget <= 1.20; baseline: A idle, same run (%d rounds alternating); max %v vs %v; A achieved %.1f pushes/s, %.2f changes/push, over %.1f s; process CPU %.2f vs %.2f cores\t\n",
			cfg.Sinks, cfg.PushesPerSecond, cfg.PushBurst, us(r.Flood.P99), us(r.Idle.P99), float64(r.Flood.P99)/float64(r.Idle.P99),
			cfg.Rounds, us(r.Flood.Max), us(r.Idle.Max), r.APushesPerSec, r.AChangesPerPush, r.FloodSeconds, r.Flood.Cores, r.Idle.Cores)
		fmt.Fprintf(w, "cluster B -> %d sinks p50, A flooding at its quota\t%v\t%v\t%.2f\t%d changes of B x %d sinks per condition, %v apart\t\n",
			cfg.Sinks, us(r.Flood.P50), us(r.Idle.P50), float64(r.Flood.P50)/float64(r.Idle.P50), r.Idle.N/cfg.Sinks, cfg.Sinks, cfg.Gap)
		fmt.Fprintf(w, "cluster B push -> hub ACK p99, A flooding at its quota\t%v\t%v\t%.2f\tB's ingest (ACL, store, merge, view) as its source sees it; p50 %v vs %v\t\n",
			us(r.Flood.Ingest.P99), us(r.Idle.Ingest.P99), float64(r.Flood.Ingest.P99)/float64(r.Idle.Ingest.P99), us(r.Flood.Ingest.P50), us(r.Idle.Ingest.P50))
		fmt.Fprintf(w, "  B's receipts behind a push of A's to the same sink, p99\t%v\t%v\t%.2f\t%.1f%% of B's receipts under the flood (p50 %v): a push of A's reached that sink after B's change was made (at most these waited for it); baseline: B's other receipts under the flood (p50 %v; vs A idle: p99 %.2fx)\t\n",
			us(r.Flood.Behind.P99), us(r.Flood.Clear.P99), float64(r.Flood.Behind.P99)/float64(max(r.Flood.Clear.P99, 1)),
			100*float64(r.Flood.Behind.N)/float64(max(r.Flood.N, 1)), us(r.Flood.Behind.P50), us(r.Flood.Clear.P50), float64(r.Flood.Clear.P99)/float64(r.Idle.P99))
	}
	if rows["stalled"] {
		cfg := bench.StalledConfig{Resources: safety.stalledResources, Size: size, Early: 100, Changes: safety.stalledChanges}
		r, err := bench.StalledSink(cfg)
		if err != nil {
			fail("stalled sink", err)
		}
		fmt.Fprintf(w, "heap after %d changes, a sink that never ACKs (MiB)\t%.2f\t%.2f\t%.2f\tbaseline: a sink that ACKs, same run; after %d changes %.2f vs %.2f, so %+.2f vs %+.2f MiB over the next %d; %d resources, process heap after GC\t\n",
			cfg.Changes, r.StalledLateMiB, r.AckingLateMiB, r.StalledLateMiB/r.AckingLateMiB, cfg.Early, r.StalledEarlyMiB, r.AckingEarlyMiB,
			r.StalledLateMiB-r.StalledEarlyMiB, r.AckingLateMiB-r.AckingEarlyMiB, cfg.Changes-cfg.Early, cfg.Resources)
	}
	if rows["tenants"] {
		cfg := bench.TenantsConfig{AClusters: tenants.aClusters, ASinks: tenants.aSinks, LoopWorkers: tenants.loopWorkers, LoopConns: tenants.loopConns, LoopIdentities: tenants.loopIdentities, LoopRate: tenants.loopRate,
			BSinks: tenants.bSinks, Changes: tenants.changes, Rounds: tenants.rounds, Resources: 100, Size: size, Gap: 20 * time.Millisecond}
		r, err := bench.NoisyTenant(cfg)
		if err != nil {
			fail("noisy tenant", err)
		}
		us := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
		unpaced := ""
		if r.Unpaced > 0 {
			unpaced = fmt.Sprintf(" (NOT PACED at its limit in %d of %d rounds)", r.Unpaced, cfg.Rounds)
		}
		l := hub.Defaults().TenantLimits
		loop := fmt.Sprintf("%d workers on %d connections, %d identities", cfg.LoopWorkers, min(cfg.LoopConns, cfg.LoopWorkers), cfg.LoopIdentities)
		if cfg.LoopRate > 0 {
			loop += fmt.Sprintf(", at most %.0f/s", cfg.LoopRate)
		}
		fmt.Fprintf(w, "tenant B -> %d sinks p99, tenant A noisy (its limits: %.0f pushes/s, %.0f streams/s)\t%v\t%v\t%.2f\ttarget <= 1.20; baseline: A idle, same run (%d rounds alternating); max %v vs %v; A: %d clusters pushing %.1f/s%s, %.2f changes/push; %d sinks never ACK; loop (%s): %.0f streams/s opened, %.1f/s admitted, refused %v; over %.1f s; process CPU %.2f vs %.2f cores, heap %.0f vs %.0f MiB\t\n",
			cfg.BSinks, l.PushesPerSecond, l.StreamsPerSecond, us(r.Noisy.P99), us(r.Idle.P99), float64(r.Noisy.P99)/float64(r.Idle.P99),
			cfg.Rounds, us(r.Noisy.Max), us(r.Idle.Max), cfg.AClusters, r.APushesPerSec, unpaced, r.AChangesPerPush, cfg.ASinks,
			loop, r.LoopPerSec, r.LoopAdmittedPerSec, r.LoopRefused, r.NoisySeconds, r.Noisy.Cores, r.Idle.Cores, r.Noisy.HeapMiB, r.Idle.HeapMiB)
		fmt.Fprintf(w, "tenant B -> %d sinks p50, tenant A noisy\t%v\t%v\t%.2f\t%d changes of B x %d sinks per condition, %v apart\t\n",
			cfg.BSinks, us(r.Noisy.P50), us(r.Idle.P50), float64(r.Noisy.P50)/float64(r.Idle.P50), r.Idle.N/cfg.BSinks, cfg.BSinks, cfg.Gap)
		fmt.Fprintf(w, "tenant B push -> hub ACK p99, tenant A noisy\t%v\t%v\t%.2f\tB's ingest (ACL, store, merge, view) as its source sees it; p50 %v vs %v\t\n",
			us(r.Noisy.Ingest.P99), us(r.Idle.Ingest.P99), float64(r.Noisy.Ingest.P99)/float64(r.Idle.Ingest.P99), us(r.Noisy.Ingest.P50), us(r.Idle.Ingest.P50))
	}
	if rows["dryrun"] {
		cand := bench.DryRunCandidate(240, 100) // just under the 1 MiB a dry run takes
		cfg := bench.DryRunConfig{Clusters: 10, Sinks: 100, Changes: 100, Rounds: 5, Clients: 3, Candidate: cand, Gap: 10 * time.Millisecond}
		r, err := bench.DryRunLoop(cfg)
		if err != nil {
			fail("dry runs", err)
		}
		ms := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
		fmt.Fprintf(w, "minion -> hub -> sink p99, %d operators looping dry runs of a %d KB candidate\t%v\t%v\t%.2f\tbaseline: no dry run, same run (%d rounds alternating); p50 %v vs %v; answers %v (mean 200 in %v); process CPU %.2f vs %.2f cores; busy %v after the clients left\t\n",
			cfg.Clients, len(cand)/1000, ms(r.Looping.P99), ms(r.Idle.P99), float64(r.Looping.P99)/float64(r.Idle.P99), cfg.Rounds,
			ms(r.Looping.P50), ms(r.Idle.P50), r.Answers, r.Took.Round(time.Millisecond), r.LoopCores, r.IdleCores, r.Settle.Round(10*time.Millisecond))
	}
	w.Flush()
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}

func minionTable(kubeObjects int) {
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "minion scenario\tminion\tbaseline\tratio\tnotes\t")
	c, err := bench.ConvertThroughput(20000)
	if err != nil {
		fail("convert", err)
	}
	fmt.Fprintf(w, "convert VirtualService (objects/s)\t%.0f\t%.0f\t%.2f\t%.0f vs %.0f allocs/object, %.0f B/resource; baseline: strict decode + marshal\t\n",
		c.PerSec, c.BaselinePerSec, c.BaselinePerSec/c.PerSec, c.Allocs, c.BaselineAllocs, c.Bytes)
	if kubeObjects > 0 {
		root, err := testbin.RepoRoot()
		if err != nil {
			fail("repo", err)
		}
		s, err := bench.KubeInitialSync(kubeObjects, root)
		if err != nil {
			fail("initial sync", err)
		}
		fmt.Fprintf(w, "initial sync of %d objects, apiserver -> sink\t%v\t%v\t%.2f\tbaseline: the LIST an informer starts with, same identity (creating them took %v)\t\n",
			s.Objects, s.Sync.Round(time.Millisecond), s.BaselineList.Round(time.Millisecond), float64(s.Sync)/float64(s.BaselineList), s.Create.Round(time.Second))
		per := 10000 / float64(s.Objects)
		fmt.Fprintf(w, "heap per 10k objects (MiB)\t%.1f\t%.1f\t%.2f\tminion: informer cache + entries + store; baseline: the LIST result held\t\n",
			s.HeapMiB*per, s.BaselineHeapMiB*per, s.HeapMiB/s.BaselineHeapMiB)
	}
	w.Flush()
}

func engineTable(changes, resources, size int) {

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "sinks\tstreams\tengine/change\tbaseline/change\tratio\tKB/change\tres-encodes/change\tbody-encodes/change\tallocs/change (engine)\tallocs/change (baseline)\t")
	for _, incremental := range []bool{true, false} {
		mode := "incremental"
		if !incremental {
			mode = "full-state"
		}
		for _, n := range []int{1, 100, 1000} {
			ch := changes
			if !incremental && n == 1000 {
				ch = max(ch/4, 10) // 1,000 full states per change: keep the row short
			}
			cfg := bench.FanoutConfig{Streams: n, Resources: resources, Changes: ch, Incremental: incremental, ResourceBytes: size}
			base, err := bench.BaselineFanout(cfg)
			if err != nil {
				fmt.Fprintln(os.Stderr, "baseline:", err)
				os.Exit(1)
			}
			eng, err := bench.EngineFanout(cfg)
			if err != nil {
				fmt.Fprintln(os.Stderr, "engine:", err)
				os.Exit(1)
			}
			fmt.Fprintf(w, "%s\t%d\t%v\t%v\t%.2f\t%.1f\t%.2f\t%.2f\t%.0f\t%.0f\t\n", mode, n,
				eng.PerChange.Round(100), base.PerChange.Round(100), float64(eng.PerChange)/float64(base.PerChange),
				eng.BytesPerChange/1024, eng.ResourceEncodes, eng.BodyEncodes, eng.AllocsPerChange, base.AllocsPerChange)
		}
	}
	w.Flush()
}
