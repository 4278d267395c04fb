// Package proxsolver solves the FedProx local subproblem
//
//	h(w; a) = f(w) + (mu/2)||w - a||^2
//
// gamma-inexactly under a work budget, where f is a model's mean loss (plus
// its L2 term) on one client's data and a is the anchor (the global model for
// FedProx, the reflected point 2x - z for FedSplit). A point w is
// gamma-inexact when ||grad h(w; a)|| <= gamma ||grad f(a)|| (note that
// grad h(a; a) = grad f(a)).
//
// Two solvers: mini-batch SGD (SGD), which returns its last iterate, and
// full-batch L-BFGS (LBFGS, implemented in this package, see lbfgs.go for why
// not gonum/optimize), which returns the evaluated point with the smallest
// ||grad h||. Minimize finds the centralised optimum (mu = 0) to an absolute
// gradient tolerance.
//
// # What counts against a budget
//
// All work is counted in calls of Model.LossGrad ("gradient evaluations") of
// any batch size, and in per-sample gradients (the sum of the batch sizes of
// those calls). Every call counts: the full-gradient evaluation at the anchor,
// SGD's mini-batches, SGD's end-of-epoch gamma tests, the final measurement
// at the returned point and every L-BFGS evaluation.
//
//   - MaxGradEvals bounds Report.GradEvals, all calls included: the solver
//     never starts a call it could not pay for, and SGD keeps one call in
//     reserve for the final measurement. The smallest useful value is 1 (the
//     anchor evaluation only; the anchor is returned).
//   - MaxEpochs bounds Report.Epochs, the passes over the data spent training:
//     for SGD the mini-batch samples processed divided by n (measurement passes
//     are not training); for L-BFGS the full evaluations other than the anchor
//     measurement (GradEvals - 1), since every L-BFGS evaluation is a training
//     step.
//   - Deadline is compared with Budget.Clock once before every mini-batch
//     (SGD) or full evaluation (L-BFGS); a step that starts before the
//     deadline is finished. The final measurement at the returned point (one
//     full pass, SGD only; L-BFGS already knows the gradient at every point it
//     evaluated) runs after the deadline: callers with a hard deadline should
//     set it one pass early.
//   - Cancelling ctx is checked at the same places as the deadline and
//     behaves the same way: the point reached is returned with a report and
//     no error (Stop = "canceled").
//   - The anchor evaluation is always made, even when ctx is already canceled
//     or the deadline has passed: the report's AnchorGrad needs it. So is
//     one full evaluation at a warm start (start != anchor), when the
//     evaluation budget allows it, to know its gamma.
//
// Solve refuses (ErrConfig) to start what nothing could stop: no budget
// limit and a context that is never canceled (ctx.Done() == nil), with no
// target gamma, or with SGD (constant-step SGD stalls at a noise floor and
// may never reach its target). L-BFGS with a target and no budget is allowed:
// it stops by itself when it can make no further progress (StopStalled).
//
// Partial work is normal: every stop returns the point reached and a report.
// Solve returns an error only for a bad configuration (wrapping ErrConfig) or
// when the model produces a non-finite loss or gradient (wrapping
// ErrDiverged; the anchor is returned then). The one exception: a loss of
// +Inf at an L-BFGS line-search trial point means the step was too long (an
// overflow far from the data) and the line search shortens it.
//
// The package is pure and deterministic given the rng: no globals, no
// goroutines, no time except through the Budget's clock.
package proxsolver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
)

// Solvers.
const (
	SGD   = "sgd"   // mini-batch stochastic gradient descent
	LBFGS = "lbfgs" // full-batch limited-memory BFGS (gonum/optimize)
)

// Reasons a solve stopped (Report.Stop).
const (
	StopGamma     = "gamma"      // the target gamma was reached
	StopEpochs    = "epochs"     // Budget.MaxEpochs spent
	StopGradEvals = "grad-evals" // Budget.MaxGradEvals spent
	StopDeadline  = "deadline"   // Budget.Deadline passed
	StopCanceled  = "canceled"   // the context was canceled
	StopConverged = "converged"  // the gradient is exactly zero (e.g. grad f(a) = 0), or Minimize reached its tolerance
	StopStalled   = "stalled"    // L-BFGS could make no further progress (line search failed, usually at the limit of float64 precision)
)

var (
	// ErrConfig is wrapped by every error about the arguments of Solve and
	// Minimize.
	ErrConfig = errors.New("proxsolver: bad configuration")
	// ErrDiverged is wrapped when the model returned a non-finite loss or
	// gradient (for SGD usually a learning rate that is too large).
	ErrDiverged = errors.New("proxsolver: non-finite loss or gradient")
	// ErrNotConverged is wrapped by Minimize when the gradient tolerance was
	// not met.
	ErrNotConverged = errors.New("proxsolver: gradient tolerance not reached")
)

// Config selects the local solver and its parameters.
type Config struct {
	Solver string  // SGD or LBFGS
	Mu     float64 // proximal weight mu >= 0
	Gamma  float64 // target inexactness in (0, 1]; 0 = no target, run the whole budget
	LR     float64 // SGD learning rate > 0 (ignored by L-BFGS)
	Batch  int     // SGD mini-batch size >= 1 (ignored by L-BFGS); capped at the sample count
	// Shift, when set, adds the linear term <Shift, w> to h: every
	// gradient of f gets Shift added. SCAFFOLD's drift correction c - c_i
	// (proto/uplink/scaffold.go). SGD only; of the model's dimension.
	Shift []float64
}

// Validate reports a parameter out of range: mu must be finite and >= 0,
// gamma in [0, 1] (0 = no target), and for SGD the learning rate finite and
// > 0 and the batch size >= 1.
func (c Config) Validate() error {
	if !(c.Mu >= 0) || math.IsInf(c.Mu, 0) {
		return fmt.Errorf("%w: mu must be a finite number >= 0, got %v", ErrConfig, c.Mu)
	}
	if !(c.Gamma >= 0 && c.Gamma <= 1) {
		return fmt.Errorf("%w: gamma must be in [0, 1] (0 = no target), got %v", ErrConfig, c.Gamma)
	}
	switch c.Solver {
	case SGD:
		if !(c.LR > 0) || math.IsInf(c.LR, 0) {
			return fmt.Errorf("%w: sgd learning rate must be a finite number > 0, got %v", ErrConfig, c.LR)
		}
		if c.Batch < 1 {
			return fmt.Errorf("%w: sgd batch size must be >= 1, got %d", ErrConfig, c.Batch)
		}
	case LBFGS:
		if c.Shift != nil {
			return fmt.Errorf("%w: a gradient shift (SCAFFOLD) needs the sgd solver", ErrConfig)
		}
	default:
		return fmt.Errorf("%w: unknown solver %q (want %q or %q)", ErrConfig, c.Solver, SGD, LBFGS)
	}
	return nil
}

// Budget bounds the work of one solve. Every zero field is unlimited. See the
// package documentation for exactly what counts.
type Budget struct {
	MaxEpochs    int       // passes over the local data spent training
	MaxGradEvals int       // LossGrad calls of any batch size, anchor and final measurement included
	Deadline     time.Time // checked with Clock before every step; needs Clock
	Clock        clock.Clock
}

// Validate reports negative limits and a deadline without a clock.
func (b Budget) Validate() error {
	if b.MaxEpochs < 0 {
		return fmt.Errorf("%w: max epochs must be >= 0 (0 = unlimited), got %d", ErrConfig, b.MaxEpochs)
	}
	if b.MaxGradEvals < 0 {
		return fmt.Errorf("%w: max gradient evaluations must be >= 0 (0 = unlimited), got %d", ErrConfig, b.MaxGradEvals)
	}
	if !b.Deadline.IsZero() && b.Clock == nil {
		return fmt.Errorf("%w: a deadline needs a clock", ErrConfig)
	}
	return nil
}

func (b Budget) unlimited() bool {
	return b.MaxEpochs == 0 && b.MaxGradEvals == 0 && b.Deadline.IsZero()
}

// Report says what a solve did.
type Report struct {
	Gamma       float64       // achieved ||grad h(w)|| / ||grad f(a)||, with the full local gradient (0 when grad f(a) = 0)
	GradNorm    float64       // achieved ||grad h(w)|| (absolute)
	Epochs      float64       // passes over the local data spent training (L-BFGS: one per full evaluation after the anchor's)
	GradEvals   int           // LossGrad calls of any batch size, including the anchor and final measurements
	SampleGrads int64         // per-sample gradients computed, all calls included
	Elapsed     time.Duration // by the budget's clock (0 when there is none)
	Loss        float64       // f(w) at the returned point
	AnchorLoss  float64       // f(a)
	AnchorGrad  []float64     // grad f(a): FedSim clustering uses it
	Stop        string        // why it stopped: one of the Stop* constants
	Steps       int           // SGD's mini-batch steps taken (0 for L-BFGS)
}

// Solve approximately minimises h(w; anchor) = f(w) + (mu/2)||w - anchor||^2
// over the model m's parameters, where f is m.LossGrad on d, starting from
// start (nil = anchor), and stops at the first of: the target gamma is
// reached, the budget is spent, ctx is canceled. It returns a new vector (the
// inputs are not modified) and a report. rng drives SGD's shuffling and may
// be nil for L-BFGS.
func Solve(ctx context.Context, m model.Model, d model.Data, anchor, start []float64, cfg Config, b Budget, rng *rand.Rand) ([]float64, Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, Report{}, err
	}
	if err := b.Validate(); err != nil {
		return nil, Report{}, err
	}
	if ctx == nil {
		return nil, Report{}, fmt.Errorf("%w: nil context", ErrConfig)
	}
	if b.unlimited() && ctx.Done() == nil {
		switch {
		case cfg.Gamma == 0:
			return nil, Report{}, fmt.Errorf("%w: no target gamma, no budget and a context that is never canceled: nothing would stop the solve", ErrConfig)
		case cfg.Solver == SGD:
			return nil, Report{}, fmt.Errorf("%w: sgd needs a budget (max epochs, max gradient evaluations or a deadline) or a cancelable context: constant-step SGD may never reach gamma %v", ErrConfig, cfg.Gamma)
		}
	}
	if cfg.Solver == SGD && rng == nil {
		return nil, Report{}, fmt.Errorf("%w: sgd needs a random source", ErrConfig)
	}
	if err := checkProblem(m, d, anchor, start); err != nil {
		return nil, Report{}, err
	}

	if cfg.Shift != nil {
		if len(cfg.Shift) != m.NumParams() {
			return nil, Report{}, fmt.Errorf("%w: shift has %d values, the model %d parameters", ErrConfig, len(cfg.Shift), m.NumParams())
		}
		if i := firstNonFinite(cfg.Shift); i >= 0 {
			return nil, Report{}, fmt.Errorf("%w: shift value %d is %v", ErrConfig, i, cfg.Shift[i])
		}
	}
	obj := &objective{m: m, d: d, anchor: anchor, mu: cfg.Mu, shift: cfg.Shift}
	tr := newTracker(ctx, b)
	p := m.NumParams()

	// The anchor measurement: grad f(a), which is also grad h(a; a).
	rep := Report{AnchorGrad: make([]float64, p)}
	fa, err := obj.full(anchor, rep.AnchorGrad)
	rep.AnchorLoss = fa
	if err != nil {
		return diverged(anchor, obj, tr, rep, err)
	}
	g0 := norm2(rep.AnchorGrad)
	if g0 == 0 && obj.shift == nil {
		// a is a stationary point of f and hence of h(.; a): the exact prox
		// of a convex f.
		rep.Loss, rep.Stop = fa, StopConverged
		return clone(anchor), finish(obj, tr, rep, 0), nil
	}
	if g0 == 0 {
		g0 = 1 // a shifted objective: the anchor is not stationary; gamma is then absolute
	}
	s := session{obj: obj, tr: tr, cfg: cfg, g0: g0, thresh: cfg.Gamma * g0}
	if cfg.Gamma == 1 && (start == nil || equal(start, anchor)) && obj.shift == nil {
		// The anchor itself is 1-inexact.
		s.rep = rep
		s.done(fa, g0, StopGamma)
		return clone(anchor), s.rep, nil
	}
	var w []float64
	switch cfg.Solver {
	case SGD:
		w, err = s.sgd(start, rep, rng)
	default:
		w, err = s.lbfgs(start, rep)
	}
	if err != nil {
		return diverged(anchor, obj, tr, s.rep, err)
	}
	return w, s.rep, nil
}

// session is the state shared by the solvers once the anchor is known.
type session struct {
	obj    *objective
	tr     *tracker
	cfg    Config
	g0     float64 // ||grad f(a)|| > 0
	thresh float64 // target on ||grad h||: gamma * g0 (0 = none)
	rep    Report
}

// done fills the report for the returned point w, with f(w) and ||grad h(w)||
// measured over the full data, and stop.
func (s *session) done(f, gnorm float64, stop string) {
	s.rep.Loss, s.rep.GradNorm, s.rep.Gamma, s.rep.Stop = f, gnorm, gnorm/s.g0, stop
	s.rep = finish(s.obj, s.tr, s.rep, s.rep.Epochs)
}

func diverged(anchor []float64, obj *objective, tr *tracker, rep Report, err error) ([]float64, Report, error) {
	rep = finish(obj, tr, rep, rep.Epochs)
	rep.Loss, rep.Gamma, rep.GradNorm = rep.AnchorLoss, math.NaN(), math.NaN()
	return clone(anchor), rep, err
}

// finish copies the counters into rep.
func finish(obj *objective, tr *tracker, rep Report, epochs float64) Report {
	rep.Epochs = epochs
	rep.GradEvals = obj.gradEvals
	rep.SampleGrads = obj.sampleGrads
	rep.Elapsed = tr.elapsed()
	return rep
}

func checkProblem(m model.Model, d model.Data, anchor, start []float64) error {
	if m == nil {
		return fmt.Errorf("%w: nil model", ErrConfig)
	}
	if err := checkData(m, d); err != nil {
		return err
	}
	p := m.NumParams()
	if len(anchor) != p {
		return fmt.Errorf("%w: anchor has %d parameters, the model %d", ErrConfig, len(anchor), p)
	}
	if i := firstNonFinite(anchor); i >= 0 {
		return fmt.Errorf("%w: anchor parameter %d is %v", ErrConfig, i, anchor[i])
	}
	if start != nil {
		if len(start) != p {
			return fmt.Errorf("%w: start has %d parameters, the model %d", ErrConfig, len(start), p)
		}
		if i := firstNonFinite(start); i >= 0 {
			return fmt.Errorf("%w: start parameter %d is %v", ErrConfig, i, start[i])
		}
	}
	return nil
}

func checkData(m model.Model, d model.Data) error {
	if d.N < 1 {
		return fmt.Errorf("%w: no local data (%d samples)", ErrConfig, d.N)
	}
	if err := model.CheckTargets(m.Spec(), d); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// objective evaluates f on the full data and counts all the work.
type objective struct {
	m      model.Model
	d      model.Data
	anchor []float64 // nil when mu = 0
	mu     float64
	shift  []float64 // Config.Shift (nil: none)

	gradEvals   int
	sampleGrads int64
}

// full returns f(w) over all the data and writes grad f(w) into gf.
func (o *objective) full(w, gf []float64) (float64, error) {
	f := o.m.LossGrad(w, o.d, gf)
	o.gradEvals++
	o.sampleGrads += int64(o.d.N)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return f, fmt.Errorf("%w: loss over the %d local samples is %v", ErrDiverged, o.d.N, f)
	}
	if i := firstNonFinite(gf); i >= 0 {
		return f, fmt.Errorf("%w: gradient component %d is %v", ErrDiverged, i, gf[i])
	}
	return f, nil
}

// batch returns the loss on the mini-batch b and writes its gradient into g.
func (o *objective) batch(w []float64, b model.Data, g []float64) (float64, error) {
	f := o.m.LossGrad(w, b, g)
	o.gradEvals++
	o.sampleGrads += int64(b.N)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return f, fmt.Errorf("%w: mini-batch loss is %v", ErrDiverged, f)
	}
	return f, nil
}

// step takes one fused SGD step on the samples idx (see model.Stepper),
// counted as one gradient evaluation of len(idx) samples.
func (o *objective) step(st model.Stepper, w []float64, idx []int, lr float64) error {
	f := st.Step(w, o.d, idx, lr, o.mu, o.anchor)
	o.gradEvals++
	o.sampleGrads += int64(len(idx))
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("%w: mini-batch loss is %v", ErrDiverged, f)
	}
	return nil
}

// prox turns f(w), grad f(w) into h(w; a) and grad h(w; a) (written into gh)
// and returns h and ||grad h||.
func (o *objective) prox(w []float64, f float64, gf, gh []float64) (h, gnorm float64) {
	h = f
	var ss, dd, lin float64
	for i, g := range gf {
		if o.mu != 0 {
			di := w[i] - o.anchor[i]
			dd += di * di
			g += o.mu * di
		}
		if o.shift != nil {
			g += o.shift[i]
			lin += o.shift[i] * w[i]
		}
		gh[i] = g
		ss += g * g
	}
	return h + 0.5*o.mu*dd + lin, math.Sqrt(ss)
}

// tracker checks the context, the deadline and the clock.
type tracker struct {
	ctx context.Context
	b   Budget
	t0  time.Time
}

func newTracker(ctx context.Context, b Budget) *tracker {
	t := &tracker{ctx: ctx, b: b}
	if b.Clock != nil {
		t.t0 = b.Clock.Now()
	}
	return t
}

// interrupted returns StopCanceled or StopDeadline, or "" to go on. It reads
// the clock once when there is a deadline.
func (t *tracker) interrupted() string {
	if t.ctx.Err() != nil {
		return StopCanceled
	}
	if !t.b.Deadline.IsZero() && !t.b.Clock.Now().Before(t.b.Deadline) {
		return StopDeadline
	}
	return ""
}

func (t *tracker) elapsed() time.Duration {
	if t.b.Clock == nil {
		return 0
	}
	return t.b.Clock.Now().Sub(t.t0)
}

func norm2(v []float64) float64 {
	var ss float64
	for _, x := range v {
		ss += x * x
	}
	return math.Sqrt(ss)
}

func firstNonFinite(v []float64) int {
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return i
		}
	}
	return -1
}

func clone(v []float64) []float64 { return append([]float64(nil), v...) }
