package edgestore

import (
	"errors"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// TestSumModeEdge: FedSplit's sum mode at the edge (docs/privacy.md,
// "FedSplit"): the pending contribution is committed with the outbox
// entry, the record advances only on AckSum, once (a duplicate receipt,
// also after a reopen, changes nothing), a rejection drops the pending
// contribution and keeps the record, and a new run or the run's end clears
// them.
func TestSumModeEdge(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	v := []float64{1, 2, 3}
	if _, _, err := s.Contribution(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a fresh file has a record: %v", err)
	}
	if err := s.Commit(Commit{Round: 1, Z: v, Msg: []byte("u1"), Pending: &SumPending{Join: true, V: v}}); err != nil {
		t.Fatal(err)
	}
	if p, ok, err := s.Pending(1); err != nil || !ok || !p.Join || !slices.Equal(p.V, v) {
		t.Fatalf("pending of round 1: %+v, %v, %v", p, ok, err)
	}
	if _, err := s.Ack(1); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("Ack of a sum-mode update: %v, want ErrInvalid", err)
	}
	if _, err := s.AckSum(1, 7, v); !errors.Is(err, storage.ErrStale) {
		t.Fatalf("AckSum against another record: %v, want ErrStale", err)
	}
	// kill -9 here: the file holds the pending entry; reopen and ack.
	storetest.CloseT(t, s)
	s = openEdge(t, path)
	if had, err := s.AckSum(1, 0, v); err != nil || !had {
		t.Fatalf("AckSum: %v, %v", had, err)
	}
	if had, err := s.AckSum(1, 0, []float64{9, 9, 9}); err != nil || had {
		t.Fatalf("a duplicate receipt: %v, %v", had, err)
	}
	if r, c, err := s.Contribution(); err != nil || r != 1 || !slices.Equal(c, v) {
		t.Fatalf("record: %d %v %v", r, c, err)
	}
	// Round 2 rejected: the record stays.
	if err := s.Commit(Commit{Round: 2, Z: v, Msg: []byte("u2"), Pending: &SumPending{V: []float64{1, 1, 1}}}); err != nil {
		t.Fatal(err)
	}
	if had, err := s.AckRejected(2); err != nil || !had {
		t.Fatalf("AckRejected: %v, %v", had, err)
	}
	if _, ok, _ := s.Pending(2); ok {
		t.Fatal("a rejected update's pending contribution stayed")
	}
	if r, c, err := s.Contribution(); err != nil || r != 1 || !slices.Equal(c, v) {
		t.Fatalf("record after a rejection: %d %v %v", r, c, err)
	}
	// Round 3 confirmed.
	if err := s.Commit(Commit{Round: 3, Z: v, Msg: []byte("u3"), Pending: &SumPending{V: []float64{1, 1, 1}}}); err != nil {
		t.Fatal(err)
	}
	if had, err := s.AckSum(3, 1, []float64{2, 3, 4}); err != nil || !had {
		t.Fatalf("AckSum 3: %v, %v", had, err)
	}
	if r, c, _ := s.Contribution(); r != 3 || !slices.Equal(c, []float64{2, 3, 4}) {
		t.Fatalf("record: %d %v", r, c)
	}
	// The run's end, then a new run.
	if err := s.Commit(Commit{Round: 4, Z: v, Msg: []byte("u4"), Pending: &SumPending{V: v}}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetFinal(Final{RunID: "r", Round: 4, Digest: "d", Bundle: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Pending(4); ok {
		t.Fatal("the run's end left a pending contribution")
	}
	if _, err := s.StartRun("r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartRun("r2"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Contribution(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a new run kept the record: %v", err)
	}
	storetest.CloseT(t, s)
	s = openEdge(t, path) // the invariants hold on open
	storetest.CloseT(t, s)
}
