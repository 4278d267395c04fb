// Package selectk owns the in-place selection of the k-th smallest value
// that the robust aggregators (median, trimmed mean) and quant's top-k share.
package selectk

import (
	"math/bits"
	"sort"
)

// Kth reorders a (no NaNs) so that a[k] is its k-th smallest (0-based)
// value, everything before it is <= a[k] and everything after it >= a[k],
// and returns a[k]. Quickselect with a median-of-three pivot and Hoare
// partition; past a depth limit it sorts what is left, so hostile input
// costs O(n log n) at worst, not O(n^2).
func Kth(a []float64, k int) float64 {
	lo, hi := 0, len(a)-1
	depth := 2*bits.Len(uint(len(a))) + 8
	for lo < hi {
		if depth == 0 {
			//nolint:staticcheck // S1032: sort.Float64s is slices.Sort since Go 1.22; sort.Sort keeps the float64 pdqsort instantiation out of edge-agent
			sort.Sort(sort.Float64Slice(a[lo : hi+1]))
			return a[k]
		}
		depth--
		x, y, z := a[lo], a[lo+(hi-lo)/2], a[hi]
		p := max(min(x, y), min(max(x, y), z)) // median of three
		i, j := lo, hi
		for i <= j {
			for a[i] < p {
				i++
			}
			for a[j] > p {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default: // j < k < i: a[k] == p
			return a[k]
		}
	}
	return a[k]
}
