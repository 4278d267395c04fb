package aggregate

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// overflowed counts the streamed sums that needed their second pass.
var overflowed int

// streamed aggregates ups as a streamed close does: the coefficients from
// the sample counts (no Params), then one update at a time into a Sum,
// and a second pass when a coordinate overflowed.
func streamed(t *testing.T, a Summable, global []float64, ups []Update) ([]float64, Report) {
	t.Helper()
	counts := make([]Update, len(ups))
	for k, u := range ups {
		counts[k] = Update{Client: u.Client, Samples: u.Samples}
	}
	rep, err := a.Weights(counts)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(global))
	if err := CheckGlobal(global, out); err != nil {
		t.Fatal(err)
	}
	s := NewSum(out)
	for k, u := range ups {
		if err := s.Add(rep.Weights[k], u); err != nil {
			t.Fatal(err)
		}
	}
	if s.Overflowed() {
		overflowed++
		for k, u := range ups {
			s.Redo(rep.Weights[k], u.Params)
		}
		s.Finish()
	}
	return out, rep
}

// TestStreamedSumMatchesAggregate: the streamed form of each summable
// aggregator is its Aggregate bit for bit, the same weights and report,
// also when a coordinate overflows in the first pass and when a site's
// count is capped.
func TestStreamedSumMatchesAggregate(t *testing.T) {
	rng := newRand(7)
	g := randVec(rng, 50, 0, 1)
	ups := randUpdates(rng, g, 40, 0.3, 0)
	// 40 sites at the largest float64 in one coordinate: 1/40 of it,
	// rounded, added 40 times rounds past it (+Inf), and the second pass
	// recomputes that coordinate.
	huge := slices.Clone(ups)
	for k := range huge {
		huge[k].Params = slices.Clone(huge[k].Params)
		huge[k].Params[3] = math.MaxFloat64
		huge[k].Samples = 10
	}
	liar := slices.Clone(ups)
	liar[2].Samples = 1 << 30
	zero := slices.Clone(ups[:3])
	for k := range zero {
		zero[k].Samples = 0
	}
	cases := []struct {
		name string
		spec string
		ups  []Update
	}{
		{"fedavg", "fedavg", ups},
		{"fedavg capped", "fedavg", liar},
		{"fedavg no cap", "fedavg:cap=0", liar},
		{"fedavg no samples", "fedavg", zero},
		{"fedavg overflow", "fedavg", huge},
		{"mean", "mean", ups},
		{"fedprox overflow", "fedprox", huge},
		{"fedsplit-mean", "fedsplit-mean", ups},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, ok := AsSummable(mustNew(t, c.spec))
			if !ok {
				t.Fatalf("%s is not summable", c.spec)
			}
			want := make([]float64, len(g))
			wrep, err := a.Aggregate(g, c.ups, want)
			if err != nil {
				t.Fatal(err)
			}
			before := overflowed
			got, rep := streamed(t, a, g, c.ups)
			if strings.HasSuffix(c.name, "overflow") && overflowed == before {
				t.Fatal("the first pass did not overflow: the second is not tested")
			}
			for i := range want {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) || math.IsInf(got[i], 0) {
					t.Fatalf("coordinate %d: streamed %v, Aggregate %v", i, got[i], want[i])
				}
			}
			if !slices.Equal(rep.Weights, wrep.Weights) || len(rep.Capped) != len(wrep.Capped) {
				t.Fatalf("report: streamed %+v, Aggregate %+v", rep, wrep)
			}
		})
	}
}

// TestStreamedSumChecks: a streamed sum refuses what Aggregate refuses.
func TestStreamedSumChecks(t *testing.T) {
	g := []float64{1, 2}
	s := NewSum(make([]float64, 2))
	if err := s.Add(0.5, Update{Client: "a", Params: []float64{1}}); err == nil {
		t.Fatal("a short update was added")
	}
	if err := s.Add(0.5, Update{Client: "a", Params: []float64{1, math.NaN()}}); err == nil {
		t.Fatal("a NaN was added")
	}
	if err := CheckGlobal([]float64{math.Inf(1), 0}, make([]float64, 2)); err == nil {
		t.Fatal("an infinite global model passed")
	}
	if err := CheckGlobal(g, make([]float64, 3)); err == nil {
		t.Fatal("a short out passed")
	}
	for _, spec := range []string{"median", "trimmed", "fedsim", "simprox", "normbound", "fedsiam", "fedsim-cluster"} {
		if _, ok := AsSummable(mustNew(t, spec)); ok {
			t.Errorf("%s is summable: it needs every update at once", spec)
		}
	}
}
