//go:build !unix

package boltfile

import (
	"os"
	"time"
)

// lockFile does nothing where flock does not exist: bbolt takes its own lock, and checkFile
// does not run (it would read a file another process may be writing).
func lockFile(*os.File, time.Duration) error { return nil }

const preflight = false
