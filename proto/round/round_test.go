package round

import (
	"context"
	"errors"
	"flag"
	"io"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/proto/wire"
)

func TestValidate(t *testing.T) {
	ok := Run.Params
	cases := []struct {
		name string
		algo string
		mod  func(*Params)
		want string // "" = valid
	}{
		{"run's defaults", FedProx, func(*Params) {}, ""},
		{"zero value, fedprox", FedProx, func(p *Params) { *p = Params{} }, ""},
		{"gamma 0: no target", FedProx, func(p *Params) { p.Gamma = 0 }, ""},
		{"relax 0: Peaceman-Rachford", FedSplit, func(p *Params) { p.Relax = 0 }, ""},
		{"fedprox needs no step", FedProx, func(p *Params) { p.Step = 0 }, ""},
		{"negative mu", FedProx, func(p *Params) { p.Mu = -1 }, "--mu"},
		{"NaN mu", FedProx, func(p *Params) { p.Mu = math.NaN() }, "--mu"},
		{"infinite step", FedSplit, func(p *Params) { p.Step = math.Inf(1) }, "--step"},
		{"fedsplit without a step", FedSplit, func(p *Params) { p.Step = 0 }, "step size"},
		{"fedproxsplit without a step", FedProxSplit, func(p *Params) { p.Step = 0 }, "step size"},
		{"unknown solver", FedProx, func(p *Params) { p.Solver = "adam" }, "--solver"},
		{"gamma above 1", FedProx, func(p *Params) { p.Gamma = 1.5 }, "--gamma"},
		{"relax above 1", FedSplit, func(p *Params) { p.Relax = 2 }, "--relax"},
		{"negative lr", FedProx, func(p *Params) { p.LR = -1 }, "--lr"},
		{"negative batch", FedProx, func(p *Params) { p.Batch = -1 }, "--batch"},
		{"negative epochs", FedProx, func(p *Params) { p.MaxEpochs = -1 }, "--max-epochs"},
		{"infinite seconds", FedProx, func(p *Params) { p.MaxSeconds = math.Inf(1) }, "--max-seconds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := ok
			c.mod(&p)
			err := p.Validate(c.algo)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate = %v, want an error naming %q", err, c.want)
			}
		})
	}
}

// TestWireRoundTrip: what the aggregator announces is what a site reads.
func TestWireRoundTrip(t *testing.T) {
	p := Params{Solver: "lbfgs", Mu: 0.5, Gamma: 1e-4, MaxEpochs: 7, Batch: 32, LR: 0.02, Step: 3, Relax: 0.5, MaxSeconds: 12.5, MaxGradEvals: 99}
	pop := Population{Clients: 4, TotalSamples: 1000}
	w, b := p.ToWire(pop)
	got, gotPop := FromWire(&wire.RoundAnnouncement{Params: w, Budget: b})
	if got != p || gotPop != pop {
		t.Fatalf("round trip: %+v %+v, want %+v %+v", got, gotPop, p, pop)
	}
	if got, pop := FromWire(&wire.RoundAnnouncement{}); got != (Params{}) || pop != (Population{}) {
		t.Fatalf("empty announcement: %+v %+v", got, pop)
	}
}

func TestPrepare(t *testing.T) {
	cases := []struct {
		name    string
		algo    string
		p       Params
		pop     Population
		device  Params
		samples int
		want    proxsolver.Config
		stepJ   float64
	}{
		{"fedprox defaults to sgd, full batch", FedProx, Params{Mu: 0.5}, Population{}, Params{}, 90, proxsolver.Config{Solver: proxsolver.SGD, Mu: 0.5, LR: DefaultLR, Batch: 90}, 0},
		{"fedavg has no prox term", FedAvg, Params{Mu: 0.5, Solver: "sgd", LR: 0.1, Batch: 10}, Population{}, Params{}, 90, proxsolver.Config{Solver: proxsolver.SGD, LR: 0.1, Batch: 10}, 0},
		{"device overrides", FedProx, Params{Mu: 1, Solver: "sgd", LR: 0.1, Batch: 10}, Population{}, Params{Solver: "lbfgs", LR: 0.05, Batch: 32}, 90, proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 1, LR: 0.05, Batch: 32}, 0},
		{"fedsplit: lbfgs, mu 1/s", FedSplit, Params{Step: 2}, Population{}, Params{}, 90, proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 0.5}, 2},
		{"fedsplit: sample-weighted step", FedSplit, Params{Step: 2}, Population{Clients: 3, TotalSamples: 120}, Params{}, 40, proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 0.5}, 2},
		{"fedsplit: a larger site's step", FedSplit, Params{Step: 2}, Population{Clients: 3, TotalSamples: 120}, Params{}, 80, proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 0.25}, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := Prepare(c.algo, c.p, c.pop, c.device, c.samples)
			if err != nil || !reflect.DeepEqual(w.Solver, c.want) || w.StepJ != c.stepJ {
				t.Fatalf("got %+v s_j %v, %v; want %+v s_j %v", w.Solver, w.StepJ, err, c.want, c.stepJ)
			}
			if IsSplit(c.algo) && w.Split.Relax != 1 {
				t.Fatalf("unset relax = %v, want 1", w.Split.Relax)
			}
		})
	}
	if _, err := Prepare(FedSplit, Params{Step: 1e-320}, Population{}, Params{}, 10); err == nil {
		t.Fatal("a step whose inverse overflows: accepted")
	}
	if _, err := Prepare(FedProx, Params{Gamma: 2}, Population{}, Params{}, 10); err == nil {
		t.Fatal("gamma 2: accepted")
	}
}

// TestRegister: the flags carry the table's defaults, a command's note
// names exactly the defaults that differ from run's, and parsing fills the
// parameters.
func TestRegister(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var algo string
	var p Params
	Register(fs, &algo, &p, Run, nil)
	if algo != Run.Algorithm || p != Run.Params {
		t.Fatalf("after Register: %q %+v, want run's", algo, p)
	}
	if err := fs.Parse([]string{"--algorithm", "fedsplit", "--step", "3", "--max-epochs", "4", "--max-seconds", "9"}); err != nil {
		t.Fatal(err)
	}
	want := Run.Params
	want.Step, want.MaxEpochs, want.MaxSeconds = 3, 4, 9
	if algo != FedSplit || p != want {
		t.Fatalf("parsed %q %+v, want fedsplit %+v", algo, p, want)
	}
	if n := Run.Note(FlagAlgorithm, FlagMu); n != "" {
		t.Errorf("run's note %q, want none", n)
	}
	if n := Demo.Note(FlagAlgorithm, FlagSolver, FlagMu, FlagStep, FlagRelax, FlagGamma, FlagLR, FlagBatch, FlagMaxEpochs); n != "Defaults that differ from broker-agg run's: --algorithm fedproxsplit, --solver lbfgs, --step 10, --gamma 1e-06." {
		t.Errorf("demo's note %q", n)
	}
}

// TestSplitStep: the server step is the bounded step's mean of the z; a
// step holding a non-finite value is never taken, x is kept.
func TestSplitStep(t *testing.T) {
	x := []float64{1, 2}
	dst := make([]float64, 2)
	rep, kept, err := SplitStep(dst, x, []split.SiteInput{{Z: []float64{0, 2}}, {Z: []float64{2, 4}}}, math.Inf(1), 0, split.Watch{})
	if err != nil || kept || dst[0] != 1 || dst[1] != 3 || len(rep.Sites) != 2 {
		t.Fatalf("mean: %v %v %v %+v", dst, kept, err, rep)
	}
	_, kept, err = SplitStep(dst, x, []split.SiteInput{{Z: []float64{math.Inf(1), 0}}, {Z: []float64{2, 4}}}, math.Inf(1), 0, split.Watch{})
	if err != nil || !kept || dst[0] != 1 || dst[1] != 2 {
		t.Fatalf("non-finite: dst %v kept %v err %v, want x kept", dst, kept, err)
	}
}

// nanModel is a model whose loss turns NaN from its after-th evaluation.
type nanModel struct {
	model.Model
	calls, after int
}

func (m *nanModel) LossGrad(w []float64, d model.Data, g []float64) float64 {
	m.calls++
	l := m.Model.LossGrad(w, d, g)
	if m.calls >= m.after {
		return math.NaN()
	}
	return l
}

// TestSolveDiverged: a diverged solve takes no step, for the sites and
// simulate alike: the FedProx family sends the received model back, the
// FedSplit family its z_j unchanged, with the divergence reported.
func TestSolveDiverged(t *testing.T) {
	base, err := model.New(model.Spec{Kind: model.KindLogReg, Inputs: 3, Classes: 2})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	d := model.Data{N: 20, D: 3}
	for i := range d.N {
		d.X = append(d.X, rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64())
		d.Y = append(d.Y, float64(i%2))
	}
	x := make([]float64, base.NumParams())
	z := make([]float64, len(x))
	for i := range z {
		z[i] = 0.1 * float64(i+1)
	}
	for _, algo := range []string{FedProx, FedSplit} {
		w, err := Prepare(algo, Params{Mu: 1, Step: 1, Gamma: 1e-6, Solver: proxsolver.LBFGS}, Population{}, Params{}, d.N)
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Solve(context.Background(), &nanModel{Model: base, after: 3}, d, x, z, proxsolver.Budget{MaxEpochs: 5}, rng, false)
		if err != nil || !errors.Is(res.Diverged, proxsolver.ErrDiverged) {
			t.Fatalf("%s: err %v, diverged %v; want the divergence reported", algo, err, res.Diverged)
		}
		want := x
		if IsSplit(algo) {
			want = z
		}
		if !slices.Equal(res.Vec, want) {
			t.Errorf("%s: sent %v, want %v unchanged", algo, res.Vec, want)
		}
	}
}

// TestSolveSplitIsClientStep: FedSplit's client step inside Work.Solve
// (split.Reflect, the prox solve, split.Move, called from here, so that
// nothing below calls back into this package) is split.ClientStep with
// that prox, bit for bit, with and without relaxation.
func TestSolveSplitIsClientStep(t *testing.T) {
	m, err := model.New(model.Spec{Kind: model.KindLogReg, Inputs: 3, Classes: 2})
	if err != nil {
		t.Fatal(err)
	}
	src := rand.New(rand.NewPCG(3, 4))
	d := model.Data{N: 30, D: 3}
	for i := range d.N {
		d.X = append(d.X, src.NormFloat64(), src.NormFloat64(), src.NormFloat64())
		d.Y = append(d.Y, float64(i%2))
	}
	x, z := make([]float64, m.NumParams()), make([]float64, m.NumParams())
	for i := range x {
		x[i], z[i] = src.NormFloat64(), src.NormFloat64()
	}
	for _, relax := range []float64{0, 0.5} {
		w, err := Prepare(FedSplit, Params{Step: 0.5, Relax: relax, Gamma: 1e-3, Solver: proxsolver.LBFGS}, Population{}, Params{}, d.N)
		if err != nil {
			t.Fatal(err)
		}
		b := proxsolver.Budget{MaxEpochs: 4}
		got, err := w.Solve(context.Background(), m, d, x, z, b, rand.New(rand.NewPCG(7, 8)), false)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(7, 8))
		want, _, err := split.ClientStep(x, z, w.StepJ, w.Split, func(v []float64, _ float64) ([]float64, error) {
			s, _, err := proxsolver.Solve(context.Background(), m, d, v, x, w.Solver, b, rng)
			return s, err
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Vec, want) {
			t.Errorf("relax %v: Solve's z_j %v, ClientStep's %v", relax, got.Vec, want)
		}
	}
	if _, err := (Work{Algorithm: FedSplit, Split: split.Params{Step: 1, Relax: 1}, StepJ: 1}).Solve(context.Background(), m, d, x, z[:1], proxsolver.Budget{MaxEpochs: 1}, src, false); !errors.Is(err, split.ErrDim) {
		t.Errorf("z of another dimension: %v, want split.ErrDim", err)
	}
}
