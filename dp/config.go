package dp

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrDistributed is the error for the distributed mode until secure
// aggregation is wired into the daemons: its noise shares are only safe
// inside a secure sum (docs/privacy.md, "Threat models").
var ErrDistributed = errors.New("dp: the distributed mode needs secure aggregation (--secagg), which is not wired into the daemons yet; use central (docs/privacy.md, \"Status\")")

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
	// Adaptive, when set, is adaptive clipping (docs/privacy.md, "The
	// mechanism per round", step 3): Clip is then the first round's C,
	// each later round's follows Adaptive.Next from the noised clip bits,
	// and the updates' noise multiplier is UpdateNoise() > Noise so that
	// updates and bits together cost Noise, which the accountant charges.
	Adaptive *Adaptive `json:"adaptive,omitempty"`
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
	case c.Adaptive != nil:
		return c.Adaptive.Validate(c.Noise)
	}
	return nil
}

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
