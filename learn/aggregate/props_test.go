package aggregate

import (
	"errors"
	"math"
	"slices"
	"testing"
)

// specs covers every aggregator and option value that changes the code path.
var specs = []string{
	"fedavg", "mean", "fedprox", "fedsplit-mean",
	"simprox", "simprox:on=updates", "simprox:prev=global", "simprox:softmax=false",
	"simprox:lambda0=1:tau=0.9", "simprox:lambda0=0",
	"fedsim", "fedsim:on=updates",
	"fedsim-cluster:k=1", "fedsim-cluster:k=3", "fedsim-cluster:k=50",
	"fedsiam", "fedsiam:on=updates", "fedsiam:w0=fedavg",
	"median", "trimmed:beta=0", "trimmed:beta=0.2",
	"normbound:mult=1.5", "normbound:bound=0.5:inner=simprox:on=updates",
	"normbound:mult=1:inner=median", "normbound:mult=1:inner=fedsim-cluster:k=2",
	"normbound:mult=2:inner=normbound:bound=1:inner=fedsiam",
}

type input struct {
	name   string
	global []float64
	ups    []Update
}

// hostileInputs are finite inputs chosen to break naive arithmetic.
func hostileInputs() []input {
	rng := newRand(3)
	const d = 9
	g := randVec(rng, d, 0, 1)
	var in []input
	add := func(name string, global []float64, ups []Update) {
		in = append(in, input{name, global, ups})
	}
	add("random", g, randUpdates(rng, g, 6, 0.3, 5))
	add("all zero", fill(d, 0), constUpdates(5, fill(d, 0), fill(4, 0)))
	add("identical to global", g, constUpdates(5, g, fill(4, 1)))
	add("identical, zero global", fill(d, 0), constUpdates(4, g, fill(4, 1)))
	add("single client", g, randUpdates(rng, g, 1, 1, 3))
	add("d=1", []float64{2}, randUpdates(rng, []float64{2}, 5, 1, 2))
	add("d=0", nil, constUpdates(3, nil, fill(2, 1)))
	anti := constUpdates(2, g, fill(3, 1))
	for i := range g {
		anti[1].Params[i] = -g[i]
	}
	anti[1].AnchorGrad = fill(3, -1)
	add("anti-parallel pair", g, anti)
	huge := constUpdates(4, fill(d, math.MaxFloat64), fill(3, math.MaxFloat64))
	for i := range huge[1].Params {
		huge[1].Params[i] = -math.MaxFloat64
		huge[2].Params[i] = math.MaxFloat64 * float64(i%2*2-1)
	}
	huge[1].AnchorGrad = fill(3, -math.MaxFloat64)
	add("max float, mixed signs", fill(d, -math.MaxFloat64), huge)
	add("all max float", fill(d, math.MaxFloat64), constUpdates(3, fill(d, math.MaxFloat64), fill(2, math.MaxFloat64)))
	tiny := randUpdates(rng, fill(d, 0), 5, 1, 3)
	for _, u := range tiny {
		for i := range u.Params {
			u.Params[i] *= 1e-310
		}
		for i := range u.AnchorGrad {
			u.AnchorGrad[i] *= 1e-310
		}
	}
	add("subnormal", fill(d, 5e-324), tiny)
	mixed := randUpdates(rng, g, 5, 1, 3)
	for i := range mixed[0].Params {
		mixed[0].Params[i] *= 1e250
	}
	for i := range mixed[0].AnchorGrad {
		mixed[0].AnchorGrad[i] *= 1e250
	}
	mixed[1].Params = fill(d, 0)
	mixed[2].Params = append([]float64(nil), g...)
	add("mixed scales with zero and global-equal clients", g, mixed)
	far := randUpdates(rng, fill(d, 1e6), 5, 1e-9, 3) // far from origin, close together
	add("far from origin, tiny spread", fill(d, 1e6), far)
	zs := randUpdates(rng, g, 4, 1, 3)
	for i := range zs {
		zs[i].Samples = 0
	}
	add("zero samples", g, zs)
	return in
}

// TestNoNaNOrInf: every aggregator, on every hostile finite input, returns
// a finite model inside the box spanned by the global model and the
// updates, weights that are a probability vector, and finite metrics.
func TestNoNaNOrInf(t *testing.T) {
	for _, spec := range specs {
		for _, in := range hostileInputs() {
			t.Run(spec+"/"+in.name, func(t *testing.T) {
				a := mustNew(t, spec)
				for round := range 2 { // the second round exercises state
					out, rep := aggregate(t, a, in.global, in.ups)
					for i, v := range out {
						lo, hi := in.global[i], in.global[i]
						for _, u := range in.ups {
							lo, hi = min(lo, u.Params[i]), max(hi, u.Params[i])
						}
						// Inside the box up to rounding (a mean of equal
						// values can be an ulp off).
						slack := 4 * eps * max(math.Abs(lo), math.Abs(hi))
						if !finite(v) || v < lo-slack || v > hi+slack {
							t.Fatalf("round %d: out[%d] = %v outside [%v, %v]", round, i, v, lo, hi)
						}
					}
					checkWeights(t, rep.Weights, len(in.ups))
					for k, v := range rep.Metrics {
						if !finite(v) {
							t.Errorf("metric %s = %v", k, v)
						}
					}
				}
			})
		}
	}
}

func checkWeights(t *testing.T, w []float64, m int) {
	t.Helper()
	if w == nil {
		return
	}
	if len(w) != m {
		t.Fatalf("%d weights for %d updates", len(w), m)
	}
	for k, v := range w {
		if !finite(v) || v < 0 || v > 1 {
			t.Fatalf("weight %d = %v", k, v)
		}
	}
	if s := sum(w); math.Abs(s-1) > 1e-12 {
		t.Fatalf("weights sum to %v", s)
	}
}

// TestPermutationEquivariance: reordering the updates reorders the weights
// and leaves the model unchanged, for every aggregator, over two rounds (so
// SimProx's history is involved).
func TestPermutationEquivariance(t *testing.T) {
	rng := newRand(4)
	const d, m = 23, 9
	g := randVec(rng, d, 0.5, 1)
	// Three groups of clients so the clustering has structure to find.
	rounds := make([][]Update, 2)
	for r := range rounds {
		rounds[r] = randUpdates(rng, g, m, 0.2, 6)
		for k := range rounds[r] {
			for i := range rounds[r][k].AnchorGrad {
				rounds[r][k].AnchorGrad[i] = 0.1*rounds[r][k].AnchorGrad[i] + float64(k%3*(i%3))
			}
		}
	}
	for _, spec := range specs {
		t.Run(spec, func(t *testing.T) {
			a, b := mustNew(t, spec), mustNew(t, spec)
			for r, ups := range rounds {
				perm := newRand(uint64(10 + r)).Perm(m)
				pups := make([]Update, m)
				for i, p := range perm {
					pups[i] = ups[p]
				}
				outA, repA := aggregate(t, a, g, ups)
				outB, repB := aggregate(t, b, g, pups)
				if e := maxRelDiff(outA, outB); e > 1e-13 {
					t.Fatalf("round %d: outputs differ by %g", r, e)
				}
				if (repA.Weights == nil) != (repB.Weights == nil) {
					t.Fatalf("weights nil in one run only")
				}
				for i, p := range perm {
					if repA.Weights != nil && !near(repA.Weights[p], repB.Weights[i], 1e-13) {
						t.Fatalf("round %d: weight of %s: %v vs %v", r, ups[p].Client, repA.Weights[p], repB.Weights[i])
					}
					if repA.Clusters != nil && repA.Clusters[p] != repB.Clusters[i] {
						t.Fatalf("round %d: cluster of %s: %d vs %d", r, ups[p].Client, repA.Clusters[p], repB.Clusters[i])
					}
				}
			}
		})
	}
}

// TestInputsNotModified: aggregators must not write to the updates or the
// global model.
func TestInputsNotModified(t *testing.T) {
	rng := newRand(5)
	g := randVec(rng, 11, 0, 1)
	ups := randUpdates(rng, g, 6, 1, 4)
	snapshot := func() []float64 {
		s := slices.Clone(g)
		for _, u := range ups {
			s = append(s, u.Params...)
			s = append(s, u.AnchorGrad...)
		}
		return s
	}
	before := snapshot()
	for _, spec := range specs {
		aggregate(t, mustNew(t, spec), g, ups)
		if !slices.Equal(before, snapshot()) {
			t.Fatalf("%s modified its inputs", spec)
		}
	}
}

// TestInvalidInputs: every aggregator rejects empty, mismatched and
// non-finite input with the shared errors.
func TestInvalidInputs(t *testing.T) {
	g := []float64{1, 2, 3}
	good := constUpdates(2, g, []float64{1})
	bad := func(f func(u []Update)) []Update {
		u := constUpdates(2, g, []float64{1})
		f(u)
		return u
	}
	cases := []struct {
		name   string
		global []float64
		ups    []Update
		out    []float64
		want   error
	}{
		{"no updates", g, nil, make([]float64, 3), ErrNoUpdates},
		{"short out", g, good, make([]float64, 2), ErrDim},
		{"short update", g, bad(func(u []Update) { u[1].Params = u[1].Params[:2] }), make([]float64, 3), ErrDim},
		{"NaN update", g, bad(func(u []Update) { u[0].Params[1] = math.NaN() }), make([]float64, 3), ErrNonFinite},
		{"Inf update", g, bad(func(u []Update) { u[1].Params[0] = math.Inf(-1) }), make([]float64, 3), ErrNonFinite},
		{"NaN global", []float64{1, math.NaN(), 3}, good, make([]float64, 3), ErrNonFinite},
	}
	for _, spec := range specs {
		for _, c := range cases {
			_, err := mustNew(t, spec).Aggregate(c.global, c.ups, c.out)
			if !errors.Is(err, c.want) {
				t.Errorf("%s, %s: err = %v, want %v", spec, c.name, err, c.want)
			}
		}
	}
}
