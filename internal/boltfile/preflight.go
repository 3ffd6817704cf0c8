package boltfile

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
)

// checkFile reads a file's bbolt meta pages and freelist page with plain reads, before bbolt
// maps it, and refuses what bbolt would fault or panic on while opening it: a file shorter
// than its metadata says (bbolt maps it and faults reading past the end), and a freelist page
// that is not one (bbolt panics loading it). A panic inside bbolt's Open cannot be undone:
// its mapping of the file stays, and with it the file's lock, so the same process could not
// open the path again. What bbolt reports as an error (both meta pages invalid) is left to
// it. The caller holds the file's lock.
//
// It follows bbolt's on-disk format, version 2 (go.etcd.io/bbolt/internal/common: a page
// header of 16 bytes, the meta fields in order, native byte order, an FNV-64a checksum of
// the fields before it), which bbolt has not changed since boltdb.
func checkFile(f *os.File, size int64) error {
	m, ok := bestMeta(f, size)
	if !ok {
		return nil // bbolt's Open says what is wrong (ErrInvalid, ErrVersionMismatch, ErrChecksum)
	}
	ps := int64(m.pageSize)
	if want := int64(m.pgid) * ps; size < want {
		return fmt.Errorf("truncated: the file is %d bytes and its metadata says %d", size, want)
	}
	if m.root >= m.pgid {
		return fmt.Errorf("the root page %d is past the file's last page %d", m.root, m.pgid)
	}
	if m.freelist == noFreelist {
		return nil
	}
	if m.freelist < 2 || m.freelist >= m.pgid {
		return fmt.Errorf("the freelist page %d is out of the file's pages (2..%d)", m.freelist, m.pgid)
	}
	var h [pageHeaderSize + 8]byte
	if _, err := f.ReadAt(h[:], int64(m.freelist)*ps); err != nil {
		return fmt.Errorf("reading the freelist page %d: %v", m.freelist, err)
	}
	flags, count, overflow := ne.Uint16(h[8:]), int64(ne.Uint16(h[10:])), int64(ne.Uint32(h[12:]))
	if flags != freelistPageFlag {
		return fmt.Errorf("page %d, the freelist's, is not a freelist page (flags %#x)", m.freelist, flags)
	}
	first := int64(0)
	if count == 0xFFFF { // the count is the first element
		count, first = int64(ne.Uint64(h[pageHeaderSize:])), 1
	}
	end := int64(m.freelist) + overflow + 1
	if end > int64(m.pgid) || count < 0 || pageHeaderSize+(first+count)*8 > (overflow+1)*ps {
		return fmt.Errorf("the freelist page %d says %d free pages, more than it holds", m.freelist, count)
	}
	ids := make([]byte, count*8)
	if _, err := f.ReadAt(ids, int64(m.freelist)*ps+pageHeaderSize+first*8); err != nil {
		return fmt.Errorf("reading the freelist page %d: %v", m.freelist, err)
	}
	for i := 0; i < len(ids); i += 8 {
		if id := ne.Uint64(ids[i:]); id < 2 || id >= m.pgid {
			return fmt.Errorf("the freelist names page %d, out of the file's pages (2..%d)", id, m.pgid)
		}
	}
	return nil
}

var ne = binary.NativeEndian

const (
	pageHeaderSize   = 16
	metaSize         = 64
	bboltMagic       = 0xED0CDAED
	bboltVersion     = 2
	freelistPageFlag = 0x10
	noFreelist       = ^uint64(0)
)

type meta struct {
	pageSize                   uint32
	root, freelist, pgid, txid uint64
}

// staleMeta says why bbolt, reading the file, may be one commit behind its last ("" if
// not): bbolt writes each commit's meta page to slot txid%2, and when one of the two is
// damaged (its checksum: a flipped bit, a torn write at power loss) it reads the other
// without a word. If the damaged one is the newer, the last commit's writes are missing —
// however many a commit carried — and the file holds the state before it: a valid state,
// older than what the hub served. The damaged slot's own txid says which it was, when it is
// readable: the transaction before the one read is the older page, and nothing is lost.
func staleMeta(f *os.File, size int64) string {
	m, ok := bestMeta(f, size)
	if !ok {
		return ""
	}
	ps := int64(m.pageSize)
	_, ok0 := readMeta(f, 0)
	_, ok1 := readMeta(f, ps)
	if ok0 && ok1 {
		return ""
	}
	slot := int64(1 - m.txid%2) // the damaged page's
	var b [pageHeaderSize + metaSize]byte
	if _, err := f.ReadAt(b[:], slot*ps); err == nil && m.txid > 0 && ne.Uint64(b[pageHeaderSize+48:]) == m.txid-1 {
		return "" // the older page: the file is at its last commit (the next one rewrites that page)
	}
	return fmt.Sprintf("bbolt's meta page %d is damaged and it reads page %d, transaction %d: the file's last commit may have been transaction %d, and what it wrote is then missing", slot, 1-slot, m.txid, m.txid+1)
}

// readMeta reads the meta page at off; ok if it is valid (magic, version, checksum).
func readMeta(f *os.File, off int64) (meta, bool) {
	var b [pageHeaderSize + metaSize]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		return meta{}, false
	}
	p := b[pageHeaderSize:]
	h := fnv.New64a()
	h.Write(p[:56])
	if ne.Uint32(p[0:]) != bboltMagic || ne.Uint32(p[4:]) != bboltVersion || ne.Uint64(p[56:]) != h.Sum64() {
		return meta{}, false
	}
	m := meta{pageSize: ne.Uint32(p[8:]), root: ne.Uint64(p[16:]), freelist: ne.Uint64(p[32:]), pgid: ne.Uint64(p[40:]), txid: ne.Uint64(p[48:])}
	if m.pageSize < 1024 || m.pageSize&(m.pageSize-1) != 0 {
		return meta{}, false
	}
	return m, true
}

// bestMeta is the meta page bbolt uses: of the valid ones, the one with the higher
// transaction id. Meta page 1 is one page in; without a valid page 0 to give the page size,
// each size bbolt supports is tried, as bbolt does.
func bestMeta(f *os.File, size int64) (meta, bool) {
	m0, ok0 := readMeta(f, 0)
	var m1 meta
	var ok1 bool
	if ok0 {
		m1, ok1 = readMeta(f, int64(m0.pageSize))
	} else {
		for ps := int64(1024); ps <= 1024<<14 && ps < size; ps *= 2 {
			if m1, ok1 = readMeta(f, ps); ok1 && int64(m1.pageSize) == ps {
				break
			}
			ok1 = false
		}
	}
	switch {
	case ok0 && ok1:
		if m1.txid > m0.txid {
			return m1, true
		}
		return m0, true
	case ok0:
		return m0, true
	case ok1:
		return m1, true
	}
	return meta{}, false
}

// Meta is what a bbolt file's newest valid meta page says: its page size, the root
// bucket's page, the freelist's page, the file's page count and the last transaction.
// Tests that damage a file on purpose find its pages with it.
type Meta struct {
	PageSize                   uint32
	Root, Freelist, Pgid, Txid uint64
}

// FileMeta reads f's newest valid meta page (ok false: neither is valid).
func FileMeta(f *os.File, size int64) (Meta, bool) {
	m, ok := bestMeta(f, size)
	return Meta{PageSize: m.pageSize, Root: m.root, Freelist: m.freelist, Pgid: m.pgid, Txid: m.txid}, ok
}

// The page layout's constants a test needs to damage a file on purpose: a page's header
// size, and the flag of a branch page.
const (
	PageHeaderSize = pageHeaderSize
	BranchPageFlag = branchPageFlag
)
