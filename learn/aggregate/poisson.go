package aggregate

import (
	"math"
	"math/rand/v2"
)

// Poisson is Poisson sampling (docs/privacy.md, "Sampling rate"): every
// candidate is selected independently with the same probability, so the
// round's size is random (possibly 0) and whether one site is selected
// tells nothing about the others. It is the sampling the privacy
// accountant's amplification by subsampling is proved for (Mironov, Talwar
// & Zhang 2019; McMahan et al. 2018's DP-FedAvg), and `--dp`'s default
// selector.
//
// Q, when > 0, is that probability; Q = 0 (the spec `poisson`) takes
// min(1, k/n) for k requested of n candidates, so a round selects k sites
// on average, as uniform selection of exactly k would.
type Poisson struct {
	Q float64 // in [0, 1]; 0: k/n
}

func (p Poisson) Name() string {
	if p.Q > 0 {
		return "poisson:q=" + ftoa(p.Q)
	}
	return "poisson"
}

// Rate is the probability with which each of n candidates is selected when
// k are requested: Q, or min(1, k/n) for Q = 0 (0 when n or k is 0).
func (p Poisson) Rate(k, n int) float64 {
	if p.Q > 0 {
		return min(p.Q, 1)
	}
	if n <= 0 || k <= 0 {
		return 0
	}
	return min(float64(k)/float64(n), 1)
}

// Select draws one uniform number per candidate, in order, and keeps the
// candidates whose number is below the rate: len(cands) draws whatever the
// outcome, so the stream's later use does not depend on it.
func (p Poisson) Select(_ int, cands []Candidate, k int, rng *rand.Rand) []int {
	q := p.Rate(k, len(cands))
	picked := []int{}
	for i := range cands {
		if rng.Float64() < q {
			picked = append(picked, i)
		}
	}
	return picked
}

// Sampler is a selector whose round size is random: each of n candidates is
// selected independently with probability Rate(k, n), and Select's answer
// is the whole selection (not min(k, n) of them; the coordinator does not
// top it up).
type Sampler interface {
	Selector
	Rate(k, n int) float64
}

// SamplingRate is the probability that a given one of n candidates is
// selected when k are requested from sel: a Sampler's Rate, else
// min(k, n)/n (exact for uniform selection; the rate differential privacy
// charges, docs/privacy.md "Sampling rate"). 1 for n <= 0.
func SamplingRate(sel Selector, k, n int) float64 {
	if n <= 0 {
		return 1
	}
	if s, ok := sel.(Sampler); ok {
		return s.Rate(k, n)
	}
	return float64(min(max(k, 0), n)) / float64(n)
}

// DPDenominator is the fixed denominator m of a central-DP round drawn from
// n candidates with k requested (uplink.Private; docs/privacy.md, "The
// mechanism per round"): a number fixed before anyone answers and not
// depending on which sites the draw picked. For a Sampler it is the
// expected selection size Rate(k, n) * n, rounded, at least 1 (for
// `poisson` without q, k when k <= n); otherwise the selection's size
// min(k, n). Never the realised size of a Poisson draw: that depends on
// whether a given site was drawn, which the amplification argument keeps
// secret.
func DPDenominator(sel Selector, k, n int) int {
	if s, ok := sel.(Sampler); ok {
		return max(int(math.Round(s.Rate(k, n)*float64(max(n, 0)))), 1)
	}
	return max(min(k, n), 1)
}
