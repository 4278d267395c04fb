package aggregate

import (
	"fmt"
	"math"
	"slices"

	"github.com/edgefl/edgefl/internal/selectk"
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
func selectKth(a []float64, k int) float64 { return selectk.Kth(a, k) }

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

// Stateful: as its inner aggregator.
func (n NormBound) Stateful() bool { return n.Inner != nil && IsStateful(n.Inner) }

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
	// Work with ln ||w_k - global||: each norm is computed at its own scale
	// (a common scale would let one huge update underflow every other norm
	// to zero, the very case bounding is for), and nothing overflows.
	logn := make([]float64, m)
	for k, u := range ups {
		logn[k] = logDist(u.Params, global)
	}
	logB := math.Log(n.Bound)
	if n.Bound == 0 {
		logB = math.Log(n.Mult) + logMedian(logn)
	}
	clipped := 0
	cl := make([]Update, m)
	buf := make([]float64, m*d)
	for k, u := range ups {
		cl[k] = u
		if !(logn[k] > logB) {
			continue
		}
		clipped++
		p := buf[k*d : (k+1)*d]
		// global + (w - global) f with f = B/||w - global|| < 1, computed
		// as global + (w/2 - global/2)(2f), which cannot overflow.
		f2 := 2 * math.Exp(logB-logn[k])
		for i, w := range u.Params {
			g := global[i]
			v := g + (w*0.5-g*0.5)*f2
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
	rep.Metrics["norm_bound"] = min(math.Exp(logB), math.MaxFloat64) // saturates
	rep.Metrics["clipped"] = float64(clipped)
	return rep, nil
}

// logMedian returns ln of the median of exp(l) (the mean of the two middle
// values for an even count); when that median is 0 (-Inf) and some value is
// positive, ln of the median of the positive values; -Inf when all are 0.
func logMedian(l []float64) float64 {
	med := func(a []float64) float64 {
		a = slices.Clone(a)
		slices.Sort(a)
		n := len(a)
		if n%2 == 1 {
			return a[n/2]
		}
		lo, hi := a[n/2-1], a[n/2]
		if math.IsInf(lo, -1) {
			return hi - math.Ln2
		}
		// ln((e^lo + e^hi)/2) with hi >= lo.
		return hi + math.Log1p(math.Exp(lo-hi)) - math.Ln2
	}
	md := med(l)
	if !math.IsInf(md, -1) {
		return md
	}
	var pos []float64
	for _, x := range l {
		if !math.IsInf(x, -1) {
			pos = append(pos, x)
		}
	}
	if len(pos) == 0 {
		return math.Inf(-1)
	}
	return med(pos)
}
