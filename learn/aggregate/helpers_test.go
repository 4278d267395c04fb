package aggregate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// newRand returns a deterministic generator for the tests.
func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x7e57)) }

// randVec returns d values c + s*N(0,1).
func randVec(rng *rand.Rand, d int, c, s float64) []float64 {
	v := make([]float64, d)
	for i := range v {
		v[i] = c + s*rng.NormFloat64()
	}
	return v
}

// randUpdates returns m updates around global (spread s), with sample counts
// in [1, 100] and anchor gradients of length gl.
func randUpdates(rng *rand.Rand, global []float64, m int, s float64, gl int) []Update {
	ups := make([]Update, m)
	for k := range ups {
		p := make([]float64, len(global))
		for i, g := range global {
			p[i] = g + s*rng.NormFloat64()
		}
		ups[k] = Update{Client: fmt.Sprintf("c%03d", k), Params: p, Samples: 1 + rng.IntN(100),
			AnchorGrad: randVec(rng, gl, 0, 1), Loss: rng.Float64()}
	}
	return ups
}

// constUpdates returns m updates whose params all equal p (copied) and whose
// anchor gradients all equal g.
func constUpdates(m int, p, g []float64) []Update {
	ups := make([]Update, m)
	for k := range ups {
		ups[k] = Update{Client: fmt.Sprintf("c%03d", k), Params: append([]float64(nil), p...),
			Samples: 10, AnchorGrad: append([]float64(nil), g...), Loss: math.NaN()}
	}
	return ups
}

// scaleAll returns c*g and the updates with c times their parameters
// (copies; the inputs are left alone).
func scaleAll(c float64, g []float64, ups []Update) ([]float64, []Update) {
	scale := func(v []float64) []float64 {
		out := make([]float64, len(v))
		for i := range v {
			out[i] = c * v[i]
		}
		return out
	}
	sups := make([]Update, len(ups))
	for k, u := range ups {
		sups[k] = u
		sups[k].Params = scale(u.Params)
	}
	return scale(g), sups
}

func fill(d int, v float64) []float64 {
	s := make([]float64, d)
	for i := range s {
		s[i] = v
	}
	return s
}

// mustNew builds an aggregator from a spec or fails the test.
func mustNew(t testing.TB, spec string) Aggregator {
	t.Helper()
	a, err := NewAggregator(spec, 1)
	if err != nil {
		t.Fatalf("NewAggregator(%q): %v", spec, err)
	}
	return a
}

// aggregate runs a on (global, ups) and fails the test on error.
func aggregate(t testing.TB, a Aggregator, global []float64, ups []Update) ([]float64, Report) {
	t.Helper()
	out := make([]float64, len(global))
	rep, err := a.Aggregate(global, ups, out)
	if err != nil {
		t.Fatalf("%s: %v", a.Name(), err)
	}
	return out, rep
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

// close reports |a-b| <= tol*max(1, |a|, |b|).
func near(a, b, tol float64) bool {
	return math.Abs(a-b) <= tol*max(1, math.Abs(a), math.Abs(b))
}

func maxRelDiff(a, b []float64) float64 {
	var scale, d float64
	for i := range a {
		scale = max(scale, math.Abs(a[i]), math.Abs(b[i]))
	}
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	if scale == 0 {
		return d
	}
	return d / scale
}
