package aggregator

import (
	"math"
	"testing"

	"github.com/edgefl/edgefl/learn/aggregate"
)

// TestStreamedCloseMatchesInMemory: the streamed close of a weighted mean
// (the sample counts first, then one update at a time from the round log)
// is the in-memory close (every update decoded, then Aggregate) bit for
// bit, with the same weights and the same capped sites, for FedAvg (its
// cap lowering a site that claims far more than the others) and
// FedProx's uniform mean.
func TestStreamedCloseMatchesInMemory(t *testing.T) {
	liar := func(i int) uint64 {
		if i == 3 {
			return 5000 // above 3 x the others' median: capped
		}
		return uint64(10 + 7*i)
	}
	cases := []struct {
		name  string
		algo  string
		count func(int) uint64
		spec  string
	}{
		{"fedavg", AlgoFedAvg, nil, "fedavg"},
		{"fedavg capped", AlgoFedAvg, liar, "fedavg"},
		{"fedprox", AlgoFedProx, liar, "mean"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cb := newCloseRound(t, c.algo, 23, c.count)
			s := cb.s
			a, ok := aggregate.AsSummable(s.agg)
			if !ok || s.agg.Name() != c.spec {
				t.Fatalf("aggregator %s: summable %v, want %s", s.agg.Name(), ok, c.spec)
			}
			ups, err := s.closedUpdates(cb.cr, s.global)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float64, s.dim)
			wrep, err := a.Aggregate(s.global, ups, want)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float64, s.dim)
			rep, err := s.aggregateUpdates(cb.cr, got)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
					t.Fatalf("coordinate %d: streamed %v, in memory %v", i, got[i], want[i])
				}
			}
			if len(rep.Weights) != len(ups) || len(rep.Capped) != len(wrep.Capped) {
				t.Fatalf("report: streamed %d weights, %v capped; in memory %d, %v", len(rep.Weights), rep.Capped, len(wrep.Weights), wrep.Capped)
			}
			for k := range rep.Weights {
				if rep.Weights[k] != wrep.Weights[k] {
					t.Fatalf("weight %d: streamed %v, in memory %v", k, rep.Weights[k], wrep.Weights[k])
				}
			}
			if c.count != nil && c.algo == AlgoFedAvg && len(rep.Capped) != 1 {
				t.Fatalf("capped %v, want the one site claiming 5000", rep.Capped)
			}
		})
	}
}
