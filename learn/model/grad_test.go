package model

import (
	"fmt"
	"math"
	"testing"

	"gonum.org/v1/gonum/blas"
)

// gradSpecs covers every kind at several shapes, including a single input,
// a single hidden unit, and sizes that make gemm use several tiles.
var gradSpecs = []Spec{
	{Kind: KindLogReg, Inputs: 1, Classes: 2},
	{Kind: KindLogReg, Inputs: 3, Classes: 4},
	{Kind: KindLogReg, Inputs: 7, Classes: 2},
	{Kind: KindBinaryLogReg, Inputs: 1},
	{Kind: KindBinaryLogReg, Inputs: 5},
	{Kind: KindLinear, Inputs: 4},
	{Kind: KindMLP, Inputs: 1, Hidden: 1, Classes: 2, Activation: ActivationReLU},
	{Kind: KindMLP, Inputs: 4, Hidden: 3, Classes: 3, Activation: ActivationReLU},
	{Kind: KindMLP, Inputs: 3, Hidden: 5, Classes: 2, Activation: ActivationTanh},
	{Kind: KindMLP, Inputs: 2, Hidden: 70, Classes: 3, Activation: ActivationTanh},
	{Kind: KindMLP, Inputs: 2, Hidden: 200, Classes: 2, Activation: ActivationReLU},
	// Last, so that the draws of the cases above stay as they were.
	{Kind: KindMLP, Inputs: 3, Hidden: 5, Classes: 2, Activation: ActivationTanh, Head: 2}, // FedSiam-DA's prediction head: only L2 reaches it
}

// TestGradientFiniteDifferences compares LossGrad's gradient with central
// differences of its loss, with and without L2, for batches of 0, 1 and more
// samples.
func TestGradientFiniteDifferences(t *testing.T) {
	rng := newRNG(1)
	for _, base := range gradSpecs {
		for _, l2 := range []float64{0, 0.3} {
			for _, n := range []int{0, 1, 9, 250} {
				s := base
				s.L2 = l2
				if n == 250 && s.Hidden < 70 {
					continue // the large batch is there to exercise gemm's tiling
				}
				t.Run(fmt.Sprintf("%s/D%d/H%d/C%d/%s/l2=%v/N%d", s.Kind, s.Inputs, s.Hidden, s.Classes, s.Activation, l2, n), func(t *testing.T) {
					m := mustNew(t, s)
					d := randData(rng, s, n)
					w := randParams(rng, m, 0.7)
					grad := make([]float64, m.NumParams())
					for i := range grad {
						grad[i] = math.NaN() // LossGrad must overwrite, not accumulate
					}
					loss := m.LossGrad(w, d, grad)
					if got := m.LossGrad(w, d, nil); got != loss {
						t.Fatalf("loss without gradient %v, with %v", got, loss)
					}
					if !allFinite(grad) || math.IsNaN(loss) || math.IsInf(loss, 0) {
						t.Fatalf("non-finite loss %v or gradient %v", loss, grad)
					}
					// Every coordinate for small models, a spread of them for
					// the wide ones.
					step := max(1, len(w)/60)
					const h = 1e-5
					for i := 0; i < len(w); i += step {
						wi := w[i]
						w[i] = wi + h
						up := m.LossGrad(w, d, nil)
						w[i] = wi - h
						down := m.LossGrad(w, d, nil)
						w[i] = wi
						fd := (up - down) / (2 * h)
						if !near(grad[i], fd, 1e-6) {
							t.Errorf("param %d: gradient %.10g, finite difference %.10g", i, grad[i], fd)
						}
					}
				})
			}
		}
	}
}

// TestGemmTiling checks the tiled gemm against a naive product for every
// transpose combination, at shapes below, at and above the tile sizes, with
// beta 0 (C holding NaN, which must not leak) and beta 1.
func TestGemmTiling(t *testing.T) {
	rng := newRNG(2)
	dims := []int{1, 3, 64, 65, 193, 250}
	for _, tA := range []blas.Transpose{blas.NoTrans, blas.Trans} {
		for _, tB := range []blas.Transpose{blas.NoTrans, blas.Trans} {
			for _, m := range dims {
				for _, n := range dims {
					for _, k := range []int{0, 1, 5} {
						for _, beta := range []float64{0, 1} {
							a := make([]float64, m*k)
							b := make([]float64, k*n)
							c := make([]float64, m*n)
							for i := range a {
								a[i] = rng.NormFloat64()
							}
							for i := range b {
								b[i] = rng.NormFloat64()
							}
							for i := range c {
								c[i] = math.NaN()
								if beta != 0 {
									c[i] = rng.NormFloat64()
								}
							}
							// a is m×k (or k×m transposed), b is k×n (or n×k).
							at := func(i, l int) float64 {
								if tA == blas.NoTrans {
									return a[i*k+l]
								}
								return a[l*m+i]
							}
							bt := func(l, j int) float64 {
								if tB == blas.NoTrans {
									return b[l*n+j]
								}
								return b[j*k+l]
							}
							want := make([]float64, m*n)
							for i := range m {
								for j := range n {
									s := 0.0
									if beta != 0 {
										s = beta * c[i*n+j]
									}
									for l := range k {
										s += 0.5 * at(i, l) * bt(l, j)
									}
									want[i*n+j] = s
								}
							}
							ga, gb := general(m, k, a), general(k, n, b)
							if tA != blas.NoTrans {
								ga = general(k, m, a)
							}
							if tB != blas.NoTrans {
								gb = general(n, k, b)
							}
							gemm(tA, tB, 0.5, ga, gb, beta, general(m, n, c))
							for i := range c {
								if !near(c[i], want[i], 1e-12) {
									t.Fatalf("tA=%c tB=%c m=%d n=%d k=%d beta=%v: c[%d] = %v, want %v", tA, tB, m, n, k, beta, i, c[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
}
