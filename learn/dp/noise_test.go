package dp

import (
	"math"
	"testing"
)

// moments returns the sample mean and standard deviation.
func moments(v []float64) (mean, std float64) {
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	var ss float64
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss / float64(len(v)-1))
}

// stdTol is the tolerance on an empirical standard deviation of n normal
// draws relative to the true one: s/sigma is asymptotically N(1, 1/(2n)),
// so 6/sqrt(2n) is six standard errors (a false failure about once in 5e8
// runs for an unlucky seed; the seeds are fixed, so a pass is stable).
func stdTol(n int) float64 { return 6 / math.Sqrt(2*float64(n)) }

// meanTol is six standard errors of the mean of n draws of std sigma.
func meanTol(n int, sigma float64) float64 { return 6 * sigma / math.Sqrt(float64(n)) }

// Central mode: the noise on the sum has standard deviation z*C.
func TestCentralNoiseStd(t *testing.T) {
	const n = 200000
	for _, c := range []struct{ z, c float64 }{{1, 1}, {1.1, 0.5}, {0.7, 10}} {
		v := make([]float64, n)
		AddNoise(v, CentralStd(c.z, c.c), NoiseRand(TestKey(1), 7))
		mean, std := moments(v)
		want := c.z * c.c
		if math.Abs(std/want-1) > stdTol(n) {
			t.Errorf("z=%v C=%v: empirical std %v, want %v within %.2f%%", c.z, c.c, std, want, 100*stdTol(n))
		}
		if math.Abs(mean) > meanTol(n, want) {
			t.Errorf("z=%v C=%v: empirical mean %v, want 0 within %v", c.z, c.c, mean, meanTol(n, want))
		}
	}
}

// Distributed mode: each of K sites adds z*C/sqrt(K) with its own key; the
// sum of the K shares has standard deviation z*C.
func TestDistributedNoiseSumsToCentral(t *testing.T) {
	const d = 100000
	for _, c := range []struct {
		z, c float64
		k    int
	}{{1, 1, 10}, {1.1, 2, 3}, {0.8, 0.1, 50}} {
		sum := make([]float64, d)
		per := SiteStd(c.z, c.c, c.k)
		for j := 0; j < c.k; j++ {
			share := make([]float64, d)
			AddNoise(share, per, NoiseRand(TestKey(uint64(100+j)), 1))
			if _, std := moments(share); math.Abs(std/per-1) > stdTol(d) {
				t.Errorf("K=%d site %d: std %v, want %v", c.k, j, std, per)
			}
			for i := range sum {
				sum[i] += share[i]
			}
		}
		mean, std := moments(sum)
		want := CentralStd(c.z, c.c)
		if math.Abs(std/want-1) > stdTol(d) {
			t.Errorf("K=%d: the sum's std %v, want %v within %.2f%%", c.k, std, want, 100*stdTol(d))
		}
		if math.Abs(mean) > meanTol(d, want) {
			t.Errorf("K=%d: the sum's mean %v", c.k, mean)
		}
	}
	if !math.IsNaN(SiteStd(1, 1, 0)) {
		t.Error("SiteStd with no sites is not NaN")
	}
}

// The noise stream is a function of (key, round) only: reproducible with
// the same key, different across rounds and keys.
func TestNoiseRand(t *testing.T) {
	a, b := NoiseRand(TestKey(1), 3).Uint64(), NoiseRand(TestKey(1), 3).Uint64()
	if a != b {
		t.Fatal("same key and round draw differently")
	}
	seen := map[uint64]bool{a: true}
	for _, r := range []*struct {
		k     uint64
		round uint64
	}{{1, 4}, {2, 3}, {1, 0}} {
		v := NoiseRand(TestKey(r.k), r.round).Uint64()
		if seen[v] {
			t.Errorf("key %d round %d repeats a stream", r.k, r.round)
		}
		seen[v] = true
	}
	if Central.String() != "central" || Distributed.String() != "distributed" || Mode(9).String() != "Mode(9)" {
		t.Error("Mode names")
	}
}
