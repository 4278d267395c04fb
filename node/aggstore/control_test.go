package aggstore

import (
	"bytes"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// TestRoundControl: SCAFFOLD's c is written with the round it opens (one
// transaction with the checkpoint) and read back after a reopen; a round
// without one has none.
func TestRoundControl(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	t0 := time.Unix(1700000000, 0)
	if err := s.OpenRound(Round{Number: 1, OpenedAt: t0}, []float64{0, 0}); err != nil {
		t.Fatal(err)
	}
	c := storage.EncodeFloats([]float64{0.25, -3})
	if err := s.OpenRound(Round{Number: 2, OpenedAt: t0.Add(time.Second), Control: c}, []float64{1, 1}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openAgg(t, path)
	defer s.Close()
	cur, err := s.CurrentRound()
	if err != nil || !bytes.Equal(cur.Control, c) {
		t.Fatalf("current round's control = %x, %v; want %x", cur.Control, err, c)
	}
	r1, err := s.Round(1)
	if err != nil || r1.Control != nil {
		t.Fatalf("round 1's control = %x, %v; want none", r1.Control, err)
	}
}
