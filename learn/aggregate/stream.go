package aggregate

import (
	"fmt"
	"math"
)

// Streaming: the weighted means (FedAvg, Mean and its labels fedprox and
// fedsplit-mean) are sums sum_k c_k w_k whose coefficients depend on the
// sample counts alone. Their caller can take the coefficients from the
// counts first (Summable.Weights), then fold the updates into a Sum one
// at a time, in input order, holding one decoded update at once: O(d)
// memory instead of O(K d). Aggregate itself runs the same Weights and
// the same Sum over its in-memory updates, so the two forms agree bit for
// bit (one summation order). The other aggregators need every update at
// once (the median and the trimmed mean sort each coordinate, Krum-like
// and similarity weights compare the updates with each other): K d
// float64 values, 8 K d bytes.

// Summable is an aggregator whose result is sum_k c_k w_k, the
// coefficients c_k a function of the updates' sample counts only.
type Summable interface {
	Aggregator
	// Weights returns the report Aggregate would return for updates with
	// these sample counts (Params are not read), its Weights the c_k in
	// input order.
	Weights(ups []Update) (Report, error)
}

// AsSummable returns a as a Summable when its result is a weighted sum
// of the updates (FedAvg, Mean), and false otherwise.
func AsSummable(a Aggregator) (Summable, bool) {
	s, ok := a.(Summable)
	return s, ok
}

// Sum folds updates into sum_k c_k w_k, in the order they are added:
// weightedSum's loop, one update at a time. The coefficients must be
// non-negative and sum to 1 (a convex combination); a coordinate that
// rounded past the largest float64 is recomputed at half scale by a
// second pass over the same updates (Overflowed, Redo, Finish).
type Sum struct {
	out  []float64
	k    int
	redo []int     // the coordinates to recompute, after the first pass
	half []float64 // per redo coordinate: sum_k c_k (w_k[i] / 2)
	lo   []float64
	hi   []float64
}

// NewSum starts a sum into out (cleared).
func NewSum(out []float64) *Sum {
	clear(out)
	return &Sum{out: out}
}

// checkParams is check's test of one update: its dimension and finite
// values (k its index, for the message).
func checkParams(k int, u Update, d int) error {
	if len(u.Params) != d {
		return fmt.Errorf("%w: update %d (%s) has %d, want %d", ErrDim, k, u.Client, len(u.Params), d)
	}
	if !allFinite(u.Params) {
		return fmt.Errorf("%w in update %d (%s)", ErrNonFinite, k, u.Client)
	}
	return nil
}

// Add folds in the next update with coefficient c, after checking it as
// Aggregate checks its updates (dimension, finite values). A zero
// coefficient adds nothing.
func (s *Sum) Add(c float64, u Update) error {
	if err := checkParams(s.k, u, len(s.out)); err != nil {
		return err
	}
	s.k++
	s.add(c, u.Params)
	return nil
}

func (s *Sum) add(c float64, v []float64) {
	if c == 0 {
		return
	}
	out := s.out[:len(v)]
	for i, x := range v {
		out[i] += c * x
	}
}

// Overflowed ends the first pass: it says whether some coordinate rounded
// past the largest float64, in which case the same updates must be
// handed to Redo again, in the same order, before Finish.
func (s *Sum) Overflowed() bool {
	s.redo = s.redo[:0]
	for i, v := range s.out {
		if math.IsInf(v, 0) || math.IsNaN(v) {
			s.redo = append(s.redo, i)
		}
	}
	if len(s.redo) == 0 {
		return false
	}
	n := len(s.redo)
	s.half, s.lo, s.hi = make([]float64, n), make([]float64, n), make([]float64, n)
	for j := range n {
		s.lo[j], s.hi[j] = math.Inf(1), math.Inf(-1)
	}
	return true
}

// Redo is the second pass's step: the next update with its coefficient,
// for the coordinates that overflowed (each at half scale, so that the
// sum cannot overflow, and within the range of the inputs).
func (s *Sum) Redo(c float64, v []float64) {
	if c == 0 {
		return
	}
	for j, i := range s.redo {
		x := v[i]
		s.half[j] += c * (x * 0.5)
		s.lo[j], s.hi[j] = min(s.lo[j], x), max(s.hi[j], x)
	}
}

// Finish writes the recomputed coordinates, doubled and clamped into the
// range of the inputs (a convex combination lies within it).
func (s *Sum) Finish() {
	for j, i := range s.redo {
		if s.lo[j] > s.hi[j] { // no weight at all: cannot happen for a convex combination
			s.out[i] = 0
			continue
		}
		s.out[i] = min(max(2*s.half[j], s.lo[j]), s.hi[j])
	}
	s.redo, s.half, s.lo, s.hi = nil, nil, nil, nil
}
