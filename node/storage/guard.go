package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A damaged state file must give the daemon a one-line error and a non-zero
// exit, never a Go panic or a hang (docs/operations.md, "When a state file is damaged"). bbolt trusts
// its pages: a zeroed or truncated page makes it panic ("invalid freelist
// page", "page N already freed", slice bounds) or fault on an mmap read past
// the end of the file; a panic inside a write transaction can leave its
// locks held, so a later Close blocks forever. Three defences, in order:
//
//  1. precheck reads the two meta pages itself, before bbolt maps the file:
//     an empty file, no valid meta page, or a file shorter than its last
//     commit's high-water mark is refused without touching a data page.
//  2. Every transaction runs under DB: panics (and, with
//     debug.SetPanicOnFault, memory faults) are recovered into an error
//     wrapping ErrCorrupt that names the file. The handle is then poisoned:
//     every later call returns the same error, and after a write panic
//     Close does not touch bbolt's locks.
//  3. Open walks the page tree itself from the file's bytes (walk.go), then
//     runs bbolt's consistency check (Tx.Check: freed pages in use, key
//     order), then checks the sealed entry counts of every bucket
//     (census.go) and reads every value and checks its seal, each bounded
//     in time, before the daemon reads anything.
//
// Values inside the pages are sealed with checksums (seal.go).

// DB is a bbolt handle whose transactions cannot panic.
type DB struct {
	*bolt.DB
	path   string
	layout map[string][]string                    // bucket -> its fixed keys (nil: any key); from the schema
	nested map[string][]string                    // bucket -> the fixed keys of each bucket in it; from the schema
	value  func(bucket string, k, v []byte) error // the schema's check of a value's shape
	broken atomic.Pointer[error]                  // the first recovered panic, if any
	wedged atomic.Bool                            // a write transaction panicked: bbolt's locks may be held
}

// guard is deferred by every entry point that touches pages; it recovers a
// panic or memory fault into *err.
func (d *DB) guard(err *error, write bool) func() {
	old := debug.SetPanicOnFault(true)
	return func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			e := fmt.Errorf("%w: %s is damaged (%s)", ErrCorrupt, d.path, bboltSays(r))
			d.broken.CompareAndSwap(nil, &e)
			if write {
				d.wedged.Store(true)
			}
			*err = e
		}
	}
}

func (d *DB) failed() error {
	if e := d.broken.Load(); e != nil {
		return *e
	}
	return nil
}

// View is bolt.DB.View with panics recovered.
func (d *DB) View(fn func(*Tx) error) (err error) {
	if err := d.failed(); err != nil {
		return err
	}
	defer d.guard(&err, false)()
	return d.named(d.DB.View(func(tx *bolt.Tx) error { return fn(&Tx{Tx: tx}) }))
}

// Update is bolt.DB.Update with panics recovered. The census (census.go)
// is kept by the changes fn makes through the Tx (wtx.go) and written
// back in the same transaction.
func (d *DB) Update(fn func(*Tx) error) (err error) {
	if err := d.failed(); err != nil {
		return err
	}
	defer d.guard(&err, true)()
	return d.named(d.DB.Update(func(tx *bolt.Tx) error {
		cen, err := loadCensus(tx)
		if err != nil {
			return err
		}
		w := &Tx{Tx: tx, cen: cen}
		if err := fn(w); err != nil {
			return err
		}
		if SelfCheckCensus && w.cen != nil {
			if err := CheckCensus(w, "", false); err != nil {
				return wrapErr("the census kept by this transaction's writes is not the file's", err)
			}
		}
		return w.cen.save(tx)
	}))
}

// named adds the file's path to a corruption error found inside a
// transaction (a value failing its checksum), so the operator's one-line
// error says which file.
func (d *DB) named(err error) error {
	if err != nil && errors.Is(err, ErrCorrupt) && !strings.Contains(err.Error(), d.path) {
		return fmt.Errorf("%w (in %s)", err, d.path)
	}
	return err
}

// Close closes the file, unless a write transaction panicked: then bbolt's
// locks may be held and its Close would block forever, so the handle is
// left to the process's exit (which releases the file lock and the map).
func (d *DB) Close() (err error) {
	if d.wedged.Load() {
		return fmt.Errorf("%w: %s was left open after a failed write", ErrCorrupt, d.path)
	}
	defer d.guard(&err, false)()
	return d.DB.Close()
}

// Meta page layout (bbolt's internal/common: Page header, then Meta), in
// the machine's byte order, which is little-endian on every platform edgefl
// ships for.
const (
	pageHeaderSize = 16
	metaMagic      = 0xED0CDAED
	metaVersion    = 2
	metaChecksumAt = 56 // offset of the checksum inside Meta: fnv-64a of the bytes before it
	metaSize       = 64
	minPageSize    = 512
	maxPageSize    = 1 << 16
	noFreelist     = ^uint64(0)
)

type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

// parseMeta decodes and validates the meta at the start of page (nil:
// invalid, with the reason).
func parseMeta(page []byte) (*boltMeta, string) {
	if len(page) < pageHeaderSize+metaSize {
		return nil, "short"
	}
	m := page[pageHeaderSize : pageHeaderSize+metaSize]
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != metaMagic {
		return nil, "bad magic"
	}
	if le.Uint32(m[4:]) != metaVersion {
		return nil, fmt.Sprintf("bbolt format version %d", le.Uint32(m[4:]))
	}
	h := fnv.New64a()
	h.Write(m[:metaChecksumAt])
	if h.Sum64() != le.Uint64(m[metaChecksumAt:]) {
		return nil, "bad checksum"
	}
	bm := &boltMeta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]),
		pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
	if bm.pageSize < minPageSize || bm.pageSize > maxPageSize || bm.pageSize&(bm.pageSize-1) != 0 {
		return nil, fmt.Sprintf("page size %d", bm.pageSize)
	}
	if bm.root >= bm.pgid || (bm.freelist != noFreelist && bm.freelist >= bm.pgid) || bm.pgid < 4 {
		return nil, fmt.Sprintf("pages out of range (root %d, freelist %d, high-water mark %d)", bm.root, bm.freelist, bm.pgid)
	}
	return bm, ""
}

// metaPageFlag is bbolt's page flag of a meta page.
const metaPageFlag = 0x04

// metaHeader checks the page header of meta page id (0 or 1): "" when it
// is a meta page's, else what it is instead.
func metaHeader(page []byte, id uint64) string {
	if len(page) < pageHeaderSize {
		return ""
	}
	if !slices.ContainsFunc(page, func(b byte) bool { return b != 0 }) {
		return fmt.Sprintf("meta page %d is zeroed", id)
	}
	le := binary.LittleEndian
	if got, flags := le.Uint64(page[0:]), le.Uint16(page[8:]); got != id || flags != metaPageFlag {
		return fmt.Sprintf("meta page %d is overwritten (its header says page %d with flags %#x, not a meta page)", id, got, flags)
	}
	return ""
}

// bboltSays is an error bbolt raised on a damaged page (a panic recovered
// by guard, or an error of its consistency check, which recovers its own
// panics) without bbolt's "panic: assertion failed:" prefix: the file is
// damaged, nothing crashed.
func bboltSays(v any) string {
	s := fmt.Sprint(v)
	for {
		t := strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "panic:"), " ")
		t = strings.TrimPrefix(t, "assertion failed:")
		t = strings.TrimSpace(t)
		if t == s {
			return s
		}
		s = t
	}
}

// precheck refuses, before bbolt maps it, a file that cannot be a sound
// database: empty, without a valid meta page, or shorter than the last
// commit says it is. A missing file is fine (it will be created).
func precheck(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage: open %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("storage: stat %s: %w", path, err)
	}
	size := st.Size()
	if size == 0 {
		return fmt.Errorf("%w: %s is empty (0 bytes), not a state file", ErrCorrupt, path)
	}
	buf := make([]byte, pageHeaderSize+metaSize)
	var metas []*boltMeta
	var why []string
	overwritten := ""
	read := func(id uint64, off int64) {
		if _, err := f.ReadAt(buf, off); err != nil {
			if errors.Is(err, io.EOF) {
				why = append(why, fmt.Sprintf("meta page at %d: past the end of the file", off))
				return
			}
			why = append(why, fmt.Sprintf("meta page at %d: %v", off, err))
			return
		}
		if bad := metaHeader(buf, id); bad != "" && overwritten == "" {
			overwritten = bad
		}
		if m, bad := parseMeta(buf); m != nil {
			metas = append(metas, m)
		} else {
			why = append(why, fmt.Sprintf("meta page at %d: %s", off, bad))
		}
	}
	read(0, 0)
	second := int64(4096)
	if len(metas) == 1 {
		second = int64(metas[0].pageSize)
	}
	read(1, second)
	if len(metas) == 0 {
		return fmt.Errorf("%w: %s has no valid bbolt meta page (%s)", ErrCorrupt, path, joinWhy(why))
	}
	// bbolt keeps two meta pages so that a commit torn while writing one
	// falls back to the other: such a page still has its meta header,
	// only its checksum fails. A meta page whose header is not a meta
	// page's (zeroed, or other data written over it) is damage, not a
	// torn commit; bbolt's own check would stop on it with an assertion.
	if overwritten != "" {
		return fmt.Errorf("%w: %s is damaged: %s", ErrCorrupt, path, overwritten)
	}
	m := metas[0]
	if len(metas) == 2 && metas[1].txid > m.txid {
		m = metas[1]
	}
	if need := int64(m.pgid) * int64(m.pageSize); size < need {
		return fmt.Errorf("%w: %s is truncated: %d bytes, its last commit (transaction %d) needs %d",
			ErrCorrupt, path, size, m.txid, need)
	}
	if err := walkTree(f, m); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	return nil
}

func joinWhy(why []string) string {
	s := ""
	for i, w := range why {
		if i > 0 {
			s += "; "
		}
		s += w
	}
	return s
}

// refuseEmpty refuses an existing empty file before bbolt, which would
// initialise it as a new database (a wiped round log would start a new run,
// and `status` would say it holds no round). The size is read under the
// file's lock, so a file another process is creating right now is
// ErrLocked, not empty.
func refuseEmpty(path string) error {
	st, err := os.Stat(path)
	if err != nil || st.Size() > 0 {
		return nil // missing (created by bbolt) or not empty; bbolt reports other errors
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrLocked, path, err)
	}
	// The deferred f.Close releases the lock.
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		return fmt.Errorf("%w: %s is empty (0 bytes), not a state file", ErrCorrupt, path)
	}
	return nil
}

// openGuarded opens path with bbolt under the guard.
func openGuarded(path string, sc Schema, o *bolt.Options) (g *DB, err error) {
	g = &DB{path: path, layout: sc.Layout, nested: sc.Nested, value: sc.CheckValue}
	defer g.guard(&err, true)()
	db, err := bolt.Open(path, 0o600, o)
	if err != nil {
		return nil, err
	}
	g.DB = db
	return g, nil
}

// checkTime bounds the consistency check on open: generous for the file's
// size (bbolt checks tens of MB per second even on a gateway's SD card),
// never unbounded.
func checkTime(size int64) time.Duration {
	d := 10*time.Second + time.Duration(size/(4<<20))*time.Second
	return min(d, 5*time.Minute)
}

// bounded runs one whole-file check within checkTime. A check that
// cannot finish in time is an error: the daemon must not start on a file it
// could not verify.
func bounded(d *DB, what string, fn func() error) error {
	var size int64
	if st, err := os.Stat(d.path); err == nil {
		size = st.Size()
	}
	limit := checkTime(size)
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		// The check goroutine keeps its read transaction; the caller
		// exits, so the handle is poisoned rather than closed.
		e := fmt.Errorf("%w: %s: %s did not finish in %v", ErrCorrupt, d.path, what, limit)
		d.broken.CompareAndSwap(nil, &e)
		d.wedged.Store(true)
		return e
	}
}

// checkValues reads every value of the file and checks its seal, and that
// the buckets and the fixed keys are the schema's: a flipped bit in a key
// would otherwise make a value look absent (a "fresh" round log, an
// identity never set) instead of damaged.
func (d *DB) checkValues(tx *bolt.Tx) error {
	return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		if string(name) == string(BucketMeta) {
			return nil
		}
		fixed, known := d.layout[string(name)]
		if !known {
			return fmt.Errorf("%w: %s has an unknown bucket %q", ErrCorrupt, d.path, name)
		}
		return d.checkBucket(b, string(name), fixed)
	})
}

func (d *DB) checkBucket(b *bolt.Bucket, what string, fixed []string) error {
	return b.ForEach(func(k, v []byte) error {
		if fixed != nil && !slices.Contains(fixed, string(k)) {
			return fmt.Errorf("%w: %s has an unknown key %q", ErrCorrupt, what, k)
		}
		if v == nil {
			nb := b.Bucket(k)
			if nb == nil {
				return fmt.Errorf("%w: %s/%q is neither a value nor a bucket", ErrCorrupt, what, k)
			}
			return d.checkBucket(nb, fmt.Sprintf("%s/%x", what, k), d.nested[what])
		}
		v, err := Unseal(k, v, fmt.Sprintf("%s/%q", what, k))
		if err != nil {
			return err
		}
		if d.value == nil {
			return nil
		}
		return d.value(what, k, v)
	})
}

// compactInto copies the whole database into out under the guard.
func (d *DB) compactInto(out *bolt.DB) (err error) {
	if err := d.failed(); err != nil {
		return err
	}
	defer d.guard(&err, false)()
	return bolt.Compact(out, d.DB, 16<<20)
}
