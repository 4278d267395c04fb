package edgestore

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/edgefl/edgefl/node/storage"
)

// TestSecAggEdgeRecord: the record is committed with the round's first
// message, replaced with the next message's outbox entry in one
// transaction, only for the applied round; AckIf removes the entry only
// when it is the one answered; a new run drops the record.
func TestSecAggEdgeRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.db")
	s := openEdge(t, path)
	if _, err := s.StartRun("R1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SecAgg(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("fresh record: %v", err)
	}
	if err := s.Commit(Commit{Round: 2, Msg: []byte("advertise"), SecAgg: []byte("rec0")}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.SecAgg(); err != nil || string(rec) != "rec0" {
		t.Fatalf("record %q %v", rec, err)
	}
	if err := s.SetSecAgg(1, []byte("old"), []byte("x")); !errors.Is(err, storage.ErrStale) {
		t.Fatalf("a record of another round: %v", err)
	}
	if err := s.SetSecAgg(2, []byte("rec1"), []byte("share keys")); err != nil {
		t.Fatal(err)
	}
	out, err := s.Outbox()
	if err != nil || len(out) != 1 || string(out[0].Msg) != "share keys" {
		t.Fatalf("outbox %+v %v", out, err)
	}
	if had, err := s.AckIf(2, func(m []byte) bool { return bytes.Equal(m, []byte("advertise")) }); had || err != nil {
		t.Fatalf("a receipt of the earlier message removed the entry: %v %v", had, err)
	}
	if had, err := s.AckIf(2, func(m []byte) bool { return bytes.Equal(m, []byte("share keys")) }); !had || err != nil {
		t.Fatalf("the matching receipt: %v %v", had, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openEdge(t, path)
	if rec, err := s.SecAgg(); err != nil || string(rec) != "rec1" {
		t.Fatalf("record after reopen %q %v", rec, err)
	}
	if _, err := s.NoiseKey(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a noise key before one was drawn: %v", err)
	}
	k1 := [32]byte{1, 2, 3}
	if err := s.InitNoiseKey(k1); err != nil {
		t.Fatal(err)
	}
	if err := s.InitNoiseKey([32]byte{9}); err != nil {
		t.Fatal(err)
	}
	if k2, err := s.NoiseKey(); err != nil || k2 != k1 {
		t.Fatalf("the noise key is not kept: %v", err)
	}
	if _, err := s.StartRun("R2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SecAgg(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a new run kept the old session's record: %v", err)
	}
	if _, err := s.NoiseKey(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a new run kept the old run's noise key: %v", err)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}
