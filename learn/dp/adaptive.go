package dp

import (
	"fmt"
	"math"
)

// Adaptive is adaptive clipping to a target quantile of the update norms
// (Andrew, Thakkar, McMahan & Ramaswamy 2021, "Differentially Private
// Learning with Adaptive Clipping", Algorithm 1 with geometric updates).
//
// Each participating site reports with its update the centred bit
// Clipped.Bit() - 1/2 (its norm was at most C, or not). The server sums the
// centred bits, the sum is noised with standard deviation BitNoise (its
// sensitivity to one site is 1/2: centring halves it), and
//
//	b = 1/2 + (sum + N(0, BitNoise^2)) / m       (m the expected participants)
//	C <- C * exp(-LR * (b - Quantile))
//
// so C shrinks while more than Quantile of the updates fit under it and
// grows while fewer do. The bit query costs privacy too; the update's noise
// multiplier is raised to UpdateNoise(z) so that the pair (update sum with
// sensitivity C, bit sum with sensitivity 1/2) is a Gaussian mechanism of
// noise multiplier z, which is what the accountant charges.
type Adaptive struct {
	// Quantile is the target fraction of unclipped updates, in (0, 1)
	// (paper: 0.5).
	Quantile float64
	// LR is the geometric learning rate eta_C > 0 (paper: 0.2).
	LR float64
	// BitNoise is sigma_b, the standard deviation of the noise on the sum of
	// centred bits (paper: expected participants / 20).
	BitNoise float64
}

// Validate reports a parameter out of range, or a BitNoise too small for
// the total noise multiplier z (2*BitNoise must exceed z).
func (a Adaptive) Validate(z float64) error {
	if !(a.Quantile > 0 && a.Quantile < 1) {
		return fmt.Errorf("dp: adaptive clipping quantile must be in (0, 1), got %v", a.Quantile)
	}
	if !(a.LR > 0) || math.IsInf(a.LR, 0) {
		return fmt.Errorf("dp: adaptive clipping learning rate must be a finite number > 0, got %v", a.LR)
	}
	if _, err := UpdateNoise(z, a.BitNoise); err != nil {
		return err
	}
	return nil
}

// UpdateNoise is the noise multiplier of the update sum when the clip bits
// are noised with sigmaB: z_delta = (z^-2 - (2 sigmaB)^-2)^(-1/2) (Andrew
// et al. 2021, sec. 3), so that the two queries together have noise
// multiplier z. It needs z > 0 and 2*sigmaB > z.
func UpdateNoise(z, sigmaB float64) (float64, error) {
	if !(z > 0) || math.IsInf(z, 0) {
		return 0, fmt.Errorf("dp: noise multiplier must be a finite number > 0, got %v", z)
	}
	if !(2*sigmaB > z) || math.IsInf(sigmaB, 0) {
		return 0, fmt.Errorf("dp: clip-bit noise %v too small for noise multiplier %v (need 2*sigma_b > z)", sigmaB, z)
	}
	return 1 / math.Sqrt(1/(z*z)-1/(4*sigmaB*sigmaB)), nil
}

// UnclippedFraction is the private estimate b of the fraction of updates
// that were not clipped: 1/2 + noisySum/m, where noisySum is the sum of the
// participants' centred bits with its noise already added (by the
// aggregator in central mode, by the sites' shares in distributed mode) and
// m > 0 the expected number of participants. It is not clamped to [0, 1]:
// the noise is part of the estimate.
func UnclippedFraction(noisySum, m float64) float64 { return 0.5 + noisySum/m }

// Next is the clip norm of the next round: c * exp(-LR * (b - Quantile)),
// with b the round's UnclippedFraction.
func (a Adaptive) Next(c, b float64) float64 {
	return c * math.Exp(-a.LR*(b-a.Quantile))
}
