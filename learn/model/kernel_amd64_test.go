package model

import (
	"math"
	"testing"
)

// eachAVXKernel runs f with the AVX2 kernels, then, where this CPU has
// AVX-512, with its paired-row kernel.
func eachAVXKernel(t *testing.T, f func(t *testing.T)) {
	defer func(v bool) { useAVX512 = v }(useAVX512)
	has := useAVX512
	useAVX512 = false
	t.Run("avx2", f)
	if has {
		useAVX512 = true
		t.Run("avx512", f)
	}
}

// withoutAVX runs f with the portable kernels.
func withoutAVX(f func()) {
	defer func(v bool) { useAVX = v }(useAVX)
	useAVX = false
	f()
}

// TestKernelsAVXMatchGo checks that the assembly and the portable kernels
// give the same bits, so that a result never depends on which one ran.
func TestKernelsAVXMatchGo(t *testing.T) {
	if !useAVX {
		t.Skip("this CPU has no AVX2 and FMA: only the portable kernels run here")
	}
	eachAVXKernel(t, func(t *testing.T) {
		for i, tc := range gemmCases {
			a, lda, inca, b, c, ldc := tc.operands(uint64(i))
			want := append([]float64(nil), c...)
			withoutAVX(func() { gemmAcc(tc.m, tc.n, tc.k, a, lda, inca, b, tc.n, want, ldc, tc.load) })
			gemmAcc(tc.m, tc.n, tc.k, a, lda, inca, b, tc.n, c, ldc, tc.load)
			for j := range c {
				if math.Float64bits(c[j]) != math.Float64bits(want[j]) {
					t.Fatalf("case %d %+v: c[%d] = %v (AVX), %v (Go)", i, tc, j, c[j], want[j])
				}
			}
		}
	})
	rng := newRNG(5)
	for n := range 41 {
		w, g, a := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range w {
			w[i], g[i], a[i] = rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64()
		}
		w2 := append([]float64(nil), w...)
		var want float64
		withoutAVX(func() { want = proxStep(w2, g, a, 0.01, 1e-4, 0.3) })
		if got := proxStep(w, g, a, 0.01, 1e-4, 0.3); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("n=%d: L2 term %v (AVX), %v (Go)", n, got, want)
		}
		for i := range w {
			if math.Float64bits(w[i]) != math.Float64bits(w2[i]) {
				t.Fatalf("n=%d: w[%d] = %v (AVX), %v (Go)", n, i, w[i], w2[i])
			}
		}
	}
}

// TestKernelsAVXSpecialValues: with signed zeros, infinities and NaNs in
// the operands the assembly still gives the portable kernel's bits (a zero
// a entry is skipped, a NaN one is not; -0 + +0 is +0), for rows taken one
// at a time and in pairs.
func TestKernelsAVXSpecialValues(t *testing.T) {
	if !useAVX {
		t.Skip("this CPU has no AVX2 and FMA: only the portable kernels run here")
	}
	avals := []float64{0, math.Copysign(0, -1), math.NaN(), 1, -2, 0.5}
	bvals := []float64{math.Inf(1), math.Inf(-1), math.NaN(), 0, math.Copysign(0, -1), 1, -3}
	cvals := []float64{math.Copysign(0, -1), 0, 1, math.Inf(1)}
	eachAVXKernel(t, func(t *testing.T) { specialValues(t, avals, bvals, cvals) })
}

func specialValues(t *testing.T, avals, bvals, cvals []float64) {
	rng := newRNG(11)
	for _, sh := range []struct{ m, n, k int }{{5, 37, 6}, {4, 64, 9}, {1, 16, 3}, {3, 32, 4}, {6, 80, 5}, {2, 48, 7}} {
		for _, trans := range []bool{false, true} {
			for _, load := range []bool{false, true} {
				a := make([]float64, sh.m*sh.k)
				for i := range a {
					a[i] = avals[rng.IntN(len(avals))]
				}
				b := make([]float64, sh.k*sh.n)
				for i := range b {
					b[i] = bvals[rng.IntN(len(bvals))]
				}
				c := make([]float64, sh.m*sh.n)
				for i := range c {
					c[i] = cvals[rng.IntN(len(cvals))]
				}
				lda, inca := sh.k, 1
				if trans {
					lda, inca = 1, sh.m
				}
				want := append([]float64(nil), c...)
				withoutAVX(func() { gemmAcc(sh.m, sh.n, sh.k, a, lda, inca, b, sh.n, want, sh.n, load) })
				gemmAcc(sh.m, sh.n, sh.k, a, lda, inca, b, sh.n, c, sh.n, load)
				for j := range c {
					if math.Float64bits(c[j]) != math.Float64bits(want[j]) {
						t.Fatalf("%+v trans %v load %v: c[%d] = %v (AVX), %v (Go)", sh, trans, load, j, c[j], want[j])
					}
				}
			}
		}
	}
}
