package bundle

import (
	"errors"
	"fmt"
	"math"

	"github.com/edgefl/edgefl/learn/dp"
)

// Privacy is the differential-privacy guarantee of a model trained with
// --dp (docs/privacy.md, "What the guarantee covers"), in a bundle of
// version 2: the mode, the epsilon spent up to the bundle's round at
// Delta, how it was computed (Accountant, Conversion), the mechanism's
// parameters (ClipNorm, NoiseMultiplier), the rounds charged and their
// sampling rates, the budget, and a statement of what it covers. A bundle
// with Privacy carries no evaluation: the sites' held-out figures are not
// covered by the guarantee and stay with the aggregator's operator.
type Privacy struct {
	Mode            string    `json:"mode"`       // "central"
	Unit            string    `json:"unit"`       // "site": add/remove one site with all its rows
	Epsilon         float64   `json:"epsilon"`    // spent by the rounds up to the bundle's
	Delta           float64   `json:"delta"`      // of (epsilon, delta)
	Accountant      string    `json:"accountant"` // AccountantRDP
	Conversion      string    `json:"conversion"` // ConversionBalle2020
	ClipNorm        float64   `json:"clip_norm"`
	NoiseMultiplier float64   `json:"noise_multiplier"`
	Rounds          int       `json:"rounds"`         // rounds charged (= the bundle's round)
	SamplingRates   []dp.Rate `json:"sampling_rates"` // the rounds' sampling rates, in order
	EpsilonBudget   float64   `json:"epsilon_budget,omitempty"`
	Covers          string    `json:"covers"`
}

// The accountant and conversion a Privacy names: the Rényi DP of the
// sampled Gaussian mechanism (Mironov, Talwar & Zhang 2019) composed over
// the rounds, converted to (epsilon, delta) by Balle et al. 2020, Theorem
// 21, at the best of dp.DefaultOrders (dp.Epsilon).
const (
	AccountantRDP       = "rdp-sampled-gaussian"
	ConversionBalle2020 = "balle2020"
	UnitSite            = "site"
)

// CentralCovers is Privacy.Covers of a central-mode run with a schema.
const CentralCovers = "client-level (epsilon, delta)-DP, add/remove one site: every model the aggregator released up to this " +
	"round, this one included. Each site's update clipped to clip_norm; Gaussian noise of std noise_multiplier*clip_norm on their sum, " +
	"drawn by the aggregator (trusted: central mode). Preprocessing declared in the schema (no statistics sent); the sites' " +
	"evaluation reports stay with the aggregator and are not in this bundle. docs/privacy.md"

// The round-timing sentence of a central run's Covers: with fixed-length
// rounds (dp.Config.FixedRounds) the timing is covered, otherwise it is
// stated as not (docs/privacy.md, "What still leaks").
const (
	FixedRoundsCovers   = " Rounds closed at their deadline: their timing does not depend on the draw; epsilon is amplified by the secret Poisson draw (sampling_rates)."
	EarlyRoundsUncovers = " Not covered: round timing (a round closed once every invited site reported), which tells observers how many sites were drawn; see --dp-fixed-rounds."
	// EarlyRoundsCharged: rounds closed early (dp.Config.EarlyClose), and
	// every round was charged at q = 1, which holds whatever their timing
	// tells.
	EarlyRoundsCharged = " Rounds closed once every invited site reported (--dp-fixed-rounds=false), so their timing tells how many sites were drawn: every round is charged at q = 1 (sampling_rates), no amplification by subsampling is claimed."
)

// NewPrivacy is the Privacy of a central-mode run's model after rounds
// rounds, from the run's DP configuration and its charging history rs
// (which must record at least rounds rounds): the accountant replayed over
// the first rounds rounds, as dp.Replay gives it.
func NewPrivacy(c dp.Config, rs []dp.Rate, rounds int) (*Privacy, error) {
	if rounds < 0 {
		return nil, fmt.Errorf("bundle: privacy after %d rounds", rounds)
	}
	pre, err := dp.RatesPrefix(rs, uint64(rounds))
	if err != nil {
		return nil, wrapErr("bundle: privacy", err)
	}
	a, err := dp.Replay(pre, uint64(rounds), nil)
	if err != nil {
		return nil, wrapErr("bundle: privacy", err)
	}
	eps, _ := a.Epsilon(c.Delta)
	if pre == nil {
		pre = []dp.Rate{}
	}
	return &Privacy{Mode: dp.Central.String(), Unit: UnitSite, Epsilon: eps, Delta: c.Delta, Accountant: AccountantRDP,
		Conversion: ConversionBalle2020, ClipNorm: c.Clip, NoiseMultiplier: c.Noise, Rounds: rounds, SamplingRates: pre,
		EpsilonBudget: c.Budget, Covers: centralCovers(c)}, nil
}

func centralCovers(c dp.Config) string {
	switch {
	case c.FixedRounds:
		return CentralCovers + FixedRoundsCovers
	case c.EarlyClose:
		return CentralCovers + EarlyRoundsCharged
	}
	return CentralCovers + EarlyRoundsUncovers
}

// check verifies a Privacy read from a file: known mode, accountant and
// conversion, finite parameters in range, rates that add up to Rounds.
func (p *Privacy) check() error {
	fin := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case p.Mode != dp.Central.String():
		return fmt.Errorf("privacy mode %q, expected %q", p.Mode, dp.Central.String())
	case p.Unit != UnitSite || p.Accountant != AccountantRDP || p.Conversion != ConversionBalle2020:
		return fmt.Errorf("privacy unit %q, accountant %q, conversion %q: unknown", p.Unit, p.Accountant, p.Conversion)
	case !fin(p.Epsilon) || p.Epsilon < 0 || !(p.Delta > 0 && p.Delta < 1):
		return fmt.Errorf("privacy: epsilon %v, delta %v", p.Epsilon, p.Delta)
	case !fin(p.ClipNorm) || !(p.ClipNorm > 0) || !fin(p.NoiseMultiplier) || !(p.NoiseMultiplier > 0):
		return fmt.Errorf("privacy: clip norm %v, noise multiplier %v", p.ClipNorm, p.NoiseMultiplier)
	case !fin(p.EpsilonBudget) || p.EpsilonBudget < 0 || p.Rounds < 0:
		return fmt.Errorf("privacy: budget %v, rounds %d", p.EpsilonBudget, p.Rounds)
	case p.Covers == "":
		return errors.New("privacy: no statement of what it covers")
	}
	for _, r := range p.SamplingRates {
		if !(r.Q > 0 && r.Q <= 1) || !fin(r.Noise) || !(r.Noise > 0) || r.Rounds < 1 {
			return fmt.Errorf("privacy: sampling rate %+v", r)
		}
	}
	if n := dp.RatesRounds(p.SamplingRates); n != uint64(p.Rounds) {
		return fmt.Errorf("privacy: the sampling rates cover %d rounds, not %d", n, p.Rounds)
	}
	return nil
}

// String is the guarantee on one line, for the operator.
func (p *Privacy) String() string {
	s := fmt.Sprintf("%s differential privacy (per %s): epsilon %.4g at delta %g after %d rounds (clip %g, noise multiplier %g",
		p.Mode, p.Unit, p.Epsilon, p.Delta, p.Rounds, p.ClipNorm, p.NoiseMultiplier)
	switch len(p.SamplingRates) {
	case 0:
	case 1:
		s += fmt.Sprintf(", sampling rate %g", p.SamplingRates[0].Q)
	default:
		lo, hi := p.SamplingRates[0].Q, p.SamplingRates[0].Q
		for _, r := range p.SamplingRates {
			lo, hi = min(lo, r.Q), max(hi, r.Q)
		}
		s += fmt.Sprintf(", sampling rates %g..%g", lo, hi)
	}
	if p.EpsilonBudget > 0 {
		s += fmt.Sprintf(", budget %g", p.EpsilonBudget)
	}
	return s + ")"
}
