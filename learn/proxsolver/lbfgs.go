package proxsolver

import (
	"context"
	"fmt"
	"math"

	"github.com/edgefl/edgefl/learn/model"
)

// The L-BFGS solver.
//
// It is our own small implementation (two-loop recursion, history 15, a
// strong-Wolfe line search with cubic interpolation after Nocedal & Wright,
// Algorithms 3.5-3.6) rather than gonum.org/v1/gonum/optimize: the optimize
// package imports gonum/stat/distmv (for CMA-ES), which imports
// golang.org/x/tools/container/intsets, a module that is not in this
// module's go.sum, so using gonum here would need a go.mod/go.sum change.
// (gonum could honour the budget: Problem.Status is called after every
// evaluation and may stop the run; its gradient tests use the infinity norm
// and would be disabled in favour of our own 2-norm test; Minimize runs the
// method in its own goroutines, synchronously, so results stay deterministic.)
//
// The budget is checked before every evaluation (evaluations, ctx, deadline:
// the clock is read once per evaluation) and the gamma test after every
// evaluation, not only at accepted steps, so the solver stops at the first
// evaluated point that is gamma-inexact and never starts an evaluation it
// cannot afford. Every evaluated point's full gradient is known, so L-BFGS
// needs no final measurement: it returns the evaluated point with the
// smallest ||grad h|| (for a strongly convex h the point with the best
// guaranteed distance ||w - w*|| <= ||grad h(w)|| / (mu + l2) to the exact
// solution).
//
// Polishing. The first phase uses the strong-Wolfe line search (sufficient
// decrease 1e-4, curvature 0.9). Close to the optimum the decrease in h falls
// below the rounding error of h itself (about 1e-16 |h|, reached when
// ||grad h||^2 / (2 lambda_min) < 1e-16 |h|), the sufficient-decrease test
// becomes noise and the line search fails. When that happens before the
// target and within the budget, L-BFGS is restarted (fresh history) from the
// best point with a line search that trusts the directional derivative
// instead (slopeSearch: it brackets a sign change of
// phi'(t) = grad h(x + t d)·d and accepts when |phi'(t)| <= 0.9 |phi'(0)|,
// allowing h to rise by a rounding slack). The gradient keeps its relative
// precision where h has none, so this reaches gradient norms near the floor
// set by the rounding error of the gradient itself. Restarts continue while
// they improve the best gradient norm (at most maxRestarts); after that the
// solve stops with StopStalled.
const (
	wolfeDecrease = 1e-4
	wolfeCurv     = 0.9
	wolfeIters    = 30
	maxRestarts   = 20
	slopeIters    = 40
	slopeSlack    = 1e-12 // relative rise of h tolerated by slopeSearch
	lbfgsHistory  = 15
)

// point is an evaluated point: f, grad f, h, grad h and ||grad h||.
type point struct {
	x, gf, gh   []float64
	f, h, gnorm float64
}

func newPoint(p int) point {
	return point{x: make([]float64, p), gf: make([]float64, p), gh: make([]float64, p)}
}

func (p *point) set(q *point) {
	copy(p.x, q.x)
	copy(p.gf, q.gf)
	copy(p.gh, q.gh)
	p.f, p.h, p.gnorm = q.f, q.h, q.gnorm
}

// lbfgsRun is the state of one L-BFGS solve, over one or more phases.
type lbfgsRun struct {
	obj      *objective
	tr       *tracker
	thresh   float64 // stop when ||grad h|| <= thresh (0 = no target)
	maxEvals int     // bound on obj.gradEvals (0 = unlimited)
	evalStop string  // the Stop reported when maxEvals binds

	cur  point // the last evaluated point
	best point // the evaluated point with the smallest ||grad h||
	has  bool  // best is set

	// scratch for a phase
	x, g, d []float64
	mem     history

	stop string // why the run stopped ("" = not yet)
	err  error  // ErrDiverged from the model
}

func newLBFGSRun(obj *objective, tr *tracker, p int, thresh float64, maxEvals int, evalStop string) *lbfgsRun {
	return &lbfgsRun{
		obj: obj, tr: tr, thresh: thresh, maxEvals: maxEvals, evalStop: evalStop,
		cur: newPoint(p), best: newPoint(p),
		x: make([]float64, p), g: make([]float64, p), d: make([]float64, p),
		mem: newHistory(lbfgsHistory, p),
	}
}

// budgetSpent says why no further evaluation may start, or "". It reads the
// clock once when there is a deadline.
func (r *lbfgsRun) budgetSpent() string {
	if r.maxEvals > 0 && r.obj.gradEvals >= r.maxEvals {
		return r.evalStop
	}
	return r.tr.interrupted()
}

// eval evaluates x into cur, offers it as the best point and reports whether
// the run must stop (divergence, target reached, zero gradient). At a trial
// point of a line search (trial), a loss of +Inf is not divergence but a step
// too long (an overflow far from the data, e.g. least squares): cur.h is +Inf
// and the line search shrinks the step. Any other non-finite value is
// ErrDiverged.
func (r *lbfgsRun) eval(x []float64, trial bool) bool {
	copy(r.cur.x, x)
	f, err := r.obj.full(r.cur.x, r.cur.gf)
	if err != nil {
		if trial && math.IsInf(f, 1) {
			r.cur.f, r.cur.h, r.cur.gnorm = f, f, math.Inf(1)
			clear(r.cur.gh) // the slope is meaningless: the searches go by h
			return false
		}
		r.err = err
		return true
	}
	r.cur.f = f
	r.cur.h, r.cur.gnorm = r.obj.prox(r.cur.x, f, r.cur.gf, r.cur.gh)
	r.offer(&r.cur)
	switch {
	case r.thresh > 0 && r.cur.gnorm <= r.thresh:
		r.stop = StopGamma
	case r.cur.gnorm == 0:
		r.stop = StopConverged
	}
	return r.stop != ""
}

// offer makes p the best point if its gradient is the smallest seen.
func (r *lbfgsRun) offer(p *point) {
	if !r.has || p.gnorm < r.best.gnorm {
		r.best.set(p)
		r.has = true
	}
}

// lineSearch finds a step along a descent direction from the value h0 and
// slope d0 < 0 of phi(t) = h(x + t d).
type lineSearch interface {
	init(h0, d0, step float64)
	// iterate takes phi and phi' at the current step and reports whether it
	// is accepted; if not it returns the next step to try, or false and
	// ok = false when the search failed.
	iterate(h, d float64) (accept bool, next float64, ok bool)
}

// phase runs L-BFGS from x0 with the line search ls until the run stops (r.stop
// or r.err set) or the line search fails (both left unset).
func (r *lbfgsRun) phase(x0 *point, ls lineSearch) {
	x, g, d := r.x, r.g, r.d
	copy(x, x0.x)
	copy(g, x0.gh)
	h, gnorm := x0.h, x0.gnorm
	r.mem.reset()
	for {
		var step float64
		if r.mem.n == 0 {
			for i, v := range g {
				d[i] = -v
			}
			step = 1 / gnorm
		} else {
			r.mem.direction(g, d)
			step = 1
		}
		slope := dot(g, d)
		if !(slope < 0) {
			if r.mem.n == 0 {
				return // no descent direction at all
			}
			r.mem.reset() // a bad history: start again with steepest descent
			continue
		}
		ls.init(h, slope, step)
		for {
			if r.stop = r.budgetSpent(); r.stop != "" {
				return
			}
			moved := false
			for i := range x {
				xi := x[i] + step*d[i]
				moved = moved || xi != x[i]
				r.cur.x[i] = xi
			}
			if !moved {
				return // the step no longer changes x
			}
			if r.eval(r.cur.x, true) {
				return
			}
			accept, next, ok := ls.iterate(r.cur.h, dot(r.cur.gh, d))
			if !ok {
				return
			}
			if accept {
				break
			}
			step = next
		}
		// s = x_new - x, y = g_new - g, then move.
		r.mem.push(r.cur.x, x, r.cur.gh, g)
		copy(x, r.cur.x)
		copy(g, r.cur.gh)
		h, gnorm = r.cur.h, r.cur.gnorm
	}
}

// run minimises from x0 (already evaluated and offered), polishing with
// restarts when the line search fails.
func (r *lbfgsRun) run(x0 *point) {
	r.phase(x0, &wolfeSearch{c1: wolfeDecrease, c2: wolfeCurv})
	start := newPoint(len(x0.x))
	for i := 0; r.stop == "" && r.err == nil; i++ {
		// The line search failed.
		if i == maxRestarts {
			r.stop = StopStalled
			break
		}
		before := r.best.gnorm
		start.set(&r.best)
		r.phase(&start, &slopeSearch{curvature: wolfeCurv, slack: slopeSlack})
		if r.stop == "" && r.err == nil && !(r.best.gnorm < before) {
			r.stop = StopStalled
		}
	}
}

// lbfgs runs L-BFGS from start (nil = anchor) after the anchor measurement.
func (s *session) lbfgs(start []float64, rep Report) ([]float64, error) {
	s.rep = rep
	obj, b := s.obj, s.tr.b
	p := len(obj.anchor)

	// Every evaluation after the anchor's is a training pass: the epoch
	// limit allows MaxEpochs of them.
	maxEvals, evalStop := b.MaxGradEvals, StopGradEvals
	if b.MaxEpochs > 0 && (maxEvals == 0 || b.MaxEpochs+1 < maxEvals) {
		maxEvals, evalStop = b.MaxEpochs+1, StopEpochs
	}
	r := newLBFGSRun(obj, s.tr, p, s.thresh, maxEvals, evalStop)
	x0 := newPoint(p)
	copy(x0.x, obj.anchor)
	copy(x0.gf, rep.AnchorGrad)
	x0.f = rep.AnchorLoss
	x0.h, x0.gnorm = obj.prox(x0.x, x0.f, x0.gf, x0.gh)
	r.offer(&x0)
	if start != nil && !equal(start, obj.anchor) {
		// A warm start: L-BFGS starts there (but the anchor stays a
		// candidate for the returned point).
		if r.stop = r.budgetSpent(); r.stop == "" && !r.eval(start, false) {
			x0.set(&r.cur)
		}
	}
	if r.stop == "" && r.err == nil {
		r.run(&x0)
	}
	s.rep.Epochs = float64(obj.gradEvals - 1)
	if r.err != nil {
		return nil, r.err
	}
	s.done(r.best.f, r.best.gnorm, r.stop)
	return clone(r.best.x), nil
}

// Minimize returns the centralised optimum of f = m.LossGrad on d (the
// FedProx objective with mu = 0): full-batch L-BFGS from start (nil = zeros)
// until ||grad f|| <= gradTol (absolute, e.g. 1e-10), polishing with the
// derivative-based line search when the function values run out of precision
// (see above). At most maxEvals LossGrad calls are made in all (0 =
// unlimited). When the tolerance is not met it returns the best point reached
// (smallest gradient), its report and an error wrapping ErrNotConverged (and
// ctx.Err() when canceled). The report's anchor is start, its GradNorm the
// achieved ||grad f||, its Gamma that relative to ||grad f(start)||, and its
// Stop StopConverged when the tolerance was met.
func Minimize(ctx context.Context, m model.Model, d model.Data, start []float64, gradTol float64, maxEvals int) ([]float64, Report, error) {
	if ctx == nil {
		return nil, Report{}, fmt.Errorf("%w: nil context", ErrConfig)
	}
	if !(gradTol > 0) || math.IsInf(gradTol, 0) {
		return nil, Report{}, fmt.Errorf("%w: gradient tolerance must be a finite number > 0, got %v", ErrConfig, gradTol)
	}
	if maxEvals < 0 {
		return nil, Report{}, fmt.Errorf("%w: max evaluations must be >= 0 (0 = unlimited), got %d", ErrConfig, maxEvals)
	}
	if m != nil && start == nil {
		start = make([]float64, m.NumParams())
	}
	if err := checkProblem(m, d, start, nil); err != nil {
		return nil, Report{}, err
	}
	p := m.NumParams()
	obj := &objective{m: m, d: d}
	tr := newTracker(ctx, Budget{})
	r := newLBFGSRun(obj, tr, p, gradTol, maxEvals, StopGradEvals)
	r.eval(start, false)
	rep := Report{AnchorLoss: r.cur.f, AnchorGrad: clone(r.cur.gf)}
	if r.err != nil {
		return diverged(start, obj, tr, rep, r.err)
	}
	s := session{obj: obj, tr: tr, g0: r.cur.gnorm, rep: rep}
	if s.g0 == 0 {
		s.g0 = 1 // Gamma = 0 / 1
	}
	if r.stop == "" {
		x0 := newPoint(p)
		x0.set(&r.cur)
		r.run(&x0)
	}
	s.rep.Epochs = float64(obj.gradEvals - 1)
	if r.err != nil {
		return diverged(start, obj, tr, s.rep, r.err)
	}
	stop := r.stop
	if stop == StopGamma {
		stop = StopConverged
	}
	s.done(r.best.f, r.best.gnorm, stop)
	w := clone(r.best.x)
	if r.best.gnorm > gradTol {
		err := fmt.Errorf("%w: ||grad f|| = %.3g > %.3g after %d evaluations (%s)", ErrNotConverged, r.best.gnorm, gradTol, obj.gradEvals, stop)
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		}
		return w, s.rep, err
	}
	return w, s.rep, nil
}

// wolfeSearch finds a step satisfying the strong Wolfe conditions
// phi(t) <= phi(0) + c1 t phi'(0) and |phi'(t)| <= c2 |phi'(0)|: bracketing
// by extrapolation (x4), then zooming with safeguarded cubic interpolation
// (Nocedal & Wright, Algorithms 3.5 and 3.6). It fails after wolfeIters
// trials or when the bracket collapses.
type wolfeSearch struct {
	c1, c2 float64

	h0, d0       float64
	lo, hlo, dlo float64 // the lowest step satisfying sufficient decrease (0 at first)
	hi, hhi, dhi float64 // the other end of the bracket, once bracketed
	bracketed    bool
	step         float64
	trials       int
}

func (s *wolfeSearch) init(h0, d0, step float64) {
	s.h0, s.d0 = h0, d0
	s.lo, s.hlo, s.dlo = 0, h0, d0
	s.bracketed = false
	s.step, s.trials = step, 0
}

func (s *wolfeSearch) iterate(h, d float64) (bool, float64, bool) {
	s.trials++
	t := s.step
	armijo := h <= s.h0+s.c1*t*s.d0
	if armijo && math.Abs(d) <= -s.c2*s.d0 {
		return true, t, true
	}
	if s.trials >= wolfeIters {
		return false, 0, false
	}
	if !armijo || h >= s.hlo {
		s.hi, s.hhi, s.dhi = t, h, d
		s.bracketed = true
	} else {
		if s.bracketed {
			if d*(s.hi-s.lo) >= 0 {
				s.hi, s.hhi, s.dhi = s.lo, s.hlo, s.dlo
			}
		} else if d >= 0 {
			s.hi, s.hhi, s.dhi = s.lo, s.hlo, s.dlo
			s.bracketed = true
		}
		s.lo, s.hlo, s.dlo = t, h, d
	}
	var next float64
	if !s.bracketed {
		next = 4 * t
	} else {
		a, b := math.Min(s.lo, s.hi), math.Max(s.lo, s.hi)
		w := b - a
		if w <= 1e-14*b {
			return false, 0, false
		}
		next = cubicMin(s.lo, s.hlo, s.dlo, s.hi, s.hhi, s.dhi)
		if math.IsNaN(next) || next < a+0.1*w || next > b-0.1*w {
			next = a + w/2
		}
	}
	if next == t || math.IsInf(next, 0) {
		return false, 0, false
	}
	s.step = next
	return false, next, true
}

// cubicMin is the minimiser of the cubic interpolating phi and phi' at a and
// b (NaN when it has none).
func cubicMin(a, fa, da, b, fb, db float64) float64 {
	d1 := da + db - 3*(fa-fb)/(a-b)
	disc := d1*d1 - da*db
	if !(disc >= 0) {
		return math.NaN()
	}
	d2 := math.Copysign(math.Sqrt(disc), b-a)
	return b - (b-a)*(db+d2-d1)/(db-da+2*d2)
}

// slopeSearch is the line search of the polishing phase: it trusts the
// directional derivative phi'(t) = grad h(x + t d)·d rather than function
// values. It brackets a sign change of phi' (multiplying the step by 4 until
// phi' >= 0), narrows it by safeguarded regula falsi, and accepts a step when
// |phi'(t)| <= curvature |phi'(0)| (the strong Wolfe curvature condition) and
// h has not risen by more than slack (1 + |h(0)|), a tolerance for rounding.
type slopeSearch struct {
	curvature, slack float64

	h0, d0  float64
	lo, dlo float64 // a step with phi' < 0 and h acceptable
	hi, dhi float64 // a step with phi' >= 0 or h too large; +Inf until found
	step    float64
	trials  int
}

func (s *slopeSearch) init(h0, d0, step float64) {
	s.h0, s.d0 = h0, d0
	s.lo, s.dlo = 0, d0
	s.hi, s.dhi = math.Inf(1), math.NaN()
	s.step, s.trials = step, 0
}

func (s *slopeSearch) iterate(h, d float64) (bool, float64, bool) {
	s.trials++
	hok := h <= s.h0+s.slack*(1+math.Abs(s.h0))
	if hok && math.Abs(d) <= -s.curvature*s.d0 {
		return true, s.step, true
	}
	if s.trials >= slopeIters {
		return false, 0, false
	}
	if hok && d < 0 {
		s.lo, s.dlo = s.step, d
	} else {
		s.hi, s.dhi = s.step, d
	}
	var next float64
	switch {
	case math.IsInf(s.hi, 1):
		next = 4 * s.step
	case s.dhi > 0:
		// The root of the secant of phi' between lo and hi, kept inside the
		// middle 80% of the bracket.
		w := s.hi - s.lo
		next = s.lo + w*s.dlo/(s.dlo-s.dhi)
		next = math.Max(s.lo+0.1*w, math.Min(s.hi-0.1*w, next))
	default:
		next = (s.lo + s.hi) / 2
	}
	if next == s.step || !(next > 0) || math.IsInf(next, 0) {
		return false, 0, false
	}
	s.step = next
	return false, next, true
}

// history holds the last m pairs s = x_{k+1} - x_k, y = g_{k+1} - g_k.
type history struct {
	s, y  [][]float64
	rho   []float64
	alpha []float64
	head  int // index of the next slot to write
	n     int // pairs stored
}

func newHistory(m, p int) history {
	h := history{s: make([][]float64, m), y: make([][]float64, m), rho: make([]float64, m), alpha: make([]float64, m)}
	for i := range m {
		h.s[i], h.y[i] = make([]float64, p), make([]float64, p)
	}
	return h
}

func (h *history) reset() { h.head, h.n = 0, 0 }

// push stores s = x1 - x0, y = g1 - g0 unless the curvature s·y is not
// positive (then the pair would break the positive definiteness of the
// quasi-Newton matrix and is skipped).
func (h *history) push(x1, x0, g1, g0 []float64) {
	var sy float64
	for i := range x1 {
		sy += (x1[i] - x0[i]) * (g1[i] - g0[i])
	}
	if !(sy > 0) {
		return // before touching the slot: when the ring is full it holds the oldest pair
	}
	s, y := h.s[h.head], h.y[h.head]
	for i := range s {
		s[i] = x1[i] - x0[i]
		y[i] = g1[i] - g0[i]
	}
	h.rho[h.head] = 1 / sy
	h.head = (h.head + 1) % len(h.s)
	h.n = min(h.n+1, len(h.s))
}

// direction writes -H g into d by the two-loop recursion, with the initial
// matrix (s·y / y·y) I from the newest pair. Needs n >= 1.
func (h *history) direction(g, d []float64) {
	m := len(h.s)
	copy(d, g)
	for k := 1; k <= h.n; k++ { // newest to oldest
		i := (h.head - k + m) % m
		h.alpha[i] = h.rho[i] * dot(h.s[i], d)
		axpy(-h.alpha[i], h.y[i], d)
	}
	newest := (h.head - 1 + m) % m
	scale := 1 / (h.rho[newest] * dot(h.y[newest], h.y[newest]))
	for i := range d {
		d[i] *= scale
	}
	for k := h.n; k >= 1; k-- { // oldest to newest
		i := (h.head - k + m) % m
		beta := h.rho[i] * dot(h.y[i], d)
		axpy(h.alpha[i]-beta, h.s[i], d)
	}
	for i := range d {
		d[i] = -d[i]
	}
}

func dot(a, b []float64) float64 {
	var s float64
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// axpy sets y += a x.
func axpy(a float64, x, y []float64) {
	for i, v := range x {
		y[i] += a * v
	}
}
