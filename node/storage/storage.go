// Package storage is the bbolt machinery edgefl's two stores share: the
// edge agent's (node/edgestore) and the aggregator's (node/aggstore). It
// owns opening a file (a bounded lock wait, the page checks of guard.go
// and walk.go, the kind check and the forward migrations of a Schema), the
// transaction wrappers that keep every bucket's sealed entry count
// (wtx.go, census.go), the checksummed values (seal.go), the value
// encodings and the errors the stores return. It knows no store's buckets
// beyond their names (ourBuckets): each store declares its Schema (kind,
// migrations, layout, value checks) and its own methods. The edge agent
// links this package and node/edgestore only, not the aggregator's round
// log.
//
// Durability rules, shared by both stores:
//   - every method that changes state is exactly one bbolt read-write
//     transaction, committed with fsync (NoSync is never set), so a method
//     that returned nil survived power loss and a method that did not return
//     left no trace;
//   - a file is opened by one process at a time: a second Open fails with
//     ErrLocked after Options.LockTimeout instead of hanging;
//   - the schema is versioned (bucket "meta", key "schema_version") and
//     migrated forward on Open, one transaction per step; a file written by a
//     newer binary is refused with ErrSchemaTooNew. One exception: the
//     aggregator's buckets of a run with a federation schema
//     (node/aggstore/agg_fed.go) came without a version step and are
//     created by their first write, so a run without a schema writes
//     exactly the file it wrote before; an older binary refuses such a
//     file as damaged (an unknown bucket) rather than as newer;
//   - stored bytes are treated as untrusted on read: a value of the wrong
//     shape is an error wrapping ErrCorrupt, never a panic;
//   - every value is sealed with a checksum (seal.go) and every bucket's
//     entries are counted in a sealed census (census.go), so a damaged file
//     reads back intact or is refused with ErrCorrupt naming the file: a
//     value that changed or an entry that vanished (a listing one short)
//     is never returned as data.
//
// Values: integers and keys are big-endian uint64 (so rounds sort), float
// vectors are little-endian float64, small records are JSON, messages are
// the opaque bytes the caller hands in (the encoded wire messages). The
// package does not import wire or anything MQTT.
package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// DefaultLockTimeout is how long Open waits for another process to release
// the file when Options.LockTimeout is not set.
const DefaultLockTimeout = 2 * time.Second

// Options tune Open.
type Options struct {
	// LockTimeout bounds the wait for the file lock held by another process
	// (or another handle in this one). <= 0 means DefaultLockTimeout: the
	// wait is always bounded.
	LockTimeout time.Duration
	// SkipValueCheck skips reading every value on open (the page tree and
	// the sealed entry counts are still checked, and each value's checksum
	// when it is read): for
	// rolling back a file whose newest values are damaged.
	SkipValueCheck bool
}

// Errors. Every error the stores return for these conditions wraps one of
// them (test with errors.Is).
var (
	ErrLocked         = errors.New("storage: database is locked by another process")
	ErrSchemaTooNew   = errors.New("storage: database schema is newer than this binary supports")
	ErrWrongKind      = errors.New("storage: database belongs to another component")
	ErrCorrupt        = errors.New("storage: corrupt value")
	ErrNotFound       = errors.New("storage: not found")
	ErrInvalid        = errors.New("storage: invalid argument")
	ErrStale          = errors.New("storage: round older than the stored one")
	ErrAlreadyApplied = errors.New("storage: round already applied")
	ErrExists         = errors.New("storage: already exists")
	ErrMismatch       = errors.New("storage: stored identity differs")
)

// ErrConflict: a second, different message under a key that holds one.
var ErrConflict = errors.New("storage: a different message is stored under this key")

// ourBuckets are the bucket names of every edgefl schema, old or new, of
// both stores: a file without its meta bucket but with one of these is a
// damaged edgefl file, whichever binary opens it.
var ourBuckets = []string{"meta", "agg", "clients", "rounds", "updates", "latest_z", "checkpoints", "edge", "residuals", "outbox", "sum_pending",
	"statistics", "evals", "federation", "secagg", "secagg_msgs"}

// Bucket and key names shared by both schemas.
var (
	BucketMeta       = []byte("meta")
	KeySchemaVersion = []byte("schema_version")
	keyKind          = []byte("kind")
)

// Migration moves a file from schema version i to i+1, where i is its index
// in a schema's list. It runs inside the transaction that also stamps the new
// version, so a step is all or nothing.
type Migration struct {
	Name string
	Run  func(tx *Tx) error
}

// Schema is one kind of file: its name in the meta bucket and its migrations;
// the current version is len(migrations).
type Schema struct {
	Kind       string
	Migrations []Migration
	// layout names the buckets of the current version and, for buckets
	// with fixed keys, those keys (nil: keys are data, e.g. client ids);
	// the check on open refuses anything else (guard.go).
	Layout map[string][]string
	// nested names, for a bucket of buckets, the fixed keys of each
	// bucket in it (absent: any key).
	Nested map[string][]string
	// checkValue, when set, checks the shape of a value read on open
	// (after its seal): the float vectors are decoded, so a non-finite
	// number (never written: CheckVec refuses it) is found on open, not
	// when a round needs it.
	CheckValue func(bucket string, k, v []byte) error
	// invariants, when set, checks what the layout cannot say (read on
	// open with every value).
	Invariants func(tx *Tx) error
	// countedFrom is the version whose migration wrote the census
	// (census.go): a file of that version or later must have one.
	CountedFrom uint64
}

// Version is the schema's current version: the number of its migrations.
func (s Schema) Version() uint64 { return uint64(len(s.Migrations)) }

// CreateBuckets is the body of a v0 -> v1 migration.
func CreateBuckets(names ...[]byte) func(tx *Tx) error {
	return func(tx *Tx) error {
		for _, n := range names {
			if _, err := tx.CreateBucketIfNotExists(n); err != nil {
				return fmt.Errorf("create bucket %s: %w", n, err)
			}
		}
		return nil
	}
}

// Open opens (creating if needed) the bbolt file at path, takes its lock
// with a bounded wait, verifies every page (guard.go), checks its kind and
// migrates it to sc's version. A damaged file is an error wrapping
// ErrCorrupt that names the file, never a panic or a hang.
func Open(path string, sc Schema, opts Options) (*DB, error) {
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	if err := refuseEmpty(path); err != nil {
		return nil, err
	}
	db, err := openGuarded(path, sc, &bolt.Options{
		Timeout: timeout,
		NoSync:  false, // fsync every commit: durability is the point
	})
	if err != nil {
		switch {
		case errors.Is(err, bolterrors.ErrTimeout):
			return nil, fmt.Errorf("%w: %s (gave up after %v): %w", ErrLocked, path, timeout, err)
		case errors.Is(err, ErrCorrupt):
			if perr := precheck(path); errors.Is(perr, ErrCorrupt) {
				return nil, perr // what bbolt tripped on, said better
			}
			return nil, err
		case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch):
			return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
		}
		if perr := precheck(path); errors.Is(perr, ErrCorrupt) {
			return nil, perr // what bbolt tripped on, said better
		}
		return nil, fmt.Errorf("storage: open %s: %w", path, err)
	}
	// Under the file lock bbolt now holds: nobody else writes while the
	// page tree is read from the file's bytes.
	if err := precheck(path); err != nil {
		_ = db.Close()
		return nil, err
	}
	{
		if err := bounded(db, "the consistency check", func() error { return Check(db) }); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	if err := migrate(db, sc); err != nil {
		_ = db.Close()
		if errors.Is(err, ErrCorrupt) && !strings.Contains(err.Error(), path) {
			return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
		}
		return nil, fmt.Errorf("storage: %s: %w", path, err)
	}
	// Values are sealed from schema version 2 on, and counted from
	// the census step on, so this runs on the migrated file. The
	// counts are checked even when the values are not (a rollback
	// must not start from a file that lost entries).
	if err := bounded(db, "reading every value", func() error {
		return db.View(func(tx *Tx) error {
			if err := CheckCensus(tx, "", sc.CountedFrom > 0 && sc.Version() >= sc.CountedFrom); err != nil {
				return err
			}
			if opts.SkipValueCheck {
				return nil
			}
			if err := db.checkValues(tx.Tx); err != nil {
				return err
			}
			if sc.Invariants != nil {
				return db.named(sc.Invariants(tx))
			}
			return nil
		})
	}); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// ReadMeta returns a file's schema version and kind; a file without a meta
// bucket is version 0 and must be empty.
func ReadMeta(tx *Tx) (version uint64, kind string, err error) {
	meta := tx.Bucket(BucketMeta)
	if meta == nil {
		var foreign []string
		_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			foreign = append(foreign, string(name))
			return nil
		})
		for _, n := range foreign {
			if slices.Contains(ourBuckets, n) {
				// Ours, but its meta bucket cannot be found: damaged.
				return 0, "", fmt.Errorf("%w: no meta bucket, but edgefl's buckets %q", ErrCorrupt, foreign)
			}
		}
		if len(foreign) > 0 {
			return 0, "", fmt.Errorf("%w: no meta bucket but buckets %q: not an edgefl database", ErrWrongKind, foreign)
		}
		return 0, "", nil
	}
	v := meta.Get(KeySchemaVersion)
	if v == nil {
		return 0, "", fmt.Errorf("%w: meta bucket without schema_version", ErrCorrupt)
	}
	// From version 2 on the meta values are sealed too (seal.go): a
	// flipped bit in the version would otherwise read as "a newer binary
	// wrote this file". Version 1 wrote them bare.
	sealed := len(v) == 8+SealLen
	if sealed {
		if v, err = Unseal(KeySchemaVersion, v, "meta/schema_version"); err != nil {
			return 0, "", err
		}
	}
	version, err = DecodeU64(v, "meta/schema_version")
	if err != nil {
		return 0, "", err
	}
	if sealed != (version >= 2) {
		return 0, "", fmt.Errorf("%w: meta/schema_version %d is stored %s", ErrCorrupt, version, map[bool]string{true: "with a seal", false: "without its seal"}[sealed])
	}
	k := meta.Get(keyKind)
	if sealed && k != nil {
		if k, err = Unseal(keyKind, k, "meta/kind"); err != nil {
			return 0, "", err
		}
	}
	return version, string(k), nil
}

// putMeta stamps a file's kind and schema version (sealed from version 2).
func putMeta(meta *Bucket, kind string, version uint64) error {
	k, v := []byte(kind), EncodeU64(version)
	if version >= 2 {
		k, v = Seal(keyKind, k), Seal(KeySchemaVersion, v)
	}
	if err := meta.Put(keyKind, k); err != nil {
		return err
	}
	return meta.Put(KeySchemaVersion, v)
}

func migrate(db *DB, sc Schema) error {
	var version uint64
	var kind string
	if err := db.View(func(tx *Tx) (err error) {
		version, kind, err = ReadMeta(tx)
		return err
	}); err != nil {
		return err
	}
	if version > 0 && kind == "" {
		return fmt.Errorf("%w: the meta bucket has a schema version but no kind", ErrCorrupt)
	}
	if version > 0 && kind != sc.Kind {
		return fmt.Errorf("%w: this is a %q database, not %q", ErrWrongKind, kind, sc.Kind)
	}
	if version > sc.Version()+1000 {
		// No binary will ever get there: a damaged value, not a newer file.
		return fmt.Errorf("%w: implausible schema version %d", ErrCorrupt, version)
	}
	if version > sc.Version() {
		return fmt.Errorf("%w: file has schema version %d, this binary knows up to %d (%s); upgrade the binary",
			ErrSchemaTooNew, version, sc.Version(), sc.Kind)
	}
	existing := version > 0 // a new file's steps are not news
	for version < sc.Version() {
		m := sc.Migrations[version]
		err := db.Update(func(tx *Tx) error {
			// Re-read inside the write transaction: the lock makes this
			// the only writer, but be exact about what we migrate from.
			v, _, err := ReadMeta(tx)
			if err != nil {
				return err
			}
			if v != version {
				return fmt.Errorf("%w: schema version changed from %d to %d during migration", ErrCorrupt, version, v)
			}
			if err := m.Run(tx); err != nil {
				return err
			}
			meta, err := tx.CreateBucketIfNotExists(BucketMeta)
			if err != nil {
				return err
			}
			return putMeta(meta, sc.Kind, version+1)
		})
		if err != nil {
			return fmt.Errorf("migration %s v%d -> v%d (%s): %w", sc.Kind, version, version+1, m.Name, err)
		}
		if existing {
			slog.Info("storage: migrated an existing file", "file", db.path, "kind", sc.Kind,
				"from", version, "to", version+1, "step", m.Name)
		}
		version++
	}
	return nil
}

// SchemaVersion reads the version of an open file (for tests and tools).
func SchemaVersion(db *DB) (v uint64, err error) {
	err = db.View(func(tx *Tx) error {
		v, _, err = ReadMeta(tx)
		return err
	})
	return v, err
}

// Check runs bbolt's consistency check of the whole file.
func Check(db *DB) error {
	return db.View(func(tx *Tx) error {
		var errs []string
		for err := range tx.Check() {
			if len(errs) < 3 { // the first few say enough; keep draining
				errs = append(errs, bboltSays(err))
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w: %s is damaged: it fails bbolt's consistency check: %s", ErrCorrupt, db.path, strings.Join(errs, "; "))
		}
		return nil
	})
}

// Compact writes a compacted copy of src to dst, which must not exist. It
// compacts into dst+".tmp" and renames on success, so an interrupted compaction
// never leaves a partial file under dst.
func Compact(src *DB, dst string, opts Options) (err error) {
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("%w: compact destination %s", ErrExists, dst)
	} else if !errors.Is(err, os.ErrNotExist) {
		return wrapErr("storage: compact", err)
	}
	tmp := dst + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return wrapErr("storage: compact", err)
	}
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	out, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		return fmt.Errorf("storage: compact: open %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := src.compactInto(out); err != nil {
		_ = out.Close()
		return fmt.Errorf("storage: compact %s -> %s: %w", src.Path(), dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("storage: compact: close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return wrapErr("storage: compact", err)
	}
	return syncDir(filepath.Dir(dst))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return wrapErr("storage: sync dir", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("storage: sync dir %s: %w", dir, err)
	}
	return nil
}

// ---- value encodings ----

// EncodeU64 is v big-endian (keys sort by it).
func EncodeU64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// DecodeU64 reads an EncodeU64 value; what names it in the error.
func DecodeU64(b []byte, what string) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: %s is %d bytes, want 8", ErrCorrupt, what, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// EncodeTime stores a time as Unix nanoseconds; the zero time as 0.
func EncodeTime(t time.Time) []byte {
	if t.IsZero() {
		return EncodeU64(0)
	}
	return EncodeU64(uint64(t.UnixNano()))
}

// DecodeTime reads an EncodeTime value.
func DecodeTime(b []byte, what string) (time.Time, error) {
	v, err := DecodeU64(b, what)
	if err != nil || v == 0 {
		return time.Time{}, err
	}
	return time.Unix(0, int64(v)), nil
}

// AppendFloats appends v to dst as little-endian float64s.
func AppendFloats(dst []byte, v []float64) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(x))
	}
	return dst
}

// EncodeFloats is v as little-endian float64s.
func EncodeFloats(v []float64) []byte { return AppendFloats(make([]byte, 0, 8*len(v)), v) }

// DecodeFloats copies a non-empty little-endian float64 vector out of b
// (which may be bbolt memory, valid only inside the transaction).
func DecodeFloats(b []byte, what string) ([]float64, error) {
	if len(b) == 0 || len(b)%8 != 0 {
		return nil, fmt.Errorf("%w: %s is %d bytes, want a positive multiple of 8", ErrCorrupt, what, len(b))
	}
	v := make([]float64, len(b)/8)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		if math.IsNaN(v[i]) || math.IsInf(v[i], 0) {
			// Never written (CheckVec refuses it): the file was altered.
			return nil, fmt.Errorf("%w: %s[%d] is %v", ErrCorrupt, what, i, v[i])
		}
	}
	return v, nil
}

// EncodeRoundVec is a round-tagged vector: 8-byte big-endian round, then
// the floats.
func EncodeRoundVec(round uint64, v []float64) []byte {
	return AppendFloats(binary.BigEndian.AppendUint64(make([]byte, 0, 8+8*len(v)), round), v)
}

// DecodeRoundVec reads an EncodeRoundVec value.
func DecodeRoundVec(b []byte, what string) (uint64, []float64, error) {
	if len(b) < 16 || len(b)%8 != 0 {
		return 0, nil, fmt.Errorf("%w: %s is %d bytes, want 8 + a positive multiple of 8", ErrCorrupt, what, len(b))
	}
	v, err := DecodeFloats(b[8:], what)
	return binary.BigEndian.Uint64(b), v, err
}

// RoundOf reads only the round of a round-tagged vector.
func RoundOf(b []byte, what string) (uint64, error) {
	if len(b) < 16 || len(b)%8 != 0 {
		return 0, fmt.Errorf("%w: %s is %d bytes, want 8 + a positive multiple of 8", ErrCorrupt, what, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// CheckVec rejects vectors that must never be stored: empty or non-finite.
func CheckVec(what string, v []float64) error {
	if len(v) == 0 {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	}
	if 8*uint64(len(v)) > bolt.MaxValueSize-8 {
		return fmt.Errorf("%w: %s has %d values, too large for one value", ErrInvalid, what, len(v))
	}
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%w: %s[%d] is %v", ErrInvalid, what, i, x)
		}
	}
	return nil
}

// CheckName validates a client id or residual name used as a key. The
// storage layer does not know wire's id charset; it only keeps keys sane.
func CheckName(what, s string) error {
	if s == "" || len(s) > 255 {
		return fmt.Errorf("%w: %s must be 1..255 bytes, got %d", ErrInvalid, what, len(s))
	}
	if bytes.IndexByte([]byte(s), 0) >= 0 {
		return fmt.Errorf("%w: %s contains NUL", ErrInvalid, what)
	}
	return nil
}

// NeedBucket returns the top-level bucket name, which must exist: a missing
// one is ErrCorrupt.
func NeedBucket(tx *Tx, name []byte) (*Bucket, error) {
	b := tx.Bucket(name)
	if b == nil {
		return nil, fmt.Errorf("%w: bucket %s is missing", ErrCorrupt, name)
	}
	return b, nil
}

// InBucket is a transaction function (for db.View or db.Update) that runs fn
// on the top-level bucket name, which must exist.
func InBucket(name []byte, fn func(b *Bucket) error) func(tx *Tx) error {
	return func(tx *Tx) error {
		b, err := NeedBucket(tx, name)
		if err != nil {
			return err
		}
		return fn(b)
	}
}

// MakeBucket returns a bucket created by its first write (a version-3
// bucket), creating it.
func MakeBucket(tx *Tx, name []byte) (*Bucket, error) {
	b, err := tx.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", name, err)
	}
	return b, nil
}

// OptBucket returns a bucket created by its first write, nil (no error) when it has not
// been written yet.
func OptBucket(tx *Tx, name []byte) (*Bucket, error) { return tx.Bucket(name), nil }
