package dp

import (
	"math"
	"testing"
)

// TestDiscreteGaussianPMF: for small sigma (one below 1, where the
// discrete Laplace's scale is 1, and two above) the empirical distribution
// of 200,000 draws matches the exact pmf exp(-x^2/(2 sigma^2)) / Z at every
// integer within 5 standard errors, and its variance the pmf's.
func TestDiscreteGaussianPMF(t *testing.T) {
	for i, sigma := range []float64{0.6, 1.5, 3.2} {
		g, err := NewDiscreteGaussian(sigma, NoiseRand(TestKey(uint64(40+i)), 1))
		if err != nil {
			t.Fatal(err)
		}
		const n = 200_000
		counts := map[int64]int{}
		var sum, ssq float64
		for range n {
			x := g.Draw()
			counts[x]++
			sum += float64(x)
			ssq += float64(x) * float64(x)
		}
		lim := int64(12*sigma) + 2
		z, v := 0.0, 0.0
		for x := -lim; x <= lim; x++ {
			w := math.Exp(-float64(x*x) / (2 * sigma * sigma))
			z += w
			v += w * float64(x*x)
		}
		v /= z
		for x := -lim; x <= lim; x++ {
			p := math.Exp(-float64(x*x)/(2*sigma*sigma)) / z
			se := math.Sqrt(p * (1 - p) / n)
			if got := float64(counts[x]) / n; math.Abs(got-p) > 5*se+1e-6 {
				t.Errorf("sigma %v: P(%d) = %.5f, want %.5f (se %.5f)", sigma, x, got, p, se)
			}
		}
		for x := range counts {
			if x < -lim || x > lim {
				t.Errorf("sigma %v: drew %d, beyond 12 sigma", sigma, x)
			}
		}
		mean, variance := sum/n, ssq/n-(sum/n)*(sum/n)
		if math.Abs(mean) > 5*math.Sqrt(v/n) || math.Abs(variance-v)/v > 0.02 {
			t.Errorf("sigma %v: mean %.4f, variance %.4f; want 0, %.4f", sigma, mean, variance, v)
		}
	}
}

// TestDiscreteGaussianLargeSigma: at the distributed mode's scales (a
// share of thousands of grid steps) the draws have mean 0 and standard
// deviation sigma, and the same stream gives the same draws.
func TestDiscreteGaussianLargeSigma(t *testing.T) {
	const sigma, n = 12345.678, 20_000
	g, err := NewDiscreteGaussian(sigma, NoiseRand(TestKey(7), 3))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := NewDiscreteGaussian(sigma, NoiseRand(TestKey(7), 3))
	var sum, ssq float64
	for range n {
		x := g.Draw()
		if y := h.Draw(); y != x {
			t.Fatalf("the same stream drew %d and %d", x, y)
		}
		sum += float64(x)
		ssq += float64(x) * float64(x)
	}
	mean, std := sum/n, math.Sqrt(ssq/n-(sum/n)*(sum/n))
	if math.Abs(mean) > 5*sigma/math.Sqrt(n) || math.Abs(std-sigma)/sigma > 0.03 {
		t.Fatalf("mean %.1f, std %.1f; want 0, %.1f", mean, std, sigma)
	}
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1), 2 * MaxDiscreteSigma} {
		if _, err := NewDiscreteGaussian(bad, nil); err == nil {
			t.Errorf("sigma %v accepted", bad)
		}
	}
}

// TestDistributedTau: tau of Kairouz, Liu & Steinke 2021 at hand-computed
// points, and the share check's threshold.
func TestDistributedTau(t *testing.T) {
	// n = 2: 10 exp(-pi^2 sigma^2).
	if got, want := DistributedTau(1, 2), 10*math.Exp(-math.Pi*math.Pi); math.Abs(got-want) > 1e-18 {
		t.Fatalf("tau(1, 2) = %g, want %g", got, want)
	}
	if DistributedTau(5, 1) != 0 {
		t.Fatal("one site: tau must be 0")
	}
	if err := CheckDistributedShare(1, 10, 1000); err == nil {
		t.Fatal("a share of one grid step accepted")
	}
	if err := CheckDistributedShare(4, 100, 1<<30); err != nil {
		t.Fatalf("a share of 4 grid steps: %v", err)
	}
}
