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
