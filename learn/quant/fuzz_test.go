package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// Seed corpora live in testdata/fuzz/<FuzzName>/ (written by
// `go test ./learn/quant -run TestWriteFixtures -update`); run a target
// with e.g. `go test ./learn/quant -run '^$' -fuzz '^FuzzDecode$' -fuzztime 10s`.

// fuzzLimits keep each execution small.
var fuzzLimits = Limits{MaxDim: 1 << 16, MaxFrame: 1 << 20}

func fuzzCodec(tb testing.TB) *Codec {
	c, err := ParseWithLimits("fp32", fuzzLimits)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func finiteAll(x []float64) int {
	for i, f := range x {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return i
		}
	}
	return -1
}

// FuzzDecode: Decode never panics, every error wraps a class, and a
// successful decode has the declared dimension, finite values, and agrees
// with Inspect and DecodeAdd. With reseal the CRC is recomputed so that
// mutations reach the payload parsers.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("EFLQ"), false)
	c := fuzzCodec(f)
	f.Fuzz(func(t *testing.T, data []byte, reseal bool) {
		if reseal {
			data = resealed(data)
		}
		y, err := c.Decode(data, nil)
		if err != nil {
			if y != nil || !classified(err) {
				t.Fatalf("Decode error %v (returned %d values): want nil and a quant error class", err, len(y))
			}
			return
		}
		info, err := Inspect(data)
		if err != nil {
			t.Fatalf("Decode accepted a frame Inspect rejects: %v", err)
		}
		if len(y) != info.Dim || info.Dim > fuzzLimits.MaxDim {
			t.Fatalf("decoded %d values, frame declares %d (limit %d)", len(y), info.Dim, fuzzLimits.MaxDim)
		}
		if i := finiteAll(y); i >= 0 {
			t.Fatalf("decoded value %d is %v", i, y[i])
		}
		acc := make([]float64, len(y))
		if err := c.DecodeAdd(data, acc, 1); err != nil {
			t.Fatalf("Decode accepted a frame DecodeAdd rejects: %v", err)
		}
		for i := range acc {
			if acc[i] != y[i] {
				t.Fatalf("DecodeAdd[%d] = %v, Decode %v", i, acc[i], y[i])
			}
		}
	})
}

// FuzzDecodeAdd: DecodeAdd never panics, leaves dst untouched on error, and
// on success adds finite values.
func FuzzDecodeAdd(f *testing.F) {
	f.Add([]byte("EFLQ"), false, 1.0)
	c := fuzzCodec(f)
	f.Fuzz(func(t *testing.T, data []byte, reseal bool, scale float64) {
		if reseal {
			data = resealed(data)
		}
		dim := 3
		if info, err := Inspect(data); err == nil && info.Dim <= fuzzLimits.MaxDim {
			dim = info.Dim
		}
		dst := make([]float64, dim)
		for i := range dst {
			dst[i] = float64(i) - 1.5
		}
		before := slices.Clone(dst)
		if err := c.DecodeAdd(data, dst, scale); err != nil {
			if !classified(err) {
				t.Fatalf("DecodeAdd error %v wraps no quant error class", err)
			}
			if !slices.Equal(dst, before) {
				t.Fatalf("DecodeAdd changed dst on error %v", err)
			}
			return
		}
		if math.IsNaN(scale) || math.IsInf(scale, 0) {
			t.Fatalf("DecodeAdd accepted scale %v", scale)
		}
		if math.Abs(scale) <= 1e6 {
			if i := finiteAll(dst); i >= 0 {
				t.Fatalf("dst[%d] = %v after DecodeAdd with scale %v", i, dst[i], scale)
			}
		}
	})
}

// FuzzInspect: Inspect never panics and reports a consistent header.
func FuzzInspect(f *testing.F) {
	f.Add([]byte("EFLQ\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := Inspect(data)
		if err != nil {
			if !classified(err) {
				t.Fatalf("Inspect error %v wraps no quant error class", err)
			}
			return
		}
		if info.FrameLen != len(data) || info.NNZ > info.Dim || info.RawLen < 0 {
			t.Fatalf("inconsistent %+v for %d bytes", info, len(data))
		}
		// A top-k frame with nothing in it shows "topk:0", not a valid spec.
		if info.NNZ > 0 || !strings.HasPrefix(info.Spec, "topk:") {
			if _, err := parseSpec(info.Spec); err != nil {
				t.Fatalf("Inspect spec %q does not parse: %v", info.Spec, err)
			}
		}
	})
}

// FuzzParse: Parse never panics, and what it accepts round-trips through
// String.
func FuzzParse(f *testing.F) {
	for _, s := range allSpecs {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := parseSpec(spec)
		if err != nil {
			if !errors.Is(err, ErrSpec) {
				t.Fatalf("Parse(%q) error %v is not ErrSpec", spec, err)
			}
			return
		}
		s := c.String()
		c2, err := parseSpec(s)
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", spec, s, err)
		}
		if c2.String() != s || c2.val != c.val || c2.top != c.top || c2.sparse != c.sparse || c2.raw != c.raw {
			t.Fatalf("Parse(%q) = %q does not round-trip: %q", spec, s, c2.String())
		}
	})
}

// FuzzRoundTrip: any finite float32-range vector encodes under every codec,
// and decodes within the codec's bound; the residual is exactly what was not
// received.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("\x00\x00\x80\x3f\x00\x00\x00\xc0"), uint8(0), uint64(1), true)
	codecs := make([]*Codec, len(allSpecs))
	for i, s := range allSpecs {
		codecs[i] = mustParse(f, s)
	}
	f.Fuzz(func(t *testing.T, data []byte, which uint8, seed uint64, ef bool) {
		c := codecs[int(which)%len(codecs)]
		x := make([]float64, len(data)/4)
		for i := range x {
			v := math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
				x[i] = float64(v)
			}
		}
		var res []float64
		if ef {
			res = make([]float64, len(x))
		}
		msg, err := c.Encode(nil, x, res, newRNG(seed))
		if err != nil {
			if c.val.kind == valQSGD && errors.Is(err, ErrInput) {
				return // a bucket whose norm overflows float32
			}
			if c.tf.on() && errors.Is(err, ErrInput) {
				return // shorter than the dct shape, or a coefficient beyond float32
			}
			t.Fatalf("%s: Encode: %v", c, err)
		}
		y, err := c.Decode(msg, nil)
		if err != nil {
			t.Fatalf("%s: Decode of our own frame: %v", c, err)
		}
		if len(y) != len(x) {
			t.Fatalf("%s: %d values, want %d", c, len(y), len(x))
		}
		if i := finiteAll(y); i >= 0 {
			t.Fatalf("%s: decoded value %d is %v", c, i, y[i])
		}
		for i := range res {
			if res[i] != x[i]-y[i] {
				t.Fatalf("%s: residual[%d] = %v, want %v", c, i, res[i], x[i]-y[i])
			}
		}
		if c.sparse || c.tf.on() {
			return // per-element bounds hold for the coefficients: TestDCT
		}
		switch c.val.kind {
		case valFP32:
			// Bit-exact, except that with error feedback the sender encodes
			// x + residual, and -0 + 0 is +0: equal values, other sign.
			for i := range x {
				if math.Float64bits(y[i]) != math.Float64bits(x[i]) && (!ef || y[i] != x[i]) {
					t.Fatalf("fp32 value %d: %v decoded as %v", i, x[i], y[i])
				}
			}
		case valFP16:
			for i := range x {
				if a := math.Abs(x[i]); a <= maxHalf && math.Abs(y[i]-x[i]) > max(a*0x1p-11, 0x1p-25) {
					t.Fatalf("fp16 value %d: %v decoded as %v", i, x[i], y[i])
				}
			}
		case valQ8, valQ4:
			b := c.val.bucket
			for lo := 0; lo < len(x); lo += b {
				hi := min(lo+b, len(x))
				bound := linearBound(c.val, x[lo:hi])
				for i := lo; i < hi; i++ {
					if math.Abs(y[i]-x[i]) > bound {
						t.Fatalf("%s value %d: %v decoded as %v, bound %g", c, i, x[i], y[i], bound)
					}
				}
			}
		}
	})
}
