package secagg

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/bits"
)

// RingBits is the width of the ring every masked value lives in: Z_{2^32}.
// Why 32 and not 64: a masked vector is uniformly random and does not
// compress, so it costs RingBits/8 bytes per coordinate on the uplink; 32
// bits is what the lossless fp32 codec sends today, and it leaves room for
// 2^20 fixed-point steps per unit on 1,000 sites with |x| <= 1 (see Quantizer).
const RingBits = 32

// MaxScaleBits bounds Quantizer's scale 2^ScaleBits; beyond it a float64
// times the scale no longer has a fractional part to round.
const MaxScaleBits = 40

// Quantizer maps real vectors into Z_{2^32} and the ring sum back. A value x
// is clipped to [-Clip, Clip], scaled by s = 2^ScaleBits and rounded
// stochastically to floor(x*s) or floor(x*s)+1 with the probabilities that
// make the expectation exactly x*s (unbiased). Each quantised value then
// lies in [-B, B] with B = ceil(Clip*s), so the sum of at most MaxSites of
// them lies in [-MaxSites*B, MaxSites*B], which the ring's signed range
// [-2^31, 2^31-1] holds whenever ceil(log2(2*MaxSites*B+1)) <= 32. NewQuantizer
// refuses any configuration for which it does not: a sum can never wrap.
//
// The scale is a power of two so that dequantising the sum (an int64 times
// 2^-ScaleBits) is exact in float64.
type Quantizer struct {
	Clip      float64 // |x| is clipped to Clip; > 0
	ScaleBits int     // s = 2^ScaleBits; 0..MaxScaleBits
	MaxSites  int     // the most inputs ever summed; >= 1
}

// NewQuantizer checks the headroom bound and returns the quantiser.
func NewQuantizer(clip float64, scaleBits, maxSites int) (Quantizer, error) {
	q := Quantizer{Clip: clip, ScaleBits: scaleBits, MaxSites: maxSites}
	return q, q.Validate()
}

// MaxScaleBitsFor returns the largest ScaleBits that NewQuantizer accepts for
// clip and maxSites, or an error if even 2^0 would wrap.
func MaxScaleBitsFor(clip float64, maxSites int) (int, error) {
	for sb := MaxScaleBits; sb >= 0; sb-- {
		if (Quantizer{Clip: clip, ScaleBits: sb, MaxSites: maxSites}).Validate() == nil {
			return sb, nil
		}
	}
	return 0, fmt.Errorf("secagg: clip %g with %d sites does not fit %d bits at any scale", clip, maxSites, RingBits)
}

// Bound returns B = ceil(Clip*2^ScaleBits), the largest |quantised value|.
func (q Quantizer) Bound() uint64 {
	return uint64(math.Ceil(math.Ldexp(q.Clip, q.ScaleBits)))
}

// BitsNeeded returns ceil(log2(2*MaxSites*B+1)), the ring bits the worst-case
// sum needs.
func (q Quantizer) BitsNeeded() int {
	hi, lo := bits.Mul64(2*q.Bound(), uint64(q.MaxSites))
	if hi != 0 || lo == math.MaxUint64 {
		return 65
	}
	// the number of bits of (2*K*B+1)-1 = 2*K*B is ceil(log2(2*K*B+1)).
	return bits.Len64(lo)
}

// Validate refuses a configuration whose worst-case sum could wrap.
func (q Quantizer) Validate() error {
	switch {
	case !(q.Clip > 0) || math.IsInf(q.Clip, 0):
		return fmt.Errorf("secagg: clip %g must be positive and finite", q.Clip)
	case q.ScaleBits < 0 || q.ScaleBits > MaxScaleBits:
		return fmt.Errorf("secagg: scale bits %d not in 0..%d", q.ScaleBits, MaxScaleBits)
	case q.MaxSites < 1:
		return fmt.Errorf("secagg: max sites %d must be >= 1", q.MaxSites)
	case math.Ldexp(q.Clip, q.ScaleBits) > 1<<40:
		return fmt.Errorf("secagg: clip %g at scale 2^%d exceeds %d bits", q.Clip, q.ScaleBits, RingBits)
	}
	if n := q.BitsNeeded(); n > RingBits {
		return fmt.Errorf("secagg: the sum of %d values in [-%g, %g] at scale 2^%d needs %d bits, the ring has %d: lower the scale, the clip or the number of sites",
			q.MaxSites, q.Clip, q.Clip, q.ScaleBits, n, RingBits)
	}
	return nil
}

// Quantize clips, scales and stochastically rounds x into the ring, drawing
// 8 bytes per value from rnd (crypto/rand in production). A NaN is an error.
func (q Quantizer) Quantize(x []float64, rnd io.Reader) ([]uint32, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	out := make([]uint32, len(x))
	var buf [8]byte
	for i, v := range x {
		if math.IsNaN(v) {
			return nil, fmt.Errorf("secagg: value %d is NaN", i)
		}
		v = math.Max(-q.Clip, math.Min(q.Clip, v))
		y := math.Ldexp(v, q.ScaleBits)
		f := math.Floor(y)
		if _, err := io.ReadFull(rnd, buf[:]); err != nil {
			return nil, wrapErr("secagg: randomness", err)
		}
		u := float64(binary.LittleEndian.Uint64(buf[:])>>11) / (1 << 53) // uniform in [0, 1)
		if u < y-f {
			f++
		}
		out[i] = uint32(int64(f))
	}
	return out, nil
}

// Signed returns the ring element v read as a two's-complement integer in
// [-2^31, 2^31-1]: the exact integer sum when no wrap occurred, which
// Validate guarantees for at most MaxSites inputs.
func Signed(v uint32) int64 { return int64(int32(v)) }

// Dequantize maps a ring sum of at most MaxSites quantised vectors back to
// reals: Signed(v) * 2^-ScaleBits, exact in float64.
func (q Quantizer) Dequantize(sum []uint32) []float64 {
	out := make([]float64, len(sum))
	for i, v := range sum {
		out[i] = math.Ldexp(float64(Signed(v)), -q.ScaleBits)
	}
	return out
}

// AddRing adds b into a coordinate-wise in Z_{2^32}; the lengths must match.
func AddRing(a, b []uint32) {
	for i := range a {
		a[i] += b[i]
	}
}
