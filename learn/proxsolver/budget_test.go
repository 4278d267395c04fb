package proxsolver

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
)

// spy wraps a model: it counts LossGrad calls and samples independently of
// the solver, and can run a hook on every call (after the model's work).
type spy struct {
	model.Model
	calls   int
	samples int64
	hook    func(calls int, d model.Data, loss float64) float64
}

func (s *spy) LossGrad(w []float64, d model.Data, grad []float64) float64 {
	loss := s.Model.LossGrad(w, d, grad)
	s.calls++
	s.samples += int64(d.N)
	if s.hook != nil {
		loss = s.hook(s.calls, d, loss)
	}
	return loss
}

// checkCounts verifies the report's work counters against the spy.
func checkCounts(t *testing.T, name string, s *spy, rep Report) {
	t.Helper()
	if rep.GradEvals != s.calls || rep.SampleGrads != s.samples {
		t.Errorf("%s: report says %d evaluations and %d sample gradients, the model saw %d and %d", name, rep.GradEvals, rep.SampleGrads, s.calls, s.samples)
	}
}

// budgetProblem: 100 samples, so SGD with batch 30 runs 4 mini-batches per
// epoch (the last of 10 samples).
func budgetProblem(t *testing.T) lsProblem { return newLSProblem(t, 11, 100, 5, 0.1, 0.5) }

func TestBudgetGradEvals(t *testing.T) {
	pr := budgetProblem(t)
	for _, tt := range []struct {
		cfg Config
		max int
	}{
		{Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-12, LR: 0.05, Batch: 30}, 25},
		{Config{Solver: SGD, Mu: pr.mu, LR: 0.05, Batch: 30}, 25}, // no target: no end-of-epoch tests
		{Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-14}, 10},
		{Config{Solver: LBFGS, Mu: pr.mu}, 10},
	} {
		for max := 1; max <= tt.max; max++ {
			s := &spy{Model: pr.m}
			w, rep, err := Solve(context.Background(), s, pr.d, pr.a, nil, tt.cfg, Budget{MaxGradEvals: max}, rand.New(rand.NewPCG(1, 2)))
			if err != nil {
				t.Fatal(err)
			}
			name := tt.cfg.Solver + " gamma " + ftoa(tt.cfg.Gamma) + " max " + itoa(max)
			checkCounts(t, name, s, rep)
			// SGD may leave one evaluation unused: it keeps one in reserve
			// for the final measurement and does not start a mini-batch it
			// could not measure.
			if rep.GradEvals > max || rep.GradEvals < max-1 || rep.Stop != StopGradEvals {
				t.Errorf("%s: %d evaluations, stop %q; want %d (or one fewer), stop %q", name, rep.GradEvals, rep.Stop, max, StopGradEvals)
			}
			if max == 1 && dist(w, pr.a) != 0 {
				t.Errorf("%s: with only the anchor evaluation, want the anchor back", name)
			}
		}
	}
}

func TestBudgetEpochs(t *testing.T) {
	pr := budgetProblem(t)
	for epochs := 1; epochs <= 4; epochs++ {
		for _, tt := range []struct {
			cfg       Config
			wantEvals int
		}{
			// anchor + 4 mini-batches per epoch + one gamma test per epoch
			{Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-12, LR: 0.05, Batch: 30}, 1 + 4*epochs + epochs},
			// anchor + 4 mini-batches per epoch + the final measurement
			{Config{Solver: SGD, Mu: pr.mu, LR: 0.05, Batch: 30}, 1 + 4*epochs + 1},
			// anchor + one evaluation per epoch
			{Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-14}, 1 + epochs},
		} {
			s := &spy{Model: pr.m}
			_, rep, err := Solve(context.Background(), s, pr.d, pr.a, nil, tt.cfg, Budget{MaxEpochs: epochs}, rand.New(rand.NewPCG(1, 2)))
			if err != nil {
				t.Fatal(err)
			}
			name := tt.cfg.Solver + " gamma " + ftoa(tt.cfg.Gamma) + " epochs " + itoa(epochs)
			checkCounts(t, name, s, rep)
			if rep.Epochs != float64(epochs) || rep.Stop != StopEpochs || rep.GradEvals != tt.wantEvals {
				t.Errorf("%s: %v epochs, %d evaluations, stop %q; want %d, %d, %q", name, rep.Epochs, rep.GradEvals, rep.Stop, epochs, tt.wantEvals, StopEpochs)
			}
		}
	}
	// The tighter of two limits binds.
	s := &spy{Model: pr.m}
	_, rep, _ := Solve(context.Background(), s, pr.d, pr.a, nil, Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-12, LR: 0.05, Batch: 30}, Budget{MaxEpochs: 3, MaxGradEvals: 7}, rand.New(rand.NewPCG(1, 2)))
	if rep.Stop != StopGradEvals || rep.GradEvals > 7 || rep.Epochs >= 3 {
		t.Errorf("epochs 3 and evaluations 7: stop %q after %d evaluations and %v epochs", rep.Stop, rep.GradEvals, rep.Epochs)
	}
	_, rep, _ = Solve(context.Background(), s, pr.d, pr.a, nil, Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-14}, Budget{MaxEpochs: 3, MaxGradEvals: 7}, nil)
	if rep.Stop != StopEpochs || rep.GradEvals != 4 {
		t.Errorf("lbfgs epochs 3 and evaluations 7: stop %q after %d evaluations", rep.Stop, rep.GradEvals)
	}
}

func TestBudgetDeadline(t *testing.T) {
	pr := newLSProblem(t, 12, 100, 5, 0.1, 0.5)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	sgd := Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-12, LR: 0.05, Batch: 10}
	lbfgs := Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-15}

	// Every reading of the clock costs a tick: the solve must end within one
	// tick of the deadline.
	for _, tt := range []struct {
		cfg      Config
		deadline time.Duration
	}{
		{sgd, 25 * time.Millisecond}, {sgd, 3 * time.Millisecond}, {sgd, 0},
		{lbfgs, 6 * time.Millisecond}, {lbfgs, 2 * time.Millisecond}, {lbfgs, 0},
	} {
		fake := clock.NewFake(t0)
		fake.Tick = time.Millisecond
		s := &spy{Model: pr.m}
		w, rep, err := Solve(context.Background(), s, pr.d, pr.a, nil, tt.cfg, Budget{MaxEpochs: 1000, Deadline: t0.Add(tt.deadline), Clock: fake}, rand.New(rand.NewPCG(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		name := tt.cfg.Solver + " deadline " + tt.deadline.String()
		checkCounts(t, name, s, rep)
		end := fake.Now().Add(-fake.Tick)
		if rep.Stop != StopDeadline || (tt.deadline > 2*fake.Tick && end.After(t0.Add(tt.deadline+fake.Tick))) {
			t.Errorf("%s: stop %q at %v (elapsed %v); want %q within a tick of the deadline", name, rep.Stop, end.Sub(t0), rep.Elapsed, StopDeadline)
		}
		if want := end.Sub(t0.Add(fake.Tick)); rep.Elapsed != want {
			t.Errorf("%s: elapsed %v, want %v", name, rep.Elapsed, want)
		}
		// A deadline already passed on entry (the first reading of the clock
		// is at t0 + tick): no work beyond the anchor evaluation.
		if tt.deadline <= fake.Tick && (rep.GradEvals != 1 || dist(w, pr.a) != 0) {
			t.Errorf("%s: deadline passed before the first step: want the anchor after 1 evaluation, got %d", name, rep.GradEvals)
		}
		if tt.deadline > 5*fake.Tick && rep.Epochs < 1 {
			t.Errorf("%s: only %v epochs done before the deadline", name, rep.Epochs)
		}
	}

	// The clock advances with the work (1µs per sample gradient): a step that
	// starts before the deadline is finished, so the solve ends within one
	// step of the deadline, plus the final measurement pass for SGD.
	const perSample = time.Microsecond
	n := time.Duration(pr.d.N)
	for _, tt := range []struct {
		cfg   Config
		slack time.Duration
	}{
		{sgd, 10*perSample + n*perSample},
		{lbfgs, n * perSample},
	} {
		fake := clock.NewFake(t0)
		s := &spy{Model: pr.m, hook: func(_ int, d model.Data, loss float64) float64 {
			fake.Advance(time.Duration(d.N) * perSample)
			return loss
		}}
		deadline := t0.Add(750 * perSample)
		_, rep, err := Solve(context.Background(), s, pr.d, pr.a, nil, tt.cfg, Budget{Deadline: deadline, Clock: fake}, rand.New(rand.NewPCG(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		if end := t0.Add(rep.Elapsed); rep.Stop != StopDeadline || end.After(deadline.Add(tt.slack)) {
			t.Errorf("%s work clock: stop %q at %v, want %q by %v", tt.cfg.Solver, rep.Stop, rep.Elapsed, StopDeadline, deadline.Add(tt.slack).Sub(t0))
		}
	}
}

func TestBudgetCancel(t *testing.T) {
	pr := budgetProblem(t)
	for _, tt := range []struct {
		cfg       Config
		after     int // cancel during this LossGrad call
		wantEvals int
	}{
		{Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-12, LR: 0.05, Batch: 30}, 7, 8}, // + the final measurement
		{Config{Solver: SGD, Mu: pr.mu, Gamma: 1e-12, LR: 0.05, Batch: 30}, 1, 1}, // canceled during the anchor evaluation
		{Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-14}, 4, 4},
		{Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-14}, 1, 1},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		s := &spy{Model: pr.m, hook: func(calls int, _ model.Data, loss float64) float64 {
			if calls == tt.after {
				cancel()
			}
			return loss
		}}
		w, rep, err := Solve(ctx, s, pr.d, pr.a, nil, tt.cfg, Budget{MaxEpochs: 100}, rand.New(rand.NewPCG(1, 2)))
		cancel()
		name := tt.cfg.Solver + " cancel at " + itoa(tt.after)
		if err != nil {
			t.Fatalf("%s: %v (cancellation is partial work, not an error)", name, err)
		}
		checkCounts(t, name, s, rep)
		if rep.Stop != StopCanceled || rep.GradEvals != tt.wantEvals {
			t.Errorf("%s: stop %q after %d evaluations, want %q after %d", name, rep.Stop, rep.GradEvals, StopCanceled, tt.wantEvals)
		}
		if _, g := gradH(pr.m, pr.d, w, pr.a, pr.mu); math.Abs(g-rep.GradNorm) > 1e-12 {
			t.Errorf("%s: reported ||grad h|| %g, recomputed %g", name, rep.GradNorm, g)
		}
	}
}

func TestDeterminism(t *testing.T) {
	pr := newLSProblem(t, 13, 150, 6, 0.1, 0.2)
	for _, cfg := range []Config{
		{Solver: SGD, Mu: pr.mu, Gamma: 0.01, LR: 0.03, Batch: 8},
		{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-6},
	} {
		run := func(seed uint64) ([]float64, Report) {
			w, rep, err := Solve(context.Background(), pr.m.Clone(), pr.d, pr.a, nil, cfg, Budget{MaxEpochs: 30}, rand.New(rand.NewPCG(seed, 1)))
			if err != nil {
				t.Fatal(err)
			}
			return w, rep
		}
		w1, r1 := run(5)
		w2, r2 := run(5)
		for i := range w1 {
			if math.Float64bits(w1[i]) != math.Float64bits(w2[i]) {
				t.Fatalf("%s: same seed, w[%d] = %v and %v", cfg.Solver, i, w1[i], w2[i])
			}
		}
		if !reflect.DeepEqual(r1, r2) {
			t.Errorf("%s: same seed, reports differ:\n%+v\n%+v", cfg.Solver, r1, r2)
		}
		if cfg.Solver == SGD {
			if w3, _ := run(6); dist(w1, w3) == 0 {
				t.Errorf("sgd: different seeds gave the same point: is the shuffle seeded?")
			}
		}
	}
}

func TestDiverged(t *testing.T) {
	pr := budgetProblem(t)
	nanAfter := func(k int) func(int, model.Data, float64) float64 {
		return func(calls int, _ model.Data, loss float64) float64 {
			if calls >= k {
				return math.NaN()
			}
			return loss
		}
	}
	for _, tt := range []struct {
		name string
		cfg  Config
		hook func(int, model.Data, float64) float64
	}{
		{"sgd learning rate too large", Config{Solver: SGD, Mu: pr.mu, Gamma: 0.01, LR: 1e3, Batch: 30}, nil},
		{"sgd model NaN in a mini-batch", Config{Solver: SGD, Mu: pr.mu, Gamma: 0.01, LR: 0.05, Batch: 30}, nanAfter(3)},
		{"sgd model NaN at the anchor", Config{Solver: SGD, Mu: pr.mu, Gamma: 0.01, LR: 0.05, Batch: 30}, nanAfter(1)},
		{"lbfgs model NaN", Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-9}, nanAfter(3)},
		{"lbfgs model NaN at the anchor", Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-9}, nanAfter(1)},
	} {
		s := &spy{Model: pr.m, hook: tt.hook}
		w, rep, err := Solve(context.Background(), s, pr.d, pr.a, nil, tt.cfg, Budget{MaxEpochs: 50}, rand.New(rand.NewPCG(1, 2)))
		if !errors.Is(err, ErrDiverged) {
			t.Errorf("%s: error %v, want ErrDiverged", tt.name, err)
		}
		if dist(w, pr.a) != 0 {
			t.Errorf("%s: want the anchor back", tt.name)
		}
		checkCounts(t, tt.name, s, rep)
	}
	// +Inf at the warm start (not a line-search trial) is divergence too.
	s0 := &spy{Model: pr.m, hook: func(calls int, _ model.Data, loss float64) float64 {
		if calls == 2 {
			return math.Inf(1)
		}
		return loss
	}}
	start := randVec(rand.New(rand.NewPCG(9, 9)), len(pr.a), 1)
	if w, _, err := Solve(context.Background(), s0, pr.d, pr.a, start, Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-9}, Budget{}, nil); !errors.Is(err, ErrDiverged) || dist(w, pr.a) != 0 {
		t.Errorf("lbfgs +Inf at the warm start: error %v, want ErrDiverged and the anchor", err)
	}
	// Minimize too.
	s := &spy{Model: pr.m, hook: nanAfter(4)}
	if _, _, err := Minimize(context.Background(), s, pr.d, nil, 1e-10, 0); !errors.Is(err, ErrDiverged) {
		t.Errorf("minimize: error %v, want ErrDiverged", err)
	}
}

func TestBadConfig(t *testing.T) {
	pr := budgetProblem(t)
	good := Config{Solver: SGD, Mu: 0.1, Gamma: 0.1, LR: 0.1, Batch: 10}
	logreg := model.NewLogReg(5, 3, 0.1)
	for _, tt := range []struct {
		name   string
		mutate func(*Config, *Budget, *solveArgs)
	}{
		{"unknown solver", func(c *Config, _ *Budget, _ *solveArgs) { c.Solver = "adam" }},
		{"empty solver", func(c *Config, _ *Budget, _ *solveArgs) { c.Solver = "" }},
		{"negative mu", func(c *Config, _ *Budget, _ *solveArgs) { c.Mu = -1 }},
		{"NaN mu", func(c *Config, _ *Budget, _ *solveArgs) { c.Mu = math.NaN() }},
		{"infinite mu", func(c *Config, _ *Budget, _ *solveArgs) { c.Mu = math.Inf(1) }},
		{"negative gamma", func(c *Config, _ *Budget, _ *solveArgs) { c.Gamma = -0.1 }},
		{"gamma above 1", func(c *Config, _ *Budget, _ *solveArgs) { c.Gamma = 1.5 }},
		{"NaN gamma", func(c *Config, _ *Budget, _ *solveArgs) { c.Gamma = math.NaN() }},
		{"zero learning rate", func(c *Config, _ *Budget, _ *solveArgs) { c.LR = 0 }},
		{"negative learning rate", func(c *Config, _ *Budget, _ *solveArgs) { c.LR = -1 }},
		{"infinite learning rate", func(c *Config, _ *Budget, _ *solveArgs) { c.LR = math.Inf(1) }},
		{"zero batch", func(c *Config, _ *Budget, _ *solveArgs) { c.Batch = 0 }},
		{"negative max epochs", func(_ *Config, b *Budget, _ *solveArgs) { b.MaxEpochs = -1 }},
		{"negative max grad evals", func(_ *Config, b *Budget, _ *solveArgs) { b.MaxGradEvals = -1 }},
		{"deadline without clock", func(_ *Config, b *Budget, _ *solveArgs) { b.Deadline = time.Unix(1, 0) }},
		{"no target and no budget", func(c *Config, b *Budget, _ *solveArgs) { c.Gamma = 0; *b = Budget{} }},
		{"lbfgs, no target and no budget", func(c *Config, b *Budget, _ *solveArgs) { *c = Config{Solver: LBFGS}; *b = Budget{} }},
		{"sgd with a target but no budget", func(_ *Config, b *Budget, _ *solveArgs) { *b = Budget{} }},
		{"sgd without rng", func(_ *Config, _ *Budget, a *solveArgs) { a.rng = nil }},
		{"nil context", func(_ *Config, _ *Budget, a *solveArgs) { a.ctx = nil }},
		{"nil model", func(_ *Config, _ *Budget, a *solveArgs) { a.m = nil }},
		{"short anchor", func(_ *Config, _ *Budget, a *solveArgs) { a.anchor = a.anchor[1:] }},
		{"NaN in anchor", func(_ *Config, _ *Budget, a *solveArgs) { a.anchor = []float64{0, math.NaN(), 0, 0, 0, 0} }},
		{"long start", func(_ *Config, _ *Budget, a *solveArgs) { a.start = make([]float64, 7) }},
		{"infinite start", func(_ *Config, _ *Budget, a *solveArgs) { a.start = []float64{0, 0, math.Inf(-1), 0, 0, 0} }},
		{"no data", func(_ *Config, _ *Budget, a *solveArgs) { a.d = model.Data{D: 5} }},
		{"data of another width", func(_ *Config, _ *Budget, a *solveArgs) {
			a.d = model.Data{N: 1, D: 4, X: make([]float64, 4), Y: make([]float64, 1)}
		}},
		{"short targets", func(_ *Config, _ *Budget, a *solveArgs) { a.d.Y = a.d.Y[:10] }},
		{"class index out of range", func(_ *Config, _ *Budget, a *solveArgs) {
			a.m, a.anchor = logreg, make([]float64, logreg.NumParams())
			a.d.Y = append([]float64(nil), a.d.Y...)
			for i := range a.d.Y {
				a.d.Y[i] = float64(i % 4) // 3 is not a class of 3
			}
		}},
	} {
		cfg, b := good, Budget{MaxEpochs: 5}
		args := solveArgs{ctx: context.Background(), m: pr.m, d: pr.d, anchor: pr.a, rng: rand.New(rand.NewPCG(1, 1))}
		tt.mutate(&cfg, &b, &args)
		w, _, err := Solve(args.ctx, args.m, args.d, args.anchor, args.start, cfg, b, args.rng)
		if !errors.Is(err, ErrConfig) || w != nil {
			t.Errorf("%s: got w %v, error %v; want nil and ErrConfig", tt.name, w != nil, err)
		}
	}
	// L-BFGS ignores the SGD fields and needs no rng.
	if err := (Config{Solver: LBFGS, Mu: 0.1, Gamma: 0.1}).Validate(); err != nil {
		t.Errorf("lbfgs without lr and batch: %v", err)
	}
	if _, _, err := Solve(context.Background(), pr.m, pr.d, pr.a, nil, Config{Solver: LBFGS, Mu: 0.1, Gamma: 0.1}, Budget{}, nil); err != nil {
		t.Errorf("lbfgs without rng: %v", err)
	}
	// Without a budget, a cancelable context is enough.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, rep, err := Solve(ctx, pr.m, pr.d, pr.a, nil, Config{Solver: SGD, LR: 0.1, Batch: 10}, Budget{}, rand.New(rand.NewPCG(1, 1))); err != nil || rep.Stop != StopCanceled {
		t.Errorf("sgd without budget, cancelable context: stop %q, error %v", rep.Stop, err)
	}
	// gamma 0 is "no target" and fine with a budget; gamma 1 is allowed.
	for _, g := range []float64{0, 1} {
		if err := (Config{Solver: SGD, Gamma: g, LR: 1, Batch: 1}).Validate(); err != nil {
			t.Errorf("gamma %v: %v", g, err)
		}
	}
}

type solveArgs struct {
	ctx    context.Context
	m      model.Model
	d      model.Data
	anchor []float64
	start  []float64
	rng    *rand.Rand
}

func itoa(i int) string { return strconv.Itoa(i) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// TestLBFGSBacktracksFromOverflow: a loss of +Inf at a line-search trial
// point (here a barrier just outside the solution, as an overflow far from
// the data would be) shortens the step instead of failing the solve.
func TestLBFGSBacktracksFromOverflow(t *testing.T) {
	// A large mu keeps the solution close to the anchor: the first trial step
	// (of length 1) crosses the barrier.
	pr := newLSProblem(t, 14, 200, 6, 0.1, 50)
	radius := dist(pr.exact, pr.a) * 1.001
	infs := 0
	barrier := &barrierModel{Model: pr.m, a: pr.a, radius: radius, hits: &infs}
	w, rep, err := Solve(context.Background(), barrier, pr.d, pr.a, nil, Config{Solver: LBFGS, Mu: pr.mu, Gamma: 1e-9}, Budget{MaxGradEvals: 500}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stop != StopGamma || dist(w, pr.exact) > 1e-7 {
		t.Errorf("stop %q, ||w - exact|| = %.3g after %d evaluations", rep.Stop, dist(w, pr.exact), rep.GradEvals)
	}
	if infs == 0 {
		t.Errorf("the barrier was never hit: the test does not exercise the backtracking")
	}
	t.Logf("%d evaluations, %d of them beyond the barrier", rep.GradEvals, infs)
}

// barrierModel returns a loss of +Inf (and a NaN gradient) outside the ball
// of the given radius around a.
type barrierModel struct {
	model.Model
	a      []float64
	radius float64
	hits   *int
}

func (m *barrierModel) LossGrad(w []float64, d model.Data, grad []float64) float64 {
	loss := m.Model.LossGrad(w, d, grad)
	if dist(w, m.a) > m.radius {
		*m.hits++
		for i := range grad {
			grad[i] = math.NaN()
		}
		return math.Inf(1)
	}
	return loss
}
