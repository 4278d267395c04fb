package dp

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// naiveNorm is sqrt(sum of squares), an independent measure (it overflows
// to +Inf for huge values; callers skip those).
func naiveNorm(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

func TestNorm(t *testing.T) {
	for _, c := range []struct {
		name string
		v    []float64
		want float64
	}{
		{"empty", nil, 0},
		{"zeros", []float64{0, 0, 0}, 0},
		{"3-4-5", []float64{3, -4}, 5},
		{"huge", []float64{3e300, 4e300}, 5e300},
		{"tiny", []float64{3e-310, 4e-310}, 5e-310},
		{"overflows float64", []float64{math.MaxFloat64, math.MaxFloat64}, math.Inf(1)},
		{"inf", []float64{1, math.Inf(-1)}, math.Inf(1)},
	} {
		got := Norm(c.v)
		if math.Abs(got-c.want) > 1e-15*c.want && got != c.want {
			t.Errorf("%s: Norm = %v, want %v", c.name, got, c.want)
		}
	}
	if got := Norm([]float64{1, math.NaN()}); !math.IsNaN(got) {
		t.Errorf("Norm with NaN = %v", got)
	}
}

// A non-finite update is refused and left as it was, never clipped into
// something finite.
func TestClipRefusesNonFinite(t *testing.T) {
	for _, v := range [][]float64{
		{math.NaN()}, {1, 2, math.Inf(1)}, {math.Inf(-1), 0}, {1e308, math.NaN(), 1e308},
	} {
		orig := slices.Clone(v)
		_, err := Clip(v, 1)
		if !errors.Is(err, ErrNonFinite) {
			t.Errorf("Clip(%v) error %v, want ErrNonFinite", orig, err)
		}
		for i := range v {
			if math.Float64bits(v[i]) != math.Float64bits(orig[i]) {
				t.Errorf("Clip(%v) changed the refused update to %v", orig, v)
				break
			}
		}
	}
	for _, c := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := Clip([]float64{1}, c); err == nil || errors.Is(err, ErrNonFinite) {
			t.Errorf("Clip with bound %v: error %v, want a bound error", c, err)
		}
	}
}

func TestClipTable(t *testing.T) {
	for _, c := range []struct {
		name    string
		v       []float64
		c       float64
		want    []float64
		norm    float64
		clipped bool
	}{
		{"inside", []float64{0.3, 0.4}, 1, []float64{0.3, 0.4}, 0.5, false},
		{"on the bound", []float64{3, 4}, 5, []float64{3, 4}, 5, false},
		{"scaled", []float64{3, 4}, 1, []float64{0.6, 0.8}, 5, true},
		{"zero", []float64{0, 0}, 1, []float64{0, 0}, 0, false},
		{"empty", []float64{}, 1, []float64{}, 0, false},
	} {
		v := slices.Clone(c.v)
		got, err := Clip(v, c.c)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got.Norm != c.norm || got.Clipped != c.clipped || got.Bit() != map[bool]float64{false: 1, true: 0}[c.clipped] {
			t.Errorf("%s: Clip = %+v (bit %v), want norm %v clipped %v", c.name, got, got.Bit(), c.norm, c.clipped)
		}
		for i := range v {
			if math.Abs(v[i]-c.want[i]) > 1e-15 {
				t.Errorf("%s: clipped to %v, want %v", c.name, v, c.want)
				break
			}
		}
	}
}

// checkClip clips a copy of v to c and checks the contract: the norm is at
// most c (by Norm and, where it does not overflow, by the naive formula),
// an update within the bound is untouched bit for bit, a clipped one is a
// positive multiple of the original with norm close to c.
func checkClip(t *testing.T, v []float64, c float64) {
	t.Helper()
	w := slices.Clone(v)
	res, err := Clip(w, c)
	if err != nil {
		t.Fatalf("Clip(len %d, c=%v): %v", len(v), c, err)
	}
	if n := Norm(w); n > c {
		t.Fatalf("clipped norm %v > bound %v (pre-clip %v)", n, c, res.Norm)
	}
	if n := naiveNorm(w); !math.IsInf(n, 0) && n > c*(1+1e-12) {
		t.Fatalf("clipped norm (naive) %v > bound %v", n, c)
	}
	if !res.Clipped {
		for i := range v {
			if math.Float64bits(v[i]) != math.Float64bits(w[i]) {
				t.Fatalf("an update within the bound was changed")
			}
		}
		if res.Norm > c {
			t.Fatalf("norm %v above bound %v but not clipped", res.Norm, c)
		}
		return
	}
	if !(res.Norm > c) {
		t.Fatalf("clipped although norm %v <= %v", res.Norm, c)
	}
	// Same direction: w = s v with one s in (0, 1], where w is not
	// subnormal (which keeps fewer digits).
	const normal = 1e-300
	var s float64
	for i := range v {
		if v[i] != 0 && math.Abs(w[i]) > normal {
			s = w[i] / v[i]
			break
		}
	}
	for i := range v {
		if v[i] == 0 {
			if w[i] != 0 {
				t.Fatalf("a zero became %v", w[i])
			}
			continue
		}
		if r := w[i] / v[i]; math.Abs(w[i]) > normal && math.Abs(r-s) > 1e-9*s {
			t.Fatalf("clipping changed the direction: ratios %v and %v", s, r)
		}
	}
	// Below the normal range a bound may fall between the representable
	// vectors of v's direction (four entries of the least subnormal have
	// twice its norm); rounding down to zero is then the safe answer.
	if n := Norm(w); n < c*(1-1e-9) && c/res.Norm > 1e-290 && c > normal {
		t.Fatalf("clipped to %v, far below the bound %v", n, c)
	}
}

// Property: random updates of every magnitude, length and bound.
func TestClipNeverExceedsBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	exps := []float64{-320, -300, -150, -10, -1, 0, 1, 10, 150, 300, 307}
	for it := 0; it < 3000; it++ {
		n := []int{1, 2, 3, 10, 100, 1000, 10000}[rng.IntN(7)]
		mag := math.Pow(10, exps[rng.IntN(len(exps))])
		v := make([]float64, n)
		for i := range v {
			switch rng.IntN(10) {
			case 0:
				v[i] = 0
			case 1:
				v[i] = math.MaxFloat64 * (2*rng.Float64() - 1)
			default:
				v[i] = mag * rng.NormFloat64()
			}
			if math.IsInf(v[i], 0) {
				v[i] = math.Copysign(math.MaxFloat64, v[i])
			}
		}
		c := math.Pow(10, 6*rng.Float64()-3)
		checkClip(t, v, c)
	}
}

func FuzzClip(f *testing.F) {
	f.Add(1.0, 2.0, 3.0, 1.0)
	f.Add(1e308, -1e308, 1e308, 1e-3)
	f.Add(5e-324, 0.0, -5e-324, 1e-320)
	f.Add(0.1, 0.2, 0.3, 1e6)
	f.Fuzz(func(t *testing.T, a, b, c, bound float64) {
		v := []float64{a, b, c, a, b, c}
		if !(bound > 0) || math.IsInf(bound, 0) {
			if _, err := Clip(v, bound); err == nil {
				t.Fatalf("bound %v accepted", bound)
			}
			return
		}
		if math.IsNaN(Norm(v)) || math.IsInf(a, 0) || math.IsInf(b, 0) || math.IsInf(c, 0) {
			if _, err := Clip(v, bound); !errors.Is(err, ErrNonFinite) {
				t.Fatalf("non-finite %v: error %v", v, err)
			}
			return
		}
		checkClip(t, v, bound)
	})
}

// TestDistributedMode: the distributed mode claims no amplification (the
// accountant charges q = 1: its adversary knows the selection) and refuses
// adaptive clipping; the central mode charges q.
func TestDistributedMode(t *testing.T) {
	c := Config{Clip: 1, Noise: 1, Delta: 1e-5}
	if q := c.ChargedRate(0.1); q != 0.1 {
		t.Fatalf("central: charged %v, want 0.1", q)
	}
	c.Distributed = true
	if q := c.ChargedRate(0.1); q != 1 {
		t.Fatalf("distributed: charged %v, want 1", q)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Adaptive = &Adaptive{Quantile: 0.5, LR: 0.2, BitNoise: 1}
	if err := c.Validate(); !errors.Is(err, ErrDistributedAdaptive) {
		t.Fatalf("distributed with adaptive clipping: %v", err)
	}
}
