package aggregate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Spec grammar, for the CLI and config files:
//
//	spec   = name { ":" key "=" value }
//	inner  = the key "inner" (normbound only) must come last; its value is
//	         the rest of the spec, itself a spec with its own ":" options:
//	         normbound:mult=3:inner=simprox:lambda0=0.5:on=updates
//
// Aggregators and their keys (defaults in brackets):
//
//	fedavg                      sample-weighted mean sum_k (n_k/n) w_k; cap=M [3]:
//	                            no n_k counts above M x the median n_k of the
//	                            other sites (cap=0: off)
//	mean                        uniform mean (aliases: fedprox, fedsplit-mean)
//	simprox                     lambda0 [0.7], tau [0.5], on=weights|updates [updates],
//	                            prev=client|global [client], softmax=true|false [true]
//	fedsim                      on=weights|updates [updates]
//	fedsim-cluster              k [5], var [0.95], iters [100]
//	fedsiam                     on=weights|updates [updates], w0=mean|fedavg [mean]
//	median
//	trimmed                     beta [0.1]
//	normbound                   bound=B | mult=M [mult=3], inner=SPEC [fedavg]
//
// Selectors: uniform, samples, loss (power [1], explore [0.1]), window,
// poisson (q [0: k/n, k the sites requested per round, n the candidates]).
//
// Unknown names and keys are errors that list the valid ones.

type aggEntry struct {
	keys  []string
	build func(o opts, seed uint64) (Aggregator, error)
}

// aggregators is the registry (built per call: no package state).
func aggregators() map[string]aggEntry {
	return map[string]aggEntry{
		"fedavg": {[]string{"cap"}, buildFedAvg},
		"mean":   {nil, func(opts, uint64) (Aggregator, error) { return Mean{}, nil }},
		"fedprox": {nil, func(opts, uint64) (Aggregator, error) {
			return Mean{Label: "fedprox"}, nil
		}},
		"fedsplit-mean": {nil, func(opts, uint64) (Aggregator, error) {
			return Mean{Label: "fedsplit-mean"}, nil
		}},
		"simprox": {[]string{"lambda0", "tau", "on", "prev", "softmax"}, buildSimProx},
		"fedsim": {[]string{"on"}, func(o opts, _ uint64) (Aggregator, error) {
			on, err := o.space()
			return FedSim{On: on}, err
		}},
		"fedsim-cluster": {[]string{"k", "var", "iters"}, buildFedSimCluster},
		"fedsiam":        {[]string{"on", "w0"}, buildFedSiam},
		"median":         {nil, func(opts, uint64) (Aggregator, error) { return Median{}, nil }},
		"trimmed":        {[]string{"beta"}, buildTrimmed},
		"normbound":      {[]string{"bound", "mult", "inner"}, buildNormBound},
	}
}

// buildFedAvg builds fedavg: cap=M, no site counted above M times the
// other sites' median sample count (0: off).
func buildFedAvg(o opts, _ uint64) (Aggregator, error) {
	c, err := o.float("cap", DefaultFedAvgCap)
	if err != nil {
		return nil, err
	}
	if c != 0 && !(c >= 1) {
		return nil, fmt.Errorf("fedavg: cap must be >= 1 (a multiple of the other sites' median sample count) or 0 (off), got %v", c)
	}
	return FedAvg{Cap: c}, nil
}

// buildSimProx builds simprox from lambda0, tau, on, prev and softmax.
func buildSimProx(o opts, _ uint64) (Aggregator, error) {
	c := DefaultSimProxConfig()
	var err error
	if c.Lambda0, err = o.float("lambda0", c.Lambda0); err != nil {
		return nil, err
	}
	if c.Tau, err = o.float("tau", c.Tau); err != nil {
		return nil, err
	}
	if c.On, err = o.space(); err != nil {
		return nil, err
	}
	prev, err := o.choice("prev", "client", "client", "global")
	if err != nil {
		return nil, err
	}
	c.ProxToGlobal = prev == "global"
	soft, err := o.bool("softmax", true)
	if err != nil {
		return nil, err
	}
	c.NoSoftmax = !soft
	return NewSimProx(c)
}

// buildFedSimCluster builds fedsim-cluster from k, var and iters; seed
// seeds its k-means++.
func buildFedSimCluster(o opts, seed uint64) (Aggregator, error) {
	c := DefaultClusterConfig()
	var err error
	if c.K, err = o.int("k", c.K); err != nil {
		return nil, err
	}
	if c.Variance, err = o.float("var", c.Variance); err != nil {
		return nil, err
	}
	if c.MaxIter, err = o.int("iters", c.MaxIter); err != nil {
		return nil, err
	}
	return NewFedSimCluster(c, rand.New(rand.NewPCG(seed, 0x66656473696d)))
}

// buildFedSiam builds fedsiam from on and w0.
func buildFedSiam(o opts, _ uint64) (Aggregator, error) {
	on, err := o.space()
	if err != nil {
		return nil, err
	}
	w0, err := o.choice("w0", "mean", "mean", "fedavg")
	return FedSiam{On: on, SampleWeighted: w0 == "fedavg"}, err
}

// buildTrimmed builds trimmed: beta in [0, 0.5).
func buildTrimmed(o opts, _ uint64) (Aggregator, error) {
	b, err := o.float("beta", 0.1)
	if err != nil {
		return nil, err
	}
	if !(b >= 0 && b < 0.5) {
		return nil, fmt.Errorf("beta = %v, want it in [0, 0.5)", b)
	}
	return TrimmedMean{Beta: b}, nil
}

// buildNormBound builds normbound: bound=B or mult=M, around the inner
// aggregator (fedavg unless inner=SPEC).
func buildNormBound(o opts, seed uint64) (Aggregator, error) {
	_, hasB := o.kv["bound"]
	_, hasM := o.kv["mult"]
	if hasB && hasM {
		return nil, fmt.Errorf("give bound or mult, not both")
	}
	n := NormBound{}
	var err error
	if hasB {
		if n.Bound, err = o.float("bound", 0); err != nil {
			return nil, err
		}
		if !(n.Bound > 0) {
			return nil, fmt.Errorf("bound = %v, want > 0", n.Bound)
		}
	} else {
		if n.Mult, err = o.float("mult", 3); err != nil {
			return nil, err
		}
		if !(n.Mult > 0) {
			return nil, fmt.Errorf("mult = %v, want > 0", n.Mult)
		}
	}
	inner := o.kv["inner"]
	if inner == "" {
		inner = "fedavg"
	}
	if n.Inner, err = NewAggregator(inner, seed); err != nil {
		return nil, fmt.Errorf("inner: %w", err)
	}
	return n, nil
}

// Names returns the aggregator names NewAggregator accepts, sorted.
func Names() []string {
	n := make([]string, 0, 16)
	for k := range aggregators() {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

// SelectorNames returns the selector names NewSelector accepts, sorted.
func SelectorNames() []string { return []string{"loss", "poisson", "samples", "uniform", "window"} }

// NewAggregator builds an aggregator from a spec (see the grammar above).
// seed seeds the aggregators that draw random numbers (fedsim-cluster's
// k-means++), also inside normbound.
func NewAggregator(spec string, seed uint64) (Aggregator, error) {
	name, o, err := parseSpec(spec, "inner")
	if err != nil {
		return nil, err
	}
	e, ok := aggregators()[name]
	if !ok {
		return nil, fmt.Errorf("aggregate: unknown aggregator %q (valid: %s)", name, strings.Join(Names(), ", "))
	}
	if err := o.only(name, e.keys); err != nil {
		return nil, err
	}
	a, err := e.build(o, seed)
	if err != nil {
		return nil, fmt.Errorf("aggregate: %s: %w", name, err)
	}
	return a, nil
}

// NewSelector builds a selector from a spec: uniform, samples,
// loss[:power=P][:explore=E], window, poisson[:q=Q].
func NewSelector(spec string) (Selector, error) {
	name, o, err := parseSpec(spec, "")
	if err != nil {
		return nil, err
	}
	keys := map[string][]string{"uniform": nil, "samples": nil, "window": nil, "loss": {"power", "explore"}, "poisson": {"q"}}
	k, ok := keys[name]
	if !ok {
		return nil, fmt.Errorf("aggregate: unknown selector %q (valid: %s)", name, strings.Join(SelectorNames(), ", "))
	}
	if err := o.only(name, k); err != nil {
		return nil, err
	}
	switch name {
	case "uniform":
		return Uniform{}, nil
	case "samples":
		return BySamples{}, nil
	case "window":
		return NewWindow(), nil
	case "poisson":
		q, err := o.float("q", 0)
		if err != nil {
			return nil, fmt.Errorf("aggregate: poisson: %w", err)
		}
		if _, set := o.kv["q"]; set && !(q > 0 && q <= 1) {
			return nil, fmt.Errorf("aggregate: poisson: q = %v, want a probability in (0, 1] (omit q for k/n)", q)
		}
		return Poisson{Q: q}, nil
	}
	b := ByLoss{}
	if b.Power, err = o.float("power", 1); err != nil {
		return nil, fmt.Errorf("aggregate: loss: %w", err)
	}
	if b.Explore, err = o.float("explore", 0.1); err != nil {
		return nil, fmt.Errorf("aggregate: loss: %w", err)
	}
	if !(b.Power >= 0) || !(b.Explore >= 0) || b.Power > 1e6 || b.Explore > 1e6 {
		return nil, fmt.Errorf("aggregate: loss: power = %v, explore = %v, want both in [0, 1e6]", b.Power, b.Explore)
	}
	return b, nil
}

// opts are a spec's key=value options.
type opts struct {
	kv    map[string]string
	order []string
}

// parseSpec splits name[:key=value...]; the value of the key rest (if
// not "") runs to the end of the spec.
func parseSpec(spec, rest string) (string, opts, error) {
	o := opts{kv: map[string]string{}}
	spec = strings.TrimSpace(spec)
	name, tail, _ := strings.Cut(spec, ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", o, fmt.Errorf("aggregate: empty spec %q (want name[:key=value...])", spec)
	}
	for tail != "" {
		item, next, _ := strings.Cut(tail, ":")
		k, v, ok := strings.Cut(item, "=")
		k = strings.ToLower(strings.TrimSpace(k))
		if !ok || k == "" {
			return "", o, fmt.Errorf("aggregate: %s: option %q is not key=value", name, item)
		}
		if rest != "" && k == rest {
			_, v, _ = strings.Cut(tail, "=")
			next = ""
		}
		if _, dup := o.kv[k]; dup {
			return "", o, fmt.Errorf("aggregate: %s: option %q given twice", name, k)
		}
		o.kv[k] = strings.TrimSpace(v)
		o.order = append(o.order, k)
		tail = next
	}
	return name, o, nil
}

func (o opts) only(name string, keys []string) error {
	for _, k := range o.order {
		if !slices.Contains(keys, k) {
			valid := "none"
			if len(keys) > 0 {
				valid = strings.Join(keys, ", ")
			}
			return fmt.Errorf("aggregate: %s: unknown option %q (valid: %s)", name, k, valid)
		}
	}
	return nil
}

func (o opts) float(k string, def float64) (float64, error) {
	v, ok := o.kv[k]
	if !ok {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("option %s: %w", k, err)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("option %s=%s: want a finite number", k, v)
	}
	return f, nil
}

func (o opts) int(k string, def int) (int, error) {
	v, ok := o.kv[k]
	if !ok {
		return def, nil
	}
	i, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("option %s: %w", k, err)
	}
	return i, nil
}

func (o opts) bool(k string, def bool) (bool, error) {
	v, ok := o.kv[k]
	if !ok {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("option %s: %w", k, err)
	}
	return b, nil
}

func (o opts) choice(k, def string, valid ...string) (string, error) {
	v, ok := o.kv[k]
	if !ok {
		return def, nil
	}
	if !slices.Contains(valid, v) {
		return "", fmt.Errorf("option %s=%q (valid: %s)", k, v, strings.Join(valid, ", "))
	}
	return v, nil
}

func (o opts) space() (Space, error) {
	v, err := o.choice("on", "updates", "weights", "updates")
	if err != nil {
		return 0, err
	}
	return ParseSpace(v)
}
