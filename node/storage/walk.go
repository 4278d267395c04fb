package storage

import (
	"encoding/binary"
	"fmt"
	"io"
)

// walkTree checks the page tree of a bbolt file from its bytes, without
// bbolt and without mapping it: every page reachable from the chosen meta
// page lies below the high-water mark, says it is the page it was reached
// as, has a known type, keeps its elements inside itself, and is reached
// exactly once. bbolt itself trusts these pointers: a branch pointing back
// up the tree makes its cursor descend forever, and an element offset past
// the page makes it read outside the map. After walkTree, bbolt walks a
// sound tree. (Page layout: bbolt's internal/common page.go and bucket.go.)
func walkTree(r io.ReaderAt, m *boltMeta) error {
	w := treeWalker{r: r, m: m, seen: map[uint64]bool{}}
	if err := w.page(m.root, 0, "root", nil); err != nil {
		return err
	}
	return w.freelist()
}

const freelistPageFlag = 0x10

// freelist checks the free-page list: a freelist page, its ids inside it,
// below the high-water mark, each once and none in use by the tree. (A
// damaged count makes bbolt's own check loop over billions of ids.)
func (w *treeWalker) freelist() error {
	id := w.m.freelist
	if id == noFreelist {
		return nil
	}
	ps := uint64(w.m.pageSize)
	if id < 2 || id >= w.m.pgid {
		return fmt.Errorf("freelist: page %d is outside the data pages", id)
	}
	hdr := make([]byte, pageHeaderSize+8)
	if _, err := w.r.ReadAt(hdr, int64(id*ps)); err != nil {
		return fmt.Errorf("freelist: page %d: %w", id, err)
	}
	le := binary.LittleEndian
	overflow := uint64(le.Uint32(hdr[12:]))
	switch {
	case le.Uint64(hdr) != id:
		return fmt.Errorf("freelist: page %d says it is page %d", id, le.Uint64(hdr))
	case le.Uint16(hdr[8:]) != freelistPageFlag:
		return fmt.Errorf("freelist: page %d has type %#x", id, le.Uint16(hdr[8:]))
	case id+overflow >= w.m.pgid:
		return fmt.Errorf("freelist: page %d runs %d pages past the high-water mark", id, overflow)
	}
	count, skip := uint64(le.Uint16(hdr[10:])), uint64(0)
	if count == 0xFFFF {
		count, skip = le.Uint64(hdr[pageHeaderSize:]), 1
	}
	room := ((overflow+1)*ps - pageHeaderSize) / 8
	if count+skip > room || count > w.m.pgid {
		return fmt.Errorf("freelist: %d free pages do not fit its %d pages", count, overflow+1)
	}
	buf := make([]byte, (count+skip)*8)
	if _, err := w.r.ReadAt(buf, int64(id*ps+pageHeaderSize)); err != nil {
		return wrapErr("freelist", err)
	}
	free := make(map[uint64]bool, count)
	for i := skip; i < count+skip; i++ {
		f := le.Uint64(buf[8*i:])
		switch {
		case f < 2 || f >= w.m.pgid:
			return fmt.Errorf("freelist: free page %d is outside the data pages", f)
		case free[f]:
			return fmt.Errorf("freelist: page %d is freed twice", f)
		case w.seen[f]:
			return fmt.Errorf("freelist: page %d is free and in use", f)
		}
		free[f] = true
	}
	return nil
}

const (
	branchPageFlag = 0x01
	leafPageFlag   = 0x02
	bucketLeafFlag = 0x01
	elemSize       = 16
	inBucketSize   = 16
	maxTreeDepth   = 64
)

type treeWalker struct {
	r    io.ReaderAt
	m    *boltMeta
	seen map[uint64]bool
}

// page checks page id and the tree below it; first, when not nil, is the
// key its parent's branch element says the page starts with.
func (w *treeWalker) page(id uint64, depth int, where string, first []byte) error {
	ps := uint64(w.m.pageSize)
	switch {
	case depth > maxTreeDepth:
		return fmt.Errorf("%s: the tree is deeper than %d pages", where, maxTreeDepth)
	case id < 2 || id >= w.m.pgid:
		return fmt.Errorf("%s: page %d is outside the data pages (2..%d)", where, id, w.m.pgid-1)
	case w.seen[id]:
		return fmt.Errorf("%s: page %d is reached twice", where, id)
	}
	w.seen[id] = true
	hdr := make([]byte, pageHeaderSize)
	if _, err := w.r.ReadAt(hdr, int64(id*ps)); err != nil {
		return fmt.Errorf("%s: page %d: %w", where, id, err)
	}
	le := binary.LittleEndian
	overflow := uint64(le.Uint32(hdr[12:]))
	if got := le.Uint64(hdr); got != id {
		return fmt.Errorf("%s: page %d says it is page %d", where, id, got)
	}
	if id+overflow >= w.m.pgid {
		return fmt.Errorf("%s: page %d runs %d pages past the high-water mark", where, id, overflow)
	}
	for o := uint64(1); o <= overflow; o++ {
		if w.seen[id+o] {
			return fmt.Errorf("%s: page %d overlaps page %d", where, id, id+o)
		}
		w.seen[id+o] = true
	}
	buf := make([]byte, (overflow+1)*ps)
	if _, err := w.r.ReadAt(buf, int64(id*ps)); err != nil {
		return fmt.Errorf("%s: page %d: %w", where, id, err)
	}
	return w.node(buf, depth, fmt.Sprintf("%s/page %d", where, id), first)
}

// node checks one page's elements (p is the whole page, header included:
// element offsets count from each element's own position).
func (w *treeWalker) node(p []byte, depth int, where string, first []byte) error {
	le := binary.LittleEndian
	flags, count := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
	if pageHeaderSize+count*elemSize > len(p) {
		return fmt.Errorf("%s: %d elements do not fit", where, count)
	}
	if flags != branchPageFlag && flags != leafPageFlag {
		return fmt.Errorf("%s: page type %#x, want a branch or a leaf", where, flags)
	}
	if count == 0 && flags == branchPageFlag {
		return fmt.Errorf("%s: an empty branch", where)
	}
	var prev []byte
	// Keys must rise within a page and a page must start with the key its
	// parent files it under: a damaged key otherwise sends bbolt's search
	// down the wrong branch, and a stored value reads as absent.
	order := func(i int, k []byte) error {
		if i == 0 && first != nil && string(k) != string(first) {
			return fmt.Errorf("%s: starts with key %x, its parent says %x", where, k, first)
		}
		if i > 0 && string(k) <= string(prev) {
			return fmt.Errorf("%s: key %d (%x) is not above key %d (%x)", where, i, k, i-1, prev)
		}
		prev = k
		return nil
	}
	for i := 0; i < count; i++ {
		at := pageHeaderSize + i*elemSize
		e := p[at : at+elemSize]
		if flags == branchPageFlag {
			pos, ksize, child := uint64(le.Uint32(e)), uint64(le.Uint32(e[4:])), le.Uint64(e[8:])
			if uint64(at)+pos+ksize > uint64(len(p)) {
				return fmt.Errorf("%s: branch element %d points outside the page", where, i)
			}
			k := p[uint64(at)+pos : uint64(at)+pos+ksize]
			if err := order(i, k); err != nil {
				return err
			}
			if err := w.page(child, depth+1, where, k); err != nil {
				return err
			}
			continue
		}
		eflags, pos, ksize, vsize := le.Uint32(e), uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		end := uint64(at) + pos + ksize + vsize
		if end > uint64(len(p)) {
			return fmt.Errorf("%s: leaf element %d points outside the page", where, i)
		}
		if err := order(i, p[uint64(at)+pos:uint64(at)+pos+ksize]); err != nil {
			return err
		}
		if eflags&bucketLeafFlag == 0 {
			continue
		}
		v := p[uint64(at)+pos+ksize : end]
		if len(v) < inBucketSize {
			return fmt.Errorf("%s: bucket element %d is %d bytes", where, i, len(v))
		}
		if root := le.Uint64(v); root != 0 {
			if err := w.page(root, depth+1, where, nil); err != nil {
				return err
			}
			continue
		}
		inline := v[inBucketSize:]
		if len(inline) < pageHeaderSize {
			return fmt.Errorf("%s: inline bucket %d is %d bytes", where, i, len(inline))
		}
		if le.Uint16(inline[8:]) != leafPageFlag {
			return fmt.Errorf("%s: inline bucket %d is not a leaf", where, i)
		}
		if err := w.node(inline, depth+1, fmt.Sprintf("%s/inline %d", where, i), nil); err != nil {
			return err
		}
	}
	return nil
}
