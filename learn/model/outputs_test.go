package model

import (
	"math"
	"testing"
)

// The argmax of Outputs is Predict, and probabilities sum to one.
func TestOutputsAgreeWithPredict(t *testing.T) {
	specs := []Spec{
		{Kind: KindBinaryLogReg, Inputs: 4},
		{Kind: KindLogReg, Inputs: 4, Classes: 3},
		{Kind: KindMLP, Inputs: 4, Classes: 3, Hidden: 5, Activation: ActivationTanh},
		{Kind: KindLinear, Inputs: 4},
	}
	for _, s := range specs {
		rng := newRNG(3)
		m := mustNew(t, s)
		w := randParams(rng, m, 1)
		d := randData(rng, s, 40)
		out, k, err := Outputs(m, w, d)
		if err != nil {
			t.Fatal(err)
		}
		pred := make([]float64, d.N)
		m.Predict(w, d, pred)
		for i := range d.N {
			row := out[i*k : (i+1)*k]
			if k == 1 {
				if row[0] != pred[i] {
					t.Fatalf("%s: row %d value %v, predict %v", s.Kind, i, row[0], pred[i])
				}
				continue
			}
			best, sum := 0, 0.0
			for j, p := range row {
				sum += p
				if p > row[best] {
					best = j
				}
			}
			if math.Abs(sum-1) > 1e-12 || float64(best) != pred[i] {
				t.Fatalf("%s: row %d probabilities %v (sum %v), predict %v", s.Kind, i, row, sum, pred[i])
			}
		}
	}
}
