package sim

import (
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
)

func isAgg(n string) bool { return n == "simprox" || n == "median" }

func TestParseAlgos(t *testing.T) {
	def := DefaultConfig().Local
	tests := []struct {
		in      string
		want    []Algo
		wantErr string
	}{
		{in: "fedavg", want: []Algo{{Label: "fedavg", Family: FedAvg, Agg: "fedavg", Local: func() Local { l := def; l.Mu = 0; return l }()}}},
		{in: "fedprox:mu=0,fedprox:mu=1", want: []Algo{
			{Label: "fedprox:mu=0", Family: FedProx, Agg: "mean", Local: func() Local { l := def; l.Mu = 0; return l }()},
			{Label: "fedprox:mu=1", Family: FedProx, Agg: "mean", Local: func() Local { l := def; l.Mu = 1; return l }()},
		}},
		{in: "fedsplit:solver=lbfgs:step=10:label=split", want: []Algo{{Label: "split", Family: FedSplit, Agg: "fedsplit-robust", Local: func() Local { l := def; l.Solver = "lbfgs"; l.Step = 10; return l }()}}},
		{in: "simprox:lambda0=0.5:mu=0.1", want: []Algo{{Label: "simprox:lambda0=0.5:mu=0.1", Family: FedProx, Agg: "simprox:lambda0=0.5", Local: func() Local { l := def; l.Mu = 0.1; return l }()}}},
		{in: "scaffold:epochs=2", want: []Algo{{Label: "scaffold:epochs=2", Family: Scaffold, Agg: "mean", Local: func() Local { l := def; l.Mu, l.Solver, l.MaxEpochs = 0, "sgd", 2; return l }()}}},
		{in: "scaffold:mu=1", wantErr: "scaffold has no proximal term"},
		{in: "scaffold:beta=1", wantErr: "unknown option"},
		{in: "bogus", wantErr: `unknown algorithm "bogus"`},
		{in: "fedavg:mu=1", wantErr: "fedavg has no proximal term"},
		{in: "fedavg:cap=0", want: []Algo{{Label: "fedavg:cap=0", Family: FedAvg, Agg: "fedavg:cap=0", Local: func() Local { l := def; l.Mu = 0; return l }()}}},
		{in: "fedavg:cap=10:epochs=2", want: []Algo{{Label: "fedavg:cap=10:epochs=2", Family: FedAvg, Agg: "fedavg:cap=10", Local: func() Local { l := def; l.Mu = 0; l.MaxEpochs = 2; return l }()}}},
		{in: "fedavg:beta=1", wantErr: "unknown option"},
		{in: "fedprox:mu", wantErr: "not key=value"},
		{in: "fedprox:mu=x", wantErr: `mu="x": want a number`},
		{in: "fedprox:lambda0=1", wantErr: "unknown option"},
		{in: "fedprox,fedprox", wantErr: "listed twice"},
		{in: ",", wantErr: "no algorithm"},
		// The contrastive objectives: mu is their weight, tau MOON's (0.5 by
		// default); a tau after an aggregator name stays the aggregator's.
		{in: "moon", want: []Algo{{Label: "moon", Family: FedProx, Agg: "fedavg", Contrast: "moon", Local: func() Local { l := def; l.Tau = 0.5; return l }()}}},
		{in: "moon:mu=5:tau=0.1", want: []Algo{{Label: "moon:mu=5:tau=0.1", Family: FedProx, Agg: "fedavg", Contrast: "moon", Local: func() Local { l := def; l.Mu, l.Tau = 5, 0.1; return l }()}}},
		{in: "fedsiam-da:mu=0.1", want: []Algo{{Label: "fedsiam-da:mu=0.1", Family: FedProx, Agg: "fedsiam", Contrast: "fedsiam", Local: func() Local { l := def; l.Mu = 0.1; return l }()}}},
		{in: "simprox:tau=0.3", want: []Algo{{Label: "simprox:tau=0.3", Family: FedProx, Agg: "simprox:tau=0.3", Local: def}}},
		{in: "moon:lambda0=1", wantErr: "unknown option"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseAlgos(tt.in, def, 0, isAgg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d algos, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("algo %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	base := DefaultConfig()
	base.Algos, _ = ParseAlgos("fedprox", base.Local, 0, nil)
	tests := []struct {
		mutate func(*Config)
		flag   string
	}{
		{func(c *Config) { c.Clients = 0 }, "--clients"},
		{func(c *Config) { c.PerRound = 0 }, "--per-round"},
		{func(c *Config) { c.Rounds = 0 }, "--rounds"},
		{func(c *Config) { c.L2 = -1 }, "--l2"},
		{func(c *Config) { c.Stragglers = 1.5 }, "--stragglers"},
		{func(c *Config) { c.Algos[0].Local.Gamma = -1 }, "--gamma"},
		{func(c *Config) { c.Algos[0].Local.Gamma = 1.5 }, "--gamma"},
		{func(c *Config) { c.Algos[0].Family, c.Algos[0].Local.Step = FedProxSplit, 0 }, "--step"},
		{func(c *Config) { c.Algos[0].Local.Step = -1 }, "--step"},
		{func(c *Config) { c.Algos[0].Local.Relax = 1.5 }, "--relax"},
		{func(c *Config) { c.Algos[0].Local.LR = -1 }, "--lr"},
		{func(c *Config) { c.Algos[0].Local.Solver = "adam" }, "--solver"},
		{func(c *Config) { c.Algos[0].Local.MaxEpochs = 0 }, "--epochs"},
		{func(c *Config) { c.Faulty, c.FaultyScale, c.FaultyEvery = 1, 3, -1 }, "--faulty-every"},
	}
	for _, tt := range tests {
		c := base
		c.Algos = append([]Algo(nil), base.Algos...)
		tt.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("Validate() = %v, want an error naming %s", err, tt.flag)
		}
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

// --algo's server-* keys give one algorithm its own server optimiser
// (defaults as the flags'), and the FedSplit family and --secagg refuse
// one, as the aggregator does.
func TestParseAlgosServerOpt(t *testing.T) {
	def := DefaultConfig().Local
	tests := []struct {
		in      string
		want    string // the algorithms' optimisers, as Params.String
		wantErr string
	}{
		{in: "fedavg,fedavg:server-opt=adam:label=fedadam", want: "none adam:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001"},
		{in: "fedprox:server-opt=yogi:server-lr=0.1:server-tau=0.01:mu=0.5", want: "yogi:lr=0.1:beta1=0.9:beta2=0.99:tau=0.01"},
		{in: "median:server-opt=avgm:server-beta1=0.5", want: "avgm:lr=1:beta1=0.5"},
		{in: "fedavg:server-opt=adagrad:cap=0", want: "adagrad:lr=0.01:beta1=0.9:tau=0.001"},
		{in: "fedavg:server-lr=0.1", wantErr: "need server-opt"},
		{in: "fedavg:server-opt=lamb", wantErr: `"lamb"`},
		{in: "fedavg:server-opt=adam:server-beta2=1", wantErr: "beta2"},
		{in: "fedavg:server-opt=adam:server-lr=x", wantErr: `server-lr="x"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseAlgos(tt.in, def, 0, isAgg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := DefaultConfig()
			c.Algos = got
			var names []string
			for _, a := range got {
				names = append(names, c.serverOptOf(a).String())
			}
			if s := strings.Join(names, " "); s != tt.want {
				t.Errorf("optimisers %q, want %q", s, tt.want)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
	for _, tc := range []struct {
		algos   string
		secagg  bool
		wantErr string
	}{
		{"fedsplit:server-opt=adam", false, "not a mean of deltas"},
		{"fedproxsplit:server-opt=avgm", false, "not a mean of deltas"},
		// Under --secagg FedProx:FedSplit runs in sum mode, still
		// FedSplit's step; FedProx's uniform mean of the secure sum takes
		// the optimiser (below).
		{"fedproxsplit:server-opt=adam", true, "not a mean of deltas"},
	} {
		c := DefaultConfig()
		var err error
		if c.Algos, err = ParseAlgos(tc.algos, def, 0, isAgg); err != nil {
			t.Fatal(err)
		}
		if tc.secagg {
			c.SecAgg = &SecAgg{Clip: 1}
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s (secagg %v): %v, want an error naming %q", tc.algos, tc.secagg, err, tc.wantErr)
		}
	}
	c := DefaultConfig()
	var err error
	if c.Algos, err = ParseAlgos("fedprox:server-opt=adam", def, 0, isAgg); err != nil {
		t.Fatal(err)
	}
	c.SecAgg = &SecAgg{Clip: 1}
	if err := c.Validate(); err != nil {
		t.Errorf("fedprox:server-opt=adam with --secagg: %v, want accepted", err)
	}
}

// SCAFFOLD is refused where the daemons refuse it: with L-BFGS, --dp and
// --secagg.
func TestValidateScaffold(t *testing.T) {
	base := DefaultConfig()
	base.Algos, _ = ParseAlgos("scaffold", base.Local, 0, nil)
	if err := base.Validate(); err != nil {
		t.Fatalf("scaffold: %v", err)
	}
	for _, tt := range []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.Algos[0].Local.Solver = "lbfgs" }, "needs the sgd solver"},
		{func(c *Config) { c.DP = &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5} }, "does not compose with --dp"},
		{func(c *Config) { c.SecAgg = &SecAgg{Clip: 1} }, "does not compose with --secagg"},
	} {
		c := base
		c.Algos = append([]Algo(nil), base.Algos...)
		tt.mutate(&c)
		if err := c.validateScaffold(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("validateScaffold() = %v, want %q", err, tt.want)
		}
	}
}
