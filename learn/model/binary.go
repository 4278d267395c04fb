package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// BinaryLogReg is binary logistic regression with a bias, labels 0 and 1:
//
//	loss = (1/n) sum_i [log(1 + exp(z_i)) - y_i z_i] + (l2/2)(||w||^2 + b^2),  z_i = x_i·w + b.
//
// LossGrad assumes labels are 0 or 1 (check with CheckTargets); any other
// value is used as-is in the formula above (a label in (0, 1) acts as a soft
// label). LossGrad, Predict and Score panic when w, grad, out or d.D do not
// match the model's shape: those are programmer errors.
type BinaryLogReg struct {
	d    int
	l2   float64
	z    []float64 // n margins, then their gradient
	pred []float64 // Score's predictions
}

// NewBinaryLogReg returns a binary logistic regression over inputs features.
// It panics when inputs < 1; New reports that as an error instead.
func NewBinaryLogReg(inputs int, l2 float64) *BinaryLogReg {
	if inputs < 1 {
		panic(fmt.Sprintf("model: NewBinaryLogReg(%d): need inputs >= 1", inputs))
	}
	return &BinaryLogReg{d: inputs, l2: l2}
}

func (m *BinaryLogReg) Spec() Spec     { return Spec{Kind: KindBinaryLogReg, Inputs: m.d, L2: m.l2} }
func (m *BinaryLogReg) NumParams() int { return m.d + 1 }
func (m *BinaryLogReg) Clone() Model   { return NewBinaryLogReg(m.d, m.l2) }
func (m *BinaryLogReg) Layout() string {
	return fmt.Sprintf("w[0..%d) feature weights, then w[%d] the bias; the model scores class 1", m.d, m.d)
}

// InitParams returns zeros: the objective is convex.
func (m *BinaryLogReg) InitParams(*rand.Rand) []float64 { return make([]float64, m.d+1) }

// margins writes X w + b into m.z and returns it.
func (m *BinaryLogReg) margins(w []float64, d Data) []float64 {
	checkShape("BinaryLogReg", m.d+1, m.d, w, d)
	m.z = grow(m.z, d.N)
	for i := range m.z {
		m.z[i] = w[m.d]
	}
	if d.N > 0 {
		blas64.Gemv(blas.NoTrans, 1, general(d.N, d.D, d.X), blas64.Vector{N: m.d, Inc: 1, Data: w}, 1, blas64.Vector{N: d.N, Inc: 1, Data: m.z})
	}
	return m.z
}

func (m *BinaryLogReg) LossGrad(w []float64, d Data, grad []float64) float64 {
	z := m.margins(w, d)
	n := float64(max(d.N, 1))
	var loss float64
	for i, zi := range z {
		y := d.Y[i]
		// log(1+exp(z)) = max(z, 0) + log1p(exp(-|z|)): exp never overflows.
		loss += max(zi, 0) + math.Log1p(math.Exp(-math.Abs(zi))) - y*zi
		if grad != nil {
			z[i] = (sigmoid(zi) - y) / n
		}
	}
	loss /= n
	if grad != nil {
		checkLen("BinaryLogReg gradient", len(grad), m.d+1)
		clear(grad)
		if d.N > 0 {
			blas64.Gemv(blas.Trans, 1, general(d.N, d.D, d.X), blas64.Vector{N: d.N, Inc: 1, Data: z}, 0, blas64.Vector{N: m.d, Inc: 1, Data: grad[:m.d]})
		}
		for _, g := range z {
			grad[m.d] += g
		}
	}
	return loss + l2Term(m.l2, w, grad)
}

// sigmoid is 1/(1+exp(-z)) evaluated without overflow for either sign.
func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	e := math.Exp(z)
	return e / (1 + e)
}

// Predict writes 1 where the margin is positive and 0 elsewhere (a margin of
// exactly 0 goes to class 0, the lowest index, as LogReg breaks ties).
func (m *BinaryLogReg) Predict(w []float64, d Data, out []float64) {
	checkLen("BinaryLogReg predictions", len(out), d.N)
	for i, zi := range m.margins(w, d) {
		out[i] = 0
		if zi > 0 {
			out[i] = 1
		}
	}
}

// Score returns the accuracy, NaN for an empty batch.
func (m *BinaryLogReg) Score(w []float64, d Data) float64 { return predictedAccuracy(m, &m.pred, w, d) }
