package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
)

// Hidden-layer activations of the MLP.
const (
	ActivationReLU = "relu"
	ActivationTanh = "tanh"
)

// MLP is a one-hidden-layer perceptron with a softmax output:
//
//	h = act(x W1 + b1),  loss = softmax cross-entropy of h W2 + b2, plus (l2/2)||w||^2
//
// over all parameters, biases included. The ReLU's derivative at 0 is taken as
// 0. Targets are class indices 0..C-1; LossGrad assumes they are valid (check
// with CheckTargets) and an invalid one makes the loss NaN. LossGrad, Predict
// and Score panic when w, grad, out or d.D do not match the model's shape:
// those are programmer errors.
type MLP struct {
	d, h, c int
	q       int // prediction head's bottleneck width (0: no head; contrast.go)
	act     string
	l2      float64
	a       []float64 // n×h hidden activations
	da      []float64 // n×h gradient with respect to the hidden pre-activations
	z       []float64 // n×c logits, then their gradient
	pred    []float64 // Score's predictions
	w2t     []float64 // Step's W2 transposed (c×h)
	step    stepScratch
}

// NewMLP returns an MLP with inputs features, hidden units, classes outputs
// and the given hidden activation ("relu" or "tanh").
func NewMLP(inputs, hidden, classes int, activation string, l2 float64) (*MLP, error) {
	s := Spec{Kind: KindMLP, Inputs: inputs, Hidden: hidden, Classes: classes, Activation: activation, L2: l2}
	if err := checkSpec(s); err != nil {
		return nil, err
	}
	return &MLP{d: inputs, h: hidden, c: classes, act: activation, l2: l2}, nil
}

func (m *MLP) Spec() Spec {
	return Spec{Kind: KindMLP, Inputs: m.d, Classes: m.c, Hidden: m.h, Activation: m.act, L2: m.l2, Head: m.q}
}
func (m *MLP) NumParams() int { return m.classifierParams() + m.headParams() }

// classifierParams is the length of W1, b1, W2, b2: the head follows them.
func (m *MLP) classifierParams() int { return m.d*m.h + m.h + m.h*m.c + m.c }

func (m *MLP) headParams() int {
	if m.q == 0 {
		return 0
	}
	return 2*m.h*m.q + 2*m.q + m.h
}

func (m *MLP) Clone() Model {
	return &MLP{d: m.d, h: m.h, c: m.c, q: m.q, act: m.act, l2: m.l2}
}
func (m *MLP) Layout() string {
	s := fmt.Sprintf("W1 (%d×%d, row-major: feature f to hidden unit j at [f*%d+j]), b1 (%d), W2 (%d×%d, row-major: hidden unit j to class k at [j*%d+k]), b2 (%d)",
		m.d, m.h, m.h, m.h, m.h, m.c, m.c, m.c)
	if m.q > 0 {
		s += fmt.Sprintf(", then the prediction head: A (%d×%d), batch norm gamma (%d) and beta (%d), B (%d×%d), b (%d)", m.h, m.q, m.q, m.q, m.q, m.h, m.h)
	}
	return s
}

// offsets of b1, W2 and b2 in the flat vector.
func (m *MLP) offsets() (b1, w2, b2 int) {
	b1 = m.d * m.h
	w2 = b1 + m.h
	b2 = w2 + m.h*m.c
	return
}

// InitParams draws the weights from a normal distribution scaled for the
// activation, He (std sqrt(2/fan_in)) for ReLU and Xavier/Glorot (std
// sqrt(2/(fan_in+fan_out))) for tanh, so activations neither vanish nor blow
// up at the start; biases start at 0. The random weights break the symmetry
// between hidden units.
func (m *MLP) InitParams(rng *rand.Rand) []float64 {
	w := make([]float64, m.NumParams())
	b1, w2, b2 := m.offsets()
	fill := func(dst []float64, fanIn, fanOut int) {
		std := math.Sqrt(2 / float64(fanIn))
		if m.act == ActivationTanh {
			std = math.Sqrt(2 / float64(fanIn+fanOut))
		}
		for i := range dst {
			dst[i] = std * rng.NormFloat64()
		}
	}
	fill(w[:b1], m.d, m.h)
	fill(w[w2:b2], m.h, m.c)
	if m.q > 0 {
		// The head's weights must be random too: a zero head predicts the
		// zero vector, whose cosine similarity is undefined. Batch
		// normalisation starts as the identity (gamma 1, beta 0).
		hA, hG, hB, _ := m.headOffsets()
		fill(w[hA:hG], m.h, m.q)
		fill(w[hB:hB+m.q*m.h], m.q, m.h)
		for i := range m.q {
			w[hG+i] = 1
		}
	}
	return w
}

// forward writes the hidden activations into m.a and the logits into m.z and
// returns the logits.
func (m *MLP) forward(w []float64, d Data) []float64 {
	checkShape("MLP", m.NumParams(), m.d, w, d)
	b1, w2, b2 := m.offsets()
	m.a = grow(m.a, d.N*m.h)
	m.z = grow(m.z, d.N*m.c)
	if d.N == 0 {
		return m.z
	}
	setRows(m.a, w[b1:w2])
	productNN(d.N, m.h, m.d, d.X, w[:b1], m.a, true)
	if m.act == ActivationTanh {
		for i, v := range m.a {
			m.a[i] = math.Tanh(v)
		}
	} else {
		for i, v := range m.a {
			m.a[i] = max(v, 0)
		}
	}
	setRows(m.z, w[b2:b2+m.c])
	productNN(d.N, m.c, m.h, m.a, w[w2:b2], m.z, true)
	return m.z
}

func (m *MLP) LossGrad(w []float64, d Data, grad []float64) float64 {
	z := m.forward(w, d)
	loss := softmaxXent(z, m.c, d.Y[:d.N], grad != nil)
	if grad != nil {
		checkLen("MLP gradient", len(grad), m.NumParams())
		clear(grad)
		if d.N > 0 {
			m.backward(w, d, grad)
		}
	}
	return loss + l2Term(m.l2, w, grad)
}

// backward writes the data term's gradient into the zeroed grad, given the
// forward pass's activations and the logits' gradient in m.z.
func (m *MLP) backward(w []float64, d Data, grad []float64) {
	b1, w2, b2 := m.offsets()
	productTN(m.h, m.c, d.N, m.a, m.z, grad[w2:b2], false)
	addColSums(grad[b2:b2+m.c], m.z)
	m.da = grow(m.da, d.N*m.h)
	if fastFMA {
		// da = G W2ᵀ through the kernel, which reads W2ᵀ by rows.
		m.transposeW2(w[w2:b2])
		productNN(d.N, m.h, m.c, m.z, m.w2t, m.da, false)
	} else {
		gemm(blas.NoTrans, blas.Trans, 1, general(d.N, m.c, m.z), general(m.h, m.c, w[w2:b2]), 0, general(d.N, m.h, m.da))
	}
	// The activation's derivative, from its output: relu' = [a > 0],
	// tanh' = 1 - a^2.
	if m.act == ActivationTanh {
		for i, v := range m.a {
			m.da[i] *= 1 - v*v
		}
	} else {
		for i, v := range m.a {
			if v <= 0 {
				m.da[i] = 0
			}
		}
	}
	productTN(m.d, m.h, d.N, d.X, m.da, grad[:b1], false)
	addColSums(grad[b1:w2], m.da)
}

// Predict writes the most likely class of every sample (the lowest index on
// ties).
func (m *MLP) Predict(w []float64, d Data, out []float64) {
	checkLen("MLP predictions", len(out), d.N)
	argmaxRows(m.forward(w, d), m.c, out)
}

// Score returns the accuracy, NaN for an empty batch.
func (m *MLP) Score(w []float64, d Data) float64 { return predictedAccuracy(m, &m.pred, w, d) }
