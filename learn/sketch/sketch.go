// Package sketch owns the seeded random-projection sketch of a gradient that
// a client sends with its update for FedSim clustering. It is its own tiny
// package so that edge-agent computes exactly what the aggregator expects
// without linking the server-side aggregate package (and gonum/mat).
package sketch

import "math"

// Of returns a dim-dimensional random projection of grad, (1/sqrt(dim))
// R grad with R a dim×len(grad) matrix of independent ±1 entries (Achlioptas'
// database-friendly Johnson-Lindenstrauss projection): inner products and
// distances are preserved in expectation, with relative error about
// 1/sqrt(dim). The entries are never stored: each is a bit of a SplitMix64
// hash of (seed, input coordinate, output block), so every client with the
// same seed computes the same projection, on any platform, in O(len(grad) *
// dim) time and O(dim) memory. dim <= 0 gives nil.
//
// Clients send Of(grad f_k(w^t), dim, seed) as Update.AnchorGrad with a
// seed fixed for the federation (or announced with the round); FedSimCluster
// then clusters the sketches.
func Of(grad []float64, dim int, seed uint64) []float64 {
	if dim <= 0 {
		return nil
	}
	out := make([]float64, dim)
	blocks := (dim + 63) / 64
	for i, g := range grad {
		if g == 0 {
			continue
		}
		gb := math.Float64bits(g)
		hi := splitmix(seed ^ splitmix(uint64(i)+0x632be59bd9b4e019))
		for b := range blocks {
			h := splitmix(hi + uint64(b)*0x9e3779b97f4a7c15)
			o := out[b*64 : min(b*64+64, dim)]
			for j := range o {
				// Flip the sign bit of g when bit j of h is set.
				o[j] += math.Float64frombits(gb ^ (h>>uint(j)&1)<<63)
			}
		}
	}
	s := 1 / math.Sqrt(float64(dim))
	for j := range out {
		out[j] *= s
	}
	return out
}

// splitmix is SplitMix64's output function applied to x + golden gamma.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
