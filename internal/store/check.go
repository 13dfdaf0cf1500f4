package store

// bbolt reads its file through a memory map and trusts it: on some damage
// it panics — in places a caller cannot recover, such as the goroutine
// that rebuilds a missing free list or runs its consistency check — and
// on other damage it follows a page number past the end of the file and
// faults, or around a cycle of pages for ever. A damaged or hostile store
// file must make Open refuse it, saying what to do, never crash or hang
// the agent. So before bbolt opens it, checkFile reads the file as plain
// bytes (bounds-checked Go, no mapping) and walks it the way bbolt will:
// the meta page bbolt picks, every page reachable from it (each once,
// its header naming it, its elements and keys inside it, keys in order),
// and the free list (inside the file, no page free and live at once). A
// file that passes holds nothing bbolt panics on; bbolt then opens it,
// and Open reads every record, cooling entry and the schema once as the
// agent will. What bbolt does at open still runs under guard, should a
// case slip through: a panic, or a fault in the mapping
// (SetPanicOnFault), becomes an error there.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/vpcni/vpcni/internal/family"
	"hash/fnv"
	"io/fs"
	"os"
	"runtime/debug"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrDamaged: the store file is not one this vpcnid can trust.
var ErrDamaged = errors.New("allocation store is damaged")

// damaged says why a file is refused and what the operator can do.
func damaged(path string, why error) error {
	return fmt.Errorf("%w: %s: %w. vpcnid will not start on it: move it aside (mv %s %s.damaged) and start vpcnid again, "+
		"with no records — drain the node first: an agent without records takes every pod's wiring on the node for an orphan and removes it",
		ErrDamaged, path, why, path, path)
}

// errLocked: another process holds the file.
var errLocked = errors.New("locked")

// panicked is a panic guard caught.
type panicked struct{ v any }

func (p *panicked) Error() string { return fmt.Sprintf("reading it failed (%v)", p.v) }

// guard runs fn and returns a panic inside it — bbolt's, or a fault
// reading the mapped file, which SetPanicOnFault makes a panic rather than
// a crash — as a *panicked error.
func guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if v := recover(); v != nil {
			err = &panicked{v}
		}
	}()
	return fn()
}

// bbolt's file format (version 2), native byte order. Every page starts
// with a header: id u64, flags u16, count u16, overflow u32 (the pages
// after it that it spans). The meta pages 0 and 1 hold after it: magic,
// version, page size, flags (u32 each), the root bucket (root page,
// sequence), the free list's page, the page count, the transaction (u64
// each), and an FNV-64a checksum of the 56 bytes before it. A branch
// page's elements are {pos, ksize u32; child page u64}, a leaf page's
// {flags, pos, ksize, vsize u32}, each key (and value) pos bytes after its
// element. A bucket's value is its root page and sequence (u64 each),
// followed, when the root is 0, by the bucket's own leaf page inline. A
// free-list page holds page ids (u64), its count in the header or, when
// that says 0xFFFF, in the first id.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	boltHeader     = 16
	boltElement    = 16
	boltBucket     = 16
	boltNoFreelist = ^uint64(0)

	branchPage   = 0x01
	leafPage     = 0x02
	freelistPage = 0x10
	bucketLeaf   = 0x01

	// maxDepth bounds a bucket's tree and the nesting of buckets: bbolt's
	// trees are balanced, and vpcni's are a few levels deep.
	maxDepth = 64
)

var ne = binary.NativeEndian

type boltMeta struct {
	pageSize                   uint64
	root, freelist, pages, txn uint64
}

// readMeta reads the meta page at off; ok is false when it is not one
// bbolt would accept (magic, version, checksum).
func readMeta(data []byte, off uint64) (m boltMeta, ok bool) {
	if off > uint64(len(data)) || uint64(len(data))-off < boltHeader+64 {
		return m, false
	}
	b := data[off+boltHeader : off+boltHeader+64]
	sum := fnv.New64a()
	sum.Write(b[:56])
	if ne.Uint32(b[0:]) != boltMagic || ne.Uint32(b[4:]) != boltVersion || ne.Uint64(b[56:]) != sum.Sum64() {
		return m, false
	}
	return boltMeta{pageSize: uint64(ne.Uint32(b[8:])), root: ne.Uint64(b[16:]), freelist: ne.Uint64(b[32:]),
		pages: ne.Uint64(b[40:]), txn: ne.Uint64(b[48:])}, true
}

// currentMeta finds the meta page bbolt will use, as bbolt finds it: the
// page size from meta page 0, else from the first valid meta page at
// 1 KiB << i; then of pages 0 and 1 the valid one with the higher
// transaction. ok is false when there is none (bbolt refuses the file).
func currentMeta(data []byte) (m boltMeta, ok bool, err error) {
	size := uint64(len(data))
	var pageSize uint64
	if m0, ok := readMeta(data, 0); ok {
		pageSize = m0.pageSize
	} else {
		for i := 0; i <= 14 && 1024<<i+1024 < size; i++ {
			if m1, ok := readMeta(data, 1024<<i); ok {
				pageSize = m1.pageSize
				break
			}
		}
	}
	if pageSize == 0 {
		return m, false, nil
	}
	if pageSize < 1024 || pageSize > 1<<24 || pageSize&(pageSize-1) != 0 {
		return m, false, fmt.Errorf("its meta page gives a page size of %d bytes", pageSize)
	}
	m0, ok0 := readMeta(data, 0)
	m1, ok1 := readMeta(data, pageSize)
	m, ok = m0, ok0
	if ok1 && (!ok0 || m1.txn > m0.txn) {
		m, ok = m1, true
	}
	if ok && m.pageSize != pageSize {
		return m, false, fmt.Errorf("its meta pages disagree on the page size (%d, %d)", pageSize, m.pageSize)
	}
	return m, ok, nil
}

// checkFile says why bbolt would crash or hang on a store file (bad; see
// the top of this file), or why the file could not be read (err;
// errLocked when another process holds it: the check holds the file's
// lock while it reads, so that it never reads a file another agent is
// writing). A missing or empty file is new; one without a valid meta page
// bbolt refuses itself.
func checkFile(path string) (bad, err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close() // and with it the lock, for bbolt to take
	for deadline := time.Now().Add(lockWait); ; time.Sleep(50 * time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock: %w", err)
		}
		if time.Now().After(deadline) {
			return nil, errLocked
		}
	}
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return nil, err
	}
	// Mapped, not read: the file may be large, and the mapping is only as
	// long as the file, so every access is bounds-checked (guard covers a
	// file cut short meanwhile).
	data, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map it: %w", err)
	}
	defer syscall.Munmap(data)
	return guard(func() error { return checkBytes(data) }), nil
}

// checkBytes is checkFile on the file's bytes.
func checkBytes(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	m, ok, err := currentMeta(data)
	if err != nil || !ok {
		return err
	}
	switch size := uint64(len(data)); {
	case m.pages > size/m.pageSize:
		return fmt.Errorf("its meta page counts %d pages of %d bytes, the file has %d bytes (truncated?)", m.pages, m.pageSize, size)
	case m.freelist == boltNoFreelist:
		return errors.New("its meta page names no free list, and vpcnid always writes one")
	}
	w := &walker{data: data, m: m, live: map[uint64]bool{}}
	if err := w.tree(m.root, 0, nil, nil); err != nil {
		return fmt.Errorf("root bucket: %w", err)
	}
	return w.freelist()
}

// walker reads a file's pages, each once.
type walker struct {
	data []byte
	m    boltMeta
	live map[uint64]bool // pages reachable from the root
}

// page returns page id with its overflow, checked: inside the file and
// the page count, named id by its header, and reached for the first time.
func (w *walker) page(id uint64) (p []byte, flags uint16, count int, err error) {
	if id < 2 || id >= w.m.pages {
		return nil, 0, 0, fmt.Errorf("page %d is outside pages 2..%d", id, w.m.pages-1)
	}
	off := id * w.m.pageSize
	if ne.Uint64(w.data[off:]) != id {
		return nil, 0, 0, fmt.Errorf("page %d names itself %d", id, ne.Uint64(w.data[off:]))
	}
	overflow := uint64(ne.Uint32(w.data[off+12:]))
	if overflow >= w.m.pages-id {
		return nil, 0, 0, fmt.Errorf("page %d spans %d pages more, past the last", id, overflow)
	}
	for i := id; i <= id+overflow; i++ {
		if w.live[i] {
			return nil, 0, 0, fmt.Errorf("page %d is reached twice", i)
		}
		w.live[i] = true
	}
	return w.data[off : off+(overflow+1)*w.m.pageSize], ne.Uint16(w.data[off+8:]), int(ne.Uint16(w.data[off+10:])), nil
}

// elements returns a page's count elements, each checked to lie inside p.
func elements(p []byte, count int) ([][]byte, error) {
	if boltHeader+count*boltElement > len(p) {
		return nil, fmt.Errorf("%d elements do not fit in %d bytes", count, len(p))
	}
	out := make([][]byte, count)
	for i := range out {
		off := boltHeader + i*boltElement
		out[i] = p[off : off+boltElement]
	}
	return out, nil
}

// span is the n bytes of p that start pos bytes after p[from:]; ok false
// when they do not lie inside p.
func span(p []byte, from int, pos, n uint32) ([]byte, bool) {
	start := uint64(from) + uint64(pos)
	if start > uint64(len(p)) || uint64(n) > uint64(len(p))-start {
		return nil, false
	}
	return p[start : start+uint64(n)], true
}

// tree checks the pages of a bucket from page id down, each key in
// [lo, hi) (nil: unbounded) and in order.
func (w *walker) tree(id uint64, depth int, lo, hi []byte) error {
	if depth > maxDepth {
		return fmt.Errorf("page %d: more than %d levels deep", id, maxDepth)
	}
	p, flags, count, err := w.page(id)
	if err != nil {
		return err
	}
	switch flags {
	case branchPage:
		elems, err := elements(p, count)
		if err != nil || count == 0 {
			return fmt.Errorf("branch page %d: %d elements: %v", id, count, err)
		}
		keys := make([][]byte, count)
		for i, e := range elems {
			k, ok := span(p, boltHeader+i*boltElement, ne.Uint32(e[0:]), ne.Uint32(e[4:]))
			if !ok {
				return fmt.Errorf("branch page %d: key %d lies outside it", id, i)
			}
			keys[i] = k
		}
		if err := ordered(keys, lo, hi); err != nil {
			return fmt.Errorf("branch page %d: %w", id, err)
		}
		for i, e := range elems {
			next := hi
			if i+1 < count {
				next = keys[i+1]
			}
			if err := w.tree(ne.Uint64(e[8:]), depth+1, keys[i], next); err != nil {
				return err
			}
		}
		return nil
	case leafPage:
		if err := w.leaf(p, count, depth, lo, hi); err != nil {
			return fmt.Errorf("leaf page %d: %w", id, err)
		}
		return nil
	}
	return fmt.Errorf("page %d is of type %#x, not a branch or leaf", id, flags)
}

// leaf checks a leaf page's elements, and the buckets among them.
func (w *walker) leaf(p []byte, count, depth int, lo, hi []byte) error {
	elems, err := elements(p, count)
	if err != nil {
		return err
	}
	keys := make([][]byte, count)
	for i, e := range elems {
		from := boltHeader + i*boltElement
		ksize, vsize := ne.Uint32(e[8:]), ne.Uint32(e[12:])
		if ksize+vsize < ksize {
			return fmt.Errorf("key %d: sizes %d and %d", i, ksize, vsize)
		}
		kv, ok := span(p, from, ne.Uint32(e[4:]), ksize+vsize)
		if !ok {
			return fmt.Errorf("key %d lies outside it", i)
		}
		keys[i] = kv[:ksize]
		if ne.Uint32(e[0:])&bucketLeaf != 0 {
			if err := w.bucket(kv[ksize:], depth+1); err != nil {
				return fmt.Errorf("bucket %q: %w", kv[:ksize], err)
			}
		}
	}
	return ordered(keys, lo, hi)
}

// bucket checks a bucket's value: its root page's tree, or its inline
// leaf page.
func (w *walker) bucket(v []byte, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("buckets nested more than %d deep", maxDepth)
	}
	if len(v) < boltBucket {
		return fmt.Errorf("a bucket's value of %d bytes", len(v))
	}
	if root := ne.Uint64(v); root != 0 {
		return w.tree(root, depth, nil, nil)
	}
	inline := v[boltBucket:]
	if len(inline) < boltHeader || ne.Uint16(inline[8:]) != leafPage {
		return errors.New("an inline bucket without a leaf page")
	}
	return w.leaf(inline, int(ne.Uint16(inline[10:])), depth, nil, nil)
}

// ordered says whether keys rise strictly, within [lo, hi).
func ordered(keys [][]byte, lo, hi []byte) error {
	for i, k := range keys {
		switch {
		case i > 0 && bytes.Compare(keys[i-1], k) >= 0:
			return fmt.Errorf("key %d is not above key %d", i, i-1)
		case lo != nil && bytes.Compare(k, lo) < 0, hi != nil && bytes.Compare(k, hi) >= 0:
			return fmt.Errorf("key %d lies outside its parent's range", i)
		}
	}
	return nil
}

// freelist checks the free list: a page of its own, every id a page of
// the file, none twice, none reachable.
func (w *walker) freelist() error {
	p, flags, count, err := w.page(w.m.freelist)
	if err != nil {
		return fmt.Errorf("free list: %w", err)
	}
	if flags != freelistPage {
		return fmt.Errorf("free list: page %d is of type %#x", w.m.freelist, flags)
	}
	ids := p[boltHeader:]
	n := uint64(count)
	if count == 0xFFFF {
		if len(ids) < 8 {
			return errors.New("free list: no room for its count")
		}
		n, ids = ne.Uint64(ids), ids[8:]
	}
	if n > uint64(len(ids))/8 {
		return fmt.Errorf("free list: %d ids do not fit in its pages", n)
	}
	free := map[uint64]bool{}
	for i := range n {
		id := ne.Uint64(ids[i*8:])
		switch {
		case id < 2 || id >= w.m.pages:
			return fmt.Errorf("free list: page %d is outside pages 2..%d", id, w.m.pages-1)
		case free[id]:
			return fmt.Errorf("free list: page %d is free twice", id)
		case w.live[id]:
			return fmt.Errorf("free list: page %d is free and in use", id)
		}
		free[id] = true
	}
	return nil
}

// openBolt opens the file with bbolt under guard. A panic can leave
// bbolt's handle half-open, so the file it opened is closed here, which
// drops its lock; the mapping stays until the process exits, which the
// agent does when its store is refused.
func openBolt(path string) (db *bolt.DB, closeFile func(), err error) {
	var file *os.File
	closeFile = func() {
		if file != nil {
			file.Close()
		}
	}
	opts := &bolt.Options{Timeout: lockWait, OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		file = f
		return f, err
	}}
	err = guard(func() (err error) {
		db, err = bolt.Open(path, 0o600, opts)
		return err
	})
	var p *panicked
	if errors.As(err, &p) {
		closeFile()
		return nil, nil, err
	}
	return db, closeFile, err
}

// readAll decodes what the agent reads: the schema, every record and
// every cooling and leaving entry of both families. The caller runs it
// under guard. A file of a newer schema is not read further: migrate
// refuses it as newer, not as damaged, whatever its records hold.
func readAll(db *bolt.DB) error {
	return db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(bucketMeta); meta != nil {
			n, err := schemaOf(meta)
			if err != nil {
				return err
			}
			if n > Schema {
				return nil
			}
		}
		if b := tx.Bucket(bucketAllocs); b != nil {
			if err := b.ForEach(func(k, v []byte) error { _, err := decode(k, v); return err }); err != nil {
				return err
			}
		}
		for _, f := range family.All {
			if b := tx.Bucket(coolingOf(hostOf(f))); b != nil {
				if err := b.ForEach(func(k, v []byte) error { _, _, _, err := decodeCooling(k, v, f); return err }); err != nil {
					return err
				}
			}
			if b := tx.Bucket(leavingOf(hostOf(f))); b != nil {
				if err := b.ForEach(func(k, _ []byte) error { _, err := decodeLeaving(k, f); return err }); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// refusedByBolt says that bbolt (or guard) refused the file for what it
// holds, not for a failure to open or lock it.
func refusedByBolt(err error) bool {
	var p *panicked
	var pathErr *fs.PathError
	return errors.As(err, &p) || !(errors.As(err, &pathErr) || errors.Is(err, berrors.ErrTimeout))
}
