package aggregate

import (
	"fmt"
	"math"
)

// Space says which vectors a similarity-based aggregator compares.
type Space uint8

const (
	// OnUpdates compares the updates w_k - global. Where a paper compares a
	// client with the global model, the update-space counterpart is the
	// round's mean update (1/K) sum_k (w_k - global): the global model itself
	// is a point, not a direction. It is the default (the zero value): on
	// weights, every client's model is dominated by the shared global part,
	// cosines to the global model are all close to 1 and FedSim's weights
	// collapse to the uniform mean; on updates FedSim was better on every
	// synthetic setting of docs/results.md's comparison.
	OnUpdates Space = iota
	// OnWeights compares the client models w_k themselves, as the papers
	// write (SimProx eq. 8-9, FedSim's sim(w_k, w), FedSiam-DA eq. 14).
	OnWeights
)

func (s Space) String() string {
	switch s {
	case OnWeights:
		return "weights"
	case OnUpdates:
		return "updates"
	}
	return fmt.Sprintf("Space(%d)", uint8(s))
}

// ParseSpace parses "weights" or "updates".
func ParseSpace(v string) (Space, error) {
	switch v {
	case "weights":
		return OnWeights, nil
	case "updates":
		return OnUpdates, nil
	}
	return 0, fmt.Errorf("aggregate: similarity space %q: want weights or updates", v)
}

const eps = 0x1p-53 // unit roundoff of float64

// pow2Scale returns a power of two s and its exact inverse such that every
// |v| <= mx scales into [0, 1) (or, for mx beyond 2^1000, into [0, 2^24)).
// Scaling by a power of two is exact, so cosines and distance ratios computed
// on scaled vectors equal those of the originals up to ordinary rounding, and
// sums of squares of scaled vectors can neither overflow nor lose the largest
// entries to underflow.
func pow2Scale(mx float64) (s, inv float64) {
	if !(mx > 0) || math.IsInf(mx, 0) {
		return 1, 1
	}
	_, e := math.Frexp(mx)
	e = min(max(e, -1000), 1000)
	return math.Ldexp(1, e), math.Ldexp(1, -e)
}

// maxAbs returns the largest |v| over global and every update's parameters
// (which must be finite: for finite floats the order of |v| is the order of
// their bit patterns without the sign, compared here as integers).
func maxAbs(global []float64, ups []Update) float64 {
	mx := maxAbsBits(global)
	for _, u := range ups {
		mx = max(mx, maxAbsBits(u.Params))
	}
	return math.Float64frombits(mx)
}

func maxAbsBits(v []float64) uint64 {
	var mx uint64
	for _, x := range v {
		mx = max(mx, math.Float64bits(x)&^(1<<63))
	}
	return mx
}

// allFinite reports whether v holds no NaN or Inf (x*0 is NaN exactly for
// those, and a NaN makes the sum NaN).
func allFinite(v []float64) bool {
	var s float64
	for _, x := range v {
		s += x * 0
	}
	return s == 0
}

// dist returns ||a - b|| (||a|| when b is nil) without intermediate overflow
// or harmful underflow: the result is +Inf only when the true distance exceeds
// the float64 range.
func dist(a, b []float64) float64 {
	s, r := distParts(a, b)
	return 2 * s * r
}

// logDist returns ln ||a - b|| (-Inf for equal vectors), finite for any
// finite input.
func logDist(a, b []float64) float64 {
	s, r := distParts(a, b)
	if r == 0 {
		return math.Inf(-1)
	}
	return math.Ln2 + math.Log(s) + math.Log(r)
}

// distParts returns a power of two s and r with ||a - b|| = 2 s r, r at most
// sqrt(len(a)): the differences are halved (so they cannot overflow) and
// scaled by their own largest magnitude.
func distParts(a, b []float64) (s, r float64) {
	var mx float64
	for i, v := range a {
		h := v * 0.5
		if b != nil {
			h -= b[i] * 0.5
		}
		mx = max(mx, math.Abs(h))
	}
	if mx == 0 {
		return 1, 0
	}
	s, inv := pow2Scale(mx)
	var ss float64
	for i, v := range a {
		h := v * 0.5
		if b != nil {
			h -= b[i] * 0.5
		}
		h *= inv
		ss += h * h
	}
	return s, math.Sqrt(ss)
}

// cosineToRef returns cos(v_k, r) for every update, where v_k = w_k
// (centre false) or w_k - global (centre true), and r = global when p is nil,
// else r = sum_k p_k v_k (p non-negative, summing to 1). The values are
// clamped into [-1, 1]. A cosine involving a vector that is zero, or zero to
// within the rounding of its computation, is 0.
func cosineToRef(global []float64, ups []Update, centre bool, p []float64) []float64 {
	d := len(global)
	_, inv := pow2Scale(maxAbs(global, ups))
	gs := make([]float64, d) // global, scaled
	for i, g := range global {
		gs[i] = g * inv
	}
	r := make([]float64, d)
	if p == nil {
		copy(r, gs)
	} else {
		for k, u := range ups {
			pk := p[k]
			if pk == 0 {
				continue
			}
			if centre {
				for i, w := range u.Params {
					r[i] += pk * (w*inv - gs[i])
				}
			} else {
				for i, w := range u.Params {
					r[i] += pk * (w * inv)
				}
			}
		}
	}
	var rn2 float64
	for _, v := range r {
		rn2 += v * v
	}
	dots := make([]float64, len(ups))
	norms := make([]float64, len(ups))
	for k, u := range ups {
		var dot, n2 float64
		if centre {
			for i, w := range u.Params {
				v := w*inv - gs[i]
				dot += v * r[i]
				n2 += v * v
			}
		} else {
			for i, w := range u.Params {
				v := w * inv
				dot += v * r[i]
				n2 += v * v
			}
		}
		dots[k], norms[k] = dot, math.Sqrt(n2)
	}
	rn := math.Sqrt(rn2)
	if p != nil {
		// r is a mean: its rounding error is at most about m*eps times the
		// weighted mean norm. Anything below that is cancellation noise.
		var mean float64
		for k, n := range norms {
			mean += p[k] * n
		}
		if rn <= float64(len(ups)+2)*eps*mean {
			rn = 0
		}
	}
	out := make([]float64, len(ups))
	for k := range ups {
		if rn == 0 || norms[k] == 0 {
			continue
		}
		out[k] = clamp1(dots[k] / norms[k] / rn)
	}
	return out
}

func clamp1(v float64) float64 { return min(max(v, -1), 1) }

// weightStats are the weight-distribution metrics shared by the weighted
// aggregators: max_weight, min_weight, weight_entropy (natural log, 0 log 0 =
// 0).
func weightStats(m map[string]float64, w []float64) {
	mx, mn, h := math.Inf(-1), math.Inf(1), 0.0
	for _, v := range w {
		mx, mn = max(mx, v), min(mn, v)
		if v > 0 {
			h -= v * math.Log(v)
		}
	}
	m["max_weight"], m["min_weight"], m["weight_entropy"] = mx, mn, max(h, 0)
}

// uniform returns m weights of 1/m.
func uniform(m int) []float64 {
	w := make([]float64, m)
	for i := range w {
		w[i] = 1 / float64(m)
	}
	return w
}

// normalizePos turns non-negative scores into weights summing to 1; when no
// score is positive it returns uniform weights and false.
func normalizePos(s []float64) ([]float64, bool) {
	var tot float64
	for _, v := range s {
		tot += v
	}
	if !(tot > 0) {
		return uniform(len(s)), false
	}
	w := make([]float64, len(s))
	for i, v := range s {
		w[i] = v / tot
	}
	return w, true
}
