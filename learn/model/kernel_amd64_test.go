package model

import (
	"math"
	"testing"
)

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
