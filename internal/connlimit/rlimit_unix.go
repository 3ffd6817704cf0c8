//go:build unix

package connlimit

import (
	"math"
	"syscall"
)

// fileLimit is the process's soft limit of open files (the Go runtime has raised it to the
// hard limit at start), 0 if unknown.
func fileLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return int(min(r.Cur, math.MaxInt32))
}
