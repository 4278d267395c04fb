package round

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/split"
)

// Work is one site's work in one round, as the round's parameters and the
// site determine it: the solver's configuration and, for the FedSplit
// family, the steps. Prepare builds it; Solve carries it out.
type Work struct {
	Algorithm string
	Solver    proxsolver.Config
	// Split and StepJ are FedSplit's: the step and relaxation as
	// announced (an unset relaxation is 1) and this site's prox step s_j.
	Split split.Params
	StepJ float64
}

// Prepare checks the round's parameters p of algorithm algo (Validate)
// and resolves them for a site holding samples training rows: the solver
// ("" is sgd, lbfgs for the FedSplit family), fedavg's mu of 0, SGD's
// default learning rate and full batch, and FedSplit's sample-weighted
// step s_j = s m n_j / n with pop (without it every site's step is s), so
// that the plain mean of the z_j has the minimiser of the sample-weighted
// pooled objective as its fixed point. device holds a site's overrides of
// the solver, the learning rate and the batch (zeros: as announced).
func Prepare(algo string, p Params, pop Population, device Params, samples int) (Work, error) {
	if err := p.Validate(algo); err != nil {
		return Work{}, err
	}
	p = p.Effective(algo)
	split_ := IsSplit(algo)
	cfg := proxsolver.Config{Solver: p.Solver, Mu: p.Mu, Gamma: p.Gamma, LR: p.LR, Batch: p.Batch}
	if cfg.Solver == "" {
		cfg.Solver = proxsolver.SGD
		if split_ {
			cfg.Solver = proxsolver.LBFGS
		}
	}
	if device.Solver != "" {
		cfg.Solver = device.Solver
	}
	if cfg.Solver != proxsolver.SGD && cfg.Solver != proxsolver.LBFGS {
		return Work{}, fmt.Errorf("solver %q: want %s or %s", cfg.Solver, proxsolver.SGD, proxsolver.LBFGS)
	}
	if device.LR > 0 {
		cfg.LR = device.LR
	}
	if device.Batch > 0 {
		cfg.Batch = device.Batch
	}
	if cfg.Solver == proxsolver.SGD {
		if cfg.LR == 0 {
			cfg.LR = DefaultLR
		}
		if cfg.Batch == 0 { // 0 means full batch
			cfg.Batch = max(samples, 1)
		}
	}
	w := Work{Algorithm: algo, Solver: cfg}
	if split_ {
		w.Split = split.Params{Step: p.Step, Relax: p.Relax}
		if w.Split.Relax == 0 {
			w.Split.Relax = 1 // unset: Peaceman-Rachford
		}
		if err := w.Split.Validate(); err != nil {
			return Work{}, err
		}
		w.StepJ = StepOf(p.Step, pop, samples)
		w.Solver.Mu = 1 / w.StepJ
		if math.IsInf(w.Solver.Mu, 0) || !(w.StepJ > 0) {
			return Work{}, fmt.Errorf("fedsplit step %v for this site is out of range (1/step overflows)", w.StepJ)
		}
	}
	if err := w.Solver.Validate(); err != nil {
		return Work{}, err
	}
	return w, nil
}

// StepOf is a FedSplit site's prox step: s m n_j / n for a site of
// samples rows among pop, or s itself without the population (under DP
// the total is not announced).
func StepOf(s float64, pop Population, samples int) float64 {
	if pop.Clients > 0 && pop.TotalSamples > 0 && samples > 0 {
		return split.ClientStepSize(s, int(min(pop.Clients, math.MaxInt32)), float64(samples)/float64(pop.TotalSamples))
	}
	return s
}

// Result is a site's work of one round.
type Result struct {
	// Vec is what the site sends: its local model w (FedProx family) or
	// its new z_j (FedSplit family).
	Vec []float64
	// Report is the solver's. For the FedSplit family its anchor loss
	// (and gradient, when asked) are at the received global model x, as
	// the wire report defines them, not at the prox's anchor 2x - z.
	Report proxsolver.Report
	// Diverged is the solver's divergence (proxsolver.ErrDiverged): Vec is
	// then the received model (FedProx family) or z_j unchanged
	// (FedSplit): no step is taken, and the site says so (stop reason
	// ERROR).
	Diverged error
}

// Solve runs the site's work on data from the global model x: the local
// solve anchored at x, or FedSplit's client step from the site's z (its
// z_j; the caller keeps it). b bounds the work (the caller's clock and
// deadline); rng is the site's solver stream of the round; anchorGrad asks
// for the gradient at x. An error other than divergence (a canceled
// context, a configuration the solver refuses) leaves no result.
func (w Work) Solve(ctx context.Context, m model.Model, data model.Data, x, z []float64, b proxsolver.Budget, rng *rand.Rand, anchorGrad bool) (Result, error) {
	if !IsSplit(w.Algorithm) {
		v, rep, err := proxsolver.Solve(ctx, m, data, x, nil, w.Solver, b, rng)
		if errors.Is(err, proxsolver.ErrDiverged) {
			return Result{Vec: slices.Clone(x), Report: rep, Diverged: err}, nil
		}
		if err != nil {
			return Result{Report: rep}, fmt.Errorf("local solve: %w", err)
		}
		return Result{Vec: v, Report: rep}, nil
	}
	// FedSplit's client step (split.ClientStep's arithmetic, without its
	// prox callback, so that control never climbs back from learn/ into
	// this package): v = 2x - z, zHalf = prox(v), zNew = z + 2 alpha
	// (zHalf - x).
	if len(x) != len(z) {
		return Result{}, fmt.Errorf("FedSplit client step: %w: x has %d, z has %d", split.ErrDim, len(x), len(z))
	}
	if err := w.Split.Validate(); err != nil {
		return Result{}, fmt.Errorf("FedSplit client step: %w", err)
	}
	zHalf, rep, err := proxsolver.Solve(ctx, m, data, split.Reflect(nil, x, z), x, w.Solver, b, rng)
	var diverged error
	if errors.Is(err, proxsolver.ErrDiverged) {
		diverged, err = err, nil
	}
	if err != nil {
		return Result{Report: rep}, fmt.Errorf("FedSplit client step: fedsplit prox update: %w", err)
	}
	if len(zHalf) != len(x) {
		return Result{Report: rep}, fmt.Errorf("FedSplit client step: %w: prox returned %d, want %d", split.ErrDim, len(zHalf), len(x))
	}
	zNew := split.Move(nil, z, zHalf, x, w.Split.Relax)
	// The prox's anchor is v = 2x - z: the loss (and the gradient) are
	// reported at x instead. One full evaluation outside the budget.
	var g []float64
	if anchorGrad {
		g = make([]float64, len(x))
	}
	rep.AnchorLoss, rep.AnchorGrad = m.LossGrad(x, data, g), g
	if diverged != nil {
		return Result{Vec: z, Report: rep, Diverged: diverged}, nil
	}
	return Result{Vec: zNew, Report: rep}, nil
}
