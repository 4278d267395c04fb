package dp

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// z_delta and sigma_b together are a Gaussian mechanism of multiplier z:
// 1/z_delta^2 + 1/(2 sigma_b)^2 = 1/z^2 (Andrew et al. 2021, sec. 3).
func TestUpdateNoise(t *testing.T) {
	for _, c := range []struct{ z, sb float64 }{{1, 0.5 + 1e-9}, {1, 5}, {1.1, 0.6}, {0.5, 100}} {
		zd, err := UpdateNoise(c.z, c.sb)
		if err != nil {
			t.Fatalf("UpdateNoise(%v, %v): %v", c.z, c.sb, err)
		}
		if !(zd > c.z) {
			t.Errorf("z_delta %v not above z %v", zd, c.z)
		}
		if got := 1/(zd*zd) + 1/(4*c.sb*c.sb); math.Abs(got-1/(c.z*c.z)) > 1e-12 {
			t.Errorf("z=%v sigma_b=%v: 1/z_delta^2 + 1/(2 sigma_b)^2 = %v, want %v", c.z, c.sb, got, 1/(c.z*c.z))
		}
	}
	if zd, _ := UpdateNoise(1, 5); math.Abs(zd-1/math.Sqrt(0.99)) > 1e-15 {
		t.Errorf("UpdateNoise(1, 5) = %v", zd)
	}
	for _, c := range []struct{ z, sb float64 }{{1, 0.5}, {1, 0.1}, {0, 1}, {math.Inf(1), 1}, {1, math.Inf(1)}, {1, math.NaN()}} {
		if _, err := UpdateNoise(c.z, c.sb); err == nil {
			t.Errorf("UpdateNoise(%v, %v) accepted", c.z, c.sb)
		}
	}
}

func TestAdaptiveValidate(t *testing.T) {
	ok := Adaptive{Quantile: 0.5, LR: 0.2, BitNoise: 0.5}
	if err := ok.Validate(0.9); err != nil {
		t.Fatal(err)
	}
	for _, a := range []Adaptive{
		{Quantile: 0, LR: 0.2, BitNoise: 1}, {Quantile: 1, LR: 0.2, BitNoise: 1},
		{Quantile: 0.5, LR: 0, BitNoise: 1}, {Quantile: 0.5, LR: math.Inf(1), BitNoise: 1},
		{Quantile: 0.5, LR: 0.2, BitNoise: 0.4},
	} {
		if err := a.Validate(1); err == nil {
			t.Errorf("%+v accepted", a)
		}
	}
}

// The geometric update moves C towards the target quantile of the update
// norms and settles there, with the bit sum privatised as the paper
// prescribes (sigma_b = m/20), from far below and far above.
func TestAdaptiveTracksQuantile(t *testing.T) {
	const sites, m = 1000, 100 // N registered, m expected per round
	rng := rand.New(rand.NewPCG(2021, 3))
	norms := make([]float64, sites)
	for i := range norms {
		norms[i] = math.Exp(rng.NormFloat64()) // log-normal, median 1
	}
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	for _, target := range []float64{0.5, 0.9} {
		want := sorted[int(target*sites)]
		a := Adaptive{Quantile: target, LR: 0.2, BitNoise: float64(m) / 20}
		if err := a.Validate(1); err != nil {
			t.Fatal(err)
		}
		for _, c0 := range []float64{0.01, 100} {
			c := c0
			noise := NoiseRand(TestKey(uint64(target*10)), 0)
			var late []float64
			for round := 0; round < 400; round++ {
				var sum float64
				for _, j := range rng.Perm(sites)[:m] {
					res := Clipped{Norm: norms[j], Clipped: norms[j] > c}
					sum += res.Bit() - 0.5
				}
				sum += a.BitNoise * noise.NormFloat64()
				c = a.Next(c, UnclippedFraction(sum, m))
				if round >= 300 {
					late = append(late, c)
				}
			}
			// Median of the last 100 clip norms: within 15 % of the target
			// quantile (the noise on b has std 1/20, the step is LR*b).
			slices.Sort(late)
			got := late[len(late)/2]
			if math.Abs(got/want-1) > 0.15 {
				t.Errorf("quantile %v from C0=%v: C settles at %v, the quantile is %v", target, c0, got, want)
			}
		}
	}
}

func TestAdaptiveNext(t *testing.T) {
	a := Adaptive{Quantile: 0.5, LR: 0.2}
	if got := a.Next(1, 0.5); got != 1 {
		t.Errorf("at the target C moves to %v", got)
	}
	if got := a.Next(2, 1); math.Abs(got-2*math.Exp(-0.1)) > 1e-15 {
		t.Errorf("all unclipped: %v", got)
	}
	if got := a.Next(2, 0); math.Abs(got-2*math.Exp(0.1)) > 1e-15 {
		t.Errorf("all clipped: %v", got)
	}
	if got := UnclippedFraction(10-0.5*40, 40); got != 0.25 {
		t.Errorf("UnclippedFraction = %v", got)
	}
}

// TestConfigAdaptive: a configuration with adaptive clipping is checked
// against its noise multiplier and raises the update noise to
// UpdateNoise(z, sigma_b); without it the update noise is z.
func TestConfigAdaptive(t *testing.T) {
	c := Config{Clip: 1, Noise: 1.1, Delta: 1e-5}
	if c.UpdateNoise() != 1.1 {
		t.Fatalf("fixed clip: update noise %v", c.UpdateNoise())
	}
	c.Adaptive = &Adaptive{Quantile: 0.5, LR: 0.2, BitNoise: 5}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want, _ := UpdateNoise(1.1, 5)
	if got := c.UpdateNoise(); got != want || !(got > 1.1) {
		t.Fatalf("adaptive: update noise %v, want %v > z", got, want)
	}
	c.Adaptive.BitNoise = 0.5 // 2 sigma_b <= z
	if err := c.Validate(); err == nil {
		t.Fatal("a bit noise too small for z was accepted")
	}
}
