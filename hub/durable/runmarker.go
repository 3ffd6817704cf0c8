package durable

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The run marker, <path>.run: one fixed-size line saying how the last process left the
// file — "open" while a writable Store has it, "failing" while its commits fail, "closed"
// after a Close that wrote everything. OpenState reads it before writing "open" itself:
// "open" there means the last process was killed or crashed (State.Unclean), "failing" that
// its writes were failing when it stopped (State.Failing).
//
// It must say "failing" when the disk is full, so it is never grown: created once at its
// full size and fsynced, then overwritten in place (pwrite of the same bytes at offset 0,
// fsync). Overwriting allocated blocks needs no free space on ext4, xfs and the like; a
// copy-on-write file system (btrfs, zfs) must allocate even then, and there a full disk
// leaves the marker at "open": the next start then reports Unclean without Failing.

const (
	runOpen    = "open"
	runFailing = "failing"
	runClosed  = "closed"

	runMarkerPrefix = "meshfed hub state file, last run: "
	runMarkerSize   = 64
)

func runMarkerPath(path string) string { return path + ".run" }

// readRunMarker returns what the marker says; an error if it is missing (os.ErrNotExist)
// or not one (torn, another size, another content).
func readRunMarker(path string) (string, error) {
	b, err := os.ReadFile(runMarkerPath(path))
	if err != nil {
		return "", err
	}
	word, ok := bytes.CutPrefix(b, []byte(runMarkerPrefix))
	w := strings.TrimRight(string(word), " \n")
	if !ok || len(b) != runMarkerSize || (w != runOpen && w != runFailing && w != runClosed) {
		return "", fmt.Errorf("the run marker %s is not one (%q)", runMarkerPath(path), truncate(string(b)))
	}
	return w, nil
}

func encodeRunMarker(word string) []byte {
	b := bytes.Repeat([]byte{' '}, runMarkerSize)
	copy(b, runMarkerPrefix+word)
	b[runMarkerSize-1] = '\n'
	return b
}

// openRunMarker opens (creating it at its full size) the marker of a writable Store and
// writes "open". A marker that cannot be written is logged and left: the next start then
// reads the last state it had, or none (Unclean).
func (s *Store) openRunMarker() {
	name := runMarkerPath(s.path)
	_, statErr := os.Stat(name)
	f, err := s.cfg.openFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		s.log.Warn("state file: cannot open its run marker: the next start will take this run as unclean", "marker", name, "err", err)
		return
	}
	s.runFile = f
	s.markRun(runOpen)
	if errors.Is(statErr, os.ErrNotExist) {
		syncDir(filepath.Dir(name))
	}
}

// markRun overwrites the marker with word and fsyncs it. It runs on the writer goroutine,
// or once the writer has ended (Close), never both at once.
func (s *Store) markRun(word string) {
	if s.runFile == nil || s.runWord == word {
		return
	}
	if s.cfg.beforeMark != nil && s.cfg.beforeMark() != nil {
		return
	}
	_, err := s.runFile.WriteAt(encodeRunMarker(word), 0)
	if err == nil {
		err = s.runFile.Sync()
	}
	if err != nil {
		s.log.Warn("state file: cannot write its run marker", "marker", s.runFile.Name(), "state", word, "err", err)
		s.runWord = "" // unknown: written again next time
		return
	}
	s.runWord = word
}

func (s *Store) closeRunMarker(word string) {
	if s.runFile == nil {
		return
	}
	s.markRun(word)
	_ = s.runFile.Close()
	s.runFile = nil
}

// syncDir fsyncs a directory, so that a file just created or renamed in it is there after
// a power loss. Best effort: not every system can.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
