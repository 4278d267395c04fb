package dp

import (
	"math"
	"math/rand/v2"
	"testing"
)

// fedSplitError runs FedSplit (relaxed Peaceman-Rachford, exact prox) on
// scalar quadratics f_j(w) = (1/2)(w - b_j)^2 (curvature 1) with K of m
// sites selected uniformly per round, the aggregator keeping only
// S = sum_j z_j as docs/privacy.md prescribes (S += the participants' z_j
// deltas + N(0, sigma^2), x = S/m), and returns the root-mean-square of
// x_t - x* over seeds at each of ts.
func fedSplitError(m, k int, s, alpha, sigma float64, ts []int, seeds int) []float64 {
	out := make([]float64, len(ts))
	for seed := 0; seed < seeds; seed++ {
		rng := rand.New(rand.NewPCG(uint64(seed), 13))
		noise := NoiseRand(TestKey(uint64(seed)), 0)
		b := make([]float64, m)
		var opt float64
		for j := range b {
			b[j] = 3 * rng.NormFloat64()
			opt += b[j] / float64(m)
		}
		z := make([]float64, m) // every z_j starts at x^0 = 0
		var sum, x float64
		next := 0
		for t := 1; next < len(ts); t++ {
			var deltas float64
			for _, j := range rng.Perm(m)[:k] {
				half := (2*x - z[j] + s*b[j]) / (1 + s) // prox of s f_j at 2x - z_j
				nz := z[j] + 2*alpha*(half-x)
				deltas += nz - z[j]
				z[j] = nz
			}
			sum += deltas + sigma*noise.NormFloat64()
			x = sum / float64(m)
			if t == ts[next] {
				out[next] += (x - opt) * (x - opt)
				next++
			}
		}
	}
	for i := range out {
		out[i] = math.Sqrt(out[i] / float64(seeds))
	}
	return out
}

// docs/privacy.md, "FedSplit": without noise the sum-only aggregator keeps
// FedSplit exact (also with K < m); with noise of std sigma = z*C on every
// round's sum the noise accumulates in S as a random walk, and x_t - x*
// grows like sigma*sqrt(t)/(m*s*lambda) (lambda the curvature, 1 here).
// Run with -v to see the figures quoted there.
func TestFedSplitNoiseDrift(t *testing.T) {
	ts := []int{10, 100, 1000}
	for _, c := range []struct {
		m, k  int
		s     float64
		alpha float64
	}{{10, 10, 1, 1}, {10, 10, 1, 0.5}, {10, 10, 10, 1}, {100, 10, 1, 1}, {100, 10, 1, 0.5}} {
		exact := fedSplitError(c.m, c.k, c.s, c.alpha, 0, ts, 20)
		if exact[2] > 1e-6 {
			t.Errorf("%+v: without noise x is %v from the optimum after 1000 rounds", c, exact[2])
		}
		noisy := fedSplitError(c.m, c.k, c.s, c.alpha, 1, ts, 200)
		for i, n := range ts {
			law := math.Sqrt(float64(n)) / (float64(c.m) * c.s)
			t.Logf("m=%d K=%d s=%v alpha=%v: t=%d rms |x - x*| = %.3f, sigma*sqrt(t)/(m s) = %.3f", c.m, c.k, c.s, c.alpha, n, noisy[i], law)
		}
		// At t = 1000 the random walk dominates: within 25 % of the law
		// (200 seeds: the rms has a relative standard error of 5 %).
		law := math.Sqrt(1000) / (float64(c.m) * c.s)
		if math.Abs(noisy[2]/law-1) > 0.25 {
			t.Errorf("%+v: rms error %v after 1000 rounds, the random-walk law says %v", c, noisy[2], law)
		}
	}
}
