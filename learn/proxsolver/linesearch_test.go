package proxsolver

import (
	"math"
	"testing"
)

// TestLineSearches drives both line searches on one-dimensional convex
// functions phi(t) from several initial steps and checks the accepted step.
func TestLineSearches(t *testing.T) {
	funcs := []struct {
		name string
		phi  func(t float64) (float64, float64)
	}{
		{"quadratic", func(t float64) (float64, float64) { return (t - 2) * (t - 2), 2 * (t - 2) }},
		{"quartic", func(t float64) (float64, float64) { u := t - 0.3; return u * u * u * u, 4 * u * u * u }},
		{"softplus-like", func(t float64) (float64, float64) {
			return math.Log1p(math.Exp(5-t)) + 0.01*t*t, -1/(1+math.Exp(t-5)) + 0.02*t
		}},
		{"steep", func(t float64) (float64, float64) { return 1e4 * (t - 1e-5) * (t - 1e-5), 2e4 * (t - 1e-5) }},
	}
	searches := []struct {
		name string
		new  func() lineSearch
		ok   func(f0, d0, f, d float64, step float64) bool
	}{
		{"wolfe", func() lineSearch { return &wolfeSearch{c1: wolfeDecrease, c2: wolfeCurv} }, func(f0, d0, f, d, step float64) bool {
			return f <= f0+wolfeDecrease*step*d0 && math.Abs(d) <= -wolfeCurv*d0
		}},
		{"slope", func() lineSearch { return &slopeSearch{curvature: wolfeCurv, slack: slopeSlack} }, func(f0, d0, f, d, _ float64) bool {
			return f <= f0+slopeSlack*(1+math.Abs(f0)) && math.Abs(d) <= -wolfeCurv*d0
		}},
	}
	for _, fn := range funcs {
		f0, d0 := fn.phi(0)
		for _, ls := range searches {
			for _, step := range []float64{1e-6, 1e-2, 1, 100} {
				s := ls.new()
				s.init(f0, d0, step)
				accepted := false
				for range 60 {
					f, d := fn.phi(step)
					accept, next, ok := s.iterate(f, d)
					if !ok {
						break
					}
					if accept {
						if !ls.ok(f0, d0, f, d, step) {
							t.Errorf("%s on %s from %g: accepted step %g with phi %g, phi' %g", ls.name, fn.name, step, step, f, d)
						}
						accepted = true
						break
					}
					step = next
				}
				if !accepted {
					t.Errorf("%s on %s: no step accepted", ls.name, fn.name)
				}
			}
		}
	}
}

// TestHistoryDirection checks the two-loop recursion: the L-BFGS matrix H
// satisfies the secant equation H y = s for the newest pair, and -H g is a
// descent direction.
func TestHistoryDirection(t *testing.T) {
	A := [][]float64{{4, 1, 0}, {1, 3, 0.5}, {0, 0.5, 2}}
	grad := func(x []float64) []float64 {
		g := make([]float64, 3)
		for i := range 3 {
			for j := range 3 {
				g[i] += A[i][j] * x[j]
			}
		}
		return g
	}
	h := newHistory(2, 3) // fewer slots than pairs: the ring wraps
	x := []float64{1, -2, 0.5}
	var s, y []float64
	for _, step := range [][]float64{{0.1, 0, 0}, {0, 0.2, 0.1}, {0.05, -0.1, 0.3}} {
		x1 := []float64{x[0] + step[0], x[1] + step[1], x[2] + step[2]}
		g0, g1 := grad(x), grad(x1)
		h.push(x1, x, g1, g0)
		s, y = step, []float64{g1[0] - g0[0], g1[1] - g0[1], g1[2] - g0[2]}
		x = x1
	}
	d := make([]float64, 3)
	h.direction(y, d)
	for i := range s {
		if math.Abs(-d[i]-s[i]) > 1e-12 {
			t.Fatalf("H y = %v, want s = %v", []float64{-d[0], -d[1], -d[2]}, s)
		}
	}
	for _, g := range [][]float64{{1, 0, 0}, {0, -1, 0}, {0.3, 0.2, -5}} {
		h.direction(g, d)
		if dot(g, d) >= 0 {
			t.Errorf("g = %v: g·d = %g, want a descent direction", g, dot(g, d))
		}
	}
	// A pair with non-positive curvature is skipped, and leaves the
	// history (full here) as it was.
	g := []float64{0.3, 0.2, -5}
	before := make([]float64, 3)
	h.direction(g, before)
	n, head := h.n, h.head
	h.push([]float64{1, 0, 0}, []float64{0, 0, 0}, []float64{-1, 0, 0}, []float64{0, 0, 0})
	h.direction(g, d)
	if h.n != n || h.head != head || dist(before, d) != 0 {
		t.Errorf("a pair with s·y < 0 changed the history")
	}
}
