package quant

import "math"

// The dct stage: an orthonormal 2-D DCT-II over image-shaped weights.
//
// Models on images keep, for each input pixel, one weight per output (class,
// hidden unit): with pixels row-major and outputs innermost, the first
// H·W·C parameters are an H×W image for each of C channels, value
// (r·W + col)·C + k. An update of such weights is a sum of training images
// times scalars, smooth like the images, so its DCT packs most of the energy
// into few low-frequency coefficients (on Fashion-MNIST FedSplit deltas, the
// top 12 % of DCT coefficients hold 96-99 % of the energy; the top 12 % of the
// raw weights, 72-77 %). The coefficients are written in zigzag order
// (diagonal r+c ascending, then r), channels innermost, so position tracks
// frequency; the parameters after the first H·W·C (biases, other layers) pass
// through unchanged. Being orthonormal, the transform keeps squared errors:
// what top-k or quantisation drops in the coefficients is exactly what the
// decoded vector misses.

// maxDCTSide bounds H and W: the cosine tables are H²+W² float64s, and a
// hostile frame's transform costs C·H·W·(H+W) multiply-adds.
const maxDCTSide = 256

// dctShape is the transform's parameters; the zero value means no transform.
type dctShape struct {
	h, w, c int
}

func (s dctShape) on() bool  { return s.h > 0 }
func (s dctShape) size() int { return s.h * s.w * s.c }

// dctTables are the cosine bases and the zigzag order of one shape.
type dctTables struct {
	h, w   int
	ch, cw []float64 // ch[k*h+n] = a_k cos(pi k (2n+1) / 2h)
	zz     []int32   // zz[r*w+col] = rank of frequency (r, col) in zigzag order
	img    []float64 // scratch: one channel
	tmp    []float64
}

func cosBasis(n int) []float64 {
	b := make([]float64, n*n)
	for k := range n {
		a := math.Sqrt(2 / float64(n))
		if k == 0 {
			a = math.Sqrt(1 / float64(n))
		}
		for i := range n {
			b[k*n+i] = a * math.Cos(math.Pi*float64(k)*float64(2*i+1)/float64(2*n))
		}
	}
	return b
}

// tables returns the codec's tables for s, built once per shape.
func (c *Codec) tables(s dctShape) *dctTables {
	if t := c.dct; t != nil && t.h == s.h && t.w == s.w {
		return t
	}
	t := &dctTables{h: s.h, w: s.w, ch: cosBasis(s.h), cw: cosBasis(s.w),
		zz: make([]int32, s.h*s.w), img: make([]float64, s.h*s.w), tmp: make([]float64, s.h*s.w)}
	rank := int32(0)
	for d := 0; d <= s.h+s.w-2; d++ {
		for r := max(0, d-s.w+1); r <= min(d, s.h-1); r++ {
			t.zz[r*s.w+d-r] = rank
			rank++
		}
	}
	c.dct = t
	return t
}

// dctForward writes the transform of v to out (len(v), not v).
func (c *Codec) dctForward(s dctShape, v, out []float64) {
	t := c.tables(s)
	h, w, ch := s.h, s.w, s.c
	for k := range ch {
		for p := range h * w {
			t.img[p] = v[p*ch+k]
		}
		// Rows, then columns. float64(a*b) keeps each product rounded on
		// its own (no FMA), so every platform computes the same bits.
		for r := range h {
			row := t.img[r*w : (r+1)*w]
			for kc := range w {
				basis := t.cw[kc*w : (kc+1)*w]
				acc := 0.0
				for i, x := range row {
					acc += float64(basis[i] * x)
				}
				t.tmp[r*w+kc] = acc
			}
		}
		for kr := range h {
			basis := t.ch[kr*h : (kr+1)*h]
			for kc := range w {
				acc := 0.0
				for i, b := range basis {
					acc += float64(b * t.tmp[i*w+kc])
				}
				out[int(t.zz[kr*w+kc])*ch+k] = acc
			}
		}
	}
	copy(out[s.size():], v[s.size():])
}

// dctInverse writes the inverse transform of coefficients u to out (len(u),
// not u).
func (c *Codec) dctInverse(s dctShape, u, out []float64) {
	t := c.tables(s)
	h, w, ch := s.h, s.w, s.c
	for k := range ch {
		for p := range h * w {
			t.img[p] = u[int(t.zz[p])*ch+k]
		}
		// Columns: tmp[r][kc] = sum_kr ch[kr][r] img[kr][kc].
		for r := range h {
			for kc := range w {
				acc := 0.0
				for kr := range h {
					acc += float64(t.ch[kr*h+r] * t.img[kr*w+kc])
				}
				t.tmp[r*w+kc] = acc
			}
		}
		// Rows: out[r][col] = sum_kc cw[kc][col] tmp[r][kc].
		for r := range h {
			row := t.tmp[r*w : (r+1)*w]
			for col := range w {
				acc := 0.0
				for kc, x := range row {
					acc += float64(t.cw[kc*w+col] * x)
				}
				out[(r*w+col)*ch+k] = acc
			}
		}
	}
	copy(out[s.size():], u[s.size():])
}
