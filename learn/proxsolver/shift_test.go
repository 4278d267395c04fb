package proxsolver

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
)

// TestShiftStep: with a shift s, SGD's step is w <- w - lr (g(w) + s) (the
// SCAFFOLD correction), and Report.Steps counts the mini-batch steps taken,
// a partial epoch's included.
func TestShiftStep(t *testing.T) {
	d := linearData(rand.New(rand.NewPCG(1, 2)), 10, 3, 0.1)
	m := model.NewLinear(3, 0.1)
	a := []float64{0.1, -0.2, 0.3, 0.05}
	shift := []float64{0.5, -1, 0.25, 2}
	const lr = 0.05
	for _, tc := range []struct {
		name      string
		batch     int
		epochs    int
		wantSteps int
	}{
		{"full batch, one epoch", 10, 1, 1},
		{"batches of 4, two epochs", 4, 2, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Solver: SGD, LR: lr, Batch: tc.batch, Shift: shift}
			w, rep, err := Solve(context.Background(), m, d, a, nil, cfg, Budget{MaxEpochs: tc.epochs}, rand.New(rand.NewPCG(3, 4)))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Steps != tc.wantSteps {
				t.Fatalf("Steps = %d, want %d", rep.Steps, tc.wantSteps)
			}
			// The same run by hand, without the shift, shifted afterwards,
			// is only comparable for one full-batch step.
			if tc.batch == 10 {
				g := make([]float64, 4)
				m.LossGrad(a, d, g)
				for i := range g {
					if want := a[i] - lr*(g[i]+shift[i]); w[i] != want {
						t.Fatalf("w[%d] = %v, want %v", i, w[i], want)
					}
				}
			}
			plain, _, err := Solve(context.Background(), m, d, a, nil, Config{Solver: SGD, LR: lr, Batch: tc.batch}, Budget{MaxEpochs: tc.epochs}, rand.New(rand.NewPCG(3, 4)))
			if err != nil {
				t.Fatal(err)
			}
			if equal(plain, w) {
				t.Fatal("the shift changed nothing")
			}
		})
	}
	_, _, err := Solve(context.Background(), m, d, a, nil, Config{Solver: LBFGS, Shift: shift}, Budget{MaxEpochs: 1}, nil)
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("lbfgs with a shift: %v, want ErrConfig", err)
	}
	_, _, err = Solve(context.Background(), m, d, a, nil, Config{Solver: SGD, LR: lr, Batch: 1, Shift: shift[:2]}, Budget{MaxEpochs: 1}, rand.New(rand.NewPCG(3, 4)))
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("a shift of the wrong length: %v, want ErrConfig", err)
	}
}
