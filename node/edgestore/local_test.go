package edgestore

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// TestEdgeLocalModel: the contrastive objectives' previous local model is
// written with the round's commit, survives a reopen, stays when a commit
// leaves it out, is never written by a refused commit (a NaN, a round
// already applied) and is cleared by a new run.
func TestEdgeLocalModel(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	if _, err := s.Residual(ResidualLocal); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("local model on a new store = %v, want ErrNotFound", err)
	}
	if _, err := s.StartRun("run-a"); err != nil {
		t.Fatal(err)
	}
	w3 := []float64{0.5, -1, 2}
	if err := s.Commit(Commit{Round: 3, Local: w3, Msg: []byte("u3")}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openEdge(t, path)
	if got, err := s.Residual(ResidualLocal); err != nil || !slices.Equal(got, w3) {
		t.Fatalf("local model after reopen = %v %v, want %v", got, err, w3)
	}
	steps := []struct {
		name string
		c    Commit
		want error
	}{
		{"without a local model", Commit{Round: 4, Msg: []byte("u4")}, nil},
		{"NaN", Commit{Round: 5, Local: []float64{math.NaN(), 0, 0}, Msg: []byte("u5")}, storage.ErrInvalid},
		{"already applied", Commit{Round: 4, Local: []float64{9, 9, 9}, Msg: []byte("u4'")}, storage.ErrAlreadyApplied},
	}
	for _, st := range steps {
		if err := s.Commit(st.c); !errors.Is(err, st.want) && !(st.want == nil && err == nil) {
			t.Fatalf("%s: Commit = %v, want %v", st.name, err, st.want)
		}
		if got, err := s.Residual(ResidualLocal); err != nil || !slices.Equal(got, w3) {
			t.Fatalf("%s: local model = %v %v, want %v kept", st.name, got, err, w3)
		}
	}
	if err := s.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if rs, err := s.StartRun("run-b"); err != nil || !rs.Reset {
		t.Fatalf("StartRun(run-b) = %+v %v, want a reset", rs, err)
	}
	if _, err := s.Residual(ResidualLocal); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("local model after a new run = %v, want ErrNotFound", err)
	}
}
