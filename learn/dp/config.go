package dp

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrDistributed is the error for the distributed mode without secure
// aggregation: its noise shares are only safe inside a secure sum
// (docs/privacy.md, "Threat models").
var ErrDistributed = errors.New("dp: the distributed mode needs secure aggregation (--secagg): each site's noise share is only safe inside a secure sum (docs/privacy.md, \"Threat models\")")

// ParseMode parses a --dp value: off (or empty), central, distributed. It
// returns 0 for off.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "off":
		return 0, nil
	case "central":
		return Central, nil
	case "distributed":
		return Distributed, nil
	}
	return 0, fmt.Errorf("dp: unknown mode %q (want off, central or distributed)", s)
}

// Config is a run's central-DP setting (docs/privacy.md, "The mechanism
// per round"): what `simulate` and the aggregator are configured with and
// what the aggregator announces. The zero value is "no DP".
type Config struct {
	// Clip is C, the L2 bound of one site's update.
	Clip float64 `json:"clip"`
	// Noise is the noise multiplier z: the noise on the sum of clipped
	// updates has standard deviation z*C.
	Noise float64 `json:"noise_multiplier"`
	// Delta is the delta of the (epsilon, delta) the run reports.
	Delta float64 `json:"delta"`
	// Budget, when > 0, is the epsilon the run may not exceed: it stops
	// before a round that would.
	Budget float64 `json:"epsilon_budget,omitempty"`
	// Distributed: the sites add the noise in shares inside secure
	// aggregation (SiteStd, docs/privacy.md "Threat models"); false: the
	// aggregator adds it (central).
	Distributed bool `json:"distributed,omitempty"`
	// Adaptive, when set, is adaptive clipping (docs/privacy.md, "The
	// mechanism per round", step 3): Clip is then the first round's C,
	// each later round's follows Adaptive.Next from the noised clip bits,
	// and the updates' noise multiplier is UpdateNoise() > Noise so that
	// updates and bits together cost Noise, which the accountant charges.
	Adaptive *Adaptive `json:"adaptive,omitempty"`
	// FixedRounds: every round closes at its deadline, never earlier, so
	// its length does not depend on how many sites were drawn (central
	// mode's private selection; docs/privacy.md, "What still leaks",
	// "Round timing"). Without it a round closes once every invited site
	// has reported, and an empty round at once.
	FixedRounds bool `json:"fixed_rounds,omitempty"`
	// EarlyClose: central mode without FixedRounds, a round closing once
	// every invited site has reported (an empty draw at once), so that
	// its length tells observers how many sites were drawn and, through
	// the sites' speeds, which. Amplification by subsampling assumes the
	// selection secret, so such rounds are charged at q = 1 (ChargedRate):
	// the figure that holds whatever the timing reveals (docs/privacy.md,
	// "Round timing").
	EarlyClose bool `json:"early_close,omitempty"`
	// Colluders is the distributed mode's collusion bound c: the sites
	// besides the aggregator (and the broker) that the guarantee holds
	// against. Each site knows its own noise share, so c colluding sites
	// can take c shares out of any sum; the shares are sized so that the
	// t - c left in any sum of at least t inputs still carry z*C
	// (uplink.SecAggNoiseShares; docs/privacy.md "Threat models"). 0: the
	// aggregator and the broker only.
	Colluders int `json:"colluders,omitempty"`
}

// Mode is the configuration's mode (Central or Distributed).
func (c Config) Mode() Mode {
	if c.Distributed {
		return Distributed
	}
	return Central
}

// UpdateNoise is the noise multiplier of the update sum: Noise with a fixed
// clip, dp.UpdateNoise(Noise, Adaptive.BitNoise) with adaptive clipping
// (Validate checks it exists).
func (c Config) UpdateNoise() float64 {
	if c.Adaptive == nil {
		return c.Noise
	}
	z, err := UpdateNoise(c.Noise, c.Adaptive.BitNoise)
	if err != nil {
		return math.NaN()
	}
	return z
}

// ChargedRate is the sampling rate the accountant charges for a round
// drawn at rate q: q in the central mode; 1 in the distributed mode, whose
// adversary knows the selection (the aggregator draws it, and under secure
// aggregation the KeyList on the round topic names the round's sites to
// every site), so amplification by subsampling does not hold against it
// and none is claimed (docs/privacy.md, "Sampling rate").
//
// Central rounds that close early (EarlyClose) are charged at 1 too: their
// timing tells the draw's size.
func (c Config) ChargedRate(q float64) float64 {
	if c.Distributed || c.EarlyClose {
		return 1
	}
	return q
}

// Amplified reports whether the accountant's figure is amplified by
// subsampling (a secret Poisson draw whose size nothing publishes): the
// central mode without EarlyClose. Otherwise every round is charged at
// q = 1.
func (c Config) Amplified() bool { return !c.Distributed && !c.EarlyClose }

// HoldsAgainst says whom a distributed-mode epsilon holds against: the
// aggregator (its operator included), the broker and any Colluders sites
// together, each of which knows its own noise share (uplink.SecAggNoiseShares
// sizes the shares for them). "" in the central mode.
func (c Config) HoldsAgainst() string {
	if !c.Distributed {
		return ""
	}
	switch c.Colluders {
	case 0:
		return "the aggregator and the broker, with no site colluding (a site that knows its own noise share sees a sum with less noise than z*C)"
	case 1:
		return "the aggregator, the broker and any one site together"
	}
	return fmt.Sprintf("the aggregator, the broker and any %d sites together", c.Colluders)
}

// On reports whether c asks for DP.
func (c Config) On() bool { return c != Config{} }

// Validate checks an enabled configuration.
func (c Config) Validate() error {
	switch {
	case !(c.Clip > 0) || math.IsInf(c.Clip, 0):
		return fmt.Errorf("dp: the clip norm must be a finite number > 0, got %v", c.Clip)
	case !(c.Noise > 0) || math.IsInf(c.Noise, 0):
		return fmt.Errorf("dp: the noise multiplier must be a finite number > 0, got %v", c.Noise)
	case !(c.Delta > 0 && c.Delta < 1):
		return fmt.Errorf("dp: delta must be in (0, 1), got %v", c.Delta)
	case !(c.Budget >= 0) || math.IsInf(c.Budget, 0):
		return fmt.Errorf("dp: the epsilon budget must be a finite number >= 0 (0: none), got %v", c.Budget)
	case c.Adaptive != nil && c.Distributed:
		return ErrDistributedAdaptive
	case c.FixedRounds && c.Distributed:
		return ErrDistributedFixedRounds
	case c.EarlyClose && (c.FixedRounds || c.Distributed):
		return errors.New("dp: early-closing rounds are central mode without fixed-length rounds")
	case c.Colluders < 0 || (c.Colluders > 0 && !c.Distributed):
		return fmt.Errorf("dp: the collusion bound %d: want >= 0, and only in the distributed mode (the central mode's aggregator sees every update)", c.Colluders)
	case c.Adaptive != nil:
		return c.Adaptive.Validate(c.Noise)
	}
	return nil
}

// ErrDistributedAdaptive refuses adaptive clipping in the distributed mode:
// its clip bits would need their own noised secure sum (the aggregator
// sees no single site's bit there), which is not built (docs/privacy.md,
// "Threat models").
var ErrDistributedAdaptive = errors.New("dp: adaptive clipping in the distributed mode: the clip bits would need their own secure sum with noise shares, which is not built; use a fixed --dp-clip")

// ErrDistributedFixedRounds refuses fixed-length rounds in the distributed
// mode: they hide how many sites a private selection drew, and the
// distributed mode's selection is public (its KeyList names the sites).
var ErrDistributedFixedRounds = errors.New("dp: fixed-length rounds (--dp-fixed-rounds) in the distributed mode, whose selection is published (hint: drop --dp-fixed-rounds)")

// EpsilonAfterStep is the epsilon a (nil: a new accountant) would report
// after one more round at sampling rate q with noise multiplier z; a is
// not changed.
func EpsilonAfterStep(a *Accountant, q, z, delta float64) (float64, error) {
	b := NewAccountant(nil)
	if a != nil {
		b = &Accountant{Orders: a.Orders, RDP: slices.Clone(a.RDP), Rounds: a.Rounds}
	}
	if err := b.Step(q, z); err != nil {
		return 0, err
	}
	eps, _ := b.Epsilon(delta)
	return eps, nil
}

// Within reports whether one more round at sampling rate q keeps a within
// c's budget (always true without a budget), and the epsilon it would
// reach.
func (c Config) Within(a *Accountant, q float64) (bool, float64, error) {
	eps, err := EpsilonAfterStep(a, q, c.Noise, c.Delta)
	if err != nil {
		return false, 0, err
	}
	return c.Budget == 0 || eps <= c.Budget, eps, nil
}
