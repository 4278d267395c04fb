package sim

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
)

// TestSimPoisson: under --dp the default selection is Poisson at q = K/N:
// rounds of varying size, empty ones included, the same draws for every
// algorithm of the run (FedAvg drops no selected client as a straggler
// with --stragglers 0, however many were drawn); the per-site unamplified
// epsilon is the unsampled Gaussian over the most rounds any client
// contributed to, above the amplified figure.
func TestSimPoisson(t *testing.T) {
	cfg := dpConfig()
	cfg.Clients, cfg.PerRound, cfg.Rounds, cfg.DPNoiseSeed = 10, 2, 12, 4
	local := cfg.Algos[0].Local
	cfg.Algos = []Algo{{Label: "fedavg", Family: FedAvg, Agg: "fedavg", Local: local}, cfg.Algos[0]}
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Config.Select != "poisson" {
		t.Errorf("--dp's selection is %q, want poisson", res.Config.Select)
	}
	var sizes [][]int
	for _, r := range res.Runs {
		var s []int
		for _, row := range r.Rounds[1:] {
			s = append(s, row.Participants)
		}
		sizes = append(sizes, s)
		want := dp.EpsilonAfter(1, cfg.DP.Noise, r.DP.MaxSiteRounds, cfg.DP.Delta, nil)
		if got := float64(r.DP.EpsilonUnamplified); math.Abs(got-want) > 1e-9*want || got <= float64(r.DP.Epsilon) {
			t.Errorf("%s: per-site epsilon %v over %d rounds, want %v (amplified %v)", r.Algo, got, r.DP.MaxSiteRounds, want, r.DP.Epsilon)
		}
		if math.Abs(r.DP.SamplingRate-0.2) > 1e-15 {
			t.Errorf("%s: sampling rate %v, want 0.2", r.Algo, r.DP.SamplingRate)
		}
	}
	if !slices.Equal(sizes[0], sizes[1]) {
		t.Fatalf("the algorithms drew different rounds: %v", sizes)
	}
	if !slices.Contains(sizes[0], 0) || slices.Max(sizes[0]) <= cfg.PerRound {
		t.Errorf("round sizes %v: want an empty round and one above --per-round %d (the seed was picked for it)", sizes[0], cfg.PerRound)
	}
}
