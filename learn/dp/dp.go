// Package dp owns client-level differential privacy
// (docs/privacy.md): what a site does to its update before it leaves
// (Clip, the adaptive-clipping bit), the Gaussian noise that makes the
// aggregate private (CentralStd, SiteStd, AddNoise, NoiseRand), the adaptive
// clip norm's update (Adaptive, Andrew et al. 2021), and the privacy
// accountant: Rényi DP of the sampled Gaussian mechanism (RDP, Mironov,
// Talwar & Zhang 2019) composed over rounds (Accountant) and converted to
// (epsilon, delta) (Epsilon, EpsilonClassic), with the budget helpers the
// daemons and docs/privacy.md's figures need (RoundsWithin, CalibrateNoise).
//
// The unit of privacy is a site: neighbouring federations differ by one
// site's entire data, and the guarantee covers every update vector that site
// ever sends (docs/privacy.md, "What the guarantee covers").
//
// The package is pure: no goroutines, globals, clocks or I/O. Randomness
// comes from the *rand.Rand the caller hands in. The aggregator's central
// noise must not be predictable by the sites: its seed comes from
// crypto/rand in production (NoiseRand takes a 32-byte key for ChaCha8, a
// cryptographically secure generator), and a fixed seed only in tests and
// `simulate` when a flag asks for a reproducible run.
package dp

import (
	"errors"
	"fmt"
	"math"
)

// ErrNonFinite is returned for an update holding NaN or ±Inf: such an
// update is refused, never clipped into something finite.
var ErrNonFinite = errors.New("dp: update has a non-finite value")

// Norm returns the L2 norm of v without spurious overflow or underflow (the
// scaled sum of squares of the reference BLAS dnrm2): +Inf only if v holds
// an infinity or its norm exceeds the largest float64, NaN if v holds a NaN.
func Norm(v []float64) float64 {
	s, ssq, ok := normParts(v)
	if !ok {
		return s
	}
	return s * math.Sqrt(ssq)
}

// normParts returns the norm as scale*sqrt(ssq); ok is false (and scale NaN
// or +Inf) when v holds a non-finite value.
func normParts(v []float64) (scale, ssq float64, ok bool) {
	ssq = 1
	for _, x := range v {
		if math.IsNaN(x) {
			return math.NaN(), 0, false
		}
		if math.IsInf(x, 0) {
			return math.Inf(1), 0, false
		}
		if x == 0 {
			continue
		}
		a := math.Abs(x)
		if scale < a {
			r := scale / a
			ssq = 1 + ssq*r*r
			scale = a
		} else {
			r := a / scale
			ssq += r * r
		}
	}
	return scale, ssq, true
}

// Clipped is what Clip did to an update.
type Clipped struct {
	// Norm is the update's L2 norm before clipping.
	Norm float64
	// Clipped: Norm was above the bound and the update was scaled down.
	Clipped bool
}

// Bit is the adaptive-clipping report of this update (Andrew et al. 2021):
// 1 if its norm was at most the bound, else 0.
func (c Clipped) Bit() float64 {
	if c.Clipped {
		return 0
	}
	return 1
}

// Clip scales v in place to L2 norm at most c (> 0, finite) and reports its
// norm before. An update with a NaN or an infinity is refused with
// ErrNonFinite and left as it was. The bound holds as Norm measures it,
// rounding included: a scaled vector that rounding leaves a hair above c is
// shrunk again.
func Clip(v []float64, c float64) (Clipped, error) {
	if !(c > 0) || math.IsInf(c, 0) {
		return Clipped{}, fmt.Errorf("dp: clip norm must be a finite number > 0, got %v", c)
	}
	s, ssq, ok := normParts(v)
	if !ok {
		return Clipped{Norm: s}, ErrNonFinite
	}
	n := s * math.Sqrt(ssq) // +Inf past the largest float64; still clipped
	if n <= c {
		return Clipped{Norm: n}, nil
	}
	scale(v, c/s/math.Sqrt(ssq))
	// The factor and the products round; shrink by a growing margin until
	// the measured norm is within the bound (once at most in practice).
	for margin := 0x1p-50; ; margin *= 16 {
		m := Norm(v)
		if m <= c {
			break
		}
		scale(v, c/m*(1-margin))
	}
	return Clipped{Norm: n, Clipped: true}, nil
}

func scale(v []float64, s float64) {
	for i := range v {
		v[i] *= s
	}
}
