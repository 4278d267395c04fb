package aggregate

import (
	"math"
	"strings"
	"testing"
)

// TestPoissonRateAndDenominator: the inclusion probability and the DP
// round's fixed denominator, for poisson with and without q and for
// uniform (docs/privacy.md, "Sampling rate").
func TestPoissonRateAndDenominator(t *testing.T) {
	for _, tc := range []struct {
		sel     Selector
		k, n    int
		q       float64
		denom   int
		wantErr bool
	}{
		{Poisson{}, 10, 100, 0.1, 10, false},
		{Poisson{}, 10, 7, 1, 7, false},
		{Poisson{}, 3, 0, 1, 1, false}, // no candidates: SamplingRate's 1, denominator at least 1
		{Poisson{}, 0, 5, 0, 1, false},
		{Poisson{Q: 0.05}, 10, 30, 0.05, 2, false}, // 1.5 rounds to 2
		{Poisson{Q: 0.05}, 10, 5, 0.05, 1, false},  // 0.25: at least 1
		{Poisson{Q: 1}, 2, 9, 1, 9, false},
		{Uniform{}, 10, 100, 0.1, 10, false},
		{Uniform{}, 10, 4, 1, 4, false},
	} {
		if q := SamplingRate(tc.sel, tc.k, tc.n); math.Abs(q-tc.q) > 1e-15 {
			t.Errorf("%s k=%d n=%d: rate %v, want %v", tc.sel.Name(), tc.k, tc.n, q, tc.q)
		}
		if m := DPDenominator(tc.sel, tc.k, tc.n); m != tc.denom {
			t.Errorf("%s k=%d n=%d: denominator %d, want %d", tc.sel.Name(), tc.k, tc.n, m, tc.denom)
		}
	}
}

// TestPoissonDraw: each candidate is drawn with probability q,
// independently (the pair frequency is q^2), the round size varies and is
// sometimes 0, indices are valid and increasing, and a draw always takes
// one number per candidate from the stream, whatever it selects.
func TestPoissonDraw(t *testing.T) {
	const n, trials = 20, 20000
	for _, p := range []Poisson{{}, {Q: 0.3}} {
		k := 4 // poisson without q: 4/20 = 0.2
		q := p.Rate(k, n)
		rng := newRand(5)
		count := make([]int, n)
		pair, empty := 0, 0
		sizes := map[int]bool{}
		for range trials {
			got := p.Select(1, cands(n), k, rng)
			sizes[len(got)] = true
			if len(got) == 0 {
				empty++
			}
			in := map[int]bool{}
			for j, i := range got {
				if i < 0 || i >= n || (j > 0 && got[j-1] >= i) {
					t.Fatalf("%s: bad indices %v", p.Name(), got)
				}
				count[i]++
				in[i] = true
			}
			if in[0] && in[1] {
				pair++
			}
		}
		sd := math.Sqrt(q * (1 - q) / trials)
		for i, c := range count {
			if f := float64(c) / trials; math.Abs(f-q) > 5*sd {
				t.Errorf("%s: candidate %d drawn with frequency %.4f, want %.4f", p.Name(), i, f, q)
			}
		}
		if f := float64(pair) / trials; math.Abs(f-q*q) > 5*math.Sqrt(q*q*(1-q*q)/trials) {
			t.Errorf("%s: candidates 0 and 1 together with frequency %.4f, want q^2 = %.4f", p.Name(), f, q*q)
		}
		if want := math.Pow(1-q, n) * trials; empty == 0 || math.Abs(float64(empty)-want) > 5*math.Sqrt(want) {
			t.Errorf("%s: %d empty rounds, want about %.0f", p.Name(), empty, want)
		}
		if len(sizes) < 5 {
			t.Errorf("%s: round sizes %v barely vary", p.Name(), sizes)
		}
	}
	// Stream use: after a draw the next number is the (n+1)-th.
	for _, q := range []float64{1e-9, 0.5, 1} {
		a, b := newRand(9), newRand(9)
		Poisson{Q: q}.Select(1, cands(7), 3, a)
		for range 7 {
			b.Float64()
		}
		if a.Uint64() != b.Uint64() {
			t.Errorf("q = %v: the draw did not take exactly one number per candidate", q)
		}
	}
	if got := (Poisson{Q: 1}).Select(1, cands(6), 0, newRand(1)); len(got) != 6 {
		t.Errorf("q = 1 selected %v, want every candidate", got)
	}
	if got := (Poisson{}).Select(1, cands(6), 0, newRand(1)); len(got) != 0 {
		t.Errorf("k = 0 selected %v, want none", got)
	}
}

func TestNewSelectorPoisson(t *testing.T) {
	for spec, want := range map[string]string{"poisson": "poisson", "poisson:q=0.1": "poisson:q=0.1", " poisson:q=1 ": "poisson:q=1"} {
		s, err := NewSelector(spec)
		if err != nil || s.Name() != want {
			t.Errorf("NewSelector(%q) = %v, %v; want %s", spec, s, err, want)
		}
	}
	for _, spec := range []string{"poisson:q=0", "poisson:q=1.5", "poisson:q=-0.1", "poisson:q=NaN", "poisson:k=3", "poisson:q=x"} {
		if _, err := NewSelector(spec); err == nil {
			t.Errorf("NewSelector(%q) accepted", spec)
		}
	}
}

func TestCheckDPSelectors(t *testing.T) {
	for _, spec := range []string{"", "poisson", "poisson:q=0.2", "uniform"} {
		if err := CheckDP("mean", spec, false); err != nil {
			t.Errorf("CheckDP(mean, %q): %v", spec, err)
		}
	}
	for _, spec := range []string{"loss", "window", "samples", "poisson:q=2", "bogus"} {
		if err := CheckDP("mean", spec, false); err == nil {
			t.Errorf("CheckDP(mean, %q) accepted", spec)
		}
	}
	// Central DP: poisson only; uniform's q = K/N is not an amplification
	// theorem for drawing exactly K without replacement.
	for _, spec := range []string{"", "poisson", "poisson:q=1"} {
		if err := CheckDP("mean", spec, true); err != nil {
			t.Errorf("central: CheckDP(mean, %q): %v", spec, err)
		}
	}
	if err := CheckDP("mean", "uniform", true); err == nil || !strings.Contains(err.Error(), "Poisson sampling only") {
		t.Errorf("central: CheckDP(mean, uniform): %v", err)
	}
	if err := CheckDP("median", "poisson", true); err == nil || !strings.Contains(err.Error(), "median") {
		t.Errorf("CheckDP(median): %v", err)
	}
}
