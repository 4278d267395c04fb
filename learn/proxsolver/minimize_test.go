package proxsolver

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
)

func TestMinimizeLogRegToMachinePrecision(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		rng := rand.New(rand.NewPCG(seed, 3))
		d := logregData(rng, 3000, 60, 10)
		m := model.NewLogReg(60, 10, 0.01)
		s := &spy{Model: m}
		w, rep, err := Minimize(context.Background(), s, d, nil, 1e-10, 1000)
		if err != nil {
			t.Fatalf("seed %d: %v (report %+v)", seed, err, rep)
		}
		_, gnorm := gradH(m, d, w, w, 0)
		if !(gnorm <= 1e-10) || rep.Stop != StopConverged {
			t.Errorf("seed %d: ||grad f|| = %.3g (stop %q), want <= 1e-10", seed, gnorm, rep.Stop)
		}
		if math.Abs(gnorm-rep.GradNorm) > 1e-15 {
			t.Errorf("seed %d: reported ||grad f|| %.3g, recomputed %.3g", seed, rep.GradNorm, gnorm)
		}
		checkCounts(t, "minimize", s, rep)
		t.Logf("seed %d: ||grad f|| = %.3g after %d evaluations, loss %.12g", seed, gnorm, rep.GradEvals, rep.Loss)
	}
}

func TestMinimizeLeastSquares(t *testing.T) {
	pr := newLSProblem(t, 21, 300, 10, 0.05, 0)
	want := exactProx(t, pr.d, pr.l2, 0, make([]float64, 11))
	w, rep, err := Minimize(context.Background(), pr.m, pr.d, pr.a, 1e-12, 500)
	if err != nil {
		t.Fatal(err)
	}
	if got := dist(w, want); got > 1e-10 {
		t.Errorf("||w - closed form|| = %.3g after %d evaluations", got, rep.GradEvals)
	}
	// Starting at the optimum: one evaluation.
	_, rep, err = Minimize(context.Background(), pr.m, pr.d, w, 1e-12, 500)
	if err != nil || rep.GradEvals != 1 || rep.Stop != StopConverged {
		t.Errorf("from the optimum: %d evaluations, stop %q, error %v", rep.GradEvals, rep.Stop, err)
	}
}

func TestMinimizeNotConverged(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	d := logregData(rng, 500, 20, 5)
	m := model.NewLogReg(20, 5, 0.01)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		name     string
		ctx      context.Context
		maxEvals int
		stop     string
	}{
		{"evaluation budget", context.Background(), 6, StopGradEvals},
		{"canceled", ctx, 0, StopCanceled},
	} {
		s := &spy{Model: m}
		w, rep, err := Minimize(tt.ctx, s, d, nil, 1e-10, tt.maxEvals)
		if !errors.Is(err, ErrNotConverged) || (tt.ctx.Err() != nil && !errors.Is(err, context.Canceled)) {
			t.Errorf("%s: error %v, want ErrNotConverged (and the context's error)", tt.name, err)
		}
		if w == nil || rep.Stop != tt.stop || (tt.maxEvals > 0 && rep.GradEvals > tt.maxEvals) {
			t.Errorf("%s: stop %q after %d evaluations, want %q within %d and a point", tt.name, rep.Stop, rep.GradEvals, tt.stop, tt.maxEvals)
		}
		if _, g := gradH(m, d, w, w, 0); math.Abs(g-rep.GradNorm) > 1e-15 {
			t.Errorf("%s: reported ||grad f|| %g, recomputed %g", tt.name, rep.GradNorm, g)
		}
		checkCounts(t, tt.name, s, rep)
	}
}

func TestMinimizeBadArgs(t *testing.T) {
	pr := budgetProblem(t)
	for _, tt := range []struct {
		name     string
		ctx      context.Context
		m        model.Model
		d        model.Data
		start    []float64
		tol      float64
		maxEvals int
	}{
		{"nil context", nil, pr.m, pr.d, nil, 1e-10, 0},
		{"zero tolerance", context.Background(), pr.m, pr.d, nil, 0, 0},
		{"negative tolerance", context.Background(), pr.m, pr.d, nil, -1, 0},
		{"NaN tolerance", context.Background(), pr.m, pr.d, nil, math.NaN(), 0},
		{"infinite tolerance", context.Background(), pr.m, pr.d, nil, math.Inf(1), 0},
		{"negative max evaluations", context.Background(), pr.m, pr.d, nil, 1e-10, -1},
		{"nil model", context.Background(), nil, pr.d, nil, 1e-10, 0},
		{"short start", context.Background(), pr.m, pr.d, []float64{1}, 1e-10, 0},
		{"no data", context.Background(), pr.m, model.Data{D: 5}, nil, 1e-10, 0},
	} {
		w, _, err := Minimize(tt.ctx, tt.m, tt.d, tt.start, tt.tol, tt.maxEvals)
		if !errors.Is(err, ErrConfig) || w != nil {
			t.Errorf("%s: error %v, want ErrConfig and no point", tt.name, err)
		}
	}
}
