package uplink

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/wire"
)

type seeded struct{ r *rand.ChaCha8 }

func (s seeded) Read(p []byte) (int, error) { return s.r.Read(p) }

// TestSecAggRules: the session binds run, round and attempt; the setup
// refuses a wrapping spec; the mean of the ring sum of quantised updates is
// the global model plus the mean update to within the quantiser's step,
// and exactly the dequantised integer sum divided by n.
func TestSecAggRules(t *testing.T) {
	s1, s2, s3 := SecAggSession("R", 1, 0), SecAggSession("R", 1, 1), SecAggSession("R", 2, 0)
	if bytes.Equal(s1, s2) || bytes.Equal(s1, s3) || bytes.Equal(SecAggSession("R1", 1, 0), SecAggSession("R", 0x31, 0)) {
		t.Fatal("sessions of different rounds or attempts collide")
	}
	sb, err := SecAggScaleBits(1, 10)
	if err != nil || sb < 20 {
		t.Fatalf("scale bits %d %v", sb, err)
	}
	sp := &wire.SecAggSpec{Threshold: 7, Clip: 1, ScaleBits: uint32(sb), MaxSites: 10}
	_, q, err := SecAggSetup(sp, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := SecAggSetup(&wire.SecAggSpec{Threshold: 7, Clip: 1, ScaleBits: 30, MaxSites: 1000}, 4); err == nil {
		t.Fatal("a spec whose sum wraps accepted")
	}
	rnd := seeded{rand.NewChaCha8([32]byte{1})}
	x := []float64{0.5, -0.25, 0, 3}
	ws := [][]float64{{0.6, -0.3, 0.1, 3.5}, {0.4, -0.2, -2, 3}, {0.5, -0.25, 0.2, 2.9}}
	var ins [][]uint32
	want := make([]float64, 4)
	for _, w := range ws {
		in, err := SecAggInput(q, w, x, rnd)
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
		for i := range w {
			want[i] += math.Max(-1, math.Min(1, w[i]-x[i])) / 3
		}
	}
	sum := SecAggPlainSum(ins, 4)
	got, err := SecAggMean(q, x, sum, 3)
	if err != nil {
		t.Fatal(err)
	}
	step := math.Ldexp(1, -sb)
	for i := range got {
		exact := 0.0
		for _, in := range ins {
			exact += float64(secagg.Signed(in[i]))
		}
		if got[i] != x[i]+math.Ldexp(exact, -sb)/3 {
			t.Fatalf("coordinate %d: %v is not the dequantised integer sum / 3", i, got[i])
		}
		if math.Abs(got[i]-x[i]-want[i]) > step {
			t.Fatalf("coordinate %d: mean update %v, want %v within %v", i, got[i]-x[i], want[i], step)
		}
	}
	if _, err := SecAggMean(q, x, sum, 0); err == nil {
		t.Fatal("a mean of 0 inputs")
	}
	if _, err := SecAggInput(q, []float64{math.Inf(1), 0, 0, 0}, x, rnd); err == nil {
		t.Fatal("an infinite update accepted")
	}
}

// TestSecAggDistributedDP: the sum of t sites' noise shares has standard
// deviation z C (empirically, over many coordinates, within 3 %); a site's
// clipped, noiseless contribution stays within C after the rounding; the
// quantiser's range holds the clip and six share deviations.
func TestSecAggDistributedDP(t *testing.T) {
	const (
		clip, z = 0.5, 1.2
		sites   = 4 // the threshold: shares are sized for it
		dim     = 20000
	)
	std := dp.SiteStd(z, clip, sites)
	r := SecAggDPRange(clip, z, sites)
	if want := clip + 6*std; r != want {
		t.Fatalf("range %v, want %v", r, want)
	}
	sb, err := SecAggScaleBits(r, sites)
	if err != nil {
		t.Fatal(err)
	}
	q, err := secagg.NewQuantizer(r, sb, sites)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float64, dim)
	rnd := seeded{rand.NewChaCha8([32]byte{2})}
	var ins [][]uint32
	for i := range sites {
		in, err := SecAggNoisyInput(q, x, x, clip, std, dp.NoiseRand(dp.TestKey(uint64(i)), 1), rnd)
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
	}
	sum := q.Dequantize(SecAggPlainSum(ins, dim))
	var ss float64
	for _, v := range sum {
		ss += v * v
	}
	got := math.Sqrt(ss / dim)
	if want := z * clip; math.Abs(got-want) > 0.03*want {
		t.Fatalf("the sum's noise has std %v, want z C = %v", got, want)
	}
	// A long update, no noise: clipped to within C after the rounding.
	big := make([]float64, dim)
	for i := range big {
		big[i] = 0.3
	}
	in, err := SecAggNoisyInput(q, big, x, clip, 0, dp.NoiseRand(dp.TestKey(9), 1), rnd)
	if err != nil {
		t.Fatal(err)
	}
	var n2 float64
	for _, v := range q.Dequantize(in) {
		n2 += v * v
	}
	if n := math.Sqrt(n2); n > clip {
		t.Fatalf("a clipped contribution has norm %v > C = %v", n, clip)
	}
	// The share is added after the rounding, on the ring's integers: the
	// noised input less the rounded one (same rounding stream) is exactly
	// the discrete Gaussian's draws from the site's noise stream, whatever
	// the update.
	clean, err := SecAggNoisyInput(q, big, x, clip, 0, nil, seeded{rand.NewChaCha8([32]byte{3})})
	if err != nil {
		t.Fatal(err)
	}
	noisy, err := SecAggNoisyInput(q, big, x, clip, std, dp.NoiseRand(dp.TestKey(9), 2), seeded{rand.NewChaCha8([32]byte{3})})
	if err != nil {
		t.Fatal(err)
	}
	g, err := dp.NewDiscreteGaussian(math.Ldexp(std, q.ScaleBits), dp.NoiseRand(dp.TestKey(9), 2))
	if err != nil {
		t.Fatal(err)
	}
	for i := range noisy {
		if d, want := int32(noisy[i]-clean[i]), g.Draw(); int64(d) != want {
			t.Fatalf("coordinate %d: the share is %d, want the discrete Gaussian's %d", i, d, want)
		}
	}
}

// BenchmarkAddRingNoise: a site's discrete-Gaussian share under distributed
// DP for docs/results.md's Fashion-MNIST logistic regression (7,850 values), at
// the scale the aggregator picks for 10 sites, z = 1, C = 1.
func BenchmarkAddRingNoise(b *testing.B) {
	const dim, sites = 7850, 10
	t := SecAggThreshold(sites, 0)
	r := SecAggDPRange(1, 1, t)
	sb, err := SecAggScaleBits(r, sites)
	if err != nil {
		b.Fatal(err)
	}
	q, err := secagg.NewQuantizer(r, sb, sites)
	if err != nil {
		b.Fatal(err)
	}
	in := make([]uint32, dim)
	std := dp.SiteStd(1, 1, t)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := AddRingNoise(q, in, std, dp.NoiseRand(dp.TestKey(1), uint64(i))); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSecAggNoiseShares: the noise is split into t - c shares, so that a
// sum of t inputs less c shares still holds one whole z*C; c >= t refused.
func TestSecAggNoiseShares(t *testing.T) {
	for _, tc := range []struct{ t, c, want int }{
		{2, 0, 2}, {2, 1, 1}, {3, 1, 2}, {67, 1, 66}, {67, 10, 57}, {2, 2, 0}, {3, 5, 0}, {3, -1, 0},
	} {
		k, err := SecAggNoiseShares(tc.t, tc.c)
		if k != tc.want || (err != nil) != (tc.want == 0) {
			t.Errorf("SecAggNoiseShares(%d, %d) = %d, %v; want %d", tc.t, tc.c, k, err, tc.want)
		}
		if err == nil && float64(tc.t-tc.c)/float64(k) < 1 {
			t.Errorf("t %d c %d: %d shares leave %.3f of the variance", tc.t, tc.c, k, float64(tc.t-tc.c)/float64(k))
		}
	}
}
