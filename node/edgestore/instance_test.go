package edgestore

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// Each installation draws its own instance id once: InitIdentity keeps it
// across calls and reopenings, another file draws another, and a file of
// schema version 3 (before instance ids) gets one on its first InitIdentity
// and is stamped version 4, which the version-3 code refuses as newer.
func TestEdgeInstanceID(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	id, err := s.InitIdentity("site-1", t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(id.InstanceID) != 26 {
		t.Fatalf("instance id %q", id.InstanceID)
	}
	again, err := s.InitIdentity("site-1", t0.Add(time.Hour))
	if err != nil || again != id {
		t.Fatalf("InitIdentity again: %+v, %v; want %+v", again, err, id)
	}
	storetest.CloseT(t, s)
	s = openEdge(t, path)
	if got, err := s.Identity(); err != nil || got != id {
		t.Fatalf("after reopening: %+v, %v; want %+v", got, err, id)
	}
	storetest.CloseT(t, s)

	other := openEdge(t, storetest.TempPath(t, "clone.db"))
	oid, err := other.InitIdentity("site-1", t0)
	if err != nil {
		t.Fatal(err)
	}
	if oid.InstanceID == id.InstanceID || oid.InstanceID == "" {
		t.Fatalf("a second file's instance id %q, the first's %q", oid.InstanceID, id.InstanceID)
	}
	storetest.CloseT(t, other)

	// A version-3 file.
	v3 := edgeSchema
	v3.Migrations = edgeSchema.Migrations[:3]
	v3.Layout = maps.Clone(edgeSchema.Layout)
	delete(v3.Layout, string(bucketPending))
	v3.Layout[string(bucketEdge)] = slices.DeleteFunc(slices.Clone(v3.Layout[string(bucketEdge)]), func(k string) bool {
		return k == string(keyInstanceID)
	})
	oldPath := storetest.TempPath(t, "v3.db")
	db, err := storage.Open(oldPath, v3, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := &EdgeStore{db: db}
	if err := old.update(func(b *storage.Bucket, _ *storage.Tx) error {
		if err := storage.SPut(b, keyClientID, []byte("site-1")); err != nil {
			return err
		}
		return storage.SPut(b, keyCreatedAt, storage.EncodeTime(t0))
	}); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, old)
	s = openEdge(t, oldPath)
	if v, _ := storage.SchemaVersion(s.db); v != edgeSchema.Version() {
		t.Fatalf("version %d after open, want %d", v, edgeSchema.Version())
	}
	if got, err := s.Identity(); err != nil || got.InstanceID != "" || got.ClientID != "site-1" {
		t.Fatalf("a version-3 identity: %+v, %v", got, err)
	}
	got, err := s.InitIdentity("site-1", t0.Add(time.Hour))
	if err != nil || len(got.InstanceID) != 26 || !got.CreatedAt.Equal(t0) {
		t.Fatalf("InitIdentity of a version-3 file: %+v, %v", got, err)
	}
	storetest.CloseT(t, s)
	if _, err := storage.Open(oldPath, v3, storage.Options{}); !errors.Is(err, storage.ErrSchemaTooNew) {
		t.Fatalf("the version-3 code opening a current file: %v, want ErrSchemaTooNew", err)
	}
}
