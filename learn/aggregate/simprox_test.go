package aggregate

import (
	"fmt"
	"math"
	"testing"
)

// directSimProx computes SimProx's quantities the obvious way: every
// pairwise distance and cosine by its own loop over the raw vectors, g_i
// from prev (nil entries meaning first seen: the global model), exp(-g_i) in
// the linear domain. It is the reference for the Gram-matrix path.
func directSimProx(cfg SimProxConfig, global []float64, ups []Update, prev [][]float64) simproxTerms {
	m := len(ups)
	vec := func(k int) []float64 {
		v := append([]float64(nil), ups[k].Params...)
		if cfg.On == OnUpdates {
			for i := range v {
				v[i] -= global[i]
			}
		}
		return v
	}
	norm := func(a []float64) float64 {
		var s float64
		for _, x := range a {
			s += x * x
		}
		return math.Sqrt(s)
	}
	cos := func(a, b []float64) float64 {
		na, nb := norm(a), norm(b)
		if na == 0 || nb == 0 {
			return 0
		}
		var s float64
		for i := range a {
			s += a[i] * b[i]
		}
		return s / na / nb
	}
	dist := func(a, b []float64) float64 {
		var s float64
		for i := range a {
			s += (a[i] - b[i]) * (a[i] - b[i])
		}
		return math.Sqrt(s)
	}
	t := simproxTerms{cos: make([]float64, m*m), gauss: make([]float64, m*m), g: make([]float64, m)}
	var sigma float64
	for i := range m {
		for j := i + 1; j < m; j++ {
			sigma += dist(ups[i].Params, ups[j].Params)
		}
	}
	sigma /= float64(m*(m-1)) / 2
	t.sigma = sigma
	for i := range m {
		for j := range m {
			t.cos[i*m+j] = cos(vec(i), vec(j))
			d := dist(ups[i].Params, ups[j].Params)
			t.gauss[i*m+j] = math.Exp(-d * d / (2 * sigma * sigma))
		}
	}
	ref := global
	if cfg.On == OnUpdates {
		ref = make([]float64, len(global))
		for k := range ups {
			for i, v := range vec(k) {
				ref[i] += v / float64(m)
			}
		}
	}
	for k := range ups {
		t.sbar += cos(vec(k), ref) / float64(m)
	}
	t.lambda = cfg.Lambda0
	if t.sbar < cfg.Tau {
		t.lambda = cfg.Lambda0 * t.sbar / cfg.Tau
	}
	alpha := make([]float64, m)
	var z float64
	for i := range m {
		p := prev[i]
		if p == nil || cfg.ProxToGlobal {
			p = global
		}
		t.g[i] = dist(ups[i].Params, p)
		var s float64
		for j := range m {
			if j != i {
				s += t.lambda*t.cos[i*m+j] + (1-t.lambda)*t.gauss[i*m+j]
			}
		}
		alpha[i] = math.Exp(-t.g[i]) * (1 + s/float64(m-1))
		z += alpha[i]
	}
	t.norm = make([]float64, m)
	var ze float64
	for i := range alpha {
		t.norm[i] = alpha[i] / z
		ze += math.Exp(t.norm[i])
	}
	t.weights = make([]float64, m)
	for i := range alpha {
		t.weights[i] = math.Exp(t.norm[i]) / ze
		if cfg.NoSoftmax {
			t.weights[i] = t.norm[i]
		}
	}
	return t
}

// TestSimProxGramMatchesDirect: the Gram-matrix, log-domain computation
// equals the direct pairwise one, on weights and on updates, with and
// without history, for models near the origin and far from it.
func TestSimProxGramMatchesDirect(t *testing.T) {
	cases := []struct {
		name         string
		centre, sprd float64
		on           Space
		prevGlobal   bool
		noSoftmax    bool
		lambda0, tau float64
	}{
		{"weights near origin", 0, 1, OnWeights, false, false, 0.7, 0.5},
		{"weights far from origin", 50, 0.01, OnWeights, false, false, 0.7, 0.5},
		{"updates", 3, 0.5, OnUpdates, false, false, 0.7, 0.5},
		{"updates, prev=global", 3, 0.5, OnUpdates, true, false, 0.7, 0.5},
		{"weights, no softmax", 1, 0.3, OnWeights, false, true, 0.7, 0.5},
		{"lambda below threshold", 0, 1, OnWeights, false, false, 0.9, 0.99},
		{"lambda0 = 1", 0.2, 1, OnUpdates, false, false, 1, 0.3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := newRand(7)
			cfg := SimProxConfig{Lambda0: c.lambda0, Tau: c.tau, On: c.on, ProxToGlobal: c.prevGlobal, NoSoftmax: c.noSoftmax}
			s, err := NewSimProx(cfg)
			if err != nil {
				t.Fatal(err)
			}
			g := randVec(rng, 40, c.centre, 1)
			prev := make([][]float64, 8)
			for round := range 3 {
				ups := randUpdates(rng, g, 8, c.sprd, 1)
				// Round 2: only some clients return, one newcomer.
				if round == 2 {
					ups[3].Client = "newcomer"
				}
				for k, u := range ups {
					prev[k] = nil
					if p, ok := s.prev[u.Client]; ok {
						prev[k] = p
					}
				}
				got := s.terms(g, ups)
				want := directSimProx(cfg, g, ups, prev)
				cmp := func(name string, a, b []float64, tol float64) {
					t.Helper()
					for i := range a {
						if !near(a[i], b[i], tol) {
							t.Fatalf("round %d: %s[%d] = %.17g, direct %.17g", round, name, i, a[i], b[i])
						}
					}
				}
				cmp("sigma", []float64{got.sigma}, []float64{want.sigma}, 1e-12)
				cmp("s_bar", []float64{got.sbar}, []float64{want.sbar}, 1e-12)
				cmp("lambda", []float64{got.lambda}, []float64{want.lambda}, 1e-12)
				cmp("cos", got.cos, want.cos, 1e-12)
				// Distances from the centred Gram matrix: relative
				// accuracy of sqrt(eps) at worst for near-equal models.
				cmp("gauss", got.gauss, want.gauss, 1e-9)
				cmp("g", got.g, want.g, 1e-12)
				cmp("normalised alpha", got.norm, want.norm, 1e-9)
				cmp("weights", got.weights, want.weights, 1e-9)
				aggregate(t, s, g, ups)
				g = randVec(rng, 40, c.centre, 1)
			}
		})
	}
}

// TestSimProxLogDomain: proximal terms so large that exp(-g_i) underflows
// to 0 for every client still give the weights exp(-g_i)(1+...) normalised:
// only differences of g matter.
func TestSimProxLogDomain(t *testing.T) {
	for _, shift := range []float64{0, 800, 1e6, 1e300} {
		t.Run(fmt.Sprint(shift), func(t *testing.T) {
			s, _ := NewSimProx(SimProxConfig{Lambda0: 0.7, Tau: 0.5, NoSoftmax: true})
			// First round at the origin, second round moved by shift+i
			// along the first axis: g_i = shift + i.
			d := 3
			g := fill(d, 0)
			ups := constUpdates(3, g, nil)
			aggregate(t, s, g, ups)
			for i := range ups {
				ups[i].Params = []float64{shift + float64(i), 0, 0}
			}
			tm := s.terms(g, ups)
			// alpha_i ∝ exp(-(g_i - g_0)) c_i with c_i from the terms.
			var want []float64
			var z float64
			for i := range 3 {
				var row float64
				for j := range 3 {
					if j != i {
						row += tm.lambda*tm.cos[i*3+j] + (1-tm.lambda)*tm.gauss[i*3+j]
					}
				}
				a := math.Exp(-(tm.g[i] - tm.g[0])) * (1 + row/2)
				want = append(want, a)
				z += a
			}
			for i := range want {
				want[i] /= z
			}
			// g_i carries rounding of order eps*g_i, so differences of g
			// (all that matters) are accurate to a few eps*g; at 1e300 the
			// g_i are equal in float64 and the weights exact.
			tol := 1e-12
			if shift < 1e100 {
				tol += 16 * eps * shift
			}
			for i := range want {
				if !finite(tm.weights[i]) || !near(tm.weights[i], want[i], tol) {
					t.Fatalf("weights %v, want %v (g = %v)", tm.weights, want, tm.g)
				}
			}
			if shift >= 1e6 && math.Exp(-tm.g[0]) != 0 {
				t.Fatalf("test does not exercise underflow")
			}
		})
	}
}

func TestDynamicLambda(t *testing.T) {
	cases := []struct{ l0, tau, sbar, want float64 }{
		{0.7, 0.5, 0.9, 0.7},
		{0.7, 0.5, 0.5, 0.7},
		{0.7, 0.5, 0.25, 0.35},
		{0.7, 0.5, 0, 0},
		{0.7, 0.5, -0.5, 0}, // clamped: the paper's lambda is in [0, 1]
		{1, 0.2, 0.1, 0.5},
		{0, 0.5, 0.1, 0},
	}
	for _, c := range cases {
		if got := dynamicLambda(c.l0, c.tau, c.sbar); !near(got, c.want, 1e-15) {
			t.Errorf("dynamicLambda(%v, %v, %v) = %v, want %v", c.l0, c.tau, c.sbar, got, c.want)
		}
	}
}

// TestSimProxHistory: a first-seen client's g is its distance to the
// global model; afterwards the distance to what it submitted last; Reset
// forgets; a changed dimension counts as first seen.
func TestSimProxHistory(t *testing.T) {
	s, _ := NewSimProx(DefaultSimProxConfig())
	g := []float64{1, 1}
	ups := []Update{{Client: "a", Params: []float64{4, 5}}, {Client: "b", Params: []float64{1, 2}}}
	if tm := s.terms(g, ups); !near(tm.g[0], 5, 1e-15) || !near(tm.g[1], 1, 1e-15) {
		t.Fatalf("first round g = %v, want [5 1]", tm.g)
	}
	aggregate(t, s, g, ups)
	ups2 := []Update{{Client: "a", Params: []float64{4, 6}}, {Client: "c", Params: []float64{1, 1}}}
	if tm := s.terms(g, ups2); tm.g[0] != 1 || tm.g[1] != 0 {
		t.Fatalf("second round g = %v, want [1 0]", tm.g)
	}
	ups[0].Params[0] = 100 // the aggregator must have copied the model
	if tm := s.terms(g, ups2); tm.g[0] != 1 {
		t.Fatalf("history aliases the caller's slice: g = %v", tm.g)
	}
	s.Reset()
	if tm := s.terms(g, ups2); !near(tm.g[0], math.Hypot(3, 5), 1e-15) {
		t.Fatalf("after Reset g = %v", tm.g)
	}
}

// TestSimProxSoftmaxSpread: the paper's softmax of normalised weights keeps
// every ratio of weights within e; without it the ratio is free.
func TestSimProxSoftmaxSpread(t *testing.T) {
	g := fill(4, 0)
	ups := []Update{
		{Client: "near", Params: []float64{0.01, 0, 0, 0}},
		{Client: "far", Params: []float64{20, 0, 0, 0}},
		{Client: "mid", Params: []float64{1, 1, 0, 0}},
	}
	on, _ := NewSimProx(DefaultSimProxConfig())
	_, rep := aggregate(t, on, g, ups)
	if r := rep.Weights[0] / rep.Weights[1]; r > math.E || r < 1 {
		t.Fatalf("softmax weights %v: ratio %v not in [1, e]", rep.Weights, r)
	}
	cfg := DefaultSimProxConfig()
	cfg.NoSoftmax = true
	off, _ := NewSimProx(cfg)
	_, rep = aggregate(t, off, g, ups)
	if r := rep.Weights[0] / rep.Weights[1]; r < 1e6 {
		t.Fatalf("normalised weights %v: ratio %v, want huge", rep.Weights, r)
	}
}

// TestSimProxEdgeCases covers m = 1, identical models and bad configs.
func TestSimProxEdgeCases(t *testing.T) {
	s, _ := NewSimProx(DefaultSimProxConfig())
	g := []float64{1, 2}
	out, rep := aggregate(t, s, g, []Update{{Client: "x", Params: []float64{3, 4}}})
	if out[0] != 3 || out[1] != 4 || rep.Weights[0] != 1 {
		t.Fatalf("m = 1: out %v weights %v", out, rep.Weights)
	}
	s.Reset()
	_, rep = aggregate(t, s, g, constUpdates(4, []float64{5, 5}, nil))
	for _, w := range rep.Weights {
		if w != 0.25 {
			t.Fatalf("identical models: weights %v", rep.Weights)
		}
	}
	if rep.Metrics["sigma"] != 0 {
		t.Fatalf("identical models: sigma %v", rep.Metrics["sigma"])
	}
	for _, c := range []SimProxConfig{{Lambda0: -0.1, Tau: 0.5}, {Lambda0: 1.1, Tau: 0.5},
		{Lambda0: 0.5, Tau: 0}, {Lambda0: math.NaN(), Tau: 0.5}, {Lambda0: 0.5, Tau: math.Inf(1)}, {Lambda0: 0.5, Tau: 0.5, On: 7}} {
		if _, err := NewSimProx(c); err == nil {
			t.Errorf("NewSimProx(%+v) accepted", c)
		}
	}
}

// TestSimProxCosineScaleInvariance: scaling every vector by a common
// positive factor leaves S^C, S^G and s_bar unchanged (g_i, an absolute
// distance, does change).
func TestSimProxCosineScaleInvariance(t *testing.T) {
	for _, on := range []Space{OnWeights, OnUpdates} {
		for _, c := range []float64{3.7, 1e-200, 1e250} {
			rng := newRand(9)
			g := randVec(rng, 15, 1, 1)
			ups := randUpdates(rng, g, 6, 0.4, 1)
			cfg := DefaultSimProxConfig()
			cfg.On = on
			a, _ := NewSimProx(cfg)
			base := a.terms(g, ups)
			sg, sups := scaleAll(c, g, ups)
			sc := a.terms(sg, sups)
			if e := maxRelDiff(base.cos, sc.cos); e > 1e-12 {
				t.Errorf("%v, x%g: cosines change by %g", on, c, e)
			}
			if e := maxRelDiff(base.gauss, sc.gauss); e > 1e-9 {
				t.Errorf("%v, x%g: Gaussian similarities change by %g", on, c, e)
			}
			if !near(base.sbar, sc.sbar, 1e-12) || !near(base.lambda, sc.lambda, 1e-12) {
				t.Errorf("%v, x%g: s_bar %v -> %v", on, c, base.sbar, sc.sbar)
			}
		}
	}
}
