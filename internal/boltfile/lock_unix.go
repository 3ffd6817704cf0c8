//go:build unix

package boltfile

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lockFile takes the exclusive lock bbolt takes (flock), before bbolt reads the file, so
// that checkFile reads a file no other process writes; bbolt then takes the same lock again
// on the same handle, which holds it already. It returns ErrLocked after timeout (0: after
// one attempt).
func lockFile(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return ErrLocked
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// preflight: checkFile runs, under the lock.
const preflight = true
