package quant

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// float32Values are float64s that float32 represents exactly, the corners
// included.
func float32Values(n int, seed uint64) []float64 {
	x := []float64{0, math.Copysign(0, -1), 1, -1, math.MaxFloat32, -math.MaxFloat32,
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, float64(float32(1e-40)), 0x1p-126, float64(float32(math.Pi))}
	rng := newRNG(seed)
	for len(x) < n {
		f := math.Float32frombits(rng.Uint32())
		if !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) {
			x = append(x, float64(f))
		}
	}
	return x[:n]
}

func TestFP32Lossless(t *testing.T) {
	x := float32Values(5000, 1)
	for _, spec := range []string{"fp32", "fp32+raw", "topk:1.0+fp32"} {
		c := mustParse(t, spec)
		y := decode(t, c, encode(t, c, x, nil, 1))
		for i := range x {
			want := x[i]
			if spec == "topk:1.0+fp32" && want == 0 {
				want = 0 // zeros are not sent: they decode as +0
			}
			if math.Float64bits(y[i]) != math.Float64bits(want) {
				t.Fatalf("%s: value %d: got %v (%#x), want %v (%#x)", spec, i, y[i], math.Float64bits(y[i]), want, math.Float64bits(want))
			}
		}
	}
	// float64 input rounds to the nearest float32.
	c := mustParse(t, "fp32")
	x = gaussian(newRNG(2), 1000, 1)
	x = append(x, 1+0x1p-24, 1+3*0x1p-24, 0x1p-150, 0x1p-149*1.5)
	y := decode(t, c, encode(t, c, x, nil, 1))
	for i := range x {
		if y[i] != float64(float32(x[i])) {
			t.Fatalf("value %d: got %v, want float32 rounding %v", i, y[i], float64(float32(x[i])))
		}
	}
}

func TestFP16(t *testing.T) {
	// Every finite half round-trips exactly.
	for h := range 1 << 16 {
		if !halfFinite(uint16(h)) {
			continue
		}
		f := halfToFloat64(uint16(h))
		if got := halfFromFloat64(f); got != uint16(h) {
			t.Fatalf("half %#04x -> %v -> %#04x", h, f, got)
		}
	}
	tests := []struct {
		x    float64
		want float64
	}{
		{1 + 0x1p-11, 1},                     // tie to even
		{1 + 3*0x1p-11, 1 + 0x1p-9},          // tie to even (up)
		{1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-10}, // just above the tie: no double rounding
		{0x1p-25, 0},                         // half the smallest subnormal: tie to 0
		{0x1p-25 + 0x1p-60, 0x1p-24},         // above it
		{65504, 65504},
		{65519, 65504},
		{1e6, 65504}, // saturates
		{-1e30, -65504},
		{0x1p-14 - 0x1p-26, 0x1p-14}, // rounds up into the normal range
	}
	for _, tt := range tests {
		if got := halfToFloat64(halfFromFloat64(tt.x)); got != tt.want {
			t.Errorf("fp16(%v) = %v, want %v", tt.x, got, tt.want)
		}
	}
	// The documented bound, end to end, over many magnitudes.
	rng := newRNG(3)
	x := make([]float64, 20000)
	for i := range x {
		x[i] = math.Copysign(math.Pow(10, -10+15*rng.Float64()), rng.NormFloat64())
		x[i] = max(-65504, min(65504, x[i]))
	}
	c := mustParse(t, "fp16")
	y := decode(t, c, encode(t, c, x, nil, 1))
	for i := range x {
		if bound := max(math.Abs(x[i])*0x1p-11, 0x1p-25); math.Abs(y[i]-x[i]) > bound {
			t.Fatalf("fp16 value %v decoded as %v: error %g > bound %g", x[i], y[i], math.Abs(y[i]-x[i]), bound)
		}
	}
}

// linearBound is the documented per-element error bound of q8/q4 for one
// bucket, plus float64 rounding of the decode.
func linearBound(v valueCoder, xs []float64) float64 {
	L := float64(v.steps())
	mn, mx, amax := math.Inf(1), math.Inf(-1), 0.0
	for _, f := range xs {
		mn, mx, amax = min(mn, f), max(mx, f), max(amax, math.Abs(f))
	}
	if v.scale == scaleAbsMax {
		return amax/(2*L)*(1+0x1p-22) + 0x1p-149 + 4*0x1p-53*amax
	}
	return (mx-mn)/(2*L)*(1+0x1p-22) + 0x1p-23*math.Abs(mn) + 0x1p-149 + 4*0x1p-53*amax
}

func TestLinearBounds(t *testing.T) {
	rng := newRNG(4)
	vectors := map[string][]float64{
		"gaussian":  gaussian(rng, 3000, 0.01),
		"student-t": studentT(rng, 3000, 2, 1e-3),
		"offset":    func() []float64 { x := gaussian(rng, 1000, 1e-6); return addConst(x, 1e3) }(),
		"constant":  slices.Repeat([]float64{0.1}, 700),
		"zero":      make([]float64, 513),
		"one":       {-2.5},
		"empty":     {},
		"huge":      {math.MaxFloat32, -math.MaxFloat32, 1, 0},
		"tiny":      gaussian(rng, 100, 1e-300),
	}
	for _, spec := range []string{"q8", "q4", "q8:absmax", "q4:absmax", "q8:b=7", "q4:b=1", "q8:b=100000", "q4:b=3:absmax", "topk:0.5+q8"} {
		c := mustParse(t, spec)
		for name, x := range vectors {
			y := decode(t, c, encode(t, c, x, nil, 1))
			if len(y) != len(x) {
				t.Fatalf("%s/%s: %d values, want %d", spec, name, len(y), len(x))
			}
			if c.sparse {
				continue // the dense error bound does not apply; TestErrorFeedback covers it
			}
			b := c.val.bucket
			for lo := 0; lo < len(x); lo += b {
				hi := min(lo+b, len(x))
				bound := linearBound(c.val, x[lo:hi])
				for i := lo; i < hi; i++ {
					if e := math.Abs(y[i] - x[i]); e > bound {
						t.Fatalf("%s/%s: value %d = %v decoded as %v: error %g > bound %g", spec, name, i, x[i], y[i], e, bound)
					}
				}
			}
		}
	}
}

func addConst(x []float64, c float64) []float64 {
	for i := range x {
		x[i] += c
	}
	return x
}

// qsgdMoments returns, for one QSGD bucket as Encode quantises it, each
// element's variance unit^2 p (1-p) and the bucket's norm.
func qsgdMoments(xs []float64, s int) (vars []float64, norm float64) {
	for _, f := range xs {
		norm += f * f
	}
	norm = math.Sqrt(norm)
	n32 := float64(float32(norm))
	if n32 < norm {
		n32 = float64(math.Nextafter32(float32(norm), float32(math.Inf(1))))
	}
	unit := n32 / float64(s)
	vars = make([]float64, len(xs))
	for i, f := range xs {
		if n32 == 0 {
			continue
		}
		r := math.Abs(f) / n32 * float64(s)
		p := r - math.Floor(r)
		vars[i] = unit * unit * p * (1 - p)
	}
	return vars, norm
}

func TestQSGDUnbiased(t *testing.T) {
	const T = 3000
	rng := newRNG(5)
	x := gaussian(rng, 600, 0.02)
	x[17], x[300] = 0.3, -0.25 // a few large entries
	for _, spec := range []string{"qsgd:4:b=256+raw", "qsgd:16:b=64+raw", "qsgd:1:b=512+raw"} {
		c := mustParse(t, spec)
		mean := make([]float64, len(x))
		var y []float64
		for range T {
			msg, err := c.Encode(nil, x, nil, rng)
			if err != nil {
				t.Fatal(err)
			}
			if y, err = c.Decode(msg, y); err != nil {
				t.Fatal(err)
			}
			for i := range y {
				mean[i] += y[i] / T
			}
		}
		b := c.val.bucket
		sumSq, sumVar := 0.0, 0.0
		for lo := 0; lo < len(x); lo += b {
			hi := min(lo+b, len(x))
			vars, _ := qsgdMoments(x[lo:hi], c.val.levels)
			for j, v := range vars {
				i := lo + j
				// 6 standard errors of the mean per coordinate.
				if d := math.Abs(mean[i] - x[i]); d > 6*math.Sqrt(v/T)+1e-12 {
					t.Errorf("%s: coordinate %d: mean of %d draws %v, input %v (|diff| %g > 6 sd %g)", spec, i, T, mean[i], x[i], d, 6*math.Sqrt(v/T))
				}
				sumSq += (mean[i] - x[i]) * (mean[i] - x[i])
				sumVar += v / T
			}
		}
		// E sum (mean-x)^2 = sum var/T; over 600 coordinates it concentrates.
		if sumSq > 1.5*sumVar+1e-24 {
			t.Errorf("%s: ||mean - x||^2 = %g, expected about %g", spec, sumSq, sumVar)
		}
	}
}

func TestQSGDVariance(t *testing.T) {
	const T = 400
	rng := newRNG(6)
	vectors := map[string][]float64{
		"gaussian":  gaussian(rng, 1024, 1),
		"student-t": studentT(rng, 1024, 2, 1),
		"spike":     append(make([]float64, 1023), 5),
	}
	for _, s := range []int{1, 2, 4, 16, 127} {
		for _, b := range []int{16, 512} {
			c := &Codec{val: valueCoder{kind: valQSGD, levels: s, bucket: b}}
			for name, x := range vectors {
				recon := make([]float64, len(x))
				for lo := 0; lo < len(x); lo += b {
					xs := x[lo:min(lo+b, len(x))]
					d := float64(len(xs))
					vars, norm := qsgdMoments(xs, s)
					exact := 0.0
					for _, v := range vars {
						exact += v
					}
					bound := min(d/float64(s*s), math.Sqrt(d)/float64(s)) * norm * norm * (1 + 0x1p-21)
					if exact > bound {
						t.Fatalf("s=%d b=%d %s bucket %d: variance %g > bound %g", s, b, name, lo/b, exact, bound)
					}
					emp := 0.0
					for range T {
						if _, err := c.val.encode(nil, xs, rng, recon[:len(xs)], shrinkNone); err != nil {
							t.Fatal(err)
						}
						for i, f := range xs {
							emp += (recon[i] - f) * (recon[i] - f) / T
						}
					}
					// The empirical mean squared error matches the exact
					// variance (sd of the estimate <= exact·sqrt(2/T)·...).
					if math.Abs(emp-exact) > 0.25*exact+1e-30 {
						t.Fatalf("s=%d b=%d %s bucket %d: empirical variance %g, exact %g", s, b, name, lo/b, emp, exact)
					}
				}
			}
		}
	}
}

func TestErrorFeedback(t *testing.T) {
	const n, rounds = 400, 60
	for _, spec := range []string{"topk:0.05", "topk:7+q8", "q8", "q4", "q4:absmax", "qsgd:4", "topk:0.1+qsgd:8", "topk:0.02+q4", "fp16", "fp32"} {
		c := mustParse(t, spec)
		rng := newRNG(7)
		residual := make([]float64, n)
		received := make([]float64, n)
		sent := make([]float64, n)
		scale := 0.0
		for r := range rounds {
			delta := studentT(rng, n, 3, 0.01*float64(1+r%5))
			v := make([]float64, n)
			for i := range delta {
				v[i] = delta[i] + residual[i]
				sent[i] += delta[i]
				scale = max(scale, math.Abs(sent[i]))
			}
			msg, err := c.Encode(nil, delta, residual, rng)
			if err != nil {
				t.Fatalf("%s round %d: %v", spec, r, err)
			}
			y := decode(t, c, msg)
			for i := range y {
				// The residual is exactly what the receiver did not get.
				if residual[i] != v[i]-y[i] {
					t.Fatalf("%s round %d: residual[%d] = %v, want v - decoded = %v", spec, r, i, residual[i], v[i]-y[i])
				}
			}
			if err := c.DecodeAdd(msg, received, 1); err != nil {
				t.Fatal(err)
			}
		}
		// Over all rounds nothing is lost: received + residual == sum of deltas.
		worst, resNorm := 0.0, 0.0
		for i := range sent {
			worst = max(worst, math.Abs(received[i]+residual[i]-sent[i]))
			resNorm = max(resNorm, math.Abs(residual[i]))
		}
		if worst > 1e-12*scale*rounds {
			t.Errorf("%s: |received + residual - sum(delta)| = %g after %d rounds", spec, worst, rounds)
		}
		t.Logf("%-18s max|residual| %.3g, max|sum delta| %.3g, accounting error %.2g", spec, resNorm, scale, worst)
	}
}

func TestTopKSelection(t *testing.T) {
	v := []float64{3, -5, 0, 1, 5, 2}
	tests := []struct {
		k    int
		want []uint32
	}{
		{0, nil},
		{1, []uint32{1}}, // |-5| == |5|: the lower index wins
		{2, []uint32{1, 4}},
		{4, []uint32{0, 1, 4, 5}},
		{6, []uint32{0, 1, 3, 4, 5}}, // the zero is not sent
		{9, []uint32{0, 1, 3, 4, 5}},
	}
	c := &Codec{}
	for _, tt := range tests {
		if got := c.selectTopK(v, tt.k); !slices.Equal(got, tt.want) && len(got)+len(tt.want) > 0 {
			t.Errorf("top-%d of %v = %v, want %v", tt.k, v, got, tt.want)
		}
	}
	for _, tt := range []struct {
		spec string
		n, k int
	}{{"topk:0.01", 7850, 79}, {"topk:0.5", 7, 4}, {"topk:1e-9", 10, 1}, {"topk:100", 50, 50}, {"topk:1.0", 3, 3}, {"topk:0.1", 0, 0}} {
		if k := mustParse(t, tt.spec).top.k(tt.n); k != tt.k {
			t.Errorf("%s of %d: k = %d, want %d", tt.spec, tt.n, k, tt.k)
		}
	}
	// Against a brute-force sort, on vectors full of ties.
	rng := newRNG(8)
	for trial := range 300 {
		n := 1 + rng.IntN(200)
		x := make([]float64, n)
		for i := range x {
			x[i] = float64(rng.IntN(7) - 3)
		}
		k := rng.IntN(n + 2)
		order := make([]uint32, n)
		for i := range order {
			order[i] = uint32(i)
		}
		slices.SortStableFunc(order, func(a, b uint32) int {
			return -cmpFloat(math.Abs(x[a]), math.Abs(x[b]))
		})
		var want []uint32
		for _, i := range order[:min(k, n)] {
			if x[i] != 0 {
				want = append(want, i)
			}
		}
		slices.Sort(want)
		if got := c.selectTopK(x, k); !slices.Equal(got, want) && len(got)+len(want) > 0 {
			t.Fatalf("trial %d: top-%d of %v = %v, want %v", trial, k, x, got, want)
		}
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestKthSmallest(t *testing.T) {
	rng := newRNG(9)
	shapes := map[string]func(i, n int) float64{
		"random":   func(i, n int) float64 { return rng.Float64() },
		"sorted":   func(i, n int) float64 { return float64(i) },
		"reversed": func(i, n int) float64 { return float64(n - i) },
		"equal":    func(i, n int) float64 { return 1 },
		"organ":    func(i, n int) float64 { return float64(min(i, n-i)) },
		"few":      func(i, n int) float64 { return float64(rng.IntN(3)) },
	}
	for name, f := range shapes {
		for _, n := range []int{1, 2, 3, 10, 1000} {
			a := make([]float64, n)
			for i := range a {
				a[i] = f(i, n)
			}
			sorted := slices.Sorted(slices.Values(a))
			for _, m := range []int{0, n / 3, n / 2, n - 1} {
				b := slices.Clone(a)
				if got := kthSmallest(b, m); got != sorted[m] {
					t.Fatalf("%s n=%d: %d-th smallest = %v, want %v", name, n, m, got, sorted[m])
				}
			}
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	big := slices.Repeat([]float64{3e38}, 512)
	tests := []struct {
		name     string
		spec     string
		delta    []float64
		residual []float64
		nilRNG   bool
		want     error
	}{
		{"NaN", "fp32", []float64{1, nan, 2}, nil, false, ErrInput},
		{"+Inf", "q8", []float64{inf}, nil, false, ErrInput},
		{"-Inf", "topk:0.5+qsgd:4", []float64{1, -inf}, nil, false, ErrInput},
		{"residual NaN", "q8", []float64{1, 2}, []float64{0, nan}, false, ErrInput},
		{"residual Inf", "fp16", []float64{1, 2}, []float64{inf, 0}, false, ErrInput},
		{"residual length", "q8", []float64{1, 2}, []float64{0}, false, ErrInput},
		{"beyond float32", "fp32", []float64{1e39}, nil, false, ErrInput},
		{"sum beyond float32", "q4", []float64{3e38}, []float64{3e38}, false, ErrInput},
		{"qsgd norm overflow", "qsgd:16", big, nil, false, ErrInput},
		{"qsgd without rng", "qsgd:16", []float64{1}, nil, true, ErrInput},
		{"too large", "fp16", make([]float64, DefaultLimits.MaxDim+1), nil, false, ErrTooLarge},
	}
	for _, tt := range tests {
		c := mustParse(t, tt.spec)
		rng := newRNG(1)
		if tt.nilRNG {
			rng = nil
		}
		res := slices.Clone(tt.residual)
		dst := []byte("prefix")
		out, err := c.Encode(dst, tt.delta, res, rng)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: Encode error %v, want %v", tt.name, err, tt.want)
		}
		if string(out) != "prefix" {
			t.Errorf("%s: Encode returned %q on error, want dst unchanged", tt.name, out)
		}
		if !slices.Equal(res, tt.residual) && !(len(res) > 0 && math.IsNaN(res[len(res)-1])) {
			t.Errorf("%s: residual changed on error: %v -> %v", tt.name, tt.residual, res)
		}
	}
	// Large but in-range values are fine.
	for _, spec := range []string{"fp32", "q8", "q4:absmax", "topk:1+q8"} {
		c := mustParse(t, spec)
		x := []float64{math.MaxFloat32, -math.MaxFloat32, 1}
		if _, err := c.Encode(nil, x, make([]float64, 3), nil); err != nil {
			t.Errorf("%s: Encode(%v): %v", spec, x, err)
		}
	}
}

// TestSpecialVectors: dimension 0 and 1, all zeros, a bucket larger than
// the vector, for every codec; zeros decode exactly as zeros.
func TestSpecialVectors(t *testing.T) {
	vectors := map[string][]float64{
		"empty": {}, "one": {0.7}, "one zero": {0}, "zeros": make([]float64, 1000),
		"three": {1, -2, 3}, "neg zero": {math.Copysign(0, -1), 0},
	}
	for _, spec := range allSpecs {
		c := mustParse(t, spec)
		for name, x := range vectors {
			if len(x) < c.MinDim() {
				continue // TestDCTTooShort
			}
			res := make([]float64, len(x))
			msg := encode(t, c, x, res, 1)
			y := decode(t, c, msg)
			if len(y) != len(x) {
				t.Fatalf("%s/%s: decoded %d values, want %d", spec, name, len(y), len(x))
			}
			for i := range x {
				if x[i] == 0 && y[i] != 0 {
					t.Errorf("%s/%s: zero at %d decoded as %v", spec, name, i, y[i])
				}
				if math.IsNaN(y[i]) || math.IsInf(y[i], 0) {
					t.Errorf("%s/%s: decoded %v", spec, name, y[i])
				}
				if res[i] != x[i]-y[i] {
					t.Errorf("%s/%s: residual %v, want %v", spec, name, res[i], x[i]-y[i])
				}
			}
			if limit := 80 + 20*btoi(c.ac); name == "zeros" && !c.raw && len(msg) > limit {
				t.Errorf("%s: all-zero vector of 1000 encodes to %d bytes", spec, len(msg))
			}
		}
	}
}

func TestDecodeAddMatchesDecode(t *testing.T) {
	rng := newRNG(10)
	x := studentT(rng, 2000, 3, 0.1)
	for _, spec := range allSpecs {
		c := mustParse(t, spec)
		msg := encode(t, c, x, nil, 2)
		y := decode(t, c, msg)
		acc := gaussian(rng, len(x), 1)
		want := slices.Clone(acc)
		const scale = 0.37
		for i := range want {
			want[i] += float64(scale * y[i])
		}
		if err := c.DecodeAdd(msg, acc, scale); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if acc[i] != want[i] {
				t.Fatalf("%s: DecodeAdd[%d] = %v, want %v", spec, i, acc[i], want[i])
			}
		}
		// Any codec decodes any frame.
		other := mustParse(t, "q4")
		if y2 := decode(t, other, msg); !slices.Equal(y, y2) {
			t.Fatalf("%s frame decodes differently with a q4 codec", spec)
		}
	}
}

func TestDeterministic(t *testing.T) {
	x := gaussian(newRNG(11), 3000, 1)
	for _, spec := range allSpecs {
		a := encode(t, mustParse(t, spec), x, make([]float64, len(x)), 42)
		c := mustParse(t, spec)
		encode(t, c, gaussian(newRNG(1), 200, 1), nil, 1) // dirty scratch
		b := encode(t, c, x, make([]float64, len(x)), 42)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: same input and seed give different frames", spec)
		}
		if c.val.kind == valQSGD && c.val.bucket > 1 {
			if d := encode(t, c, x, nil, 43); bytes.Equal(a, d) {
				t.Errorf("%s: a different seed gives the same frame", spec)
			}
		}
	}
}

// TestFrameLayout pins the documented byte layout.
func TestFrameLayout(t *testing.T) {
	c := mustParse(t, "fp32+raw")
	msg := encode(t, c, []float64{1, -2}, nil, 1)
	want := []byte{
		'E', 'F', 'L', 'Q', 1, 0, 0, 1, // magic, version, flags, dense, fp32
		0, 0, 0, 0, // scale mode, levels, reserved
		0, 0, 0, 0, // bucket
		2, 0, 0, 0, // dim
		2, 0, 0, 0, // nnz
		8, 0, 0, 0, // raw length
		8, 0, 0, 0, // payload length
		0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x3f, 0xc0, // 1 = 0x3f800000, -2 = 0xc0000000, byte planes
	}
	want = binary.LittleEndian.AppendUint32(want, crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli)))
	if !bytes.Equal(msg, want) {
		t.Errorf("frame\n got % x\nwant % x", msg, want)
	}
	c = mustParse(t, "topk:2+q8:b=3:absmax+raw")
	msg = encode(t, c, []float64{0, 0, 4, 0, 0, -8, 0}, nil, 1)
	info, err := Inspect(msg)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Info{Spec: "topk:2+q8:b=3:absmax+raw", Dim: 7, NNZ: 2, RawLen: 2 + 4 + 2, FrameLen: len(msg)}); info != want {
		t.Errorf("Inspect = %+v, want %+v", info, want)
	}
	// Indices 2, 5 -> varints 2, 2. One absmax bucket: step = 8/127 rounded
	// up to float32, so 4/step is just below 63.5: codes 63, -127.
	if got := msg[headerLen : headerLen+2]; !bytes.Equal(got, []byte{2, 2}) {
		t.Errorf("index varints % x, want 02 02", got)
	}
	if got := msg[headerLen+6 : headerLen+8]; !bytes.Equal(got, []byte{63, 0x81}) {
		t.Errorf("codes % x, want 3f 81", got)
	}
}

func TestNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, spec := range allSpecs {
		c := mustParse(t, spec)
		msg := encode(t, c, gaussian(newRNG(1), 5000, 1), nil, 1)
		decode(t, c, msg)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("goroutines: %d before, %d after Parse/Encode/Decode", before, after)
	}
}

// TestErrorFeedbackBounded: over many rounds the residual stays of the order
// of one delta (error feedback with a non-contractive compressor, such as
// unscaled QSGD with s < sqrt(bucket), grows it geometrically instead).
func TestErrorFeedbackBounded(t *testing.T) {
	const n, rounds = 2048, 150
	for _, spec := range []string{"qsgd:16", "qsgd:4", "qsgd:1", "qsgd:2:b=2048", "topk:0.01+qsgd:16", "topk:0.01", "topk:0.05+q4", "q4"} {
		c := mustParse(t, spec)
		rng := newRNG(12)
		residual := make([]float64, n)
		worst := 0.0
		for r := range rounds {
			delta := gaussian(rng, n, 1)
			if _, err := c.Encode(nil, delta, residual, rng); err != nil {
				t.Fatal(err)
			}
			if r >= rounds/2 {
				worst = max(worst, norm2(residual)/norm2(delta))
			}
		}
		t.Logf("%-18s max ||residual||/||delta|| over rounds %d..%d: %.3g", spec, rounds/2, rounds, worst)
		if worst > 20 {
			t.Errorf("%s: ||residual|| reached %.3g ||delta||: error feedback is not stable", spec, worst)
		}
	}
}

func norm2(x []float64) float64 {
	s := 0.0
	for _, f := range x {
		s += f * f
	}
	return math.Sqrt(s)
}

// TestLargeVector: payloads beyond the 1 MiB zstd window (several zstd
// blocks, window descriptor instead of a single segment) round-trip.
func TestLargeVector(t *testing.T) {
	x := gaussian(newRNG(13), 300_000, 1)
	for _, spec := range []string{"fp32", "fp16", "topk:0.5"} {
		c := mustParse(t, spec)
		msg := encode(t, c, x, nil, 1)
		info, err := Inspect(msg)
		if err != nil {
			t.Fatal(err)
		}
		y := decode(t, c, msg)
		if len(y) != len(x) {
			t.Fatalf("%s: %d values, want %d", spec, len(y), len(x))
		}
		if spec == "fp32" {
			for i := range x {
				if y[i] != float64(float32(x[i])) {
					t.Fatalf("%s: value %d differs", spec, i)
				}
			}
		}
		t.Logf("%s: raw payload %d bytes, frame %d", spec, info.RawLen, info.FrameLen)
	}
}

// EncodeBounded: where QSGD's variance stays below the bucket's energy it is
// the unbiased Encode, byte for byte; where it would exceed it (s = 1 on a
// 512-bucket) the mean squared error is brought below ||v||^2, which the
// unbiased quantiser exceeds.
func TestEncodeBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	v := make([]float64, 2048)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	energy := 0.0
	for _, f := range v {
		energy += f * f
	}
	fine := mustParse(t, "qsgd:127")
	a, err := fine.Encode(nil, v, nil, newRNG(9))
	if err != nil {
		t.Fatal(err)
	}
	b, err := fine.EncodeBounded(nil, v, newRNG(9))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("qsgd:127: EncodeBounded differs from the unbiased Encode where no bucket amplifies")
	}
	coarse := mustParse(t, "qsgd:1")
	mse := func(enc func(*rand.Rand) ([]byte, error)) float64 {
		const T = 200
		sum := 0.0
		for k := range T {
			f, err := enc(newRNG(uint64(k)))
			if err != nil {
				t.Fatal(err)
			}
			y, err := coarse.Decode(f, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range v {
				sum += (y[i] - v[i]) * (y[i] - v[i])
			}
		}
		return sum / T
	}
	unbiased := mse(func(r *rand.Rand) ([]byte, error) { return coarse.Encode(nil, v, nil, r) })
	bounded := mse(func(r *rand.Rand) ([]byte, error) { return coarse.EncodeBounded(nil, v, r) })
	t.Logf("qsgd:1, ||v||^2 = %.0f: unbiased MSE %.0f, bounded %.0f", energy, unbiased, bounded)
	if unbiased <= energy || bounded >= energy {
		t.Fatalf("MSE unbiased %.0f, bounded %.0f, want them on either side of ||v||^2 = %.0f", unbiased, bounded, energy)
	}
}
