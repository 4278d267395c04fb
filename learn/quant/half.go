package quant

import "math"

const maxHalf = 65504 // largest finite IEEE binary16 value

// halfFromFloat64 rounds x (finite) to the nearest IEEE binary16, ties to
// even, in one rounding from float64 (no double rounding through float32).
// Magnitudes at or above 65504 saturate to ±65504 instead of becoming ±Inf.
func halfFromFloat64(x float64) uint16 {
	b := math.Float64bits(x)
	sign := uint16(b>>48) & 0x8000
	a := b &^ (1 << 63) // |x|
	switch {
	case a >= 0x40effc0000000000: // 65504
		return sign | 0x7bff
	case a < 0x3f10000000000000: // 2^-14: subnormal half, quantum 2^-24
		// Adding 2^52 rounds |x|·2^24 (< 2^11) to an integer, ties to
		// even, and leaves it in the low mantissa bits: 0..1024, where
		// 1024 is the smallest normal (bits 0x0400), as it should be.
		v := float64(math.Float64frombits(a)*0x1p24) + 0x1p52
		return sign | uint16(math.Float64bits(v)&0x7ff)
	}
	// Normal: rebias the exponent (1023 -> 15) and keep 10 of the 52
	// mantissa bits, rounding the other 42 to nearest even; a carry out of
	// the mantissa correctly bumps the exponent.
	m := a & (1<<52 - 1)
	h := (a>>52-1008)<<10 | m>>42
	h += (m&(1<<42-1) + (1<<41 - 1) + h&1) >> 42
	return sign | uint16(h)
}

// halfToFloat64 widens a binary16 that is not Inf/NaN (exponent 31); the
// caller has checked that with halfFinite.
func halfToFloat64(h uint16) float64 {
	bits := uint32(h&0x7fff) << 13 // exponent and mantissa in float32 position
	var f float32
	if h&0x7c00 != 0 {
		f = math.Float32frombits(bits + 112<<23) // rebias 15 -> 127
	} else {
		// Subnormal m·2^-24: read as 2^-14·(1 + m/1024), minus 2^-14 (exact).
		f = math.Float32frombits(bits+113<<23) - 0x1p-14
	}
	return float64(math.Float32frombits(math.Float32bits(f) | uint32(h&0x8000)<<16))
}

func halfFinite(h uint16) bool { return h&0x7c00 != 0x7c00 }
