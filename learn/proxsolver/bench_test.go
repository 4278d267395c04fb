package proxsolver

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
)

// Benchmarks on an MNIST-shaped client: 1,000 samples × 784 features × 10
// classes, multinomial logistic regression (7,850 parameters), mu = 0.01.
//
//	go test -run '^$' -bench . -benchmem ./learn/proxsolver/
const (
	benchN, benchD, benchC = 1000, 784, 10
	benchMu                = 0.01
	benchL2                = 1e-4
	benchBatch             = 10
	benchLR                = 0.05
)

// mnistLike draws n MNIST-shaped samples: pixels in [0, 1], about 80% of them
// zero. Each class has a prototype of about 150 "ink" pixels; a sample lights
// each of its class's pixels with probability 0.7 and any other pixel with
// probability 0.05, so the classes overlap.
func mnistLike(rng *rand.Rand, n int) model.Data {
	protos := make([][]bool, benchC)
	for c := range protos {
		protos[c] = make([]bool, benchD)
		for j := range protos[c] {
			protos[c][j] = rng.Float64() < 150.0/benchD
		}
	}
	d := model.Data{N: n, D: benchD, X: make([]float64, n*benchD), Y: make([]float64, n)}
	for i := range n {
		c := rng.IntN(benchC)
		d.Y[i] = float64(c)
		x := d.X[i*benchD : (i+1)*benchD]
		for j := range x {
			p := 0.05
			if protos[c][j] {
				p = 0.7
			}
			if rng.Float64() < p {
				x[j] = 0.5 + 0.5*rng.Float64()
			}
		}
	}
	return d
}

func benchClient() (model.Model, model.Data, []float64) {
	d := mnistLike(rand.New(rand.NewPCG(2024, 1)), benchN)
	m := model.NewLogReg(benchD, benchC, benchL2)
	return m, d, make([]float64, m.NumParams())
}

// BenchmarkSGDEpoch is one pass of FedProx mini-batch SGD (batch 10) over the
// 1,000 samples: 100 mini-batch gradients and proximal steps, nothing else.
func BenchmarkSGDEpoch(b *testing.B) {
	m, d, a := benchClient()
	obj := &objective{m: m, d: d, anchor: a, mu: benchMu}
	r := newSGDRun(obj, newTracker(context.Background(), Budget{}), clone(a), Config{Solver: SGD, Mu: benchMu, LR: benchLR, Batch: benchBatch}, 0)
	rng := rand.New(rand.NewPCG(1, 1))
	if _, err := r.epoch(rng, 0); err != nil { // warm the buffers
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := r.epoch(rng, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(benchN)*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkSolveSGDOneEpoch is a whole Solve with a one-epoch budget: the
// anchor gradient, one SGD epoch and the final measurement (3,000 sample
// gradients).
func BenchmarkSolveSGDOneEpoch(b *testing.B) {
	m, d, a := benchClient()
	cfg := Config{Solver: SGD, Mu: benchMu, LR: benchLR, Batch: benchBatch}
	rng := rand.New(rand.NewPCG(1, 1))
	b.ReportAllocs()
	var rep Report
	for b.Loop() {
		var err error
		if _, rep, err = Solve(context.Background(), m, d, a, nil, cfg, Budget{MaxEpochs: 1}, rng); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rep.SampleGrads), "sample-grads/op")
	b.ReportMetric(float64(benchN)*float64(b.N)/b.Elapsed().Seconds(), "train-samples/s")
}

// BenchmarkToGamma compares L-BFGS and SGD (batch 10) solving the FedProx
// subproblem from the anchor 0 to gamma = 0.01, with the work each needs.
func BenchmarkToGamma(b *testing.B) {
	m, d, a := benchClient()
	for _, bc := range []struct {
		name string
		cfg  Config
	}{
		{"lbfgs", Config{Solver: LBFGS, Mu: benchMu, Gamma: 0.01}},
		{"sgd", Config{Solver: SGD, Mu: benchMu, Gamma: 0.01, LR: benchLR, Batch: benchBatch}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var rep Report
			for b.Loop() {
				// The same seed every time: every op does the same work.
				rng := rand.New(rand.NewPCG(1, 1))
				var err error
				if _, rep, err = Solve(context.Background(), m, d, a, nil, bc.cfg, Budget{MaxEpochs: 500}, rng); err != nil {
					b.Fatal(err)
				}
			}
			if rep.Stop != StopGamma {
				b.Fatalf("stopped by %q at gamma %.3g, not by reaching gamma 0.01", rep.Stop, rep.Gamma)
			}
			b.ReportMetric(float64(rep.GradEvals), "grad-evals/op")
			b.ReportMetric(float64(rep.SampleGrads), "sample-grads/op")
			b.ReportMetric(rep.Epochs, "epochs/op")
			b.ReportMetric(rep.Gamma, "gamma")
		})
	}
}
