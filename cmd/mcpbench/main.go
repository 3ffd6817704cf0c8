// Command mcpbench prints the MCP engine's benchmark table: fan-out of one change to 1, 100
// and 1,000 streams, for incremental and full-state sinks, each next to a raw-gRPC baseline
// run in the same process right before it (the machine is noisy: read the ratio).
package main

import (
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/meshfed/meshfed/internal/bench"
)

func main() {
	changes := flag.Int("changes", 200, "changes measured per row")
	resources := flag.Int("resources", 100, "resources in the collection")
	size := flag.Int("size", 256, "bytes per resource body")
	flag.Parse()

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "sinks\tstreams\tengine/change\tbaseline/change\tratio\tKB/change\tres-encodes/change\tbody-encodes/change\tallocs/change (engine)\tallocs/change (baseline)\t")
	for _, incremental := range []bool{true, false} {
		mode := "incremental"
		if !incremental {
			mode = "full-state"
		}
		for _, n := range []int{1, 100, 1000} {
			ch := *changes
			if !incremental && n == 1000 {
				ch = max(ch/4, 10) // 1,000 full states per change: keep the row short
			}
			cfg := bench.FanoutConfig{Streams: n, Resources: *resources, Changes: ch, Incremental: incremental, ResourceBytes: *size}
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
