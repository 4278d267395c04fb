package model

import "golang.org/x/sys/cpu"

// useAVX selects the assembly kernels: they need AVX2 and FMA (and the OS
// saving the YMM registers, which x/sys/cpu checks).
var useAVX = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// useAVX512 selects the AVX-512 variant of the paired-row kernel (the same
// bits: every element's terms in the same order, one FMA each).
var useAVX512 = useAVX && cpu.X86.HasAVX512F

// fastFMA says whether math.FMA is a single instruction here: without it
// the portable kernels would run FMA in software, and Step keeps the
// LossGrad path instead.
var fastFMA = useAVX

// gemmAVX is gemmAcc on AVX2: rows in pairs over full blocks of 16 columns
// (gemm2x16: each b row loaded once for two rows; with AVX-512, blocks of
// 32 in gemm2x32z first), then what is left (the
// last row of an odd m; the columns past the last full block) as single
// rows over full blocks of 32 columns (eight YMM accumulators) and masked
// blocks of 16.
func gemmAVX(m, n, k int, a []float64, lda, inca int, b []float64, ldb int, c []float64, ldc int, load bool) {
	n16 := n &^ 15
	if m2 := m / 2; m2 > 0 && n16 > 0 {
		j0 := 0
		if useAVX512 && n16 >= 32 {
			j0 = n &^ 31
			gemm2x32z(m2, j0/32, k, &a[0], lda, inca, &b[0], ldb, &c[0], ldc, load)
		}
		if j0 < n16 {
			gemm2x16(m2, (n16-j0)/16, k, &a[0], lda, inca, &b[j0], ldb, &c[j0], ldc, load)
		}
		if n16 < n {
			gemmTail(2*m2, n16, n, k, a, lda, inca, b, ldb, c, ldc, load)
		}
		if m%2 == 1 {
			r := m - 1
			gemmRows(1, n, k, a[r*lda:], lda, inca, b, ldb, c[r*ldc:], ldc, load)
		}
		return
	}
	gemmRows(m, n, k, a, lda, inca, b, ldb, c, ldc, load)
}

// gemmTail runs columns j0..n-1 of m rows in masked blocks of 16.
func gemmTail(m, j0, n, k int, a []float64, lda, inca int, b []float64, ldb int, c []float64, ldc int, load bool) {
	for ; j0 < n; j0 += 16 {
		var mask [16]int64
		for j := range min(16, n-j0) {
			mask[j] = -1
		}
		gemm16m(m, k, &a[0], lda, inca, &b[j0], ldb, &c[j0], ldc, load, &mask)
	}
}

// gemmRows is gemmAVX one row at a time: full blocks of 32 columns, then
// the rest in masked blocks of 16.
func gemmRows(m, n, k int, a []float64, lda, inca int, b []float64, ldb int, c []float64, ldc int, load bool) {
	n32 := n &^ 31
	if n32 > 0 {
		gemm32(m, n32/32, k, &a[0], lda, inca, &b[0], ldb, &c[0], ldc, load)
	}
	if n32 < n {
		gemmTail(m, n32, n, k, a, lda, inca, b, ldb, c, ldc, load)
	}
}

// gemm2x16 runs m2 pairs of rows over nb blocks of 16 columns; see gemmAcc.
//
//go:noescape
func gemm2x16(m2, nb, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool)

// gemm32 runs nb blocks of 32 columns; see gemmAcc.
//
//go:noescape
func gemm32(m, nb, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool)

// gemm16m runs one block of up to 16 columns, those whose mask entry is -1.
//
//go:noescape
func gemm16m(m, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool, mask *[16]int64)

// proxStepAVX is proxStep's loop over len(w) (a multiple of 4) elements,
// adding the squares of w into ss lane by lane.
func proxStepAVX(w, g, a []float64, lr, l2, mu float64, ss *[4]float64) {
	proxStep4(&w[0], &g[0], &a[0], len(w)/4, lr, l2, mu, ss)
}

//go:noescape
func proxStep4(w, gr, a *float64, n4 int, lr, l2, mu float64, ss *[4]float64)

// gemm2x32z is gemm2x16 over nb blocks of 32 columns in ZMM registers.
//
//go:noescape
func gemm2x32z(m2, nb, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool)
