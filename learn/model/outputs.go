package model

import (
	"fmt"
	"math"
)

// Outputs returns what a model says about each sample of d, row-major with
// width k: class probabilities (k = classes; binary-logreg gives
// [P(0), P(1)], k = 2) for classifiers, the predicted value (k = 1) for
// linear. Used by evaluation and predict; the slice is freshly allocated.
func Outputs(m Model, w []float64, d Data) (out []float64, k int, err error) {
	if len(d.Y) < d.N { // unlabelled rows (predict): the shape checks want targets
		d.Y = make([]float64, d.N)
	}
	switch m := m.(type) {
	case *BinaryLogReg:
		z := m.margins(w, d)
		out = make([]float64, 2*d.N)
		for i, zi := range z {
			p := sigmoid(zi)
			out[2*i], out[2*i+1] = 1-p, p
		}
		return out, 2, nil
	case *LogReg:
		return softmaxRows(m.logits(w, d), m.c), m.c, nil
	case *MLP:
		return softmaxRows(m.forward(w, d), m.c), m.c, nil
	case *Linear:
		out = make([]float64, d.N)
		m.predictInto(w, d, out)
		return out, 1, nil
	}
	return nil, 0, fmt.Errorf("%w: no outputs for model kind %s", ErrSpec, m.Spec().Kind)
}

func softmaxRows(z []float64, c int) []float64 {
	out := make([]float64, len(z))
	for i := 0; i+c <= len(z); i += c {
		row := z[i : i+c]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		s := 0.0
		for j, v := range row {
			e := math.Exp(v - mx)
			out[i+j] = e
			s += e
		}
		for j := range row {
			out[i+j] /= s
		}
	}
	return out
}
