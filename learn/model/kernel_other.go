//go:build !amd64

package model

import "runtime"

// useAVX is amd64's assembly; elsewhere the portable kernels run.
const useAVX = false

// fastFMA says whether math.FMA is a single instruction on this
// architecture (of the gateways' targets, arm64; not 32-bit arm); without it the portable kernels would run FMA in software,
// and Step keeps the LossGrad path instead.
var fastFMA = runtime.GOARCH == "arm64"

func gemmAVX(m, n, k int, a []float64, lda, inca int, b []float64, ldb int, c []float64, ldc int, load bool) {
	panic("unreachable")
}

func proxStepAVX(w, g, a []float64, lr, l2, mu float64, ss *[4]float64) { panic("unreachable") }
