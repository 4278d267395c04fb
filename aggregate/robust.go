package aggregate

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// colBlock is how many coordinates the coordinate-wise aggregators gather at
// a time: the K values of each coordinate are copied into contiguous
// columns block by block, so the K client vectors are each read sequentially.
const colBlock = 64

// forColumns calls f(i, col) for every coordinate i with col holding the K
// clients' values of that coordinate (in input order; f may reorder col).
func forColumns(ups []Update, d int, f func(i int, col []float64)) {
	m := len(ups)
	buf := make([]float64, colBlock*m)
	for i0 := 0; i0 < d; i0 += colBlock {
		i1 := min(i0+colBlock, d)
		for k, u := range ups {
			for i, v := range u.Params[i0:i1] {
				buf[i*m+k] = v
			}
		}
		for i := i0; i < i1; i++ {
			f(i, buf[(i-i0)*m:(i-i0+1)*m])
		}
	}
}

// Median is the coordinate-wise median: for each coordinate the middle value
// of the K clients' values (the mean of the two middle values when K is
// even). It tolerates up to half of the clients sending arbitrary values.
// It is not a weighted mean: Report.Weights is nil.
type Median struct{}

func (Median) Name() string { return "median" }

func (Median) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	m := len(ups)
	forColumns(ups, len(global), func(i int, col []float64) {
		hi := selectKth(col, m/2)
		if m%2 == 1 {
			out[i] = hi
			return
		}
		lo := slices.Max(col[:m/2]) // selectKth left the smaller half in front
		out[i] = lo*0.5 + hi*0.5    // no overflow, exact when representable
	})
	return Report{}, nil
}

// selectKth reorders a so that a[k] is its k-th smallest element, the
// elements before it are <= a[k] and those after >= a[k], and returns a[k].
// Quickselect with a median-of-three pivot; it falls back to sorting when the
// partitioning degenerates, so the worst case stays O(n log n).
func selectKth(a []float64, k int) float64 {
	lo, hi := 0, len(a)-1
	budget := 2 * bits.Len(uint(len(a)))
	for hi > lo {
		if budget == 0 {
			slices.Sort(a[lo : hi+1])
			return a[k]
		}
		budget--
		mid := lo + (hi-lo)/2
		// Median of three into a[mid].
		if a[mid] < a[lo] {
			a[mid], a[lo] = a[lo], a[mid]
		}
		if a[hi] < a[lo] {
			a[hi], a[lo] = a[lo], a[hi]
		}
		if a[hi] < a[mid] {
			a[hi], a[mid] = a[mid], a[hi]
		}
		p := a[mid]
		// Hoare partition.
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
		default:
			return a[k]
		}
	}
	return a[k]
}

// TrimmedMean is the coordinate-wise trimmed mean: for each coordinate the
// floor(Beta K) smallest and the floor(Beta K) largest of the K values are
// dropped and the rest averaged. Beta is in [0, 0.5); Beta = 0 is the plain
// mean. The kept values are summed in sorted order, so the result does not
// depend on the order of the clients. Report.Weights is nil (the weights
// differ per coordinate); Report.Metrics["trimmed"] is the count dropped at
// each end.
type TrimmedMean struct {
	Beta float64
}

func (t TrimmedMean) Name() string { return "trimmed:beta=" + ftoa(t.Beta) }

func (t TrimmedMean) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if !(t.Beta >= 0 && t.Beta < 0.5) {
		return Report{}, fmt.Errorf("aggregate: trimmed mean: beta = %v, want it in [0, 0.5)", t.Beta)
	}
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	m := len(ups)
	cut := int(math.Floor(t.Beta * float64(m)))
	keep := m - 2*cut
	inv := 1 / float64(keep)
	forColumns(ups, len(global), func(i int, col []float64) {
		slices.Sort(col)
		mid := col[cut : m-cut]
		var s float64
		for _, v := range mid {
			s += v * inv
		}
		// The mean lies in [mid[0], mid[last]]; clamping only corrects
		// rounding (and overflow at the edge of the float64 range).
		out[i] = min(max(s, mid[0]), mid[keep-1])
	})
	return Report{Metrics: map[string]float64{"trimmed": float64(cut)}}, nil
}

// NormBound bounds each client's update before handing the updates to Inner,
// any aggregator: the delta w_k - global is scaled down to norm B when it is
// longer, w'_k = global + (w_k - global) min(1, B/||w_k - global||).
// B is Bound when Bound > 0, else Mult times the median of the round's delta
// norms (when that median is 0, because most clients did not move, the
// median of the non-zero norms is used; when every norm is 0 nothing is
// clipped). Exactly one of Bound and Mult must be positive.
//
// The clipped updates keep their client id, sample count, anchor gradient
// and loss; stateful inner aggregators (SimProx) therefore see and remember
// the clipped models. Report is Inner's, with Metrics gaining norm_bound (B)
// and clipped (how many updates were scaled down).
type NormBound struct {
	Inner Aggregator
	Bound float64
	Mult  float64
}

func (n NormBound) Name() string {
	s := "normbound:"
	if n.Bound > 0 {
		s += "bound=" + ftoa(n.Bound)
	} else {
		s += "mult=" + ftoa(n.Mult)
	}
	inner := "<nil>"
	if n.Inner != nil {
		inner = n.Inner.Name()
	}
	return s + ":inner=" + inner
}

func (n NormBound) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if n.Inner == nil {
		return Report{}, fmt.Errorf("aggregate: normbound: no inner aggregator")
	}
	if (n.Bound > 0) == (n.Mult > 0) || math.IsInf(n.Bound, 0) || math.IsInf(n.Mult, 0) || math.IsNaN(n.Bound) || math.IsNaN(n.Mult) {
		return Report{}, fmt.Errorf("aggregate: normbound: want exactly one of bound > 0 and mult > 0 (finite), have bound = %v, mult = %v", n.Bound, n.Mult)
	}
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	m, d := len(ups), len(global)
	// Norms on a common power-of-two scale: they cannot overflow, and the
	// clipping factor B/||delta|| is scale-free.
	sc, inv := pow2Scale(maxAbs(global, ups))
	norms := make([]float64, m)
	for k, u := range ups {
		var ss float64
		for i, w := range u.Params {
			h := (w*0.5 - global[i]*0.5) * inv
			ss += h * h
		}
		norms[k] = 2 * math.Sqrt(ss)
	}
	b := n.Bound * inv
	if n.Bound == 0 {
		b = n.Mult * medianOf(norms)
	}
	clipped := 0
	cl := make([]Update, m)
	buf := make([]float64, m*d)
	for k, u := range ups {
		cl[k] = u
		if !(norms[k] > b) {
			continue
		}
		clipped++
		p := buf[k*d : (k+1)*d]
		// global + (w - global) B/||w - global||, computed as
		// global + h B/(||w - global||/2) with h = w/2 - global/2, which
		// cannot overflow.
		f := b / (norms[k] * 0.5)
		for i, w := range u.Params {
			g := global[i]
			v := g + (w*0.5-g*0.5)*f
			// The exact value lies between global and w.
			p[i] = min(max(v, min(g, w)), max(g, w))
		}
		cl[k].Params = p
	}
	rep, err := n.Inner.Aggregate(global, cl, out)
	if err != nil {
		return rep, fmt.Errorf("normbound inner %s: %w", n.Inner.Name(), err)
	}
	if rep.Metrics == nil {
		rep.Metrics = map[string]float64{}
	}
	rep.Metrics["norm_bound"] = min(b*sc, math.MaxFloat64) // saturates
	rep.Metrics["clipped"] = float64(clipped)
	return rep, nil
}

// medianOf returns the median of the values (the mean of the two middle ones
// for an even count); when it is 0 and some value is positive, the median of
// the positive values.
func medianOf(v []float64) float64 {
	med := func(a []float64) float64 {
		a = slices.Clone(a)
		slices.Sort(a)
		n := len(a)
		if n%2 == 1 {
			return a[n/2]
		}
		return a[n/2-1]*0.5 + a[n/2]*0.5
	}
	md := med(v)
	if md > 0 {
		return md
	}
	var pos []float64
	for _, x := range v {
		if x > 0 {
			pos = append(pos, x)
		}
	}
	if len(pos) == 0 {
		return 0
	}
	return med(pos)
}
