package uplink

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
)

// TestDPClipBothSides: under DP no codec lets a site move the aggregator by
// more than C: what the site records (Frame.Applied) and what the
// aggregator computes (decode, Reclip, Receive) are the same vector bit for
// bit, within C of x, round after round with error feedback, for updates
// far longer than C and within it.
func TestDPClipBothSides(t *testing.T) {
	const c = 0.5
	for _, spec := range codecs {
		for _, scale := range []float64{0.01, 1, 100} {
			t.Run(spec, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, uint64(scale*100)))
				site, server := codec(t, spec), codec(t, spec)
				var residual []float64
				for round := uint64(1); round <= 20; round++ {
					x, w := randVec(rng, 1), randVec(rng, scale)
					for i := range w {
						w[i] += x[i]
					}
					f, err := Encode(site, Update{Round: round, Sent: w, Global: x, Residual: residual, Clip: c}, rand.New(rand.NewPCG(round, 7)))
					if err != nil {
						t.Fatal(err)
					}
					residual = f.Residual
					want := dp.Norm(sub(w, x)) > c
					if f.Clipped.Clipped != want && residual == nil {
						t.Fatalf("round %d: clipped %v, want %v (norm %v)", round, f.Clipped.Clipped, want, f.Clipped.Norm)
					}
					d, err := server.Decode(f.Payload, nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := Reclip(d, c); err != nil {
						t.Fatal(err)
					}
					if n := dp.Norm(d); n > c {
						t.Fatalf("round %d: re-clipped norm %v > %v", round, n, c)
					}
					got, err := Receive(f.Header, d, x, nil)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, f.Applied) {
						t.Fatalf("round %d: the aggregator holds %v, the site recorded %v", round, got, f.Applied)
					}
					// The aggregator's noisy mean of this one update without
					// noise worth the name stays within C of x.
					next, err := NoisyMean(x, []Contribution{{Client: "a", Delta: d}}, Private{Clip: c, Noise: 1e-300, Denominator: 1}, dp.NoiseRand(dp.TestKey(1), round))
					if err != nil {
						t.Fatal(err)
					}
					if n := dp.Norm(sub(next, x)); n > c*(1+1e-12) {
						t.Fatalf("round %d: the aggregate moved x by %v > %v", round, n, c)
					}
				}
			})
		}
	}
}

func sub(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

// TestDPUnclippedUnchanged: an update within C and a lossless codec are
// sent exactly as without DP.
func TestDPUnclippedUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	x, w := randVec(rng, 1), randVec(rng, 1)
	plain, err := Encode(codec(t, "fp32"), Update{Round: 1, Sent: w, Global: x}, nil)
	if err != nil {
		t.Fatal(err)
	}
	private, err := Encode(codec(t, "fp32"), Update{Round: 1, Sent: w, Global: x, Clip: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plain.Payload, private.Payload) || private.Clipped.Clipped {
		t.Fatalf("an update within the clip norm changed under DP")
	}
}

func TestDPRefusals(t *testing.T) {
	x := make([]float64, dim)
	w := slices.Clone(x)
	w[3] = math.NaN()
	if _, err := Encode(codec(t, "fp32"), Update{Round: 1, Sent: w, Global: x, Clip: 1}, nil); !errors.Is(err, dp.ErrNonFinite) {
		t.Fatalf("NaN update: %v, want dp.ErrNonFinite", err)
	}
	if _, err := Encode(codec(t, "fp32"), Update{Split: true, Round: 1, Sent: x, Global: x, Clip: 1}, nil); !errors.Is(err, ErrSplitDP) {
		t.Fatalf("FedSplit update under DP: %v, want ErrSplitDP", err)
	}
	if _, err := NoisyMean(x, nil, Private{Clip: 1, Noise: 1}, nil); err == nil {
		t.Fatal("NoisyMean with denominator 0: no error")
	}
}

// TestNoisyMeanNoise: the released mean is (sum of clipped deltas + noise
// of standard deviation z*C)/m: the empirical standard deviation over many
// coordinates matches z*C/m, the mean matches the clipped sum, and the
// order the contributions come in does not change a bit.
func TestNoisyMeanNoise(t *testing.T) {
	const n, z, c, m = 200000, 1.3, 0.7, 4
	x := make([]float64, n)
	big := make([]float64, n)
	for i := range big {
		big[i] = 1 // norm sqrt(n): clipped to c, so c/sqrt(n) each
	}
	cs := []Contribution{{Client: "b", Delta: slices.Clone(big)}, {Client: "a", Delta: slices.Clone(big)}}
	out, err := NoisyMean(x, cs, Private{Clip: c, Noise: z, Denominator: m}, dp.NoiseRand(dp.TestKey(5), 1))
	if err != nil {
		t.Fatal(err)
	}
	wantMean := 2 * c / math.Sqrt(n) / m
	var s, ss float64
	for _, v := range out {
		s += v
	}
	mean := s / n
	for _, v := range out {
		ss += (v - mean) * (v - mean)
	}
	std := math.Sqrt(ss / (n - 1))
	if want := z * c / m; math.Abs(std-want)/want > 0.01 {
		t.Errorf("noise std %v, want z*C/m = %v", std, want)
	}
	// The mean of n draws of N(wantMean, (zC/m)^2) is within 5 standard errors.
	if se := z * c / m / math.Sqrt(n); math.Abs(mean-wantMean) > 5*se {
		t.Errorf("mean %v, want %v +- %v", mean, wantMean, 5*se)
	}
	rev := []Contribution{{Client: "a", Delta: slices.Clone(big)}, {Client: "b", Delta: slices.Clone(big)}}
	again, err := NoisyMean(x, rev, Private{Clip: c, Noise: z, Denominator: m}, dp.NoiseRand(dp.TestKey(5), 1))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, again) {
		t.Error("the contributions' order changed the noisy mean")
	}
}

// TestNextClip: with noise too small to matter, the clip norm shrinks when
// more than the target quantile of updates fit under it and grows when
// fewer do, by exp(-eta (b - gamma)) with b the unclipped fraction over the
// expected participants; the same stream gives the same step.
func TestNextClip(t *testing.T) {
	a := dp.Adaptive{Quantile: 0.5, LR: 0.2, BitNoise: 1e-12}
	rng := func() *rand.Rand { return dp.BitNoiseRand(dp.TestKey(1), 3) }
	tests := []struct {
		bits []bool
		m    int
		b    float64
	}{
		{[]bool{true, true, true, true}, 4, 1},
		{[]bool{false, false, false, false}, 4, 0},
		{[]bool{true, false}, 4, 0.5}, // 2 of 4 answered: centred sum 0
		{[]bool{true, true}, 4, 0.75}, // 2 of 4 answered, both unclipped: (1/2 + 1/2)/4 above 1/2
		{nil, 4, 0.5},                 // nobody answered
		{[]bool{true, true, false}, 3, 2.0 / 3},
	}
	for _, tt := range tests {
		got, err := NextClip(a, 2, tt.bits, tt.m, rng())
		if err != nil {
			t.Fatal(err)
		}
		if want := 2 * math.Exp(-0.2*(tt.b-0.5)); math.Abs(got-want) > 1e-9 {
			t.Errorf("bits %v of %d: next clip %v, want %v", tt.bits, tt.m, got, want)
		}
	}
	a.BitNoise = 3
	x, _ := NextClip(a, 2, []bool{true}, 4, rng())
	y, _ := NextClip(a, 2, []bool{true}, 4, rng())
	if x != y {
		t.Error("the same stream gave another clip norm")
	}
	if _, err := NextClip(a, 2, nil, 0, rng()); err == nil {
		t.Error("no expected participants was taken")
	}
}
