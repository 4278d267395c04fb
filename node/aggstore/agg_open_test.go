package aggstore

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit"
	"github.com/edgefl/edgefl/testkit/storetest"
)

func openAgg(t *testing.T, path string) *AggStore {
	t.Helper()
	s, err := OpenAgg(path, storage.Options{LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("OpenAgg: %v", err)
	}
	return s
}

func TestLockTimeout(t *testing.T) {
	storetest.LockTimeout(t, func(p string, o storage.Options) error {
		s, err := OpenAgg(p, o)
		storetest.CloseIf(s, err)
		return err
	})
}

// TestUpdateDecoding: a stored update of the header alone is corrupt.
func TestUpdateDecoding(t *testing.T) {
	if _, err := decodeUpdate(1, []byte("c"), make([]byte, updateHeader)); !errors.Is(err, storage.ErrCorrupt) {
		t.Errorf("update header only: %v, want ErrCorrupt", err)
	}
}

// TestOpenRejects: a file of the other store, someone else's bbolt file,
// junk and a damaged schema version are refused.
func TestOpenRejects(t *testing.T) {
	dir := t.TempDir()
	edgePath := filepath.Join(dir, "edge.db")
	edge, err := edgestore.OpenEdge(edgePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, edge)
	if _, err := OpenAgg(edgePath, storage.Options{}); !errors.Is(err, storage.ErrWrongKind) {
		t.Fatalf("OpenAgg(edge file) = %v, want ErrWrongKind", err)
	}
	aggPath := filepath.Join(dir, "agg.db")
	storetest.CloseT(t, openAgg(t, aggPath))
	if _, err := edgestore.OpenEdge(aggPath, storage.Options{}); !errors.Is(err, storage.ErrWrongKind) {
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
	storetest.CloseT(t, db)
	if _, err := edgestore.OpenEdge(foreign, storage.Options{}); !errors.Is(err, storage.ErrWrongKind) {
		t.Fatalf("OpenEdge(foreign) = %v, want ErrWrongKind", err)
	}

	// Not a bbolt file at all.
	junk := filepath.Join(dir, "junk.db")
	testkit.WriteFile(t, junk, strings.Repeat("not a database ", 1000))
	if _, err := edgestore.OpenEdge(junk, storage.Options{}); err == nil {
		t.Fatal("OpenEdge(junk) succeeded")
	}

	// A corrupt schema version.
	bad := filepath.Join(dir, "badmeta.db")
	if edge, err = edgestore.OpenEdge(bad, storage.Options{}); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, edge)
	db, err = bolt.Open(bad, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(storage.BucketMeta).Put(storage.KeySchemaVersion, []byte{1}) }); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, db)
	if _, err := edgestore.OpenEdge(bad, storage.Options{}); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("OpenEdge(bad version) = %v, want ErrCorrupt", err)
	}
}
