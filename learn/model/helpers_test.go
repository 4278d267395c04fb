package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

// randData returns n samples of dim standard-normal features with targets
// valid for s: class indices for classifiers, reals for regression.
func randData(rng *rand.Rand, s Spec, n int) Data {
	d := Data{N: n, D: s.Inputs, X: make([]float64, n*s.Inputs), Y: make([]float64, n)}
	for i := range d.X {
		d.X[i] = rng.NormFloat64()
	}
	for i := range d.Y {
		switch s.Kind {
		case KindLinear:
			d.Y[i] = rng.NormFloat64()
		case KindBinaryLogReg:
			d.Y[i] = float64(rng.IntN(2))
		default:
			d.Y[i] = float64(rng.IntN(s.Classes))
		}
	}
	return d
}

func randParams(rng *rand.Rand, m Model, scale float64) []float64 {
	w := make([]float64, m.NumParams())
	for i := range w {
		w[i] = scale * rng.NormFloat64()
	}
	return w
}

func mustNew(t testing.TB, s Spec) Model {
	t.Helper()
	m, err := New(s)
	if err != nil {
		t.Fatalf("New(%+v): %v", s, err)
	}
	return m
}

func near(a, b, tol float64) bool {
	return math.Abs(a-b) <= tol*max(1, math.Abs(a), math.Abs(b))
}

func allFinite(v []float64) bool {
	for _, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return false
		}
	}
	return true
}
