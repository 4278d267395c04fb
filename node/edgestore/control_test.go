package edgestore

import (
	"errors"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// TestEdgeControl: SCAFFOLD's c_i is committed with the update that
// changes it, survives a reopen, is left as it was by a commit without one
// and by a refused commit, and a new run starts without it (zero).
func TestEdgeControl(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	if _, err := s.StartRun("A"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Residual(ResidualControl); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("fresh: %v, want ErrNotFound", err)
	}
	if err := s.Commit(Commit{Round: 1, Control: []float64{0.5, -1}, Msg: []byte("u1")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(Commit{Round: 1, Control: []float64{9, 9}, Msg: []byte("again")}); !errors.Is(err, storage.ErrAlreadyApplied) {
		t.Fatalf("second commit of round 1: %v", err)
	}
	if err := s.Commit(Commit{Round: 2, Msg: []byte("u2")}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openEdge(t, path)
	got, err := s.Residual(ResidualControl)
	if err != nil || !slices.Equal(got, []float64{0.5, -1}) {
		t.Fatalf("after reopen: %v, %v; want [0.5 -1]", got, err)
	}
	if _, err := s.StartRun("B"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Residual(ResidualControl); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("after a new run: %v, want ErrNotFound (c_i = 0)", err)
	}
	s.Close()
}

// TestEdgeControlUndo: a rejected SCAFFOLD update puts c_i back as it was
// before its round, in the transaction that drops its outbox entry (and
// across a reopen in between); an accepted one keeps c_i and drops the
// undo, so a later rejection receipt of the same round changes nothing; a
// rejection of a round the undo is not of leaves c_i alone.
func TestEdgeControlUndo(t *testing.T) {
	before, after := []float64{0.5, -1}, []float64{0.75, -2}
	tests := []struct {
		name     string
		receipts []func(s *EdgeStore) (bool, error)
		want     []float64
	}{
		{"rejected", []func(s *EdgeStore) (bool, error){func(s *EdgeStore) (bool, error) { return s.AckRejected(2) }}, before},
		{"accepted", []func(s *EdgeStore) (bool, error){func(s *EdgeStore) (bool, error) { return s.Ack(2) }}, after},
		{"accepted then rejected", []func(s *EdgeStore) (bool, error){
			func(s *EdgeStore) (bool, error) { return s.Ack(2) },
			func(s *EdgeStore) (bool, error) { return s.AckRejected(2) }}, after},
		{"other round rejected", []func(s *EdgeStore) (bool, error){func(s *EdgeStore) (bool, error) { return s.AckRejected(1) }}, after},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := storetest.TempPath(t, "edge.db")
			s := openEdge(t, path)
			if _, err := s.StartRun("A"); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(Commit{Round: 1, Control: before, ControlUndo: []float64{0, 0}, Msg: []byte("u1")}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Ack(1); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(Commit{Round: 2, Control: after, ControlUndo: before, Msg: []byte("u2")}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			s = openEdge(t, path) // a reboot between the commit and the receipt
			defer s.Close()
			for _, r := range tc.receipts {
				if _, err := r(s); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Residual(ResidualControl)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("c_i %v, %v; want %v", got, err, tc.want)
			}
			if err := s.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
