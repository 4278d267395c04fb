package quant

import "math"

const maxHalf = 65504 // largest finite IEEE binary16 value

// halfFromFloat64 rounds x (finite) to the nearest IEEE binary16, ties to
// even, in one rounding from float64 (no double rounding through float32).
// Magnitudes at or above 65504 saturate to ±65504 instead of becoming ±Inf.
func halfFromFloat64(x float64) uint16 {
	var sign uint16
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	if x >= maxHalf {
		return sign | 0x7bff
	}
	if x < 0x1p-14 { // subnormal range: quantum 2^-24
		// m in [0, 1024]; 1024 is the smallest normal, whose bits are 0x0400.
		return sign | uint16(math.RoundToEven(x*0x1p24))
	}
	frac, exp := math.Frexp(x) // x = frac·2^exp, frac in [0.5, 1)
	m := uint16(math.RoundToEven(frac * 2048))
	// m in [1024, 2048]: 2048 carries into the exponent, which is right.
	return sign | (uint16(exp+14)<<10 + m - 1024)
}

// halfToFloat64 widens a binary16 that is not Inf/NaN (exponent 31); the
// caller has checked that with halfFinite.
func halfToFloat64(h uint16) float64 {
	e := uint32(h>>10) & 0x1f
	m := uint32(h) & 0x3ff
	var f float32
	if e == 0 {
		f = float32(m) * 0x1p-24
	} else {
		f = math.Float32frombits((e+112)<<23 | m<<13)
	}
	if h&0x8000 != 0 {
		f = -f
	}
	return float64(f)
}

func halfFinite(h uint16) bool { return h&0x7c00 != 0x7c00 }
