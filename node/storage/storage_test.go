package storage

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/testkit"
)

func tempPath(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(t.TempDir(), name)
}

func openEdge(t *testing.T, path string) *EdgeStore {
	t.Helper()
	s, err := OpenEdge(path, Options{LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("OpenEdge: %v", err)
	}
	return s
}

func openAgg(t *testing.T, path string) *AggStore {
	t.Helper()
	s, err := OpenAgg(path, Options{LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("OpenAgg: %v", err)
	}
	return s
}

func closeT(t *testing.T, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestEncodings(t *testing.T) {
	vecs := [][]float64{{0}, {1, -2.5, math.MaxFloat64, math.SmallestNonzeroFloat64, math.Copysign(0, -1)}}
	for _, v := range vecs {
		got, err := decodeFloats(encodeFloats(v), "v")
		if err != nil || len(got) != len(v) {
			t.Fatalf("floats %v: %v, %v", v, got, err)
		}
		for i := range v {
			if math.Float64bits(got[i]) != math.Float64bits(v[i]) {
				t.Fatalf("floats %v: got %v", v, got)
			}
		}
		r, got, err := decodeRoundVec(encodeRoundVec(42, v), "rv")
		if err != nil || r != 42 || len(got) != len(v) {
			t.Fatalf("round vec: %d %v %v", r, got, err)
		}
	}
	// Little-endian float64 on disk, as documented.
	if b := encodeFloats([]float64{1}); string(b) != "\x00\x00\x00\x00\x00\x00\xf0\x3f" {
		t.Fatalf("1.0 encodes as %x", b)
	}
	tm := time.Unix(1700000000, 123)
	if got, err := decodeTime(encodeTime(tm), "t"); err != nil || !got.Equal(tm) {
		t.Fatalf("time: %v %v", got, err)
	}
	if got, err := decodeTime(encodeTime(time.Time{}), "t"); err != nil || !got.IsZero() {
		t.Fatalf("zero time: %v %v", got, err)
	}
	bad := []struct {
		name string
		err  error
	}{
		{"floats empty", func() error { _, err := decodeFloats(nil, "x"); return err }()},
		{"floats 7 bytes", func() error { _, err := decodeFloats(make([]byte, 7), "x"); return err }()},
		{"floats 9 bytes", func() error { _, err := decodeFloats(make([]byte, 9), "x"); return err }()},
		{"roundvec 8 bytes", func() error { _, _, err := decodeRoundVec(make([]byte, 8), "x"); return err }()},
		{"roundvec 20 bytes", func() error { _, _, err := decodeRoundVec(make([]byte, 20), "x"); return err }()},
		{"u64 3 bytes", func() error { _, err := decodeU64(make([]byte, 3), "x"); return err }()},
		{"update header only", func() error { _, err := decodeUpdate(1, []byte("c"), make([]byte, updateHeader)); return err }()},
	}
	for _, tt := range bad {
		if !errors.Is(tt.err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tt.name, tt.err)
		}
	}
}

func TestLockTimeout(t *testing.T) {
	tests := []struct {
		name string
		open func(path string, opts Options) error
	}{
		{"edge", func(p string, o Options) error { s, err := OpenEdge(p, o); closeIf(s, err); return err }},
		{"agg", func(p string, o Options) error { s, err := OpenAgg(p, o); closeIf(s, err); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tempPath(t, "db")
			// The first handle: opened with the same function so that the
			// kind matches.
			first, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close()
			start := time.Now()
			err = tt.open(path, Options{LockTimeout: 150 * time.Millisecond})
			elapsed := time.Since(start)
			if !errors.Is(err, ErrLocked) {
				t.Fatalf("second open: %v, want ErrLocked", err)
			}
			if !strings.Contains(err.Error(), "database is locked by another process") {
				t.Fatalf("unclear error: %v", err)
			}
			if elapsed > 2*time.Second {
				t.Fatalf("second open took %v", elapsed)
			}
			// Once the holder closes, the file opens.
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			if err := tt.open(path, Options{LockTimeout: 150 * time.Millisecond}); err != nil {
				t.Fatalf("open after release: %v", err)
			}
		})
	}
	// Two stores on one file in one process: the second handle times out too.
	path := tempPath(t, "edge.db")
	s := openEdge(t, path)
	defer closeT(t, s)
	if _, err := OpenEdge(path, Options{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second OpenEdge: %v, want ErrLocked", err)
	}
}

func closeIf(c interface{ Close() error }, err error) {
	if err == nil {
		_ = c.Close()
	}
}

// TestMigrationFromV0 opens a fixture made the way a pre-schema file looks:
// a bbolt file without a meta bucket.
func TestMigrationFromV0(t *testing.T) {
	path := tempPath(t, "v0.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := schemaVersion(&guardedDB{DB: db, path: path}); err != nil || v != 0 {
		t.Fatalf("fixture version = %d, %v", v, err)
	}
	closeT(t, db)

	s := openEdge(t, path)
	if v, err := schemaVersion(s.db); err != nil || v != edgeSchema.version() {
		t.Fatalf("after open: version %d, %v; want %d", v, err, edgeSchema.version())
	}
	if err := s.db.View(func(tx *wtx) error {
		for _, b := range [][]byte{bucketMeta, bucketEdge, bucketResiduals, bucketOutbox} {
			if tx.Bucket(b) == nil {
				t.Errorf("bucket %s missing", b)
			}
		}
		if _, got, err := readMeta(tx); err != nil || got != edgeKind {
			t.Errorf("kind %q, %v", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
}

// edgeV2 is a made-up next edge schema used to test the migration machinery
// on a v1 file written by the real code: it moves the outbox into a bucket
// "outbox2" and counts its runs.
func edgeV2(runs *int, fail bool) schema {
	sc := edgeSchema
	sc.layout = maps.Clone(edgeSchema.layout)
	sc.layout["outbox2"] = nil
	sc.migrations = append(append([]migration(nil), edgeSchema.migrations...), migration{
		name: "test: move outbox to outbox2",
		run: func(tx *wtx) error {
			*runs++
			dst, err := tx.CreateBucket([]byte("outbox2"))
			if err != nil {
				return err
			}
			if err := tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error { return dst.Put(k, v) }); err != nil {
				return err
			}
			if fail {
				return errors.New("disk on fire")
			}
			return tx.DeleteBucket(bucketOutbox)
		},
	})
	return sc
}

func TestMigrationFromV1(t *testing.T) {
	path := tempPath(t, "v1.db")
	s := openEdge(t, path)
	if err := s.CommitRound(3, []float64{1, 2}, nil, []byte("update-3")); err != nil {
		t.Fatal(err)
	}
	closeT(t, s)

	// A failing migration leaves the file at v1, without its partial writes.
	runs := 0
	if _, err := openDB(path, edgeV2(&runs, true), Options{}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("failing migration: %v", err)
	}
	s = openEdge(t, path)
	if v, _ := schemaVersion(s.db); v != edgeSchema.version() {
		t.Fatalf("after failed migration version = %d", v)
	}
	_ = s.db.View(func(tx *wtx) error {
		if tx.Bucket([]byte("outbox2")) != nil {
			t.Error("failed migration left outbox2 behind")
		}
		return nil
	})
	closeT(t, s)

	// The real step runs once and moves the data.
	runs = 0
	for i := 0; i < 2; i++ {
		db, err := openDB(path, edgeV2(&runs, false), Options{})
		if err != nil {
			t.Fatalf("migrate to v2: %v", err)
		}
		if v, _ := schemaVersion(db); v != edgeSchema.version()+1 {
			t.Fatalf("version = %d, want %d", v, edgeSchema.version()+1)
		}
		_ = db.View(func(tx *wtx) error {
			if got, err := sget(tx.Bucket([]byte("outbox2")), encodeU64(3), "outbox2"); err != nil || string(got) != "update-3" {
				t.Errorf("outbox2[3] = %q", got)
			}
			if tx.Bucket(bucketOutbox) != nil {
				t.Error("old outbox still there")
			}
			return nil
		})
		closeT(t, db)
	}
	if runs != 1 {
		t.Fatalf("migration ran %d times, want 1", runs)
	}

	// This binary (v1) refuses the v2 file clearly.
	_, err := OpenEdge(path, Options{})
	if want := fmt.Sprintf("schema version %d", edgeSchema.version()+1); !errors.Is(err, ErrSchemaTooNew) || !strings.Contains(err.Error(), want) {
		t.Fatalf("OpenEdge(newer file) = %v, want ErrSchemaTooNew naming %s", err, want)
	}
}

func TestOpenRejects(t *testing.T) {
	dir := t.TempDir()
	edgePath := filepath.Join(dir, "edge.db")
	closeT(t, openEdge(t, edgePath))
	if _, err := OpenAgg(edgePath, Options{}); !errors.Is(err, ErrWrongKind) {
		t.Fatalf("OpenAgg(edge file) = %v, want ErrWrongKind", err)
	}
	aggPath := filepath.Join(dir, "agg.db")
	closeT(t, openAgg(t, aggPath))
	if _, err := OpenEdge(aggPath, Options{}); !errors.Is(err, ErrWrongKind) {
		t.Fatalf("OpenEdge(agg file) = %v, want ErrWrongKind", err)
	}

	// Someone else's bbolt file.
	foreign := filepath.Join(dir, "foreign.db")
	db, err := bolt.Open(foreign, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("theirs")); return err }); err != nil {
		t.Fatal(err)
	}
	closeT(t, db)
	if _, err := OpenEdge(foreign, Options{}); !errors.Is(err, ErrWrongKind) {
		t.Fatalf("OpenEdge(foreign) = %v, want ErrWrongKind", err)
	}

	// Not a bbolt file at all.
	junk := filepath.Join(dir, "junk.db")
	testkit.WriteFile(t, junk, strings.Repeat("not a database ", 1000))
	if _, err := OpenEdge(junk, Options{}); err == nil {
		t.Fatal("OpenEdge(junk) succeeded")
	}

	// A corrupt schema version.
	bad := filepath.Join(dir, "badmeta.db")
	closeT(t, openEdge(t, bad))
	db, err = bolt.Open(bad, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte{1}) }); err != nil {
		t.Fatal(err)
	}
	closeT(t, db)
	if _, err := OpenEdge(bad, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("OpenEdge(bad version) = %v, want ErrCorrupt", err)
	}
}

func TestFileMode(t *testing.T) {
	path := tempPath(t, "edge.db")
	closeT(t, openEdge(t, path))
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("database mode %v is readable by others", fi.Mode().Perm())
	}
}
