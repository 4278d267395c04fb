package uplink

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/edgefl/edgefl/learn/dp"
)

// Central differential privacy (docs/privacy.md, "The mechanism per
// round"), both sides, once:
//
//   - the site clips what it would send, u = w - x + residual, to L2 norm C
//     before encoding (ClipDelta, called by Encode when Update.Clip > 0); the
//     error-feedback residual is then what the codec did not send of the
//     clipped vector;
//   - the aggregator clips every decoded delta again (Reclip: quantisation
//     can lengthen a vector, and a faulty site may not clip at all), and
//     Encode repeats that clip, so Frame.Applied is what the aggregator
//     holds, bit for bit;
//   - the aggregator's next model is x + (sum of the re-clipped deltas +
//     N(0, (z C)^2 I)) / m, m the round's fixed denominator (NoisyMean).
//
// This is the FedProx family (fedavg with uniform weights, fedprox); the
// FedSplit family under DP runs in sum mode (sum.go), and the per-site
// copy of z_j (Encode with Update.Split) is refused under DP (ErrSplitDP).

// ErrSplitDP is the error for a FedSplit-family update under DP outside
// sum mode.
var ErrSplitDP = errors.New("differential privacy with the FedSplit family needs sum mode (split_sum): a site's z_j is outside the guarantee (hint: docs/privacy.md, \"FedSplit\")")

// ClipDelta is the site's clip: delta + residual (residual nil, or of
// another length: none) clipped to L2 norm c, in a new slice, with the
// pre-clip norm. A non-finite value is an error (dp.ErrNonFinite), never
// clipped into a finite vector.
func ClipDelta(delta, residual []float64, c float64) ([]float64, dp.Clipped, error) {
	u := slices.Clone(delta)
	if len(residual) == len(u) {
		for i, r := range residual {
			u[i] += r
		}
	}
	cl, err := dp.Clip(u, c)
	if err != nil {
		return nil, cl, wrapErr("uplink: clip the update", err)
	}
	return u, cl, nil
}

// Reclip is the aggregator's clip of a decoded delta d, in place, to L2
// norm c: the clip the privacy proof relies on. A vector already within c
// is unchanged, so a site's own clip followed by Reclip is the site's
// clip.
func Reclip(d []float64, c float64) error {
	if _, err := dp.Clip(d, c); err != nil {
		return wrapErr("uplink: re-clip the update", err)
	}
	return nil
}

// Private is the aggregator's part of a central-DP round.
type Private struct {
	// Clip is C, the L2 bound of one site's contribution (> 0).
	Clip float64
	// Noise is the noise multiplier z: the sum carries N(0, (z C)^2) on
	// every coordinate (> 0).
	Noise float64
	// Denominator is m, the round's fixed denominator: the number of
	// sites invited, never the number that answered nor sample weights
	// (McMahan et al. 2018), so the sensitivity of the mean to one site is
	// C/m whoever answers.
	Denominator int
}

// Contribution is one site's decoded delta in a DP round.
type Contribution struct {
	Client string
	Delta  []float64
}

// NoisyMean is the aggregator's central-DP step: each delta re-clipped to
// p.Clip (in place), summed in client-id order (a deterministic sum, the
// same in `simulate` and the daemon), plus N(0, (p.Noise p.Clip)^2) per
// coordinate drawn from rng (dp.NoiseRand of the round: secret key in the
// daemon, dp.TestKey behind simulate --dp-noise-seed), divided by
// p.Denominator and added to global. A round without contributions still
// releases noise / m: the mechanism's output must not reveal that nobody
// answered. It is PrivateSum over contributions held in memory.
func NoisyMean(global []float64, cs []Contribution, p Private, rng *rand.Rand) ([]float64, error) {
	ps, err := NewPrivateSum(len(global), p)
	if err != nil {
		return nil, err
	}
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b Contribution) int { return strings.Compare(a.Client, b.Client) })
	for _, c := range cs {
		if err := ps.Add(c); err != nil {
			return nil, err
		}
	}
	return ps.Mean(global, rng), nil
}

// PrivateSum is NoisyMean's sum taken one contribution at a time (a
// streamed close holds one decoded delta, not K): the contributions must
// come in client-id order, NoisyMean's summation order.
type PrivateSum struct {
	p    Private
	sum  []float64
	last string
	n    int
}

// NewPrivateSum starts the sum of a round of p over a model of dim values.
func NewPrivateSum(dim int, p Private) (*PrivateSum, error) {
	if p.Denominator < 1 {
		return nil, fmt.Errorf("uplink: DP denominator must be >= 1, got %d", p.Denominator)
	}
	if !(p.Noise > 0) {
		return nil, fmt.Errorf("uplink: DP noise multiplier must be > 0, got %v", p.Noise)
	}
	return &PrivateSum{p: p, sum: make([]float64, dim)}, nil
}

// Add re-clips c's delta to the clip norm, in place, and adds it. Its
// client must sort after the one added before.
func (s *PrivateSum) Add(c Contribution) error {
	if s.n > 0 && c.Client < s.last {
		return fmt.Errorf("uplink: %s after %s: the contributions are summed in client-id order", c.Client, s.last)
	}
	if len(c.Delta) != len(s.sum) {
		return fmt.Errorf("uplink: %s: %d values, a global model of %d", c.Client, len(c.Delta), len(s.sum))
	}
	if err := Reclip(c.Delta, s.p.Clip); err != nil {
		return fmt.Errorf("%s: %w", c.Client, err)
	}
	for i, v := range c.Delta {
		s.sum[i] += v
	}
	s.last, s.n = c.Client, s.n+1
	return nil
}

// Mean is the release: global + (the sum + the noise from rng) / m.
func (s *PrivateSum) Mean(global []float64, rng *rand.Rand) []float64 {
	dp.AddNoise(s.sum, dp.CentralStd(s.p.Noise, s.p.Clip), rng)
	m := float64(s.p.Denominator)
	out := make([]float64, len(global))
	for i := range out {
		out[i] = global[i] + s.sum[i]/m
	}
	return out
}

// NextClip is adaptive clipping's step at the aggregator (docs/privacy.md,
// "The mechanism per round", step 3; Andrew et al. 2021): the round's
// clip bits (true: the update's norm was at most c before the clip), their
// centred sum plus N(0, a.BitNoise^2) from rng (the round's
// dp.BitNoiseRand), the noised unclipped fraction over m, the round's
// expected participants (its fixed denominator), and the next round's
// clip norm a.Next(c, b).
func NextClip(a dp.Adaptive, c float64, bits []bool, m int, rng *rand.Rand) (float64, error) {
	if m < 1 {
		return 0, fmt.Errorf("uplink: adaptive clipping over %d expected participants", m)
	}
	sum := 0.0
	for _, b := range bits {
		if b {
			sum += 0.5
		} else {
			sum -= 0.5
		}
	}
	sum += a.BitNoise * rng.NormFloat64()
	next := a.Next(c, dp.UnclippedFraction(sum, float64(m)))
	if !(next > 0) || math.IsInf(next, 0) {
		return 0, fmt.Errorf("uplink: adaptive clipping: the next clip norm is %v", next)
	}
	return next, nil
}
