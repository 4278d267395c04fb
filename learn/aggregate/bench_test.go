package aggregate

import (
	"fmt"
	"testing"
)

// BenchmarkAggregate measures one aggregation round for m clients of d =
// 7,850 parameters (multinomial logistic regression on MNIST: 784×10 + 10).
// The clustered FedSim is measured with full anchor gradients (d values per
// client) and with 256-dimensional sketches of them.
//
//	go test ./learn/aggregate/ -run '^$' -bench Aggregate -benchtime 3x
func BenchmarkAggregate(b *testing.B) {
	const d = 7850
	specs := []struct{ spec, label string }{
		{"fedavg", "fedavg"},
		{"simprox", "simprox"},
		{"fedsim", "fedsim"},
		{"fedsim-cluster:k=5", "fedsim-cluster-fullgrad"},
		{"fedsim-cluster:k=5", "fedsim-cluster-sketch256"},
		{"fedsiam", "fedsiam"},
		{"median", "median"},
		{"trimmed:beta=0.1", "trimmed"},
	}
	for _, m := range []int{10, 100, 1000} {
		rng := newRand(uint64(m))
		g := randVec(rng, d, 0, 0.1)
		full := randUpdates(rng, g, m, 0.01, d)
		sketched := make([]Update, m)
		for k, u := range full {
			sketched[k] = u
			sketched[k].AnchorGrad = Sketch(u.AnchorGrad, 256, 1)
		}
		for _, s := range specs {
			ups := full
			if s.label == "fedsim-cluster-sketch256" {
				ups = sketched
			}
			b.Run(fmt.Sprintf("%s/m=%d", s.label, m), func(b *testing.B) {
				a := mustNew(b, s.spec)
				out := make([]float64, d)
				for b.Loop() {
					if _, err := a.Aggregate(g, ups, out); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSketch is the client-side cost of sketching a d = 7,850 gradient.
func BenchmarkSketch(b *testing.B) {
	g := randVec(newRand(1), 7850, 0, 1)
	for _, dim := range []int{64, 256} {
		b.Run(fmt.Sprint(dim), func(b *testing.B) {
			for b.Loop() {
				Sketch(g, dim, 1)
			}
		})
	}
}
