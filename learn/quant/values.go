package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
)

func (v valueCoder) buckets(n int) int {
	if v.bucket <= 0 {
		return 0
	}
	return (n + v.bucket - 1) / v.bucket
}

// recLen is the per-bucket scale record of q8/q4/qsgd.
func (v valueCoder) recLen() int {
	switch v.kind {
	case valQ8, valQ4:
		if v.scale == scaleAbsMax {
			return 4
		}
		return 8
	case valQSGD:
		return 4
	}
	return 0
}

// size is the value-section length for n values.
func (v valueCoder) size(n int) int {
	recs := v.buckets(n) * v.recLen()
	switch v.kind {
	case valFP32:
		return 4 * n
	case valFP16:
		return 2 * n
	case valQ4:
		return recs + (n+1)/2
	default: // q8, qsgd
		return recs + n
	}
}

// steps is the largest code magnitude of q8/q4: codes are 0..steps (min/max)
// or -steps..steps (absmax).
func (v valueCoder) steps() int {
	switch {
	case v.kind == valQ8 && v.scale == scaleMinMax:
		return 255
	case v.kind == valQ8:
		return 127
	case v.scale == scaleMinMax:
		return 15
	default:
		return 7
	}
}

// grow extends b by n bytes (contents unspecified) and returns it.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), len(b)+n)
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

// The decoded value formulas, shared by the decoders and by Encode's
// reconstruction for error feedback. The explicit float64 conversion of each
// product forbids fusing into an FMA, so every platform computes the same
// bits.
func linVal(lo, step float64, q int) float64 { return lo + float64(float64(q)*step) }
func qsgdVal(unit float64, l int) float64    { return float64(unit * float64(l)) }

// put stores or accumulates one decoded value.
func put(out []float64, i int, x float64, add bool, scale float64) {
	if add {
		out[i] += float64(scale * x)
	} else {
		out[i] = x
	}
}

// encode appends the value section of x (finite, within float32 range) to
// dst. If recon is non-nil (len(x)) it receives the values the decoder will
// produce. rng is used by qsgd only; shrink says whether qsgd scales its
// buckets down (see encodeQSGD).
func (v valueCoder) encode(dst []byte, x []float64, rng *rand.Rand, recon []float64, shrink shrinkMode) ([]byte, error) {
	n := len(x)
	off := len(dst)
	dst = grow(dst, v.size(n))
	p := dst[off:]
	switch v.kind {
	case valFP32:
		for i, f := range x {
			b := math.Float32bits(float32(f))
			p[i], p[n+i], p[2*n+i], p[3*n+i] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
			if recon != nil {
				recon[i] = float64(math.Float32frombits(b))
			}
		}
	case valFP16:
		for i, f := range x {
			h := halfFromFloat64(f)
			p[i], p[n+i] = byte(h), byte(h>>8)
			if recon != nil {
				recon[i] = halfToFloat64(h)
			}
		}
	case valQ8, valQ4:
		v.encodeLinear(p, x, recon)
	case valQSGD:
		if err := v.encodeQSGD(p, x, rng, recon, shrink); err != nil {
			return dst[:off], err
		}
	}
	return dst, nil
}

func (v valueCoder) encodeLinear(p []byte, x []float64, recon []float64) {
	n, nb, rl := len(x), v.buckets(len(x)), v.recLen()
	recs, codes := p[:nb*rl], p[nb*rl:]
	L := v.steps()
	Lf := float64(L)
	absmax := v.scale == scaleAbsMax
	for b := range nb {
		lo, hi := b*v.bucket, min((b+1)*v.bucket, n)
		xs := x[lo:hi]
		var base float64 // lo32 for min/max, 0 for absmax
		var step32 float32
		if absmax {
			a := 0.0
			for _, f := range xs {
				a = max(a, math.Abs(f))
			}
			step32 = float32(a / Lf)
			for linVal(0, float64(step32), L) < a {
				step32 = math.Nextafter32(step32, float32(math.Inf(1)))
			}
			binary.LittleEndian.PutUint32(recs[b*rl:], math.Float32bits(step32))
		} else {
			mn, mx := xs[0], xs[0]
			for _, f := range xs[1:] {
				mn, mx = min(mn, f), max(mx, f)
			}
			lo32 := float32(mn)
			if float64(lo32) > mn {
				lo32 = math.Nextafter32(lo32, float32(math.Inf(-1)))
			}
			base = float64(lo32)
			step32 = float32((mx - base) / Lf)
			for linVal(base, float64(step32), L) < mx {
				step32 = math.Nextafter32(step32, float32(math.Inf(1)))
			}
			binary.LittleEndian.PutUint32(recs[b*rl:], math.Float32bits(lo32))
			binary.LittleEndian.PutUint32(recs[b*rl+4:], math.Float32bits(step32))
		}
		step := float64(step32)
		inv := 0.0
		if step > 0 {
			inv = 1 / step
		}
		minQ := 0
		if absmax {
			minQ = -L
		}
		for j, f := range xs {
			q := int(math.Floor((f-base)*inv + 0.5))
			q = max(minQ, min(L, q))
			i := lo + j
			if v.kind == valQ8 {
				codes[i] = byte(q) // int8 two's complement for absmax
			} else {
				nib := byte(q)
				if absmax {
					nib = byte(q + 8)
				}
				if i&1 == 0 {
					codes[i>>1] = nib
				} else {
					codes[i>>1] |= nib << 4
				}
			}
			if recon != nil {
				recon[i] = linVal(base, step, q)
			}
		}
	}
}

// encodeQSGD quantises each bucket v to levels l_i in -s..s with
// E[l_i] = s·v_i/||v||, and sends the bucket's scale: ||v|| rounded up to
// float32, so that the decoded norm/s·l is unbiased.
//
// shrinkMode says when a stochastic quantiser scales a bucket down.
type shrinkMode int

const (
	shrinkNone        shrinkMode = iota // unbiased
	shrinkMMSE                          // always (error feedback)
	shrinkIfAmplifies                   // only where V > ||v||^2 (EncodeBounded)
)

// With shrinkMMSE (error feedback), the scale sent is instead
// gamma·||v||, gamma = ||v||^2 / (||v||^2 + V), V the quantiser's variance
// for this bucket (known before drawing). That is the MMSE scalar for an
// unbiased quantiser: E||gamma·Q(v) - v||^2 = gamma·V < ||v||^2, so the
// compressor is contractive and error feedback stays bounded. Unscaled QSGD
// has variance up to min(B/s^2, sqrt(B)/s)·||v||^2, which may exceed
// ||v||^2 when s < sqrt(B), and error feedback then amplifies the residual
// round after round. shrinkIfAmplifies applies the MMSE scale only to the
// buckets where V > ||v||^2 and stays unbiased elsewhere.
func (v valueCoder) encodeQSGD(p []byte, x []float64, rng *rand.Rand, recon []float64, shrink shrinkMode) error {
	n, nb := len(x), v.buckets(len(x))
	recs, codes := p[:4*nb], p[4*nb:]
	s := float64(v.levels)
	for b := range nb {
		lo, hi := b*v.bucket, min((b+1)*v.bucket, n)
		xs := x[lo:hi]
		amax := 0.0
		for _, f := range xs {
			amax = max(amax, math.Abs(f))
		}
		// ||x|| computed as amax·sqrt(sum (x/amax)^2): no overflow nor
		// underflow; >= amax up to one rounding (the level clamp below
		// absorbs that). 1/amax is Inf only for amax < 2^-1024.
		norm := 0.0
		if amax > 0 {
			ss := 0.0
			if inv := 1 / amax; !math.IsInf(inv, 0) {
				for _, f := range xs {
					r := f * inv
					ss += r * r
				}
			} else {
				for _, f := range xs {
					r := f / amax
					ss += r * r
				}
			}
			norm = amax * math.Sqrt(ss)
		}
		// Round the norm up to float32 so that |x_i| <= norm32 and every
		// level stays <= s: unbiased with respect to the norm we send.
		n32 := float32(norm)
		if float64(n32) < norm {
			n32 = math.Nextafter32(n32, float32(math.Inf(1)))
		}
		if math.IsInf(float64(n32), 0) {
			return fmt.Errorf("%w: qsgd bucket %d (elements %d..%d) has L2 norm %g beyond float32 range", ErrInput, b, lo, hi-1, norm)
		}
		nf := float64(n32)
		scale32 := n32
		if shrink != shrinkNone && nf > 0 {
			// In units of nf^2 (no underflow for tiny buckets):
			// ||v||^2 -> rn^2 and V = sum (nf/s)^2 p(1-p) -> vn.
			vn, k := 0.0, s/nf
			for _, f := range xs {
				r := math.Abs(f) * k
				pr := r - math.Floor(r)
				vn += pr * (1 - pr)
			}
			vn /= s * s
			rn := norm / nf
			if shrink == shrinkMMSE || vn > rn*rn {
				scale32 = float32(nf * (rn * rn / (rn*rn + vn)))
			}
		}
		binary.LittleEndian.PutUint32(recs[4*b:], math.Float32bits(scale32))
		unit := float64(scale32) / s
		k := 0.0 // levels per unit of |x|
		if nf > 0 {
			k = s / nf
		}
		for j, f := range xs {
			l := 0
			if nf > 0 {
				// r <= s up to one rounding; the clamp below keeps l <= s.
				r := math.Abs(f) * k
				fl := math.Floor(r)
				// Round up with probability r - fl: u < r-fl exactly when
				// u-(r-fl) is negative. One draw per element, branch-free
				// (these branches are coin flips for the predictor).
				u := rng.Float64()
				l = int(fl) + int(math.Float64bits(u-(r-fl))>>63)
				l = min(l, v.levels)
				neg := int(int64(math.Float64bits(f)) >> 63) // -1 if f < 0
				l = (l ^ neg) - neg
			}
			codes[lo+j] = byte(int8(l))
			if recon != nil {
				recon[lo+j] = qsgdVal(unit, l)
			}
		}
	}
	return nil
}

// corrupt formats an ErrCorrupt.
func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

func f32at(b []byte, off int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[off:]))
}

func finite32(f float32) bool { return !math.IsInf(float64(f), 0) && !math.IsNaN(float64(f)) }

// validate checks a value section for n values without writing anything:
// length, finite scales and values, codes in range. After it succeeds,
// decode cannot fail.
func (v valueCoder) validate(p []byte, n int) error {
	if len(p) != v.size(n) {
		return corrupt("%s section for %d values is %d bytes, want %d", v, n, len(p), v.size(n))
	}
	switch v.kind {
	case valFP32:
		return validateFP32(p, n)
	case valFP16:
		return validateFP16(p, n)
	case valQ8, valQ4:
		return v.validateBuckets(p, n)
	case valQSGD:
		return v.validateQSGD(p, n)
	}
	return nil
}

// validateFP32 checks n fp32 values (byte planes) are finite.
func validateFP32(p []byte, n int) error {
	// Exponent bits: low 7 of byte 3 and the top bit of byte 2.
	p2, p3 := p[2*n:3*n], p[3*n:]
	for i := range n {
		if p3[i]&0x7f == 0x7f && p2[i]&0x80 != 0 {
			return corrupt("fp32 value %d is not finite", i)
		}
	}
	return nil
}

// validateFP16 checks n fp16 values (byte planes) are finite.
func validateFP16(p []byte, n int) error {
	p1 := p[n:]
	for i := range n {
		if p1[i]&0x7c == 0x7c {
			return corrupt("fp16 value %d is not finite", i)
		}
	}
	return nil
}

// validateBuckets checks a q8 or q4 section: each bucket's step (and lo)
// finite, and the codes in range (no absmax code for -128 or nibble 0,
// a zero padding nibble).
func (v valueCoder) validateBuckets(p []byte, n int) error {
	nb, rl := v.buckets(n), v.recLen()
	for b := range nb {
		step := f32at(p, b*rl+rl-4)
		if !finite32(step) || step < 0 {
			return corrupt("%s bucket %d: step %v", v, b, step)
		}
		if rl == 8 {
			if lo := f32at(p, b*rl); !finite32(lo) {
				return corrupt("%s bucket %d: lo %v", v, b, lo)
			}
		}
	}
	codes := p[nb*rl:]
	switch {
	case v.kind == valQ8 && v.scale == scaleAbsMax:
		for i, c := range codes {
			if c == 0x80 { // int8 -128: outside -127..127
				return corrupt("q8 absmax code %d is -128", i)
			}
		}
	case v.kind == valQ4:
		if v.scale == scaleAbsMax {
			for i := range n {
				if (codes[i>>1]>>(4*(i&1)))&0x0f == 0 {
					return corrupt("q4 absmax code %d is nibble 0, not a code", i)
				}
			}
		}
		if n&1 == 1 && codes[n>>1]>>4 != 0 {
			return corrupt("q4 padding nibble is not 0")
		}
	}
	return nil
}

// validateQSGD checks a qsgd section: finite non-negative bucket norms and
// levels within s.
func (v valueCoder) validateQSGD(p []byte, n int) error {
	nb := v.buckets(n)
	for b := range nb {
		if nr := f32at(p, 4*b); !finite32(nr) || math.Signbit(float64(nr)) {
			return corrupt("qsgd bucket %d: norm %v", b, nr)
		}
	}
	s := int8(v.levels)
	for i, c := range p[4*nb:] {
		if l := int8(c); l > s || l < -s {
			return corrupt("qsgd level %d is %d, beyond s=%d", i, l, s)
		}
	}
	return nil
}

// decode writes (add=false) or adds scale times (add=true) the n decoded
// values of a validated section into out[:n].
func (v valueCoder) decode(p []byte, out []float64, add bool, scale float64) {
	n := len(out)
	switch v.kind {
	case valFP32:
		p0, p1, p2, p3 := p[:n], p[n:2*n], p[2*n:3*n], p[3*n:4*n]
		for i := range n {
			b := uint32(p0[i]) | uint32(p1[i])<<8 | uint32(p2[i])<<16 | uint32(p3[i])<<24
			put(out, i, float64(math.Float32frombits(b)), add, scale)
		}
	case valFP16:
		p0, p1 := p[:n], p[n:2*n]
		for i := range n {
			put(out, i, halfToFloat64(uint16(p0[i])|uint16(p1[i])<<8), add, scale)
		}
	case valQ8, valQ4:
		nb, rl := v.buckets(n), v.recLen()
		codes := p[nb*rl:]
		absmax := v.scale == scaleAbsMax
		for b := range nb {
			base := 0.0
			if !absmax {
				base = float64(f32at(p, b*rl))
			}
			step := float64(f32at(p, b*rl+rl-4))
			lo, hi := b*v.bucket, min((b+1)*v.bucket, n)
			for i := lo; i < hi; i++ {
				var q int
				switch {
				case v.kind == valQ8 && absmax:
					q = int(int8(codes[i]))
				case v.kind == valQ8:
					q = int(codes[i])
				default:
					q = int(codes[i>>1]>>(4*(i&1))) & 0x0f
					if absmax {
						q -= 8
					}
				}
				put(out, i, linVal(base, step, q), add, scale)
			}
		}
	case valQSGD:
		nb := v.buckets(n)
		codes := p[4*nb:]
		s := float64(v.levels)
		for b := range nb {
			unit := float64(f32at(p, 4*b)) / s
			lo, hi := b*v.bucket, min((b+1)*v.bucket, n)
			for i := lo; i < hi; i++ {
				put(out, i, qsgdVal(unit, int(int8(codes[i]))), add, scale)
			}
		}
	}
}
