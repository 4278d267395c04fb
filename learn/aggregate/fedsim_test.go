package aggregate

import (
	"math"
	"testing"
)

func ups2(params ...[]float64) []Update {
	u := make([]Update, len(params))
	for k, p := range params {
		u[k] = Update{Client: string(rune('a' + k)), Params: p, Samples: k + 1}
	}
	return u
}

// TestFedSimSheet walks the validation sheet (seeds/001): its invariants and
// each of its edge cases, with hand-computed weights.
func TestFedSimSheet(t *testing.T) {
	r := 1 / math.Sqrt2
	cases := []struct {
		name         string
		on           Space
		global       []float64
		ups          []Update
		want         []float64 // weights
		excluded     float64
		fallback     float64
		avgSim, var_ float64
	}{
		{"hand example: sims 1, 0, 1/sqrt2", OnWeights, []float64{1, 0},
			ups2([]float64{1, 0}, []float64{0, 1}, []float64{1, 1}),
			[]float64{1 / (1 + r), 0, r / (1 + r)}, 1, 0,
			(1 + r) / 3, (sq(1-(1+r)/3) + sq((1+r)/3) + sq(r-(1+r)/3)) / 3},
		{"anti-correlated client excluded", OnWeights, []float64{1, 1},
			ups2([]float64{2, 2}, []float64{-1, -1}, []float64{1, 1}),
			[]float64{0.5, 0, 0.5}, 1, 0, 1.0 / 3, (2*sq(2.0/3) + sq(4.0/3)) / 3},
		{"zero-vector model excluded", OnWeights, []float64{1, 2},
			ups2([]float64{0, 0}, []float64{1, 2}, []float64{2, 4}),
			[]float64{0, 0.5, 0.5}, 1, 0, 2.0 / 3, (sq(2.0/3) + 2*sq(1.0/3)) / 3},
		{"zero update (client did not move) excluded", OnUpdates, []float64{1, 2},
			ups2([]float64{1, 2}, []float64{2, 3}, []float64{3, 4}),
			[]float64{0, 0.5, 0.5}, 1, 0, 2.0 / 3, (sq(2.0/3) + 2*sq(1.0/3)) / 3},
		{"K = 1, aligned", OnWeights, []float64{1, 0}, ups2([]float64{3, 0}), []float64{1}, 0, 0, 1, 0},
		{"K = 1, anti-correlated", OnWeights, []float64{1, 0}, ups2([]float64{-3, 0}), []float64{1}, 0, 1, -1, 0},
		{"K = 1, zero vector", OnWeights, []float64{1, 0}, ups2([]float64{0, 0}), []float64{1}, 0, 1, 0, 0},
		{"identical models = global", OnWeights, []float64{1, 2},
			ups2([]float64{1, 2}, []float64{1, 2}, []float64{1, 2}, []float64{1, 2}),
			[]float64{0.25, 0.25, 0.25, 0.25}, 0, 0, 1, 0},
		{"identical models = global, on updates", OnUpdates, []float64{1, 2},
			ups2([]float64{1, 2}, []float64{1, 2}, []float64{1, 2}),
			[]float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, 0, 1, 0, 0},
		{"zero global model: uniform fallback", OnWeights, []float64{0, 0},
			ups2([]float64{1, 2}, []float64{3, -1}),
			[]float64{0.5, 0.5}, 0, 1, 0, 0},
		{"every client anti-correlated: uniform fallback", OnWeights, []float64{1, 0},
			ups2([]float64{-1, 0}, []float64{-1, 1}),
			[]float64{0.5, 0.5}, 0, 1, (-1 - r) / 2, sq((1 - r) / 2)},
		{"updates: similarity to the mean update", OnUpdates, []float64{0, 0},
			ups2([]float64{1, 0}, []float64{0, 1}, []float64{-1, -1}, []float64{2, 2}),
			// mean update (0.5, 0.5): sims r, r, -1, 1
			[]float64{r / (1 + 2*r), r / (1 + 2*r), 0, 1 / (1 + 2*r)}, 1, 0,
			(2*r - 1 + 1) / 4, (2*sq(r-r/2) + sq(-1-r/2) + sq(1-r/2)) / 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, rep := aggregate(t, FedSim{On: c.on}, c.global, c.ups)
			for k := range c.want {
				if !near(rep.Weights[k], c.want[k], 1e-15) {
					t.Fatalf("weights %v, want %v", rep.Weights, c.want)
				}
			}
			if math.Abs(sum(rep.Weights)-1) > 1e-15 {
				t.Fatalf("weights sum to %v", sum(rep.Weights))
			}
			for i := range out {
				var w float64
				for k, u := range c.ups {
					w += c.want[k] * u.Params[i]
				}
				if !near(out[i], w, 1e-15) {
					t.Fatalf("out %v", out)
				}
			}
			m := rep.Metrics
			if m["excluded"] != c.excluded || m["fallback"] != c.fallback {
				t.Errorf("excluded %v fallback %v, want %v %v", m["excluded"], m["fallback"], c.excluded, c.fallback)
			}
			if !near(m["avg_similarity"], c.avgSim, 1e-15) || !near(m["similarity_variance"], c.var_, 1e-15) {
				t.Errorf("avg_similarity %v variance %v, want %v %v", m["avg_similarity"], m["similarity_variance"], c.avgSim, c.var_)
			}
			var h float64
			for _, w := range c.want {
				if w > 0 {
					h -= w * math.Log(w)
				}
			}
			if !near(m["weight_entropy"], h, 1e-14) || m["max_weight"] != maxOf(rep.Weights) || m["min_weight"] != minOf(rep.Weights) {
				t.Errorf("metrics %v", m)
			}
			if m["weight_entropy"] > math.Log(float64(len(c.ups)))+1e-15 || m["avg_similarity"] < -1 || m["avg_similarity"] > 1 ||
				m["similarity_variance"] < 0 || m["similarity_variance"] > 1 {
				t.Errorf("metrics out of the sheet's ranges: %v", m)
			}
		})
	}
}

func maxOf(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func minOf(v []float64) float64 {
	m := math.Inf(1)
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

// TestCosinesInRange: raw similarities are in [-1, 1] even for vectors
// whose computed cosine rounds past 1, and for hostile inputs.
func TestCosinesInRange(t *testing.T) {
	for _, in := range hostileInputs() {
		for _, centre := range []bool{false, true} {
			for _, p := range [][]float64{nil, uniform(len(in.ups))} {
				if centre && p == nil {
					continue
				}
				for _, s := range cosineToRef(in.global, in.ups, centre, p) {
					if !(s >= -1 && s <= 1) {
						t.Fatalf("%s: cosine %v", in.name, s)
					}
				}
			}
		}
	}
}

// TestCosineWeightsScaleInvariant: multiplying the global model and every
// update by the same positive factor leaves the weights of FedSim and
// FedSiam-DA unchanged.
func TestCosineWeightsScaleInvariant(t *testing.T) {
	aggs := []Aggregator{FedSim{On: OnWeights}, FedSim{On: OnUpdates}, FedSiam{On: OnWeights}, FedSiam{On: OnUpdates}, FedSiam{On: OnWeights, SampleWeighted: true}}
	for _, a := range aggs {
		for _, c := range []float64{0.3, 7, 1e-250, 1e250, math.Ldexp(1, 600)} {
			rng := newRand(11)
			g := randVec(rng, 12, 0.3, 1)
			ups := randUpdates(rng, g, 7, 0.8, 1)
			_, base := aggregate(t, a, g, ups)
			sg, sups := scaleAll(c, g, ups)
			_, scaled := aggregate(t, a, sg, sups)
			if e := maxRelDiff(base.Weights, scaled.Weights); e > 1e-13 {
				t.Errorf("%s, x%g: weights change by %g", a.Name(), c, e)
			}
		}
	}
}

// TestFedSiamEquations checks eq. 13-16 by hand and the handling of
// non-positive cosines.
func TestFedSiamEquations(t *testing.T) {
	r := 1 / math.Sqrt2
	cases := []struct {
		name   string
		a      FedSiam
		global []float64
		ups    []Update
		want   []float64
	}{
		// w0 = (1, 1): cosines r, r, 1.
		{"eq. 13-16", FedSiam{On: OnWeights}, []float64{9, 9},
			ups2([]float64{2, 0}, []float64{0, 2}, []float64{1, 1}),
			[]float64{r / (1 + 2*r), r / (1 + 2*r), 1 / (1 + 2*r)}},
		// w0 = (0, 0.5): cosines 0, 1/sqrt(1.01)... client 0 orthogonal.
		{"orthogonal client excluded", FedSiam{On: OnWeights}, []float64{0, 0},
			ups2([]float64{1, 0}, []float64{-1, 1}, []float64{0, 0.5}),
			[]float64{0, r / (r + 1), 1 / (r + 1)}},
		// w0 = 0: no direction, uniform, result w0.
		{"zero first aggregate", FedSiam{On: OnWeights}, []float64{3, 3},
			ups2([]float64{1, 2}, []float64{-1, -2}),
			[]float64{0.5, 0.5}},
		// Samples 1, 2, 3: w0 = (2+0+3, 0+4+3)/6 = (5/6, 7/6).
		{"w0 = FedAvg", FedSiam{On: OnWeights, SampleWeighted: true}, []float64{0, 0},
			ups2([]float64{2, 0}, []float64{0, 2}, []float64{1, 1}),
			func() []float64 {
				n := math.Hypot(5, 7)
				c := []float64{5 / n, 7 / n, 12 / n / math.Sqrt2}
				s := c[0] + c[1] + c[2]
				return []float64{c[0] / s, c[1] / s, c[2] / s}
			}()},
		// On updates against global (1, 1): deltas (1,-1), (-1,1), (0,0),
		// (2, 2); mean delta (0.5, 0.5): cosines 0, 0, 0 (zero), 1.
		{"on updates", FedSiam{On: OnUpdates}, []float64{1, 1},
			ups2([]float64{2, 0}, []float64{0, 2}, []float64{1, 1}, []float64{3, 3}),
			[]float64{0, 0, 0, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, rep := aggregate(t, c.a, c.global, c.ups)
			for k := range c.want {
				if !near(rep.Weights[k], c.want[k], 1e-15) {
					t.Fatalf("weights %v, want %v", rep.Weights, c.want)
				}
			}
		})
	}
}

// TestFedSimFedSiamCoincideOnUpdates documents that on updates FedSim and
// FedSiam-DA (plain-mean w0) are the same aggregator: both weight clients by
// their positive cosine to the mean update.
func TestFedSimFedSiamCoincideOnUpdates(t *testing.T) {
	rng := newRand(12)
	g := randVec(rng, 30, 0, 1)
	ups := randUpdates(rng, g, 9, 1, 1)
	a, ra := aggregate(t, FedSim{On: OnUpdates}, g, ups)
	b, rb := aggregate(t, FedSiam{On: OnUpdates}, g, ups)
	if maxRelDiff(a, b) != 0 || maxRelDiff(ra.Weights, rb.Weights) != 0 {
		t.Fatalf("fedsim and fedsiam differ on updates")
	}
}
