package model

import (
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// Linear is linear least squares with a bias:
// loss = (1/(2n)) sum_i (x_i·w + b - y_i)^2 + (l2/2)(||w||^2 + b^2).
type Linear struct {
	d     int
	l2    float64
	resid []float64
}

// NewLinear returns a least-squares model over d features.
func NewLinear(d int, l2 float64) *Linear { return &Linear{d: d, l2: l2} }

func (m *Linear) Spec() Spec                      { return Spec{Kind: KindLinear, Inputs: m.d, L2: m.l2} }
func (m *Linear) NumParams() int                  { return m.d + 1 }
func (m *Linear) Clone() Model                    { return NewLinear(m.d, m.l2) }
func (m *Linear) Layout() string                  { return "w[0..D) feature weights, then w[D] the bias" }
func (m *Linear) InitParams(*rand.Rand) []float64 { return make([]float64, m.d+1) }

// predictInto writes X w + b into out.
func (m *Linear) predictInto(w []float64, d Data, out []float64) {
	for i := range out {
		out[i] = w[m.d]
	}
	if d.N == 0 {
		return
	}
	x := blas64.General{Rows: d.N, Cols: d.D, Stride: d.D, Data: d.X}
	blas64.Gemv(blas.NoTrans, 1, x, blas64.Vector{N: d.D, Inc: 1, Data: w[:m.d]}, 1, blas64.Vector{N: d.N, Inc: 1, Data: out})
}

func (m *Linear) LossGrad(w []float64, d Data, grad []float64) float64 {
	m.resid = grow(m.resid, d.N)
	m.predictInto(w, d, m.resid)
	var loss float64
	for i, y := range d.Y {
		m.resid[i] -= y
		loss += m.resid[i] * m.resid[i]
	}
	n := float64(max(d.N, 1))
	loss /= 2 * n
	if grad != nil {
		clear(grad)
		if d.N > 0 {
			x := blas64.General{Rows: d.N, Cols: d.D, Stride: d.D, Data: d.X}
			blas64.Gemv(blas.Trans, 1/n, x, blas64.Vector{N: d.N, Inc: 1, Data: m.resid}, 0, blas64.Vector{N: d.D, Inc: 1, Data: grad[:m.d]})
			var s float64
			for _, r := range m.resid {
				s += r
			}
			grad[m.d] = s / n
		}
	}
	return loss + l2Term(m.l2, w, grad)
}

func (m *Linear) Predict(w []float64, d Data, out []float64) { m.predictInto(w, d, out) }

// Score returns R^2 = 1 - SS_res/SS_tot.
func (m *Linear) Score(w []float64, d Data) float64 {
	if d.N == 0 {
		return math.NaN()
	}
	m.resid = grow(m.resid, d.N)
	m.predictInto(w, d, m.resid)
	var mean float64
	for _, y := range d.Y {
		mean += y
	}
	mean /= float64(d.N)
	var ssRes, ssTot float64
	for i, y := range d.Y {
		ssRes += (y - m.resid[i]) * (y - m.resid[i])
		ssTot += (y - mean) * (y - mean)
	}
	if ssTot == 0 {
		if ssRes == 0 {
			return 1
		}
		return 0
	}
	return 1 - ssRes/ssTot
}
