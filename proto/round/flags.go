package round

import (
	"flag"
	"strconv"
)

// flagSpec is one training flag: its name, its help and how it reaches
// the parameters.
type flagSpec struct {
	name, help string
	register   func(fs *flag.FlagSet, name, help string, algo *string, p *Params, d Defaults)
	show       func(d Defaults) string
}

func floatFlag(get func(*Params) *float64) func(*flag.FlagSet, string, string, *string, *Params, Defaults) {
	return func(fs *flag.FlagSet, name, help string, _ *string, p *Params, d Defaults) {
		fs.Float64Var(get(p), name, *get(&d.Params), help)
	}
}

func intFlag(get func(*Params) *int) func(*flag.FlagSet, string, string, *string, *Params, Defaults) {
	return func(fs *flag.FlagSet, name, help string, _ *string, p *Params, d Defaults) {
		fs.IntVar(get(p), name, *get(&d.Params), help)
	}
}

// Flag names of Register.
const (
	FlagAlgorithm  = "algorithm"
	FlagSolver     = "solver"
	FlagMu         = "mu"
	FlagStep       = "step"
	FlagRelax      = "relax"
	FlagGamma      = "gamma"
	FlagLR         = "lr"
	FlagBatch      = "batch"
	FlagMaxEpochs  = "max-epochs"
	FlagEpochs     = "epochs" // the same setting, as simulate, bench and the load generator name it
	FlagMaxSeconds = "max-seconds"
)

// AlgorithmHelp is the help of --algorithm; a command may say more.
const AlgorithmHelp = "fedavg | fedprox | fedsplit | fedproxsplit | an aggregator name (trained like fedprox)"

var flagSpecs = []flagSpec{
	{name: FlagAlgorithm, help: AlgorithmHelp,
		register: func(fs *flag.FlagSet, name, help string, algo *string, _ *Params, d Defaults) {
			fs.StringVar(algo, name, d.Algorithm, help)
		},
		show: func(d Defaults) string { return d.Algorithm }},
	{name: FlagSolver, help: "local solver: sgd | lbfgs",
		register: func(fs *flag.FlagSet, name, help string, _ *string, p *Params, d Defaults) {
			fs.StringVar(&p.Solver, name, d.Solver, help)
		},
		show: func(d Defaults) string { return d.Solver }},
	{name: FlagMu, help: "FedProx proximal weight mu (0 for fedavg)",
		register: floatFlag(func(p *Params) *float64 { return &p.Mu }), show: func(d Defaults) string { return num(d.Mu) }},
	{name: FlagStep, help: "FedSplit step size s",
		register: floatFlag(func(p *Params) *float64 { return &p.Step }), show: func(d Defaults) string { return num(d.Step) }},
	{name: FlagRelax, help: "FedSplit relaxation alpha: 1 Peaceman-Rachford, 0.5 Douglas-Rachford",
		register: floatFlag(func(p *Params) *float64 { return &p.Relax }), show: func(d Defaults) string { return num(d.Relax) }},
	{name: FlagGamma, help: "target inexactness of the local solve, in [0, 1]: it stops once ||grad h|| <= gamma ||grad f(anchor)|| (0: no target, the whole budget)",
		register: floatFlag(func(p *Params) *float64 { return &p.Gamma }), show: func(d Defaults) string { return num(d.Gamma) }},
	{name: FlagLR, help: "SGD learning rate",
		register: floatFlag(func(p *Params) *float64 { return &p.LR }), show: func(d Defaults) string { return num(d.LR) }},
	{name: FlagBatch, help: "SGD mini-batch size (0: full batch)",
		register: intFlag(func(p *Params) *int { return &p.Batch }), show: func(d Defaults) string { return strconv.Itoa(d.Batch) }},
	{name: FlagMaxEpochs, help: "work budget: local epochs per round (0: no limit)",
		register: intFlag(func(p *Params) *int { return &p.MaxEpochs }), show: func(d Defaults) string { return strconv.Itoa(d.MaxEpochs) }},
	{name: FlagEpochs, help: "work budget: local epochs per round",
		register: intFlag(func(p *Params) *int { return &p.MaxEpochs }), show: func(d Defaults) string { return strconv.Itoa(d.MaxEpochs) }},
	{name: FlagMaxSeconds, help: "work budget: local seconds per round (0: no limit; the round deadline always applies)",
		register: floatFlag(func(p *Params) *float64 { return &p.MaxSeconds }), show: func(d Defaults) string { return num(d.MaxSeconds) }},
}

var flagByName = func() map[string]flagSpec {
	m := map[string]flagSpec{}
	for _, f := range flagSpecs {
		m[f.name] = f
	}
	return m
}()

// Register registers the training flags named (Flag* constants; all of
// them but FlagEpochs when none is named) on fs, with d's defaults, into
// algo and p: the one registration of run, demo, simulate, the load
// generator and edge-agent bench. help overrides a flag's help by name
// (nil: the shared texts). algo may be nil when FlagAlgorithm is not
// named. It first sets *p (and *algo) to d's, so that the flags not
// named keep the table's defaults. It panics on an unknown name, as flag
// does on a duplicate.
func Register(fs *flag.FlagSet, algo *string, p *Params, d Defaults, help map[string]string, names ...string) {
	*p = d.Params
	if algo != nil {
		*algo = d.Algorithm
	}
	if len(names) == 0 {
		names = []string{FlagAlgorithm, FlagSolver, FlagMu, FlagStep, FlagRelax, FlagGamma, FlagLR, FlagBatch, FlagMaxEpochs, FlagMaxSeconds}
	}
	for _, n := range names {
		f, ok := flagByName[n]
		if !ok {
			panic("round: no training flag " + strconv.Quote(n))
		}
		h := f.help
		if s, ok := help[n]; ok {
			h = s
		}
		f.register(fs, n, h, algo, p, d)
	}
}
