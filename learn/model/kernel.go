package model

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
)

// The matrix kernels of LogReg and MLP (Step, and LossGrad and Predict where
// the FMA is one instruction: fastFMA). At batch 10 the products are tiny (a
// 10×784 by 784×10 product is 78k multiply-adds), so what costs is per-call
// and per-element overhead, not arithmetic: gonum's Dgemm re-checks, tiles and
// dispatches on every call and its inner loops are length-10 axpys. These
// kernels keep a block of output columns in registers for the whole inner
// dimension instead, skip zero inputs, and on amd64 with AVX2 and FMA run as
// assembly (kernel_amd64.s).
//
// Every output element is accumulated in the same order on every path, one
// fused multiply-add per term, so the assembly and the portable Go below
// (math.FMA, exactly rounded) give the same bits: a result does not depend
// on which of them ran, only on the inputs.

// gemmAcc computes, for r < m and j < n,
//
//	c[r*ldc+j] = fma(a[r*lda+(k-1)*inca], b[(k-1)*ldb+j], ... fma(a[r*lda], b[j], c0))
//
// with c0 = c[r*ldc+j] when load is set and 0 otherwise, skipping the terms
// whose a entry is zero (as gonum's kernels do). inca lets a be read
// transposed: lda = 1, inca = cols computes aᵀ b.
func gemmAcc(m, n, k int, a []float64, lda, inca int, b []float64, ldb int, c []float64, ldc int, load bool) {
	if m == 0 || n == 0 {
		return
	}
	if (m-1)*ldc+n > len(c) || k > 0 && ((m-1)*lda+(k-1)*inca >= len(a) || (k-1)*ldb+n > len(b)) {
		panic(fmt.Sprintf("model: gemmAcc %d×%d×%d: operands too short (a %d, b %d, c %d)", m, n, k, len(a), len(b), len(c)))
	}
	if k == 0 {
		if !load {
			for r := range m {
				clear(c[r*ldc : r*ldc+n])
			}
		}
		return
	}
	if useAVX {
		gemmAVX(m, n, k, a, lda, inca, b, ldb, c, ldc, load)
		return
	}
	gemmGo(m, n, k, a, lda, inca, b, ldb, c, ldc, load)
}

// gemmGo is gemmAcc in portable Go; the order of every element's terms is
// the assembly's.
func gemmGo(m, n, k int, a []float64, lda, inca int, b []float64, ldb int, c []float64, ldc int, load bool) {
	for r := range m {
		crow := c[r*ldc : r*ldc+n]
		if !load {
			clear(crow)
		}
		ar := a[r*lda:]
		for l := range k {
			av := ar[l*inca]
			if av == 0 {
				continue
			}
			brow := b[l*ldb : l*ldb+n]
			crow := crow[:len(brow)] // one bounds check for the row, not one per element
			for j, bv := range brow {
				crow[j] = math.FMA(av, bv, crow[j])
			}
		}
	}
}

// proxStep takes the SGD step of FedProx with weight decay in place,
//
//	w <- w - lr ((g + l2 w) + mu (w - a)),
//
// where g is the data term's gradient, and returns (l2/2)||w||^2 at the
// point before the step (0 when l2 is 0), the L2 term of the mini-batch loss.
// Every operation is rounded on its own (no fused multiply-add), so the
// assembly and this loop agree bit for bit; the squares are summed in four
// lanes by index mod 4, then (s0+s1)+(s2+s3).
func proxStep(w, g, a []float64, lr, l2, mu float64) float64 {
	n := len(w)
	if len(g) != n || len(a) != n {
		panic(fmt.Sprintf("model: proxStep: lengths %d, %d, %d", len(w), len(g), len(a)))
	}
	var ss [4]float64
	i := 0
	if useAVX && n >= 4 {
		i = n &^ 3
		proxStepAVX(w[:i], g[:i], a[:i], lr, l2, mu, &ss)
	}
	for ; i < n; i++ {
		wi := w[i]
		ss[i&3] += float64(wi * wi)
		d := float64(g[i] + float64(l2*wi))
		e := float64(mu * float64(wi-a[i]))
		w[i] = wi - float64(lr*float64(d+e))
	}
	if l2 == 0 {
		return 0
	}
	return 0.5 * l2 * ((ss[0] + ss[1]) + (ss[2] + ss[3]))
}

// tnChunk is how many samples productTN hands the kernel at a time: the
// kernel reads aᵀ by columns of a, and a chunk of rows keeps those reads in
// cache lines the neighbouring output rows reuse.
const tnChunk = 64

// productNN computes C = A B (or C += A B when acc is set) for row-major A
// (m×k), B (k×n) and C (m×n): with the kernels where the FMA is one
// instruction, else with gonum.
func productNN(m, n, k int, a, b, c []float64, acc bool) {
	if fastFMA {
		gemmAcc(m, n, k, a, k, 1, b, n, c, n, acc)
		return
	}
	beta := 0.0
	if acc {
		beta = 1
	}
	gemm(blas.NoTrans, blas.NoTrans, 1, general(m, k, a), general(k, n, b), beta, general(m, n, c))
}

// productTN computes C = Aᵀ B (or C += Aᵀ B when acc is set) for row-major
// A (k×m), B (k×n) and C (m×n), like productNN. The kernel path takes the k
// rows in chunks, each chunk adding to what the previous ones left: every
// element still sums its terms in order.
func productTN(m, n, k int, a, b, c []float64, acc bool) {
	if !fastFMA {
		beta := 0.0
		if acc {
			beta = 1
		}
		gemm(blas.Trans, blas.NoTrans, 1, general(k, m, a), general(k, n, b), beta, general(m, n, c))
		return
	}
	if k == 0 {
		gemmAcc(m, n, 0, nil, 1, m, nil, n, c, n, acc)
		return
	}
	for l0 := 0; l0 < k; l0 += tnChunk {
		kc := min(tnChunk, k-l0)
		gemmAcc(m, n, kc, a[l0*m:], 1, m, b[l0*n:], n, c, n, acc || l0 > 0)
	}
}
