package aggregate

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestNewAggregator(t *testing.T) {
	cases := []struct {
		spec string
		name string // canonical Name()
	}{
		{"fedavg", "fedavg"},
		{" FedAvg ", "fedavg"},
		{"mean", "mean"},
		{"fedprox", "fedprox"},
		{"fedsplit-mean", "fedsplit-mean"},
		{"simprox", "simprox:lambda0=0.7:tau=0.5:on=updates"},
		{"simprox:lambda0=0.7:tau=0.5:on=weights", "simprox:lambda0=0.7:tau=0.5:on=weights"},
		{"simprox:on=updates:prev=global:softmax=false:tau=0.3", "simprox:lambda0=0.7:tau=0.3:on=updates:prev=global:softmax=false"},
		{"fedsim", "fedsim"},
		{"fedsim:on=updates", "fedsim"},
		{"fedsim:on=weights", "fedsim:on=weights"},
		{"fedsim-cluster", "fedsim-cluster:k=5"},
		{"fedsim-cluster:k=3", "fedsim-cluster:k=3"},
		{"fedsim-cluster:k=3:var=0.9:iters=20", "fedsim-cluster:k=3:var=0.9:iters=20"},
		{"fedsiam", "fedsiam"},
		{"fedsiam:on=updates:w0=fedavg", "fedsiam:w0=fedavg"},
		{"fedsiam:on=weights", "fedsiam:on=weights"},
		{"median", "median"},
		{"trimmed", "trimmed:beta=0.1"},
		{"trimmed:beta=0.2", "trimmed:beta=0.2"},
		{"normbound", "normbound:mult=3:inner=fedavg"},
		{"normbound:bound=2.5:inner=median", "normbound:bound=2.5:inner=median"},
		{"normbound:mult=3:inner=simprox:lambda0=0.5:on=updates", "normbound:mult=3:inner=simprox:lambda0=0.5:tau=0.5:on=updates"},
		{"normbound:mult=2:inner=normbound:bound=1:inner=fedsim-cluster:k=2", "normbound:mult=2:inner=normbound:bound=1:inner=fedsim-cluster:k=2"},
	}
	for _, c := range cases {
		a, err := NewAggregator(c.spec, 3)
		if err != nil {
			t.Errorf("NewAggregator(%q): %v", c.spec, err)
			continue
		}
		if a.Name() != c.name {
			t.Errorf("NewAggregator(%q).Name() = %q, want %q", c.spec, a.Name(), c.name)
		}
		// The name is itself a spec for the same aggregator.
		b, err := NewAggregator(a.Name(), 3)
		if err != nil || b.Name() != a.Name() {
			t.Errorf("round trip of %q: %v, %v", a.Name(), b, err)
		}
	}
}

func TestNewAggregatorErrors(t *testing.T) {
	cases := []struct {
		spec string
		want []string // substrings of the error
	}{
		{"", []string{"empty spec"}},
		{"fedavgg", []string{`unknown aggregator "fedavgg"`, "fedavg, fedprox, fedsiam, fedsim, fedsim-cluster"}},
		{"fedavg:k=1", []string{`unknown option "k"`, "valid: cap"}},
		{"simprox:lamda0=0.5", []string{`unknown option "lamda0"`, "lambda0, tau, on, prev, softmax"}},
		{"simprox:lambda0=2", []string{"lambda0 = 2"}},
		{"simprox:lambda0=x", []string{"lambda0", "invalid syntax"}},
		{"simprox:tau=NaN", []string{"finite"}},
		{"simprox:on=grads", []string{`on="grads"`, "weights, updates"}},
		{"simprox:prev=last", []string{`prev="last"`, "client, global"}},
		{"simprox:softmax=maybe", []string{"softmax"}},
		{"simprox:tau", []string{"not key=value"}},
		{"simprox:tau=0.5:tau=0.6", []string{"given twice"}},
		{"fedsim-cluster:k=0", []string{"k = 0"}},
		{"fedsim-cluster:k=2.5", []string{"option k"}},
		{"fedsiam:w0=median", []string{"w0", "mean, fedavg"}},
		{"trimmed:beta=0.5", []string{"beta = 0.5"}},
		{"normbound:bound=1:mult=2", []string{"not both"}},
		{"normbound:mult=0", []string{"mult = 0"}},
		{"normbound:bound=-1", []string{"bound = -1"}},
		{"normbound:inner=nope", []string{"inner", `unknown aggregator "nope"`}},
		{"normbound:inner=simprox:tau=0", []string{"inner", "tau"}},
	}
	for _, c := range cases {
		_, err := NewAggregator(c.spec, 1)
		if err == nil {
			t.Errorf("NewAggregator(%q) accepted", c.spec)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("NewAggregator(%q) = %q, want it to mention %q", c.spec, err, w)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("multi-line error %q", err)
		}
	}
}

func TestNewSelector(t *testing.T) {
	for spec, name := range map[string]string{
		"uniform": "uniform", "samples": "samples", "window": "window",
		"loss": "loss:power=1:explore=0.1", "loss:power=2:explore=0": "loss:power=2:explore=0",
	} {
		s, err := NewSelector(spec)
		if err != nil || s.Name() != name {
			t.Errorf("NewSelector(%q) = %v, %v; want %s", spec, s, err, name)
			continue
		}
		if s2, err := NewSelector(s.Name()); err != nil || s2.Name() != name {
			t.Errorf("round trip of %q: %v", name, err)
		}
	}
	for spec, want := range map[string]string{
		"random":         "loss, poisson, samples, uniform, window",
		"window:size=3":  "valid: none",
		"loss:temp=2":    "power, explore",
		"loss:power=-1":  "power = -1",
		"loss:power=Inf": "finite",
	} {
		_, err := NewSelector(spec)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewSelector(%q) = %v, want an error mentioning %q", spec, err, want)
		}
	}
}

func TestNames(t *testing.T) {
	n := Names()
	if !slices.IsSorted(n) {
		t.Fatalf("Names not sorted: %v", n)
	}
	for _, want := range []string{"fedavg", "mean", "simprox", "fedsim", "fedsim-cluster", "fedsiam", "median", "trimmed", "normbound"} {
		if !slices.Contains(n, want) {
			t.Errorf("Names lacks %s", want)
		}
	}
	for _, name := range n {
		if _, err := NewAggregator(name, 1); err != nil {
			t.Errorf("Names lists %s but NewAggregator fails: %v", name, err)
		}
	}
	for _, name := range SelectorNames() {
		if _, err := NewSelector(name); err != nil {
			t.Errorf("SelectorNames lists %s but NewSelector fails: %v", name, err)
		}
	}
}

// TestSeedReachesClustering: the seed given to NewAggregator drives the
// k-means++ seeding (inside normbound too): same seed, same clusters;
// results are reproducible.
func TestSeedReachesClustering(t *testing.T) {
	rng := newRand(71)
	g := randVec(rng, 10, 0, 1)
	ups := randUpdates(rng, g, 30, 1, 6) // unstructured: the seeding matters
	run := func(spec string, seed uint64) []int {
		a, err := NewAggregator(spec, seed)
		if err != nil {
			t.Fatal(err)
		}
		_, rep := aggregate(t, a, g, ups)
		return rep.Clusters
	}
	for _, spec := range []string{"fedsim-cluster:k=4", "normbound:mult=2:inner=fedsim-cluster:k=4"} {
		if !slices.Equal(run(spec, 5), run(spec, 5)) {
			t.Errorf("%s: same seed, different clusters", spec)
		}
		differ := false
		for seed := uint64(6); seed < 16 && !differ; seed++ {
			differ = !samePartition(run(spec, 5), run(spec, seed))
		}
		if !differ {
			t.Errorf("%s: the seed never changes the clustering of unstructured data", spec)
		}
	}
}

// TestFedAvgAndMean: the existing aggregators' weights, zero sample counts,
// negative counts, and the overflow guard of the weighted sum.
func TestFedAvgAndMean(t *testing.T) {
	g := []float64{0, 0}
	ups := []Update{{Client: "a", Params: []float64{1, 2}, Samples: 1}, {Client: "b", Params: []float64{3, 6}, Samples: 3}}
	cases := []struct {
		name string
		a    Aggregator
		ups  []Update
		want []float64
	}{
		{"fedavg", FedAvg{}, ups, []float64{2.5, 5}},
		{"mean", Mean{}, ups, []float64{2, 4}},
		{"fedavg, zero samples = mean", FedAvg{}, []Update{{Params: []float64{1, 2}}, {Params: []float64{3, 6}}}, []float64{2, 4}},
		{"fedavg at the float64 limit", FedAvg{}, constUpdates(3, fill(2, math.MaxFloat64), nil), fill(2, math.MaxFloat64)},
		{"mean at the float64 limit", Mean{}, constUpdates(3, fill(2, -math.MaxFloat64), nil), fill(2, -math.MaxFloat64)},
	}
	for _, c := range cases {
		out, rep := aggregate(t, c.a, g, c.ups)
		if !near(out[0], c.want[0], 1e-15) || !near(out[1], c.want[1], 1e-15) || !finite(out[0]) {
			t.Errorf("%s: %v, want %v", c.name, out, c.want)
		}
		if math.Abs(sum(rep.Weights)-1) > 1e-15 {
			t.Errorf("%s: weights %v", c.name, rep.Weights)
		}
	}
	if _, err := (FedAvg{}).Aggregate(g, []Update{{Params: []float64{1, 1}, Samples: -1}}, make([]float64, 2)); err == nil {
		t.Error("negative sample count accepted")
	}
	if (Mean{Label: "fedsplit"}).Name() != "fedsplit" || (Mean{}).Name() != "mean" || (FedAvg{Cap: DefaultFedAvgCap}).Name() != "fedavg" || (FedAvg{}).Name() != "fedavg:cap=0" {
		t.Error("names")
	}
}
