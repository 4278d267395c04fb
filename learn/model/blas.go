package model

import (
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// gemmTile bounds the output tiles handed to blas64.Gemm. gonum's pure-Go
// Dgemm splits any product whose output spans four or more 64×64 blocks
// across new goroutines, allocating a channel and closures on every call; that
// already happens for the 784×10 gradient of a 10-sample batch. Handing it
// tiles of at most three blocks keeps the hot loop on the caller's goroutine
// and allocation-free (TestSteadyStateAllocs guards this).
const gemmTile = 64

// gemm computes C = alpha op(A) op(B) + beta C like blas64.Gemm, tile by tile.
func gemm(tA, tB blas.Transpose, alpha float64, a, b blas64.General, beta float64, c blas64.General) {
	m, n := c.Rows, c.Cols
	if m == 0 || n == 0 {
		return
	}
	k := a.Cols
	if tA != blas.NoTrans {
		k = a.Rows
	}
	if k == 0 {
		// An empty inner dimension (a zero-sample batch) leaves beta C; the
		// operands may be nil, so they must not be sliced.
		for i := range m {
			row := c.Data[i*c.Stride : i*c.Stride+n]
			if beta == 0 {
				clear(row) // BLAS semantics: C is not read when beta is 0
				continue
			}
			for j := range row {
				row[j] *= beta
			}
		}
		return
	}
	colTile := min(n, 3*gemmTile)
	rowTile := gemmTile
	if colTile <= gemmTile {
		rowTile = 3 * gemmTile
	}
	for i0 := 0; i0 < m; i0 += rowTile {
		i1 := min(i0+rowTile, m)
		// Rows i0:i1 of op(A).
		as := a
		if tA == blas.NoTrans {
			as.Rows, as.Data = i1-i0, a.Data[i0*a.Stride:]
		} else {
			as.Cols, as.Data = i1-i0, a.Data[i0:]
		}
		for j0 := 0; j0 < n; j0 += colTile {
			j1 := min(j0+colTile, n)
			// Columns j0:j1 of op(B).
			bs := b
			if tB == blas.NoTrans {
				bs.Cols, bs.Data = j1-j0, b.Data[j0:]
			} else {
				bs.Rows, bs.Data = j1-j0, b.Data[j0*b.Stride:]
			}
			cs := blas64.General{Rows: i1 - i0, Cols: j1 - j0, Stride: c.Stride, Data: c.Data[i0*c.Stride+j0:]}
			blas64.Gemm(tA, tB, alpha, as, bs, beta, cs)
		}
	}
}

// general views a row-major rows×cols matrix stored in data.
func general(rows, cols int, data []float64) blas64.General {
	return blas64.General{Rows: rows, Cols: cols, Stride: max(cols, 1), Data: data}
}

// setRows sets every row of the row-major matrix m (len(v) columns) to v.
func setRows(m []float64, v []float64) {
	for i := 0; i+len(v) <= len(m); i += len(v) {
		copy(m[i:i+len(v)], v)
	}
}

// addColSums adds the column sums of the row-major matrix m (len(dst)
// columns) to dst.
func addColSums(dst, m []float64) {
	c := len(dst)
	for i := 0; i+c <= len(m); i += c {
		row := m[i : i+c]
		for j, v := range row {
			dst[j] += v
		}
	}
}

// softmaxXent computes the mean softmax cross-entropy of the logits z (n×c,
// row-major) against the class indices y. When grad is set it overwrites z
// with the gradient of that mean with respect to the logits,
// (softmax(z) - onehot(y))/n. A target that is not a class index makes the
// loss NaN instead of indexing out of range (see CheckTargets).
func softmaxXent(z []float64, c int, y []float64, grad bool) float64 {
	n := len(y)
	if n == 0 {
		return 0
	}
	inv := 1 / float64(n)
	var loss float64
	for i, yi := range y {
		row := z[i*c : (i+1)*c]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		k := int(yi)
		valid := yi >= 0 && yi < float64(c) && float64(k) == yi
		zy := 0.0
		if valid {
			zy = row[k]
		}
		var s float64
		if grad {
			for j, v := range row {
				e := math.Exp(v - mx)
				row[j] = e
				s += e
			}
		} else {
			for _, v := range row {
				s += math.Exp(v - mx)
			}
		}
		// log-sum-exp shifted by the row maximum: no overflow, and the
		// largest term is exactly 1 so the log never sees 0.
		if valid {
			loss += mx + math.Log(s) - zy
		} else {
			loss = math.NaN()
		}
		if grad {
			scale := inv / s
			for j := range row {
				row[j] *= scale
			}
			if valid {
				row[k] -= inv
			}
		}
	}
	return loss * inv
}
