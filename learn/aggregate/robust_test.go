package aggregate

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

func col(vals ...float64) []Update {
	u := make([]Update, len(vals))
	for k, v := range vals {
		u[k] = Update{Client: fmt.Sprint(k), Params: []float64{v, -v}, Samples: 1}
	}
	return u
}

func TestMedian(t *testing.T) {
	cases := []struct {
		vals []float64
		want float64
	}{
		{[]float64{5}, 5},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{1, 1, 1, 1e9}, 1},                                   // outlier ignored
		{[]float64{-1e9, 0, 1, 2, 1e300}, 1},                           // two outliers
		{[]float64{math.MaxFloat64, math.MaxFloat64}, math.MaxFloat64}, // no overflow averaging
		{[]float64{2, 2, 2, 2, 2, 2}, 2},
	}
	for _, c := range cases {
		out, rep := aggregate(t, Median{}, []float64{0, 0}, col(c.vals...))
		if out[0] != c.want || out[1] != -c.want || rep.Weights != nil {
			t.Errorf("median(%v) = %v, want %v", c.vals, out, c.want)
		}
	}
}

// TestSelectKth compares quickselect with sorting on random, duplicate-heavy
// and sorted inputs.
func TestSelectKth(t *testing.T) {
	rng := newRand(51)
	for n := 1; n <= 60; n++ {
		for _, kind := range []string{"random", "few values", "sorted", "reversed"} {
			a := make([]float64, n)
			for i := range a {
				switch kind {
				case "random":
					a[i] = rng.NormFloat64()
				case "few values":
					a[i] = float64(rng.IntN(3))
				case "sorted":
					a[i] = float64(i)
				case "reversed":
					a[i] = float64(n - i)
				}
			}
			s := slices.Clone(a)
			slices.Sort(s)
			for k := range n {
				b := slices.Clone(a)
				if got := selectKth(b, k); got != s[k] {
					t.Fatalf("%s n=%d k=%d: %v, want %v", kind, n, k, got, s[k])
				}
				for i := range k {
					if b[i] > b[k] {
						t.Fatalf("%s n=%d k=%d: not partitioned", kind, n, k)
					}
				}
			}
		}
	}
}

func TestTrimmedMean(t *testing.T) {
	cases := []struct {
		beta float64
		vals []float64
		want float64
		cut  float64
	}{
		{0, []float64{1, 2, 3, 10}, 4, 0},
		{0.2, []float64{100, 1, 2, 3, -50}, 2, 1},    // floor(0.2*5) = 1 each end
		{0.1, []float64{100, 1, 2, 3, -50}, 11.2, 0}, // floor(0.5) = 0
		{0.49, []float64{7, 1, 4}, 4, 1},             // median-like
		{0.25, []float64{1, 2, 3, 4, 5, 6, 7, 100}, 4.5, 2},
	}
	for _, c := range cases {
		out, rep := aggregate(t, TrimmedMean{Beta: c.beta}, []float64{0, 0}, col(c.vals...))
		if !near(out[0], c.want, 1e-15) || !near(out[1], -c.want, 1e-15) || rep.Metrics["trimmed"] != c.cut {
			t.Errorf("trimmed(%v, %v) = %v (cut %v), want %v (cut %v)", c.beta, c.vals, out, rep.Metrics["trimmed"], c.want, c.cut)
		}
	}
	// beta = 0 is the mean.
	rng := newRand(52)
	g := randVec(rng, 50, 0, 1)
	ups := randUpdates(rng, g, 13, 1, 1)
	a, _ := aggregate(t, TrimmedMean{}, g, ups)
	b, _ := aggregate(t, Mean{}, g, ups)
	if e := maxRelDiff(a, b); e > 1e-15 {
		t.Errorf("beta = 0 differs from the mean by %g", e)
	}
	for _, beta := range []float64{-0.1, 0.5, math.NaN()} {
		if _, err := (TrimmedMean{Beta: beta}).Aggregate(g, ups, make([]float64, len(g))); err == nil {
			t.Errorf("beta %v accepted", beta)
		}
	}
}

// spy records what an inner aggregator was handed.
type spy struct{ got []Update }

func (*spy) Name() string { return "spy" }
func (s *spy) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	s.got = ups
	return Mean{}.Aggregate(global, ups, out)
}

func TestNormBound(t *testing.T) {
	g := []float64{1, 1}
	ups := []Update{
		{Client: "a", Params: []float64{1, 1}, Samples: 3},     // norm 0
		{Client: "b", Params: []float64{4, 5}, Samples: 1},     // norm 5
		{Client: "c", Params: []float64{1, 2}, Samples: 1},     // norm 1
		{Client: "d", Params: []float64{-5, 9}, Samples: 1},    // norm 10
		{Client: "e", Params: []float64{1.6, 1.8}, Samples: 1}, // norm 1
	}
	cases := []struct {
		name    string
		nb      NormBound
		bound   float64
		clipped float64
	}{
		{"fixed bound", NormBound{Bound: 2}, 2, 2},
		{"fixed bound above all", NormBound{Bound: 20}, 20, 0},
		{"multiple of the median (1)", NormBound{Mult: 3}, 3, 2},
		{"multiple of the median, tight", NormBound{Mult: 1}, 1, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &spy{}
			c.nb.Inner = s
			_, rep := aggregate(t, c.nb, g, ups)
			if !near(rep.Metrics["norm_bound"], c.bound, 1e-15) || rep.Metrics["clipped"] != c.clipped {
				t.Fatalf("metrics %v", rep.Metrics)
			}
			for k, u := range s.got {
				orig := dist(ups[k].Params, g)
				now := dist(u.Params, g)
				if !near(now, min(orig, c.bound), 1e-14) {
					t.Fatalf("%s: norm %v -> %v, bound %v", u.Client, orig, now, c.bound)
				}
				// Direction kept.
				if orig > 0 {
					for i := range g {
						if !near((u.Params[i]-g[i])/now, (ups[k].Params[i]-g[i])/orig, 1e-14) {
							t.Fatalf("%s: direction changed", u.Client)
						}
					}
				}
				if u.Client != ups[k].Client || u.Samples != ups[k].Samples {
					t.Fatalf("metadata lost")
				}
			}
		})
	}
	if ups[3].Params[0] != -5 {
		t.Fatal("caller's update modified")
	}
	// Median of the norms is zero: the median of the non-zero ones is used.
	logs := func(v ...float64) []float64 {
		for i := range v {
			v[i] = math.Log(v[i])
		}
		return v
	}
	if m := math.Exp(logMedian(logs(0, 0, 0, 2, 4))); !near(m, 3, 1e-15) {
		t.Fatalf("median of non-zero norms = %v, want 3", m)
	}
	if m := math.Exp(logMedian(logs(0, 1, 3, 5))); !near(m, 2, 1e-15) {
		t.Fatalf("even median = %v, want 2", m)
	}
	if m := math.Exp(logMedian(logs(0, 0, 0, 3))); !near(m, 3, 1e-15) {
		t.Fatalf("median (0+0)/2 = 0 -> non-zero median %v, want 3", m)
	}
	if m := logMedian(logs(0, 0)); !math.IsInf(m, -1) {
		t.Fatalf("median of zeros = %v", m)
	}
	// Bad configurations.
	for _, nb := range []NormBound{{Inner: Mean{}}, {Inner: Mean{}, Bound: 1, Mult: 1}, {Bound: 1},
		{Inner: Mean{}, Bound: math.Inf(1)}, {Inner: Mean{}, Mult: math.NaN()}} {
		if _, err := nb.Aggregate(g, ups, make([]float64, 2)); err == nil {
			t.Errorf("%+v accepted", nb)
		}
	}
}

// TestNormBoundLimitsAttacker: one client sending a huge update moves the
// bounded FedAvg by at most its weight times the bound.
func TestNormBoundLimitsAttacker(t *testing.T) {
	rng := newRand(53)
	g := randVec(rng, 20, 0, 1)
	ups := randUpdates(rng, g, 10, 0.1, 1)
	for i := range ups[0].Params {
		ups[0].Params[i] = 1e200
	}
	for _, spec := range []string{"normbound:mult=2", "normbound:mult=2:inner=fedsim:on=updates", "normbound:bound=1:inner=simprox"} {
		out, _ := aggregate(t, mustNew(t, spec), g, ups)
		if d := dist(out, g); d > 2 {
			t.Errorf("%s: moved %v", spec, d)
		}
	}
}
