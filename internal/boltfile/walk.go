package boltfile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
)

// WalkTree checks the file's B+trees with plain reads before bbolt reads them, as checkFile
// checks its meta and freelist pages. bbolt trusts every page id it follows: a flipped bit
// in a branch element can make a subtree point back to one of its own pages, and bbolt then
// loops forever (its cursor descends without end, growing its stack; deleting the bucket
// recurses until the stack overflows) — no guard can turn that into an error. Each bucket's
// tree is walked from its root: every page it links must be in the file, be a branch or
// leaf page naming its own id, hold the elements it says, be at most maxTreeDepth deep, and
// be linked once in the whole file (a page linked from two places makes both trees bad).
//
// A bucket whose tree fails is in bad (its root page id → why): the scan treats it as
// unreadable without letting bbolt into it, and the repair moves it into the quarantine
// without reading it; nothing ever deletes it (deleting walks it). A failure of the root
// bucket's tree, or of one of the essential top-level buckets', is the error: the file
// cannot be read as a whole. A page that is both linked and on the freelist is ErrFreelistOverlap:
// bbolt would hand it out again and overwrite what it holds, so the file is readable but
// must not be written (its owner rebuilds it: the hub's state file does).
//
// It reads every page once (a load reads them all anyway, through bbolt's mapping): its
// caller runs it on a file it did not just write. The caller holds the file's lock.
func WalkTree(f *os.File, size int64, essential ...string) (bad map[uint64]string, err error) {
	m, ok := bestMeta(f, size)
	if !ok {
		return nil, nil // bbolt's Open says what is wrong
	}
	w := &walker{f: f, ps: int64(m.pageSize), max: m.pgid, owner: map[uint64]uint64{}, bad: map[uint64]string{}, top: map[string]uint64{},
		buf: make([]byte, m.pageSize)}
	w.bucket(m.root, true)
	if why := w.bad[m.root]; why != "" {
		return nil, fmt.Errorf("the root bucket's tree: %s", why)
	}
	for _, name := range essential {
		if root, ok := w.top[name]; ok && w.bad[root] != "" {
			return nil, fmt.Errorf("the %s bucket's tree: %s", name, w.bad[root])
		}
	}
	if m.freelist != noFreelist && m.freelist < m.pgid {
		ids, err := freelistIDs(f, m)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if _, linked := w.owner[id]; linked {
				return w.bad, fmt.Errorf("%w: page %d", ErrFreelistOverlap, id)
			}
		}
	}
	return w.bad, nil
}

// ErrFreelistOverlap: the freelist names a page that a tree links.
var ErrFreelistOverlap = errors.New("the freelist names a page that is in use (writing would overwrite it)")

// maxTreeDepth is deeper than any real tree: a bbolt branch holds at least two keys, so
// depth 64 would take 2^64 leaves.
const maxTreeDepth = 64

type walker struct {
	f     *os.File
	ps    int64
	max   uint64            // the file's page count (pgid): no page id reaches it
	owner map[uint64]uint64 // page → the root of the bucket whose tree links it
	bad   map[uint64]string
	top   map[string]uint64 // the root bucket's buckets: name → root page (0: inline)
	buf   []byte
}

const (
	branchPageFlag = 0x01
	leafPageFlag   = 0x02
	bucketLeafFlag = 0x01
	elemSize       = 16
	bucketHeader   = 16
)

// bucket walks the tree of the bucket rooted at root (and the buckets in it), recording it
// in w.bad if it is bad.
func (w *walker) bucket(root uint64, isRoot bool) {
	if why := w.page(root, root, 0, isRoot); why != "" && w.bad[root] == "" {
		w.bad[root] = why
	}
}

func (w *walker) page(id, root uint64, depth int, isRoot bool) string {
	if depth > maxTreeDepth {
		return fmt.Sprintf("deeper than %d levels (a loop of pages)", maxTreeDepth)
	}
	if id < 2 || id >= w.max {
		return fmt.Sprintf("page %d is out of the file's pages (2..%d)", id, w.max)
	}
	b := w.buf[:w.ps] // the page; its overflow pages are read once the header says how many
	if _, err := w.f.ReadAt(b, int64(id)*w.ps); err != nil {
		return fmt.Sprintf("page %d: %v", id, err)
	}
	self, flags, count, overflow := ne.Uint64(b[0:]), ne.Uint16(b[8:]), int(ne.Uint16(b[10:])), uint64(ne.Uint32(b[12:]))
	switch {
	case self != id:
		return fmt.Sprintf("page %d says it is page %d", id, self)
	case flags != branchPageFlag && flags != leafPageFlag:
		return fmt.Sprintf("page %d is neither a branch nor a leaf (flags %#x)", id, flags)
	case overflow >= w.max || id+overflow >= w.max:
		return fmt.Sprintf("page %d's %d overflow pages run past the file's end", id, overflow)
	}
	for p := id; p <= id+overflow; p++ {
		if other, linked := w.owner[p]; linked {
			why := fmt.Sprintf("page %d is linked twice (a loop, or two trees sharing a page)", p)
			if other != root && w.bad[other] == "" {
				w.bad[other] = why
			}
			return why
		}
		w.owner[p] = root
	}
	if overflow > 0 {
		b = make([]byte, int64(overflow+1)*w.ps)
		if _, err := w.f.ReadAt(b, int64(id)*w.ps); err != nil {
			return fmt.Sprintf("page %d: %v", id, err)
		}
	} else {
		b = bytes.Clone(b) // w.buf is reused by the pages below this one
	}
	if pageHeaderSize+count*elemSize > len(b) || flags == branchPageFlag && count == 0 {
		return fmt.Sprintf("page %d says it holds %d elements", id, count)
	}
	if flags == branchPageFlag {
		for i := range count {
			e := pageHeaderSize + i*elemSize
			pos, ksize := int(ne.Uint32(b[e:])), int(ne.Uint32(b[e+4:]))
			if ksize == 0 || e+pos+ksize > len(b) || e+pos+ksize < e {
				return fmt.Sprintf("page %d, element %d: its key runs out of the page", id, i)
			}
			if why := w.page(ne.Uint64(b[e+8:]), root, depth+1, isRoot); why != "" {
				return why
			}
		}
		return ""
	}
	for i := range count {
		e := pageHeaderSize + i*elemSize
		flags, pos, ksize, vsize := ne.Uint32(b[e:]), int(ne.Uint32(b[e+4:])), int(ne.Uint32(b[e+8:])), int(ne.Uint32(b[e+12:]))
		end := e + pos + ksize + vsize
		if end > len(b) || end < e {
			return fmt.Sprintf("page %d, element %d: its key and value run out of the page", id, i)
		}
		if flags&bucketLeafFlag == 0 {
			continue
		}
		v := b[e+pos+ksize : end]
		if len(v) < bucketHeader {
			return fmt.Sprintf("page %d, element %d: a bucket of %d bytes", id, i, len(v))
		}
		child := ne.Uint64(v)
		if isRoot {
			w.top[string(b[e+pos:e+pos+ksize])] = child
		}
		if child != 0 {
			w.bucket(child, false)
			continue
		}
		// An inline bucket (root 0): its page is inside the value. bbolt reads it as it
		// finds it — a branch there would have it follow page ids, a bucket in it would be
		// opened — so it must be a leaf, whose buckets are walked too. It has no root page to
		// be named by: what is wrong in it makes the bucket holding it bad.
		if why := w.inline(v[bucketHeader:], id, i); why != "" {
			return why
		}
	}
	return ""
}

func (w *walker) inline(in []byte, id uint64, i int) string {
	if len(in) < pageHeaderSize || ne.Uint16(in[8:]) != leafPageFlag {
		return fmt.Sprintf("page %d, element %d: an inline bucket that is not a leaf page", id, i)
	}
	n := int(ne.Uint16(in[10:]))
	if pageHeaderSize+n*elemSize > len(in) {
		return fmt.Sprintf("page %d, element %d: an inline bucket that says it holds %d elements", id, i, n)
	}
	for j := range n {
		e := pageHeaderSize + j*elemSize
		flags, pos, ksize, vsize := ne.Uint32(in[e:]), int(ne.Uint32(in[e+4:])), int(ne.Uint32(in[e+8:])), int(ne.Uint32(in[e+12:]))
		end := e + pos + ksize + vsize
		if end > len(in) || end < e {
			return fmt.Sprintf("page %d, element %d: an inline bucket's element %d runs out of it", id, i, j)
		}
		if flags&bucketLeafFlag == 0 {
			continue
		}
		v := in[e+pos+ksize : end]
		if len(v) < bucketHeader {
			return fmt.Sprintf("page %d, element %d: an inline bucket's bucket of %d bytes", id, i, len(v))
		}
		if child := ne.Uint64(v); child != 0 {
			w.bucket(child, false)
		} else if why := w.inline(v[bucketHeader:], id, i); why != "" {
			return why
		}
	}
	return ""
}

// freelistIDs reads the freelist page's ids (checkFile has checked its bounds).
func freelistIDs(f *os.File, m meta) ([]uint64, error) {
	ps := int64(m.pageSize)
	var h [pageHeaderSize + 8]byte
	if _, err := f.ReadAt(h[:], int64(m.freelist)*ps); err != nil {
		return nil, fmt.Errorf("reading the freelist page %d: %v", m.freelist, err)
	}
	count, first := int64(ne.Uint16(h[10:])), int64(0)
	if count == 0xFFFF {
		count, first = int64(ne.Uint64(h[pageHeaderSize:])), 1
	}
	overflow := int64(ne.Uint32(h[12:]))
	if count < 0 || pageHeaderSize+(first+count)*8 > (overflow+1)*ps {
		return nil, fmt.Errorf("the freelist page %d says %d free pages, more than it holds", m.freelist, count)
	}
	b := make([]byte, count*8)
	if _, err := f.ReadAt(b, int64(m.freelist)*ps+pageHeaderSize+first*8); err != nil {
		return nil, fmt.Errorf("reading the freelist page %d: %v", m.freelist, err)
	}
	ids := make([]uint64, count)
	for i := range ids {
		ids[i] = ne.Uint64(b[i*8:])
	}
	return ids, nil
}
