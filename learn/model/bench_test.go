package model

import (
	"fmt"
	"testing"
)

// mnistLike is an MNIST-shaped batch: 784 standard-normal features (dense,
// so gonum's skipping of zero inputs does not flatter the numbers), 10
// classes.
var mnistLike = Spec{Kind: KindLogReg, Inputs: 784, Classes: 10, L2: 1e-4}

func BenchmarkLogRegLossGrad(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			rng := newRNG(3)
			m := mustNew(b, mnistLike)
			d := randData(rng, mnistLike, n)
			w := randParams(rng, m, 0.01)
			grad := make([]float64, m.NumParams())
			m.LossGrad(w, d, grad) // grow the scratch buffers
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				m.LossGrad(w, d, grad)
			}
		})
	}
}

// BenchmarkLogRegSGDEpoch is one epoch of mini-batch SGD over 1,000 samples:
// 100 batches of 10 gathered from a shuffled order, each a LossGrad and an
// axpy step.
func BenchmarkLogRegSGDEpoch(b *testing.B) {
	rng := newRNG(4)
	m := mustNew(b, mnistLike)
	data := randData(rng, mnistLike, 1000)
	w := make([]float64, m.NumParams())
	grad := make([]float64, m.NumParams())
	order := make([]int, data.N)
	for i := range order {
		order[i] = i
	}
	var batch Data
	epoch := func() {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for start := 0; start < len(order); start += 10 {
			batch = data.Gather(order[start:start+10], batch)
			m.LossGrad(w, batch, grad)
			for i, g := range grad {
				w[i] -= 0.05 * g
			}
		}
	}
	epoch() // grow the batch and scratch buffers
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		epoch()
	}
}

// BenchmarkMLPLossGrad is a 784-64-10 ReLU network on a 10-sample batch.
func BenchmarkMLPLossGrad(b *testing.B) {
	s := Spec{Kind: KindMLP, Inputs: 784, Hidden: 64, Classes: 10, Activation: ActivationReLU, L2: 1e-4}
	rng := newRNG(5)
	m := mustNew(b, s)
	d := randData(rng, s, 10)
	w := m.InitParams(rng)
	grad := make([]float64, m.NumParams())
	m.LossGrad(w, d, grad)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		m.LossGrad(w, d, grad)
	}
}

// TestSteadyStateAllocs checks that, once its scratch buffers have grown,
// no model allocates in LossGrad, Predict or Score, at MNIST-like sizes
// where an untiled gonum Dgemm would start goroutines.
func TestSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	specs := []Spec{
		mnistLike,
		{Kind: KindBinaryLogReg, Inputs: 784},
		{Kind: KindLinear, Inputs: 784},
		{Kind: KindMLP, Inputs: 784, Hidden: 100, Classes: 10, Activation: ActivationReLU, L2: 1e-4},
		{Kind: KindMLP, Inputs: 50, Hidden: 300, Classes: 10, Activation: ActivationTanh},
	}
	rng := newRNG(6)
	for _, s := range specs {
		m := mustNew(t, s)
		w := m.InitParams(rng)
		grad := make([]float64, m.NumParams())
		big, small := randData(rng, s, 300), randData(rng, s, 10)
		out := make([]float64, big.N)
		for _, d := range []Data{big, small} {
			m.LossGrad(w, big, grad) // the larger batch sizes the buffers
			out := out[:d.N]
			if a := testing.AllocsPerRun(5, func() {
				m.LossGrad(w, d, grad)
				m.LossGrad(w, d, nil)
				m.Predict(w, d, out)
				m.Score(w, d)
			}); a != 0 {
				t.Errorf("%s N=%d: %v allocations per run, want 0", s.Kind, d.N, a)
			}
		}
	}
}

// BenchmarkStep is one fused FedProx SGD step (Stepper) on a batch of 10
// dense samples, for the two models of the PyTorch comparison
// (scripts/bench-torch.sh): the 784-10 logistic regression and the 784-64-10
// ReLU MLP.
func BenchmarkStep(b *testing.B) {
	mlp := Spec{Kind: KindMLP, Inputs: 784, Hidden: 64, Classes: 10, Activation: ActivationReLU, L2: 1e-4}
	for _, s := range []Spec{mnistLike, mlp} {
		b.Run(s.Kind, func(b *testing.B) {
			rng := newRNG(7)
			m := mustNew(b, s)
			d := randData(rng, s, 1000)
			w := m.InitParams(rng)
			anchor := append([]float64(nil), w...)
			st := m.(Stepper)
			var lo int
			order := rng.Perm(d.N)
			st.Step(w, d, order[:10], 0.01, 1, anchor)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				st.Step(w, d, order[lo:lo+10], 0.01, 1, anchor)
				lo = (lo + 10) % d.N
			}
			b.ReportMetric(10*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
