package edgestore

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

func openEdge(t *testing.T, path string) *EdgeStore {
	t.Helper()
	s, err := OpenEdge(path, storage.Options{LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("OpenEdge: %v", err)
	}
	return s
}

func TestLockTimeout(t *testing.T) {
	storetest.LockTimeout(t, func(p string, o storage.Options) error {
		s, err := OpenEdge(p, o)
		storetest.CloseIf(s, err)
		return err
	})
	// Two stores on one file in one process: the second handle times out too.
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	defer storetest.CloseT(t, s)
	if _, err := OpenEdge(path, storage.Options{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, storage.ErrLocked) {
		t.Fatalf("second OpenEdge: %v, want ErrLocked", err)
	}
}

// TestMigrationFromV0 opens a fixture made the way a pre-schema file looks:
// a bbolt file without a meta bucket.
func TestMigrationFromV0(t *testing.T) {
	path := storetest.TempPath(t, "v0.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		v, _, err := storage.ReadMeta(&storage.Tx{Tx: tx})
		if err != nil || v != 0 {
			t.Fatalf("fixture version = %d, %v", v, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, db)

	s := openEdge(t, path)
	if v, err := storage.SchemaVersion(s.db); err != nil || v != edgeSchema.Version() {
		t.Fatalf("after open: version %d, %v; want %d", v, err, edgeSchema.Version())
	}
	if err := s.db.View(func(tx *storage.Tx) error {
		for _, b := range [][]byte{storage.BucketMeta, bucketEdge, bucketResiduals, bucketOutbox} {
			if tx.Bucket(b) == nil {
				t.Errorf("bucket %s missing", b)
			}
		}
		if _, got, err := storage.ReadMeta(tx); err != nil || got != edgeKind {
			t.Errorf("kind %q, %v", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, s)
}

// edgeV2 is a made-up next edge schema used to test the migration machinery
// on a v1 file written by the real code: it moves the outbox into a bucket
// "outbox2" and counts its runs.
func edgeV2(runs *int, fail bool) storage.Schema {
	sc := edgeSchema
	sc.Layout = maps.Clone(edgeSchema.Layout)
	sc.Layout["outbox2"] = nil
	sc.Migrations = append(append([]storage.Migration(nil), edgeSchema.Migrations...), storage.Migration{
		Name: "test: move outbox to outbox2",
		Run: func(tx *storage.Tx) error {
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
	path := storetest.TempPath(t, "v1.db")
	s := openEdge(t, path)
	if err := s.CommitRound(3, []float64{1, 2}, nil, []byte("update-3")); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, s)

	// A failing migration leaves the file at v1, without its partial writes.
	runs := 0
	if _, err := storage.Open(path, edgeV2(&runs, true), storage.Options{}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("failing migration: %v", err)
	}
	s = openEdge(t, path)
	if v, _ := storage.SchemaVersion(s.db); v != edgeSchema.Version() {
		t.Fatalf("after failed migration version = %d", v)
	}
	_ = s.db.View(func(tx *storage.Tx) error {
		if tx.Bucket([]byte("outbox2")) != nil {
			t.Error("failed migration left outbox2 behind")
		}
		return nil
	})
	storetest.CloseT(t, s)

	// The real step runs once and moves the data.
	runs = 0
	for i := 0; i < 2; i++ {
		db, err := storage.Open(path, edgeV2(&runs, false), storage.Options{})
		if err != nil {
			t.Fatalf("migrate to v2: %v", err)
		}
		if v, _ := storage.SchemaVersion(db); v != edgeSchema.Version()+1 {
			t.Fatalf("version = %d, want %d", v, edgeSchema.Version()+1)
		}
		_ = db.View(func(tx *storage.Tx) error {
			if got, err := storage.SGet(tx.Bucket([]byte("outbox2")), storage.EncodeU64(3), "outbox2"); err != nil || string(got) != "update-3" {
				t.Errorf("outbox2[3] = %q", got)
			}
			if tx.Bucket(bucketOutbox) != nil {
				t.Error("old outbox still there")
			}
			return nil
		})
		storetest.CloseT(t, db)
	}
	if runs != 1 {
		t.Fatalf("migration ran %d times, want 1", runs)
	}

	// This binary (v1) refuses the v2 file clearly.
	_, err := OpenEdge(path, storage.Options{})
	if want := fmt.Sprintf("schema version %d", edgeSchema.Version()+1); !errors.Is(err, storage.ErrSchemaTooNew) || !strings.Contains(err.Error(), want) {
		t.Fatalf("OpenEdge(newer file) = %v, want ErrSchemaTooNew naming %s", err, want)
	}
}

func TestFileMode(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	storetest.CloseT(t, openEdge(t, path))
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("database mode %v is readable by others", fi.Mode().Perm())
	}
}
