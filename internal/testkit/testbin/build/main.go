// Command build builds (or finds cached) the test binaries named on the command line, or
// all of them: `go run ./internal/testkit/testbin/build [name...]`. `make testbins` runs it.
package main

import (
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/testbin"
)

func main() {
	names := os.Args[1:]
	if len(names) == 0 {
		for n := range testbin.Binaries {
			names = append(names, n)
		}
		sort.Strings(names)
	}
	for _, n := range names {
		start := time.Now()
		p, err := testbin.Path(n)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%-16s %s (%.1fs)\n", n, p, time.Since(start).Seconds())
	}
}
