package round

import (
	"flag"
	"strconv"
)

// flagSpec is one training flag: its name and help. The table is static
// data (no closures, no map built at init): which field of Params a flag
// sets is fieldOf's switch. A table of per-flag closures cost edge-agent
// 6 kB of text.
type flagSpec struct{ name, help string }

// fieldOf is the field of p that flag name sets: exactly one of the three
// pointers is set for a known flag other than FlagAlgorithm (which is
// Defaults.Algorithm, not a Params field); all are nil otherwise.
func fieldOf(p *Params, name string) (f *float64, i *int, s *string) {
	switch name {
	case FlagSolver:
		s = &p.Solver
	case FlagMu:
		f = &p.Mu
	case FlagStep:
		f = &p.Step
	case FlagRelax:
		f = &p.Relax
	case FlagGamma:
		f = &p.Gamma
	case FlagLR:
		f = &p.LR
	case FlagBatch:
		i = &p.Batch
	case FlagMaxEpochs, FlagEpochs:
		i = &p.MaxEpochs
	case FlagMaxSeconds:
		f = &p.MaxSeconds
	case FlagTau:
		f = &p.Tau
	}
	return f, i, s
}

// register registers flag name on fs with d's default, into algo or p.
func register(fs *flag.FlagSet, name, help string, algo *string, p *Params, d Defaults) {
	if name == FlagAlgorithm {
		fs.StringVar(algo, name, d.Algorithm, help)
		return
	}
	f, i, s := fieldOf(p, name)
	df, di, ds := fieldOf(&d.Params, name)
	switch {
	case f != nil:
		fs.Float64Var(f, name, *df, help)
	case i != nil:
		fs.IntVar(i, name, *di, help)
	case s != nil:
		fs.StringVar(s, name, *ds, help)
	}
}

// show is d's default of flag name as its help prints it.
func show(d Defaults, name string) string {
	if name == FlagAlgorithm {
		return d.Algorithm
	}
	f, i, s := fieldOf(&d.Params, name)
	switch {
	case f != nil:
		return num(*f)
	case i != nil:
		return strconv.Itoa(*i)
	case s != nil:
		return *s
	}
	return ""
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
	FlagTau        = "tau"
)

// AlgorithmHelp is the help of --algorithm; a command may say more.
const AlgorithmHelp = "fedavg | fedprox | fedsplit | fedproxsplit | scaffold (control variates; sgd only) | moon | fedsiam-da (contrastive local losses; --model mlp) | an aggregator name (trained like fedprox)"

var flagSpecs = [...]flagSpec{
	{FlagAlgorithm, AlgorithmHelp},
	{FlagSolver, "local solver: sgd | lbfgs"},
	{FlagMu, "FedProx proximal weight mu (0 for fedavg)"},
	{FlagStep, "FedSplit step size s"},
	{FlagRelax, "FedSplit relaxation alpha: 1 Peaceman-Rachford, 0.5 Douglas-Rachford"},
	{FlagGamma, "target inexactness of the local solve, in [0, 1]: it stops once ||grad h|| <= gamma ||grad f(anchor)|| (0: no target, the whole budget)"},
	{FlagLR, "SGD learning rate"},
	{FlagBatch, "SGD mini-batch size (0: full batch)"},
	{FlagMaxEpochs, "work budget: local epochs per round (0: no limit)"},
	{FlagEpochs, "work budget: local epochs per round"},
	{FlagMaxSeconds, "work budget: local seconds per round (0: no limit; the round deadline always applies)"},
	{FlagTau, "MOON's temperature (moon only; 0: 0.5)"},
}

// flagByName is name's entry of flagSpecs.
func flagByName(name string) (flagSpec, bool) {
	for _, f := range flagSpecs {
		if f.name == name {
			return f, true
		}
	}
	return flagSpec{}, false
}

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
		f, ok := flagByName(n)
		if !ok {
			panic("round: no training flag " + strconv.Quote(n))
		}
		h := f.help
		if s, ok := help[n]; ok {
			h = s
		}
		register(fs, n, h, algo, p, d)
	}
}
