package round

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/learn/proxsolver"
)

// Defaults are a command's default algorithm and training parameters.
type Defaults struct {
	Algorithm string
	Params
}

// The one table of defaults. Run is the daemon's (broker-agg run, and what
// a configuration file leaves out); every other command starts from it
// and changes only what it needs, and says so (Note) in the first line of
// its help and of its output.
var (
	// Run: broker-agg run.
	Run = Defaults{Algorithm: FedProx, Params: Params{Solver: proxsolver.SGD, Mu: 0.01, Gamma: 1e-3,
		MaxEpochs: 20, Batch: 10, LR: DefaultLR, Step: 1, Relax: 1}}
	// Demo: broker-agg demo runs FedSplit with an exact-enough L-BFGS prox
	// on a strongly convex problem, where it converges linearly within
	// the demo's rounds; its step suits the demo's l2 of 0.01. Its mu is
	// run's (it matters only with --algorithm fedprox).
	Demo = Run.with(FedProxSplit, func(p *Params) { p.Solver, p.Step, p.Gamma = proxsolver.LBFGS, 10, 1e-6 })
	// Simulate: broker-agg simulate compares FedProx at the FedProx
	// paper's mu = 1. Its fedsplit is the exact reference: SimulateSplitGamma.
	Simulate = Run.with("", func(p *Params) { p.Mu = 1 })
	// Load: the load generator's agents run FedProx-FedSplit with a short
	// budget, so that a round's length is the messaging's, not the solve's.
	Load = Run.with(FedProxSplit, func(p *Params) { p.Mu, p.MaxEpochs = 1, 5 })
	// Bench: edge-agent bench times a FedProx solve's epochs: no target
	// gamma, so the solve spends the whole budget.
	Bench = Run.with("", func(p *Params) { p.Mu, p.MaxEpochs, p.Gamma = 1, 5, 0 })
)

// SimulateSplitGamma is the target inexactness of simulate's fedsplit
// unless --gamma (or gamma=) is given: its prox is then exact to the
// solver's precision, so fedsplit is the exact reference its help
// promises.
const SimulateSplitGamma = 1e-9

func (d Defaults) with(algo string, f func(*Params)) Defaults {
	d.Algorithm = algo
	f(&d.Params)
	return d
}

// Note lists, as flags, the defaults of d that differ from Run's, in the
// registration order ("" when none differ): a command's first line of
// help and output says so.
func (d Defaults) Note(names ...string) string {
	var out []string
	for _, n := range names {
		if _, ok := flagByName(n); !ok {
			continue
		}
		if v, r := show(d, n), show(Run, n); v != r && !(n == "algorithm" && d.Algorithm == "") {
			out = append(out, "--"+n+" "+v)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return fmt.Sprintf("Defaults that differ from broker-agg run's: %s.", strings.Join(out, ", "))
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
