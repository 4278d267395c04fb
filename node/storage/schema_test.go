package storage

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

var bucketThings = []byte("things")

// testSchema is a made-up kind of file with the stores' shape: buckets
// created by the first step, the census written by the second.
func testSchema(kind string) Schema {
	return Schema{
		Kind: kind,
		Migrations: []Migration{
			{Name: "create buckets", Run: CreateBuckets(bucketThings)},
			{Name: "count entries", Run: WriteCensus},
		},
		CountedFrom: 2,
		Layout:      map[string][]string{string(bucketThings): nil},
	}
}

// TestSchemaOpen runs the shared open path on a schema of its own, as each
// store does with its own: a new file is created at the schema's version,
// a sealed value survives a reopen, and a file of another kind, of a newer
// version, with a value that fails its seal or with an unknown bucket is
// refused with the matching error naming the file.
func TestSchemaOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "things.db")
	sc := testSchema("things")
	db, err := Open(path, sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := SchemaVersion(db); err != nil || v != sc.Version() {
		t.Fatalf("version %d, %v; want %d", v, err, sc.Version())
	}
	if err := db.Update(InBucket(bucketThings, func(b *Bucket) error { return SPut(b, []byte("a"), []byte("one")) })); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(path, sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := db.View(InBucket(bucketThings, func(b *Bucket) (err error) {
		got, err = SGet(b, []byte("a"), "things/a")
		return err
	})); err != nil || string(got) != "one" {
		t.Fatalf("after reopening: %q, %v", got, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	refused := func(what string, sc Schema, want error) {
		t.Helper()
		db, err := Open(path, sc, Options{})
		if err == nil {
			_ = db.Close()
		}
		if !errors.Is(err, want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want %v naming the file", what, err, want)
		}
	}
	refused("another kind", testSchema("others"), ErrWrongKind)
	older := testSchema("things")
	older.Migrations = older.Migrations[:1]
	refused("an older binary", older, ErrSchemaTooNew)
	noLayout := testSchema("things")
	noLayout.Layout = map[string][]string{}
	refused("an unknown bucket", noLayout, ErrCorrupt)

	// A value changed behind the seal (and the census retaken, so that only
	// the seal can tell).
	raw, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketThings).Put([]byte("a"), Seal([]byte("a"), []byte("one"))[:4]); err != nil {
			return err
		}
		return WriteCensus(&Tx{Tx: tx})
	}); err != nil {
		t.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
	refused("a value failing its seal", sc, ErrCorrupt)
}
