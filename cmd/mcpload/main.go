// Command mcpload is the separate load process of `make bench`'s versus table (package
// internal/testkit/bench/load): -mode sinks opens -sinks sinks against -addr, one connection
// each, and times what the controller arms; -mode bare is the bare-gRPC baseline source.
// Both read commands as JSON lines on stdin and answer on stdout; they end when stdin ends.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/meshfed/meshfed/internal/testkit/bench/load"
)

func main() {
	mode := flag.String("mode", "sinks", "sinks (the load) or bare (the baseline source)")
	addr := flag.String("addr", "127.0.0.1:0", "sinks: the source's address; bare: where to listen")
	var o load.Options
	flag.StringVar(&o.Collection, "collection", "", "sinks: the collection each sink requests")
	flag.IntVar(&o.Sinks, "sinks", 1, "sinks: how many, one connection each")
	flag.BoolVar(&o.Incremental, "incremental", false, "sinks: ask for incremental responses")
	flag.Parse()
	var err error
	switch *mode {
	case "sinks":
		o.Addr = *addr
		err = load.RunSinks(o, os.Stdin, os.Stdout)
	case "bare":
		err = load.RunBare(*addr, os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown -mode %q (sinks or bare)", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpload:", err)
		os.Exit(1)
	}
}
