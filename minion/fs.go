package minion

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/meshfed/meshfed/mcp"
)

// DefaultDebounce is how long the fs:// source waits for a burst of file events to settle.
const DefaultDebounce = 100 * time.Millisecond

// defaultRetry is how often the fs:// source looks for its directory while it cannot read
// it: a removed directory takes its watch with it, so nothing would say it is back.
const defaultRetry = time.Second

// kindIndex finds the configured kind of an object by group and kind (any version: Istio
// serves the same schema under several versions).
type kindIndex map[schema.GroupKind]Kind

func newKindIndex(kinds []Kind) kindIndex {
	idx := kindIndex{}
	for _, k := range kinds {
		idx[schema.GroupKind{Group: k.Group, Kind: k.Kind}] = k
	}
	return idx
}

// fileState is what one file last contributed.
type fileState struct {
	modTime time.Time
	size    int64
	// objects by collection and name; kept as they were when the file last parsed.
	objects map[string]map[string]fileObject
	// err is the file's current syntax error, if any.
	err      error
	problems []Problem
}

type fileObject struct {
	line  int
	entry *mcp.Entry
}

// FileSource publishes the objects of every YAML/JSON file below a directory.
type FileSource struct {
	name     string
	root     string
	kinds    kindIndex
	colls    []string
	store    *Store
	log      *slog.Logger
	metrics  *Metrics
	debounce time.Duration
	retry    time.Duration

	mu       sync.Mutex // guards the following fields
	files    map[string]*fileState
	rootErr  error // why the directory cannot be read, if it cannot
	problems []Problem
	synced   bool
}

// NewFileSource returns a source reading root. kinds are the configured collections.
func NewFileSource(name, root string, kinds []Kind, store *Store, log *slog.Logger, m *Metrics) *FileSource {
	colls := make([]string, 0, len(kinds))
	for _, k := range kinds {
		colls = append(colls, k.Collection)
	}
	return &FileSource{name: name, root: root, kinds: newKindIndex(kinds), colls: colls, store: store,
		log: log.With("source", name), metrics: m, debounce: DefaultDebounce, retry: defaultRetry, files: map[string]*fileState{}}
}

// Name returns the source's name (its URL).
func (s *FileSource) Name() string { return s.name }

// Synced reports whether the first scan is published.
func (s *FileSource) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Problems returns the current problems (an unreadable directory, syntax errors, invalid
// objects), sorted.
func (s *FileSource) Problems() []Problem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.problems)
}

// Run scans the directory, publishes, and rescans on every change until ctx ends. The
// directory must exist at the start; if it goes later, what was read from it stays
// published and reported as a problem until it is back.
func (s *FileSource) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	defer w.Close()
	if err := s.scan(w); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	var timer *time.Timer
	var fire <-chan time.Time
	after := func(d time.Duration) {
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		fire = timer.C
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	rescan := func() {
		if s.scan(w) != nil {
			after(s.retry) // the directory's watch went with it: look again later
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New(s.name + ": watcher closed")
			}
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() {
					_ = w.Add(ev.Name) // files created inside it before this are found by the rescan
				}
			}
			after(s.debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New(s.name + ": watcher closed")
			}
			s.log.Warn("file watcher error; rescanning", "err", err)
			rescan()
		case <-fire:
			fire = nil
			rescan()
		}
	}
}

// scan walks the tree, re-parses changed files, and publishes every collection. When the
// directory cannot be read it returns why, keeps every file's objects and, once the source
// has synced, publishes that as a problem.
func (s *FileSource) scan(w *fsnotify.Watcher) error {
	seen := map[string]bool{}
	var unreadable []string // below the root: their files keep their objects
	err := filepath.WalkDir(s.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == s.root {
				return err
			}
			s.log.Warn("cannot read", "path", path, "err", err)
			unreadable = append(unreadable, path)
			return nil
		}
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && path != s.root {
				return filepath.SkipDir
			}
			if w != nil {
				if err := w.Add(path); err != nil {
					s.log.Warn("cannot watch directory", "path", path, "err", err)
				}
			}
			return nil
		}
		if !isConfigFile(d.Name()) {
			return nil
		}
		seen[path] = true
		// Stat, not the entry's Lstat: in a ConfigMap mount every file is a symlink through
		// ..data, whose swap changes what the file is, never the link.
		fi, err := os.Stat(path)
		if err != nil {
			return nil // removed meanwhile: the next event rescans
		}
		s.mu.Lock()
		old := s.files[path]
		s.mu.Unlock()
		if old != nil && old.modTime.Equal(fi.ModTime()) && old.size == fi.Size() {
			return nil
		}
		st := s.parseFile(path, old)
		st.modTime, st.size = fi.ModTime(), fi.Size()
		s.mu.Lock()
		s.files[path] = st
		s.mu.Unlock()
		return nil
	})
	s.mu.Lock()
	s.rootErr = err
	if err == nil {
		for path := range s.files {
			if !seen[path] && !under(path, unreadable) {
				delete(s.files, path)
			}
		}
	}
	synced := s.synced
	s.mu.Unlock()
	if err == nil || synced {
		s.publish()
	}
	return err
}

// under reports whether path is one of dirs or inside one: a file there that could not be
// listed is not a file that was removed.
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, d+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

func isConfigFile(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// parseFile parses one file. On a syntax error it keeps old's objects.
func (s *FileSource) parseFile(path string, old *fileState) *fileState {
	rel, _ := filepath.Rel(s.root, path)
	dirNS := ""
	if parts := strings.Split(filepath.ToSlash(rel), "/"); len(parts) > 1 {
		dirNS = parts[0]
	}
	st := &fileState{objects: map[string]map[string]fileObject{}}
	data, err := os.ReadFile(path)
	if err == nil {
		var objs []decodedObject
		objs, st.problems, err = parseDocuments(rel, data, dirNS)
		if err == nil {
			for _, d := range objs {
				s.addObject(st, old, rel, d)
			}
			return st
		}
	}
	st.err = err
	if old != nil {
		st.objects = old.objects
	}
	return st
}

func (s *FileSource) addObject(st, old *fileState, rel string, d decodedObject) {
	k, ok := s.kinds[d.gvk.GroupKind()]
	if !ok {
		s.log.Debug("skipping object of a kind not configured", "file", rel, "line", d.line, "kind", d.gvk.String())
		return
	}
	if !k.ClusterScoped && d.obj.Namespace == "" {
		d.obj.Namespace = "default"
	}
	if k.ClusterScoped {
		d.obj.Namespace = ""
	}
	name := d.obj.ResourceName()
	where := fmt.Sprintf("%s:%d", rel, d.line)
	if _, dup := st.objects[k.Collection][name]; dup {
		st.problems = append(st.problems, Problem{Where: where, Collection: k.Collection, Resource: name, Reason: "defined twice in this file; the first is used"})
		return
	}
	e, err := Convert(k, d.obj)
	s.metrics.conversion(k.Collection, err)
	if err != nil {
		st.problems = append(st.problems, Problem{Where: where, Collection: k.Collection, Resource: name, Reason: err.Error()})
		// Keep the last good version of this object, if the file had one.
		if prev, ok := old.object(k.Collection, name); ok {
			e = prev.entry
		} else {
			return
		}
	}
	if st.objects[k.Collection] == nil {
		st.objects[k.Collection] = map[string]fileObject{}
	}
	st.objects[k.Collection][name] = fileObject{line: d.line, entry: e}
}

func (st *fileState) object(collection, name string) (fileObject, bool) {
	if st == nil {
		return fileObject{}, false
	}
	o, ok := st.objects[collection][name]
	return o, ok
}

// publish merges all files (in path order: the first file defining an object wins) and
// replaces this source's content in the store.
func (s *FileSource) publish() {
	s.mu.Lock()
	paths := make([]string, 0, len(s.files))
	for p := range s.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	byColl := map[string]map[string]*mcp.Entry{}
	from := map[string]string{}
	var problems []Problem
	if s.rootErr != nil {
		problems = append(problems, Problem{Where: s.root,
			Reason: "cannot read the directory: " + s.rootErr.Error() + " (the objects read from it stay published until it is back)"})
	}
	for _, p := range paths {
		st := s.files[p]
		rel, _ := filepath.Rel(s.root, p)
		if st.err != nil {
			p := Problem{Where: rel, Reason: st.err.Error()}
			var se *SyntaxError
			if errors.As(st.err, &se) {
				p = Problem{Where: fmt.Sprintf("%s:%d", se.File, se.Line), Reason: se.Reason}
			}
			p.Reason += " (the file's previous objects stay published until it parses)"
			problems = append(problems, p)
		}
		problems = append(problems, st.problems...)
		colls := make([]string, 0, len(st.objects))
		for c := range st.objects {
			colls = append(colls, c)
		}
		sort.Strings(colls)
		for _, c := range colls {
			if byColl[c] == nil {
				byColl[c] = map[string]*mcp.Entry{}
			}
			for name, o := range st.objects[c] {
				key := c + "\x00" + name
				if first, dup := from[key]; dup {
					problems = append(problems, Problem{Where: fmt.Sprintf("%s:%d", rel, o.line), Collection: c, Resource: name,
						Reason: "also defined in " + first + "; that one is used"})
					continue
				}
				from[key] = rel
				byColl[c][name] = o.entry
			}
		}
	}
	sort.Slice(problems, func(i, j int) bool { return problems[i].String() < problems[j].String() })
	newProblems := problemsAdded(s.problems, problems)
	s.problems = problems
	s.mu.Unlock()

	for _, p := range newProblems {
		s.log.Warn("configuration problem", "where", p.Where, "collection", p.Collection, "resource", p.Resource, "reason", p.Reason)
	}
	s.metrics.problems(s.name, len(problems))
	for _, c := range s.colls {
		entries := make([]*mcp.Entry, 0, len(byColl[c]))
		for _, e := range byColl[c] {
			entries = append(entries, e)
		}
		s.store.Replace(s.name, c, entries)
		s.metrics.objects(s.name, c, len(entries))
	}
	// Synced only once the store has the scan: the minion starts publishing when every
	// source is synced, and a first push without this source's objects would read as their
	// deletion at the hub.
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
}

func problemsAdded(old, cur []Problem) []Problem {
	had := make(map[string]bool, len(old))
	for _, p := range old {
		had[p.String()] = true
	}
	var out []Problem
	for _, p := range cur {
		if !had[p.String()] {
			out = append(out, p)
		}
	}
	return out
}
