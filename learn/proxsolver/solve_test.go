package proxsolver

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
)

// lsProblem is a least-squares client with l2 > 0, a random anchor and the
// exact prox of the anchor.
type lsProblem struct {
	d      model.Data
	m      *model.Linear
	l2, mu float64
	a      []float64
	exact  []float64
}

func newLSProblem(t *testing.T, seed uint64, n, dim int, l2, mu float64) lsProblem {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	d := linearData(rng, n, dim, 0.5)
	a := randVec(rng, dim+1, 1)
	return lsProblem{d: d, m: model.NewLinear(dim, l2), l2: l2, mu: mu, a: a, exact: exactProx(t, d, l2, mu, a)}
}

func TestSolveReachesExactProx(t *testing.T) {
	pr := newLSProblem(t, 1, 400, 12, 0.05, 0.3)
	lipschitz := smoothness(t, pr.d, pr.l2, pr.mu)
	start := dist(pr.a, pr.exact)
	tests := []struct {
		name string
		cfg  Config
		b    Budget
		tol  float64 // on ||w - exact||
	}{
		{"lbfgs", Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-10}, Budget{MaxGradEvals: 200}, 1e-8},
		{"gradient descent (sgd, batch = n)", Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-8, LR: 1 / lipschitz, Batch: pr.d.N}, Budget{MaxEpochs: 5000}, 1e-6},
		{"mini-batch sgd", Config{Solver: SGD, Mu: pr.mu, LR: 0.01, Batch: 10}, Budget{MaxEpochs: 40}, 0.05 * start},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 7))
			w, rep, err := Solve(context.Background(), pr.m, pr.d, pr.a, nil, tt.cfg, tt.b, rng)
			if err != nil {
				t.Fatal(err)
			}
			if got := dist(w, pr.exact); !(got <= tt.tol) {
				t.Errorf("||w - exact prox|| = %.3g, want <= %.3g (anchor at %.3g); report %+v", got, tt.tol, start, rep)
			}
			if tt.cfg.Gamma > 0 && rep.Stop != StopGamma {
				t.Errorf("stop = %q, want %q", rep.Stop, StopGamma)
			}
			t.Logf("%s: ||w - exact|| = %.3g, gamma %.3g, %d grad evals, %.1f epochs, stop %s", tt.name, dist(w, pr.exact), rep.Gamma, rep.GradEvals, rep.Epochs, rep.Stop)
		})
	}
}

// TestReportIsHonest recomputes everything the report claims about the
// returned point with a fresh model.
func TestReportIsHonest(t *testing.T) {
	pr := newLSProblem(t, 2, 300, 8, 0.1, 0.5)
	// Constant-step mini-batch SGD stalls at its noise floor near gamma 0.01
	// here; L-BFGS goes on.
	reach := map[string][]float64{SGD: {0.5, 0.1, 0.01}, LBFGS: {0.5, 0.1, 0.01, 1e-3, 1e-6}}
	for _, solver := range []string{SGD, LBFGS} {
		for _, gamma := range reach[solver] {
			cfg := Config{Solver: solver, Mu: pr.mu, Gamma: gamma, LR: 0.05, Batch: 16}
			w, rep, err := Solve(context.Background(), pr.m, pr.d, pr.a, nil, cfg, Budget{MaxEpochs: 500}, rand.New(rand.NewPCG(3, 4)))
			if err != nil {
				t.Fatalf("%s gamma %g: %v", solver, gamma, err)
			}
			ga, g0 := gradH(pr.m, pr.d, pr.a, pr.a, pr.mu)
			_, gw := gradH(pr.m, pr.d, w, pr.a, pr.mu)
			fresh := pr.m.Clone()
			checks := []struct {
				what      string
				got, want float64
			}{
				{"gamma", rep.Gamma, gw / g0},
				{"grad norm", rep.GradNorm, gw},
				{"loss", rep.Loss, fresh.LossGrad(w, pr.d, nil)},
				{"anchor loss", rep.AnchorLoss, fresh.LossGrad(pr.a, pr.d, nil)},
				{"anchor grad distance", dist(rep.AnchorGrad, ga), 0},
			}
			for _, c := range checks {
				if math.Abs(c.got-c.want) > 1e-12*(1+math.Abs(c.want)) {
					t.Errorf("%s gamma %g: reported %s %v, recomputed %v", solver, gamma, c.what, c.got, c.want)
				}
			}
			if rep.Stop != StopGamma {
				t.Errorf("%s gamma %g: stop %q, want %q", solver, gamma, rep.Stop, StopGamma)
			}
			if gw > gamma*g0 {
				t.Errorf("%s: claims gamma %g reached, but ||grad h(w)|| = %g > %g ||grad f(a)|| = %g", solver, gamma, gw, gamma, gamma*g0)
			}
			n := int64(pr.d.N)
			if solver == LBFGS && rep.SampleGrads != int64(rep.GradEvals)*n {
				t.Errorf("lbfgs: %d sample gradients for %d full evaluations of %d samples", rep.SampleGrads, rep.GradEvals, n)
			}
			if trained := int64(math.Round(rep.Epochs * float64(n))); solver == SGD && (rep.SampleGrads < trained+2*n || rep.SampleGrads > int64(rep.GradEvals)*n) {
				t.Errorf("sgd: %d sample gradients for %.2f epochs and %d evaluations of <= %d samples", rep.SampleGrads, rep.Epochs, rep.GradEvals, n)
			}
		}
	}
}

func TestZeroAnchorGradientReturnsAtOnce(t *testing.T) {
	// y = 0 and a = 0: grad f(0) = A'(A 0 - 0)/n + l2 0 = 0 exactly.
	d := model.Data{N: 50, D: 3, X: randVec(rand.New(rand.NewPCG(1, 1)), 150, 1), Y: make([]float64, 50)}
	m := model.NewLinear(3, 0.1)
	a := make([]float64, 4)
	start := []float64{1, 2, 3, 4}
	for _, solver := range []string{SGD, LBFGS} {
		w, rep, err := Solve(context.Background(), m, d, a, start, Config{Solver: solver, Mu: 1, Gamma: 0.1, LR: 0.1, Batch: 5}, Budget{MaxEpochs: 10}, rand.New(rand.NewPCG(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		if dist(w, a) != 0 || rep.Gamma != 0 || rep.GradNorm != 0 || rep.Stop != StopConverged || rep.GradEvals != 1 || rep.Epochs != 0 {
			t.Errorf("%s: w = %v, report %+v; want the anchor, gamma 0, stop converged, 1 evaluation", solver, w, rep)
		}
	}
}

func TestGammaOneIsTheAnchor(t *testing.T) {
	pr := newLSProblem(t, 5, 100, 4, 0.1, 0.5)
	for _, solver := range []string{SGD, LBFGS} {
		w, rep, err := Solve(context.Background(), pr.m, pr.d, pr.a, nil, Config{Solver: solver, Mu: pr.mu, Gamma: 1, LR: 0.1, Batch: 10}, Budget{MaxEpochs: 10}, rand.New(rand.NewPCG(1, 1)))
		if err != nil || dist(w, pr.a) != 0 || rep.Stop != StopGamma || rep.Gamma != 1 || rep.GradEvals != 1 {
			t.Errorf("%s gamma 1: error %v, stop %q, gamma %v, %d evaluations; want the anchor at once", solver, err, rep.Stop, rep.Gamma, rep.GradEvals)
		}
	}
}

// TestLBFGSStopsByItself: a target below floating-point precision and no
// budget; L-BFGS must stop on its own, at the precision floor.
func TestLBFGSStopsByItself(t *testing.T) {
	pr := newLSProblem(t, 6, 300, 8, 0.1, 0.5)
	w, rep, err := Solve(context.Background(), pr.m, pr.d, pr.a, nil, Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-300}, Budget{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if (rep.Stop != StopStalled && rep.Stop != StopConverged) || dist(w, pr.exact) > 1e-12 {
		t.Errorf("stop %q after %d evaluations, ||w - exact|| = %.3g", rep.Stop, rep.GradEvals, dist(w, pr.exact))
	}
	t.Logf("stop %q after %d evaluations at ||grad h|| = %.3g", rep.Stop, rep.GradEvals, rep.GradNorm)
	_, rep, err = Minimize(context.Background(), pr.m, pr.d, nil, 1e-300, 0)
	if !errors.Is(err, ErrNotConverged) || rep.Stop != StopStalled {
		t.Errorf("minimize to 1e-300: stop %q, error %v", rep.Stop, err)
	}
}

func TestWarmStart(t *testing.T) {
	pr := newLSProblem(t, 3, 200, 6, 0.1, 0.5)
	near := append([]float64(nil), pr.exact...)
	near[0] += 1e-3
	for _, tt := range []struct {
		name      string
		cfg       Config
		start     []float64
		maxEvals  int // expected at most
		wantStop  string
		wantExact bool
	}{
		// The exact solution is gamma-inexact for every gamma: measured once and returned.
		{"sgd at the solution", Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-6, LR: 0.1, Batch: 10}, pr.exact, 2, StopGamma, true},
		{"lbfgs at the solution", Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-6}, pr.exact, 2, StopGamma, true},
		{"lbfgs near the solution", Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-9}, near, 20, StopGamma, false},
	} {
		w, rep, err := Solve(context.Background(), pr.m, pr.d, pr.a, tt.start, tt.cfg, Budget{MaxEpochs: 100}, rand.New(rand.NewPCG(1, 1)))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if rep.Stop != tt.wantStop || rep.GradEvals > tt.maxEvals {
			t.Errorf("%s: stop %q after %d evaluations, want %q within %d", tt.name, rep.Stop, rep.GradEvals, tt.wantStop, tt.maxEvals)
		}
		if tt.wantExact && dist(w, tt.start) != 0 {
			t.Errorf("%s: moved from a gamma-inexact start", tt.name)
		}
		if tt.start[0] != pr.exact[0] && tt.start[0] != near[0] {
			t.Errorf("%s: start modified", tt.name)
		}
	}
}

func TestWarmStartOutOfBudget(t *testing.T) {
	pr := newLSProblem(t, 3, 200, 6, 0.1, 0.5)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, solver := range []string{SGD, LBFGS} {
		for _, tt := range []struct {
			ctx  context.Context
			b    Budget
			stop string
		}{
			{context.Background(), Budget{MaxGradEvals: 1}, StopGradEvals},
			{ctx, Budget{MaxEpochs: 5}, StopCanceled},
		} {
			cfg := Config{Solver: solver, Mu: pr.mu, Gamma: 0.1, LR: 0.1, Batch: 10}
			w, rep, err := Solve(tt.ctx, pr.m, pr.d, pr.a, pr.exact, cfg, tt.b, rand.New(rand.NewPCG(1, 1)))
			if err != nil || dist(w, pr.a) != 0 || rep.GradEvals != 1 || rep.Stop != tt.stop || rep.Gamma != 1 {
				t.Errorf("%s %s: error %v, %d evaluations, stop %q, gamma %v; want the anchor (gamma 1) after its evaluation only", solver, tt.stop, err, rep.GradEvals, rep.Stop, rep.Gamma)
			}
		}
	}
}

func TestInputsNotModified(t *testing.T) {
	pr := newLSProblem(t, 4, 100, 4, 0.1, 0.5)
	a := append([]float64(nil), pr.a...)
	start := randVec(rand.New(rand.NewPCG(5, 5)), 5, 1)
	start0 := append([]float64(nil), start...)
	x0 := append([]float64(nil), pr.d.X...)
	for _, solver := range []string{SGD, LBFGS} {
		w, _, err := Solve(context.Background(), pr.m, pr.d, a, start, Config{Solver: solver, Mu: 0.5, Gamma: 0.01, LR: 0.1, Batch: 7}, Budget{MaxEpochs: 20}, rand.New(rand.NewPCG(1, 1)))
		if err != nil {
			t.Fatal(err)
		}
		if dist(a, pr.a) != 0 || dist(start, start0) != 0 || dist(x0, pr.d.X) != 0 {
			t.Fatalf("%s modified its inputs", solver)
		}
		w[0] = 1e9 // the result must not alias the inputs
		if a[0] == 1e9 || start[0] == 1e9 {
			t.Fatalf("%s returned an alias of its inputs", solver)
		}
	}
}
