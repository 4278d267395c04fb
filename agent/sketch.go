package agent

import "math"

// sketch is the random-projection sketch of the anchor gradient a round asks
// for (wire.SketchSpec): the same function as aggregate.Sketch, copied so
// that edge-agent does not link the server-side aggregate package and its
// gonum/mat dependency. TestSketchMatchesAggregate keeps the two identical.
func sketch(grad []float64, dim int, seed uint64) []float64 {
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
