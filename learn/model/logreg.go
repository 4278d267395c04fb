package model

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// LogReg is multinomial logistic regression (softmax cross-entropy) with a
// bias:
//
//	loss = (1/n) sum_i [logsumexp(x_i W + b) - (x_i W + b)_{y_i}] + (l2/2)(||W||^2 + ||b||^2).
//
// Targets are class indices 0..C-1 stored as float64. LossGrad assumes they
// are valid (check with CheckTargets); an invalid one makes the loss NaN.
// LossGrad, Predict and Score panic when w, grad, out or d.D do not match the
// model's shape: those are programmer errors.
type LogReg struct {
	d, c int
	l2   float64
	z    []float64 // n×c logits, then their gradient
	pred []float64 // Score's predictions
	step stepScratch
}

// NewLogReg returns a multinomial logistic regression over inputs features and
// classes classes. It panics when inputs < 1 or classes < 2; New reports
// those as errors instead.
func NewLogReg(inputs, classes int, l2 float64) *LogReg {
	if inputs < 1 || classes < 2 {
		panic(fmt.Sprintf("model: NewLogReg(%d, %d): need inputs >= 1 and classes >= 2", inputs, classes))
	}
	return &LogReg{d: inputs, c: classes, l2: l2}
}

func (m *LogReg) Spec() Spec {
	return Spec{Kind: KindLogReg, Inputs: m.d, Classes: m.c, L2: m.l2}
}
func (m *LogReg) NumParams() int { return m.d*m.c + m.c }
func (m *LogReg) Clone() Model   { return NewLogReg(m.d, m.c, m.l2) }
func (m *LogReg) Layout() string {
	return fmt.Sprintf("W (%d×%d, row-major: w[f*%d+k] weighs feature f for class k), then b (%d class biases)", m.d, m.c, m.c, m.c)
}

// InitParams returns zeros: the objective is convex, so no symmetry needs
// breaking.
func (m *LogReg) InitParams(*rand.Rand) []float64 { return make([]float64, m.NumParams()) }

// logits writes X W + b into m.z and returns it.
//
// Both products keep X as the A operand, whose zero entries the kernels
// (productNN, productTN, and gonum's where they run) skip: on ARM that beats
// transposing W to get long dot products, by about 3x on MNIST-like inputs
// that are mostly 0.
func (m *LogReg) logits(w []float64, d Data) []float64 {
	checkShape("LogReg", m.NumParams(), m.d, w, d)
	m.z = grow(m.z, d.N*m.c)
	setRows(m.z, w[m.d*m.c:])
	if d.N > 0 {
		productNN(d.N, m.c, m.d, d.X, w[:m.d*m.c], m.z, true)
	}
	return m.z
}

func (m *LogReg) LossGrad(w []float64, d Data, grad []float64) float64 {
	if grad != nil {
		checkLen("LogReg gradient", len(grad), m.NumParams())
	}
	z := m.logits(w, d)
	loss := softmaxXent(z, m.c, d.Y[:d.N], grad != nil)
	if grad != nil {
		// z now holds dLoss/dlogits: dW = Xᵀ G, db = column sums of G.
		productTN(m.d, m.c, d.N, d.X, z, grad[:m.d*m.c], false)
		gb := grad[m.d*m.c:]
		clear(gb)
		addColSums(gb, z)
	}
	return loss + l2Term(m.l2, w, grad)
}

// Predict writes the most likely class of every sample (the lowest index on
// ties).
func (m *LogReg) Predict(w []float64, d Data, out []float64) {
	checkLen("LogReg predictions", len(out), d.N)
	argmaxRows(m.logits(w, d), m.c, out)
}

// Score returns the accuracy, NaN for an empty batch.
func (m *LogReg) Score(w []float64, d Data) float64 { return predictedAccuracy(m, &m.pred, w, d) }

// argmaxRows writes the column index of every row's largest entry.
func argmaxRows(z []float64, c int, out []float64) {
	for i := range out {
		row := z[i*c : (i+1)*c]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		out[i] = float64(best)
	}
}

// predictor is what a classifier's Score needs of it.
type predictor interface {
	Predict(w []float64, d Data, out []float64)
}

// predictedAccuracy is a classifier's Score: the accuracy of its
// predictions (written to *buf, grown as needed), NaN for an empty batch.
func predictedAccuracy(c predictor, buf *[]float64, w []float64, d Data) float64 {
	*buf = grow(*buf, d.N)
	c.Predict(w, d, *buf)
	return accuracy(*buf, d.Y[:d.N])
}

func accuracy(pred, y []float64) float64 {
	if len(y) == 0 {
		return math.NaN()
	}
	var ok int
	for i, p := range pred {
		if p == y[i] {
			ok++
		}
	}
	return float64(ok) / float64(len(y))
}

// checkShape panics when w or d do not fit a model with np parameters over
// dim features.
func checkShape(name string, np, dim int, w []float64, d Data) {
	if len(w) != np {
		panic(fmt.Sprintf("model: %s has %d parameters, got a vector of %d", name, np, len(w)))
	}
	if d.N > 0 && d.D != dim {
		panic(fmt.Sprintf("model: %s expects %d features, data has %d", name, dim, d.D))
	}
	if len(d.X) < d.N*d.D || len(d.Y) < d.N {
		panic(fmt.Sprintf("model: %s: data %d×%d has %d features and %d targets", name, d.N, d.D, len(d.X), len(d.Y)))
	}
}

func checkLen(what string, got, want int) {
	if got != want {
		panic(fmt.Sprintf("model: %s need length %d, got %d", what, want, got))
	}
}
