package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
)

// naiveDCT is the 2-D DCT-II from its definition, channel by channel, in
// row-major frequency order (no zigzag): the reference the fast separable
// transform is checked against.
func naiveDCT(s dctShape, x []float64) [][]float64 {
	out := make([][]float64, s.c)
	a := func(k, n int) float64 {
		if k == 0 {
			return math.Sqrt(1 / float64(n))
		}
		return math.Sqrt(2 / float64(n))
	}
	for ch := range s.c {
		out[ch] = make([]float64, s.h*s.w)
		for k1 := range s.h {
			for k2 := range s.w {
				sum := 0.0
				for r := range s.h {
					for c := range s.w {
						sum += x[(r*s.w+c)*s.c+ch] *
							math.Cos(math.Pi*float64(k1)*float64(2*r+1)/float64(2*s.h)) *
							math.Cos(math.Pi*float64(k2)*float64(2*c+1)/float64(2*s.w))
					}
				}
				out[ch][k1*s.w+k2] = a(k1, s.h) * a(k2, s.w) * sum
			}
		}
	}
	return out
}

func TestDCT(t *testing.T) {
	for _, tc := range []struct {
		s    dctShape
		tail int
	}{
		{dctShape{28, 28, 10}, 10}, {dctShape{1, 5, 1}, 0}, {dctShape{3, 7, 2}, 3}, {dctShape{7, 3, 1}, 1}, {dctShape{1, 1, 4}, 2},
	} {
		s := tc.s
		c := mustParse(t, s.String()+"+fp32")
		x := studentT(newRNG(5), s.size()+tc.tail, 3, 1)
		u := make([]float64, len(x))
		c.dctForward(s, x, u)
		// Against the definition, through the zigzag order.
		ref := naiveDCT(s, x)
		tables := c.tables(s)
		for ch := range s.c {
			for p := range s.h * s.w {
				if got, want := u[int(tables.zz[p])*s.c+ch], ref[ch][p]; math.Abs(got-want) > 1e-12*(1+math.Abs(want)) {
					t.Fatalf("%s: coefficient (%d, %d) of channel %d = %v, definition %v", s, p/s.w, p%s.w, ch, got, want)
				}
			}
		}
		// The zigzag order is a permutation that never ranks a higher
		// diagonal r+c before a lower one.
		perm := slices.Clone(tables.zz)
		slices.Sort(perm)
		for i, r := range perm {
			if int(r) != i {
				t.Fatalf("%s: zigzag order is not a permutation", s)
			}
		}
		for p := range s.h * s.w {
			for q := range s.h * s.w {
				if p/s.w+p%s.w < q/s.w+q%s.w && tables.zz[p] > tables.zz[q] {
					t.Fatalf("%s: frequency %d ranked after %d of a higher diagonal", s, p, q)
				}
			}
		}
		// Orthonormal: energy kept, the inverse inverts, the tail untouched.
		var ex, eu float64
		for i := range x {
			ex += x[i] * x[i]
			eu += u[i] * u[i]
		}
		if math.Abs(ex-eu) > 1e-12*ex {
			t.Errorf("%s: energy %v after the transform, %v before", s, eu, ex)
		}
		if !slices.Equal(u[s.size():], x[s.size():]) {
			t.Errorf("%s: the values after the shape changed", s)
		}
		back := make([]float64, len(x))
		c.dctInverse(s, u, back)
		for i := range x {
			if math.Abs(back[i]-x[i]) > 1e-12*math.Sqrt(ex) {
				t.Fatalf("%s: inverse[%d] = %v, want %v", s, i, back[i], x[i])
			}
		}
	}
}

// TestDCTErrorFeedback: through the transform, the residual is still exactly
// what the receiver did not get, in the parameter domain, so over rounds
// sum(decoded) + residual = sum(delta).
func TestDCTErrorFeedback(t *testing.T) {
	for _, spec := range []string{"dct:6x5x3+topk:0.1+q4+ac", "dct:6x5x3+q4", "dct:10x9+topk:0.05+qsgd:8"} {
		c := mustParse(t, spec)
		rng := newRNG(8)
		n := 95
		res := make([]float64, n)
		sumDelta := make([]float64, n)
		sumGot := make([]float64, n)
		for round := range 200 {
			d := gaussian(rng, n, 1)
			msg := encode(t, c, d, res, uint64(round))
			y := decode(t, c, msg)
			for i := range d {
				sumDelta[i] += d[i]
				sumGot[i] += y[i]
			}
		}
		for i := range res {
			if diff := sumGot[i] + res[i] - sumDelta[i]; math.Abs(diff) > 1e-9 {
				t.Fatalf("%s: value %d: received + residual - sent = %v", spec, i, diff)
			}
			if math.Abs(res[i]) > 20 {
				t.Fatalf("%s: residual[%d] = %v grew without bound", spec, i, res[i])
			}
		}
	}
}

func TestDCTTooShort(t *testing.T) {
	c := mustParse(t, "dct:28x28x10+topk:0.1+q4")
	if c.MinDim() != 7840 {
		t.Fatalf("MinDim = %d, want 7840", c.MinDim())
	}
	_, err := c.Encode(nil, make([]float64, 7839), nil, newRNG(1))
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "needs at least 7840 values") {
		t.Fatalf("Encode of 7839 values: %v", err)
	}
}

// readDelta reads testdata/fedsplit_delta.f32: one Fashion-MNIST FedSplit
// uplink delta (z_j minus the aggregator's copy, logistic regression
// 784×10 + 10) from round 50 of docs/results.md's compression run.
func readDelta(tb testing.TB) []float64 {
	tb.Helper()
	b, err := os.ReadFile("testdata/fedsplit_delta.f32")
	if err != nil {
		tb.Fatal(err)
	}
	x := make([]float64, len(b)/4)
	for i := range x {
		x[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return x
}

// keptEnergy is the share of |v|^2 in its largest k entries.
func keptEnergy(v []float64, k int) float64 {
	sq := make([]float64, len(v))
	tot := 0.0
	for i, f := range v {
		sq[i] = f * f
		tot += sq[i]
	}
	sort.Float64s(sq)
	kept := 0.0
	for _, f := range sq[len(sq)-k:] {
		kept += f
	}
	return kept / tot
}

// TestDCTCompactsRealDelta checks the reason for the dct stage on a real
// update: its top 12 % of coefficients hold far more energy than the top
// 12 % of the raw values, and the ac stage codes the same content in fewer
// bytes than zstd.
func TestDCTCompactsRealDelta(t *testing.T) {
	x := readDelta(t)
	if len(x) != 7850 {
		t.Fatalf("fixture has %d values", len(x))
	}
	c := mustParse(t, "dct:28x28x10+fp32")
	u := make([]float64, len(x))
	c.dctForward(c.tf, x, u)
	k := len(x) * 12 / 100
	raw, dct := keptEnergy(x, k), keptEnergy(u, k)
	t.Logf("top 12%%: %.4f of the energy raw, %.4f after the dct", raw, dct)
	if raw > 0.85 || dct < 0.95 {
		t.Errorf("top 12%% keeps %.3f raw and %.3f after the dct: want raw below 0.85 and dct above 0.95", raw, dct)
	}
	sizes := map[string]int{}
	for _, spec := range []string{"topk:0.16+q4", "dct:28x28x10+topk:0.16+q4", "dct:28x28x10+topk:0.16+q4+ac"} {
		sizes[spec] = len(encode(t, mustParse(t, spec), x, nil, 1))
	}
	t.Logf("frame bytes: %v (raw float32: %d)", sizes, 4*len(x))
	if sizes["dct:28x28x10+topk:0.16+q4+ac"] >= sizes["dct:28x28x10+topk:0.16+q4"]*9/10 {
		t.Errorf("ac saves less than 10%% over zstd: %v", sizes)
	}
}

// TestACMatchesZstd: the ac stage carries exactly what the zstd and raw
// payloads carry, for every value coder, dense and sparse, at the edges
// (one value, all kept, nothing kept).
func TestACMatchesZstd(t *testing.T) {
	specs := []string{"fp32", "fp16", "q8", "q4", "q4:b=3:absmax", "q8:absmax", "qsgd:4:b=7", "topk:0.3+q4",
		"topk:1.0+q8", "topk:1+fp16", "topk:0.01+qsgd:16", "dct:5x5x3+topk:0.2+q4"}
	vectors := map[string][]float64{
		"one": {0.3}, "zeros": make([]float64, 100), "gauss": gaussian(newRNG(4), 1001, 1),
		"heavy": studentT(newRNG(6), 4000, 2, 1), "sparse": func() []float64 {
			x := make([]float64, 500)
			x[3], x[499] = 1, -2
			return x
		}(),
	}
	for _, spec := range specs {
		zc, ac := mustParse(t, spec), mustParse(t, spec+"+ac")
		if got := ac.String(); got != zc.String()+"+ac" {
			t.Fatalf("%s+ac prints as %q", spec, got)
		}
		for name, x := range vectors {
			if len(x) < zc.MinDim() {
				continue
			}
			a := encode(t, ac, x, nil, 9)
			z := encode(t, zc, x, nil, 9)
			ya, yz := decode(t, zc, a), decode(t, ac, z) // any codec decodes any frame
			if !slices.Equal(ya, yz) {
				t.Fatalf("%s/%s: ac and zstd frames decode differently", spec, name)
			}
			info, err := Inspect(a)
			if err != nil || info.Spec == "" || info.Compressed {
				t.Fatalf("%s/%s: Inspect %+v, %v", spec, name, info, err)
			}
		}
	}
}

// TestACHostile: damaged ac streams and version 2 headers fail with the
// right class, through Decode and DecodeAdd.
func TestACHostile(t *testing.T) {
	c := mustParse(t, "dct:10x10x2+topk:0.2+q4+ac")
	x := gaussian(newRNG(12), 210, 1)
	good := encode(t, c, x, nil, 1)
	h, pay, err := parseFrame(good, c.lim)
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(h *header), p []byte) []byte {
		hh := h
		f(&hh)
		return buildFrame(hh, p)
	}
	same := func(*header) {}
	edit := func(f func(m []byte)) []byte {
		m := slices.Clone(good)
		f(m)
		return resealed(m)
	}
	tests := []struct {
		name string
		msg  []byte
		want error
	}{
		{"stream cut short", with(same, pay[:len(pay)-3]), ErrCorrupt},
		{"stream with a trailing byte", with(same, append(slices.Clone(pay), 0)), ErrCorrupt},
		{"below the scale records", with(same, pay[:10]), ErrCorrupt},
		{"raw length not the value section", with(func(h *header) { h.rawLen++ }, pay), ErrCorrupt},
		{"shape beyond dim", with(func(h *header) { h.tf.c = 3 }, pay), ErrCorrupt},
		{"transform 2", edit(func(m []byte) { m[10] = 2 }), ErrFormat},
		{"entropy coder 2", edit(func(m []byte) { m[11] = 2 }), ErrFormat},
		{"zstd and ac", edit(func(m []byte) { m[5] |= flagZstd }), ErrFormat},
		{"dct height 0", edit(func(m []byte) { binary.LittleEndian.PutUint16(m[32:], 0) }), ErrCodec},
		{"dct width 257", edit(func(m []byte) { binary.LittleEndian.PutUint16(m[34:], 257) }), ErrCodec},
		{"dct channels 0", edit(func(m []byte) { binary.LittleEndian.PutUint32(m[36:], 0) }), ErrCodec},
		{"dct huge", edit(func(m []byte) { binary.LittleEndian.PutUint32(m[36:], 1<<31) }), ErrTooLarge},
		{"shape without transform", edit(func(m []byte) { m[10] = 0 }), ErrFormat},
		{"version 2, neither stage", edit(func(m []byte) { m[10], m[11] = 0, 0; clear(m[32:40]) }), ErrFormat},
		{"version 1 with a transform byte", edit(func(m []byte) { m[4] = 1 }), ErrFormat},
	}
	for _, tc := range tests {
		checkRejects(t, tc.name, c, tc.msg, tc.want)
	}
	// A flipped bit anywhere in the stream decodes (garbage in, garbage
	// out) or fails with a class; it never panics nor yields a non-finite value.
	for i := range len(pay) * 8 {
		p := slices.Clone(pay)
		p[i/8] ^= 1 << (i % 8)
		y, err := c.Decode(with(same, p), nil)
		if err != nil && !classified(err) {
			t.Fatalf("bit %d: unclassified error %v", i, err)
		}
		if err == nil && finiteAll(y) >= 0 {
			t.Fatalf("bit %d: non-finite value decoded", i)
		}
	}
}
