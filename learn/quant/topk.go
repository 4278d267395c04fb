package quant

import (
	"encoding/binary"
	"math"

	"github.com/edgefl/edgefl/internal/selectk"
)

// selectTopK returns, in ascending order, the indices of the k entries of v
// with the largest magnitude, ties going to the lower index, exact zeros
// left out (so it may return fewer than k). The result lives in c.idx.
func (c *Codec) selectTopK(v []float64, k int) []uint32 {
	n := len(v)
	idx := c.idx[:0]
	if k <= 0 {
		return idx
	}
	t := 0.0 // keep |v_i| > t, and |v_i| == t while ties remain
	ties := n
	if k < n {
		c.abs = resize(c.abs, n)
		for i, f := range v {
			c.abs[i] = math.Abs(f)
		}
		t = kthSmallest(c.abs, n-k) // the k-th largest magnitude
		gt := 0
		for _, f := range v {
			if math.Abs(f) > t {
				gt++
			}
		}
		ties = k - gt
	}
	for i, f := range v {
		a := math.Abs(f)
		if a > t || (a == t && a > 0 && ties > 0) {
			if a == t {
				ties--
			}
			idx = append(idx, uint32(i))
		}
	}
	c.idx = idx
	return idx
}

// kthSmallest returns the m-th smallest (0-based) of a (no NaNs), reordering
// a. Quickselect with a median-of-three pivot; past a depth limit it sorts
// what is left, so the worst case is O(n log n).
func kthSmallest(a []float64, m int) float64 { return selectk.Kth(a, m) }

// appendIndices writes ascending indices as uvarints: the first index, then
// each gap minus one.
func appendIndices(dst []byte, idx []uint32) []byte {
	prev := -1
	for _, i := range idx {
		dst = binary.AppendUvarint(dst, uint64(int(i)-prev-1))
		prev = int(i)
	}
	return dst
}

// parseIndices reads nnz indices from the start of p into idx (reused) and
// returns them with the number of bytes consumed. Every index must be < dim,
// and each varint at most 5 bytes.
func parseIndices(p []byte, nnz, dim int, idx []uint32) ([]uint32, int, error) {
	idx = resize(idx, nnz)
	off, next := 0, uint64(0) // next: the smallest index allowed
	for j := range nnz {
		g, m := binary.Uvarint(p[off:])
		if m <= 0 || m > binary.MaxVarintLen32 {
			return idx, 0, corrupt("index varint %d at byte %d is malformed", j, off)
		}
		off += m
		i := next + g
		if g >= uint64(dim) || i >= uint64(dim) {
			return idx, 0, corrupt("index %d is %d, dimension %d", j, i, dim)
		}
		idx[j] = uint32(i)
		next = i + 1
	}
	return idx, off, nil
}

// resize returns s with length n, reusing its storage when it can.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
