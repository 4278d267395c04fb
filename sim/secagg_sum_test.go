package sim

import (
	"context"
	"math"
	"testing"

	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/proto/uplink"
)

// TestSecAggSumModeConverges: FedProx:FedSplit under --secagg without DP
// runs in sum mode (docs/privacy.md, "FedSplit under secure aggregation":
// the aggregator keeps S and m and adds the secure sum of the sites'
// quantised deltas). On real data (Fashion-MNIST shirts against T-shirts,
// 6 non-IID sites, every site every round) it reaches plain FedProx:FedSplit's
// optimum to the quantiser's resolution: the secure run's distance to the
// optimum is within the plain run's plus a few grid steps per coordinate
// (sqrt(d) 2^-f), the two final models are that close, and its gap falls
// as far (by more than 1e4).
func TestSecAggSumModeConverges(t *testing.T) {
	if testing.Short() {
		t.Skip("runs FedProx:FedSplit to convergence twice")
	}
	data := shirtsCSV(t, 600)
	run := func(sa *SecAgg) AlgoRun {
		cfg := DefaultConfig()
		cfg.Dataset, cfg.Partition, cfg.Clients, cfg.PerRound = "csv:"+data+":label=label", "dirichlet:0.5", 6, 6
		cfg.Standardize, cfg.L2, cfg.Rounds, cfg.Seed, cfg.Codec = "global", 0.1, 60, 2, "fp32"
		cfg.Workers, cfg.EvalEvery, cfg.OptimumTol = 2, 20, 1e-9
		local := Local{Solver: proxsolver.LBFGS, Gamma: 1e-9, Step: 0.5, Relax: 1, MaxEpochs: 50, Batch: 10, LR: 0.01}
		cfg.Algos = []Algo{{Label: "fedprox:fedsplit", Family: FedProxSplit, Agg: split.StepMean, Local: local}}
		cfg.SecAgg = sa
		res, err := Run(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Runs[0]
	}
	plain := run(nil)
	sa := &SecAgg{Clip: 4}
	sec := run(sa)
	if sec.Rounds[1].Metrics["split_counted"] != 6 {
		t.Fatalf("the secure run did not run in sum mode: %v", sec.Rounds[1].Metrics)
	}
	last := func(r AlgoRun) Round { return r.Rounds[len(r.Rounds)-1] }
	p, s, s0 := last(plain), last(sec), sec.Rounds[0]
	var diff float64
	for i := range plain.Final {
		diff = max(diff, math.Abs(plain.Final[i]-sec.Final[i]))
	}
	sb, err := uplink.SecAggScaleBits(sa.Clip, 6) // the run's: the finest that cannot wrap
	if err != nil {
		t.Fatal(err)
	}
	res := math.Sqrt(float64(len(plain.Final))) * math.Ldexp(1, -sb)
	t.Logf("after %d rounds: plain ||x - x*|| = %.3g (gap %.3g), --secagg %.3g (gap %.3g; %.3g at the start); the models differ by %.3g; sqrt(d) 2^-%d = %.3g",
		p.Round, float64(p.DistToOpt), float64(p.Gap), float64(s.DistToOpt), float64(s.Gap), float64(s0.Gap), diff, sb, res)
	if !(float64(s.Gap) < 1e-4*float64(s0.Gap)) {
		t.Fatalf("--secagg sum mode did not converge: gap %v (%v at the start)", s.Gap, s0.Gap)
	}
	if !(float64(s.DistToOpt) <= float64(p.DistToOpt)+4*res) || diff > 4*res {
		t.Fatalf("--secagg sum mode is %v from the optimum, plain FedProx:FedSplit %v, the models %v apart: more than 4 sqrt(d) 2^-f = %v", s.DistToOpt, p.DistToOpt, diff, 4*res)
	}
}
