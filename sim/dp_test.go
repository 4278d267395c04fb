package sim

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/proto/uplink"
)

func dpConfig() Config {
	cfg := DefaultConfig()
	cfg.Dataset, cfg.Partition, cfg.Clients, cfg.PerRound, cfg.Rounds, cfg.Seed = "synthetic:1,1", "natural", 10, 4, 6, 3
	cfg.L2, cfg.Workers, cfg.OptimumEvals = 0.01, 2, 200
	local := Local{Solver: proxsolver.SGD, Mu: 1, Gamma: 1e-3, MaxEpochs: 2, Batch: 10, LR: 0.01, Step: 1, Relax: 1}
	cfg.Algos = []Algo{{Label: "fedprox", Family: FedProx, Agg: "mean", Local: local}}
	cfg.DP = &dp.Config{Clip: 0.05, Noise: 1.2, Delta: 1e-5}
	return cfg
}

// TestSimDP: under --dp every frame a client sends decodes (and re-clips)
// to at most C, the accountant's epsilon after each round is
// dp.EpsilonAfter at q = K/N, and the run is a function of its flags (the
// same noise seed gives the same model bit for bit, another seed another
// model).
func TestSimDP(t *testing.T) {
	run := func(cfg Config) (*Results, []float64) {
		var last []float64
		c, err := quant.Parse("fp32")
		if err != nil {
			t.Fatal(err)
		}
		cfg.trace = func(_ string, round int, frames map[string]*uplink.Frame, x []float64) {
			for id, f := range frames {
				d, err := c.Decode(f.Payload, nil)
				if err != nil {
					t.Fatal(err)
				}
				if n := dp.Norm(d); n > cfg.DP.Clip*(1+1e-6) { // fp32 rounding of a clipped vector
					t.Errorf("round %d, %s: sent a delta of norm %v > C = %v", round, id, n, cfg.DP.Clip)
				}
			}
			last = slices.Clone(x)
		}
		res, err := Run(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res, last
	}
	cfg := dpConfig()
	res, x1 := run(cfg)
	r := res.Runs[0]
	if r.DP == nil || r.DP.Rounds != cfg.Rounds || r.DP.Stopped != "" {
		t.Fatalf("DP report %+v", r.DP)
	}
	q := float64(cfg.PerRound) / float64(cfg.Clients)
	for _, row := range r.Rounds[1:] {
		want := dp.EpsilonAfter(q, cfg.DP.Noise, row.Round, cfg.DP.Delta, nil)
		if math.Abs(float64(row.Epsilon)-want) > 1e-9*want {
			t.Errorf("round %d: epsilon %v, want %v", row.Round, row.Epsilon, want)
		}
	}
	if _, again := run(cfg); !slices.Equal(x1, again) {
		t.Error("the same flags gave another model")
	}
	cfg.DPNoiseSeed = 99
	if _, other := run(cfg); slices.Equal(x1, other) {
		t.Error("another noise seed gave the same model")
	}
}

// TestSimDPBudgetStop: the run stops before the round that would exceed
// --dp-epsilon, after exactly dp.RoundsWithin rounds, within the budget.
func TestSimDPBudgetStop(t *testing.T) {
	cfg := dpConfig()
	cfg.Rounds = 50
	q := float64(cfg.PerRound) / float64(cfg.Clients)
	cfg.DP.Budget = dp.EpsilonAfter(q, cfg.DP.Noise, 4, cfg.DP.Delta, nil) * 1.0001
	want, err := dp.RoundsWithin(cfg.DP.Budget, cfg.DP.Delta, q, cfg.DP.Noise)
	if err != nil || want != 4 {
		t.Fatalf("RoundsWithin = %d, %v; want 4", want, err)
	}
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := res.Runs[0]
	if r.DP.Stopped != "epsilon_budget" || r.DP.Rounds != want || len(r.Rounds) != want+1 {
		t.Fatalf("stopped %q after %d rounds (%d rows), want epsilon_budget after %d", r.DP.Stopped, r.DP.Rounds, len(r.Rounds), want)
	}
	if float64(r.DP.Epsilon) > cfg.DP.Budget {
		t.Fatalf("spent %v > budget %v", r.DP.Epsilon, cfg.DP.Budget)
	}
}

// TestSimDPRefusals: what --dp cannot cover is refused with an error that
// says why.
func TestSimDPRefusals(t *testing.T) {
	sites, _ := testSites(t) // its schema does not declare its preprocessing
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"fedsplit robust step", func(c *Config) { c.Algos[0].Family, c.Algos[0].Agg = FedProxSplit, split.StepRobust+":mult=3" }, "needs each site's z_j"},
		{"median", func(c *Config) { c.Algos[0].Agg = "median" }, "aggregator \"median\""},
		{"loss selection", func(c *Config) { c.Select = "loss" }, "selector \"loss\""},
		{"undeclared schema", func(c *Config) {
			c.Schema, c.Dataset, c.SiteColumn, c.Partition, c.Clients, c.PerRound = filepath.Join(sites, "schema.json"), "csv:"+filepath.Join(sites, "all.csv"), "site", "natural", 0, 0
		}, "the schema must declare its preprocessing"},
		{"faulty", func(c *Config) { c.Faulty, c.FaultyScale = 1, 10 }, "--faulty"},
		{"clip 0", func(c *Config) { c.DP.Clip = 0 }, "clip norm"},
		{"delta 1", func(c *Config) { c.DP.Delta = 1 }, "delta"},
		{"budget below one round", func(c *Config) { c.DP.Budget = 0.01 }, "even one round"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := dpConfig()
			tt.mutate(&cfg)
			_, err := Run(context.Background(), cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
	cfg := dpConfig()
	cfg.Algos[0].Family, cfg.Algos[0].Agg = FedSplit, split.StepRobust
	if err := cfg.Validate(); err != nil {
		t.Fatalf("fedsplit under DP (sum mode): %v", err)
	}
	cfg.Algos[0].Agg = split.StepMean + ":x"
	if err := cfg.Validate(); !errors.Is(err, uplink.ErrSplitRobustDP) {
		t.Fatalf("fedsplit with another server step: %v, want uplink.ErrSplitRobustDP", err)
	}
}
