package secagg

import (
	"math"
	"strings"
	"testing"
)

func TestQuantizerBound(t *testing.T) {
	cases := []struct {
		clip      float64
		scaleBits int
		sites     int
		bits      int
		ok        bool
	}{
		{1, 20, 1000, 31, true},            // 2*1000*2^20 = 0.98 * 2^31
		{1, 20, 2048, 33, false},           // 2*2048*2^20 = 2^32: one bit too many
		{1, 16, 100, 24, true},             // ceil(log2(2*100*65536+1)) = 24
		{0.5, 24, 255, 32, true},           // 2*255*2^23 < 2^32
		{0.5, 24, 256, 33, false},          // 2*256*2^23 = 2^32
		{1e-3, 30, 10, 25, true},           // B = ceil(1e-3 * 2^30) = 1073742
		{1, 0, 1, 2, true},                 // values -1, 0, 1
		{3.5, 0, 1, 4, true},               // B = 4: [-4, 4] needs 4 bits
		{math.Inf(1), 10, 10, 0, false},    // not finite
		{0, 10, 10, 0, false},              // not positive
		{1, MaxScaleBits + 1, 1, 0, false}, // scale out of range
		{1, 10, 0, 0, false},               // no sites
	}
	for _, c := range cases {
		q, err := NewQuantizer(c.clip, c.scaleBits, c.sites)
		if (err == nil) != c.ok {
			t.Errorf("%+v: err %v", c, err)
			continue
		}
		if c.bits != 0 && q.BitsNeeded() != c.bits {
			t.Errorf("%+v: %d bits", c, q.BitsNeeded())
		}
		if err != nil && c.bits > RingBits && !strings.Contains(err.Error(), "needs") {
			t.Errorf("%+v: unclear error %v", c, err)
		}
	}
	sb, err := MaxScaleBitsFor(1, 100)
	if err != nil || sb != 24 { // 2*100*2^24 < 2^32 <= 2*100*2^25
		t.Fatalf("MaxScaleBitsFor(1, 100) = %d, %v", sb, err)
	}
	if _, err := MaxScaleBitsFor(1e12, 100); err == nil {
		t.Fatal("a clip of 1e12 fits no scale")
	}
}

// TestQuantizerNoWrap sums MaxSites inputs at the clip (the worst case the
// bound allows) and gets the exact integer sum back.
func TestQuantizerNoWrap(t *testing.T) {
	q, err := NewQuantizer(1, 20, 1000)
	if err != nil {
		t.Fatal(err)
	}
	rnd := seeded(1)
	for _, v := range []float64{1, -1, 5, -5, 0.999999} { // 5 is clipped to 1
		sum := make([]uint32, 1)
		for range q.MaxSites {
			x, err := q.Quantize([]float64{v}, rnd)
			if err != nil {
				t.Fatal(err)
			}
			AddRing(sum, x)
		}
		want := float64(q.MaxSites) * math.Max(-1, math.Min(1, v))
		if got := q.Dequantize(sum)[0]; math.Abs(got-want) > float64(q.MaxSites)/(1<<20) {
			t.Fatalf("sum of %d x %g = %g, want %g", q.MaxSites, v, got, want)
		}
	}
	if _, err := q.Quantize([]float64{math.NaN()}, rnd); err == nil {
		t.Fatal("NaN quantised")
	}
}

// TestQuantizerUnbiased checks E[Q(x)] = x*s: the mean of many roundings of
// a value between two grid points is within 5 standard errors of it, and
// every rounding is one of the two neighbours.
func TestQuantizerUnbiased(t *testing.T) {
	q := Quantizer{Clip: 1, ScaleBits: 4, MaxSites: 10}
	rnd := seeded(2)
	for _, x := range []float64{0.3, -0.7123, 0.03125, 1e-9} {
		const n = 40000
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = x
		}
		v, err := q.Quantize(xs, rnd)
		if err != nil {
			t.Fatal(err)
		}
		lo := math.Floor(x * 16)
		var sum float64
		for _, u := range v {
			s := float64(Signed(u))
			if s != lo && s != lo+1 {
				t.Fatalf("%g rounded to %g", x, s)
			}
			sum += s
		}
		p := x*16 - lo
		se := math.Sqrt(p*(1-p)/n) + 1e-12
		if mean := sum / n; math.Abs(mean-x*16) > 5*se {
			t.Fatalf("mean rounding of %g*16 is %g (se %g)", x, mean, se)
		}
	}
}

func TestDequantizeExact(t *testing.T) {
	q := Quantizer{Clip: 1, ScaleBits: 20, MaxSites: 1000}
	sum := []uint32{uint32(0xffffffff), 1 << 20, uint32(1<<31 - 1)}
	got := q.Dequantize(sum)
	want := []float64{-1.0 / (1 << 20), 1, float64(1<<31-1) / (1 << 20)}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%d: %v, want %v", i, got[i], want[i])
		}
	}
}
