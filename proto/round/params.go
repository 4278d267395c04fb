// Package round owns a round's training parameters and the work they
// define, written once for the aggregator, the sites and simulate: the
// Params type with its only Validate, the one table of defaults, the one
// flag registration, the mapping to and from the round announcement, the
// site's work (the local prox solve, FedSplit's client step) and the
// FedSplit server step. It is pure: no I/O, no clock of its own (a budget
// carries the caller's), randomness only from the stream the caller passes,
// so simulate computes exactly what the daemons compute.
package round

import (
	"errors"
	"fmt"
	"math"

	"github.com/edgefl/edgefl/learn/proxsolver"
)

// Algorithm families (the announcement's algorithm field). Any other name
// (an aggregator of learn/aggregate) is trained like FedProx; the
// aggregator checks that it names one.
const (
	FedAvg       = "fedavg"
	FedProx      = "fedprox"
	FedSplit     = "fedsplit"
	FedProxSplit = "fedproxsplit"
	// Scaffold is SCAFFOLD (control variates, option II): local SGD
	// without a proximal term, shifted by c - c_i (proto/uplink).
	Scaffold = "scaffold"
)

// IsSplit reports whether algo is of the FedSplit family.
func IsSplit(algo string) bool { return algo == FedSplit || algo == FedProxSplit }

// DefaultLR is the SGD learning rate of an announcement that leaves it 0.
const DefaultLR = 0.01

// ErrParams is wrapped by every error of Validate.
var ErrParams = errors.New("round: bad training parameters")

// Params are the training parameters of a round: the local solve, FedSplit's
// steps and the work budget. The aggregator announces them (ToWire), a site
// reads them back (FromWire) and simulate runs them. The JSON names are
// simulate's results.json's "local" object. A zero field means the rule
// its comment names, so the zero value is valid for the FedProx family.
type Params struct {
	// Solver is sgd or lbfgs; "" = sgd, lbfgs for the FedSplit family.
	Solver string `json:"solver"`
	// Mu is FedProx's proximal weight, >= 0 (fedavg: 0 whatever it says).
	Mu float64 `json:"mu"`
	// Gamma is the target inexactness of the local solve in [0, 1]: the
	// solve stops once ||grad h|| <= gamma ||grad f(anchor)|| (0: no
	// target, the whole budget is spent).
	Gamma float64 `json:"gamma"`
	// MaxEpochs is the work budget in passes over the local data (0: no
	// limit).
	MaxEpochs int `json:"epochs"`
	// Batch is SGD's mini-batch size (0: full batch).
	Batch int `json:"batch"`
	// LR is SGD's learning rate (0: DefaultLR).
	LR float64 `json:"lr"`
	// Step is FedSplit's step size s (> 0 for the FedSplit family).
	Step float64 `json:"step"`
	// Relax is FedSplit's relaxation alpha in (0, 1]: 1 Peaceman-Rachford,
	// 0.5 Douglas-Rachford (0: 1).
	Relax float64 `json:"relax"`
	// MaxSeconds is the work budget in seconds (0: no limit; a live
	// round's deadline applies anyway).
	MaxSeconds float64 `json:"max_seconds,omitempty"`
	// MaxGradEvals is the work budget in gradient evaluations (0: no
	// limit).
	MaxGradEvals uint64 `json:"max_grad_evals,omitempty"`
	// Tau is MOON's temperature (algorithm moon; 0: model.DefaultTau).
	Tau float64 `json:"tau,omitempty"`
}

// Validate checks p for algorithm algo: the one check of the training
// parameters, made by the aggregator at start, by a site on every
// announcement and by simulate for each algorithm. Errors name the flag.
func (p Params) Validate(algo string) error {
	bad := func(flag string, v any, want string) error {
		return fmt.Errorf("%w: --%s %v: want %s", ErrParams, flag, v, want)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	for _, f := range []struct {
		name string
		v    float64
	}{{"mu", p.Mu}, {"step", p.Step}, {"lr", p.LR}, {"max-seconds", p.MaxSeconds}} {
		if !finite(f.v) || f.v < 0 {
			return bad(f.name, f.v, "a finite number >= 0")
		}
	}
	switch {
	case p.Solver != "" && p.Solver != proxsolver.SGD && p.Solver != proxsolver.LBFGS:
		return bad("solver", fmt.Sprintf("%q", p.Solver), "sgd or lbfgs")
	case !(p.Gamma >= 0 && p.Gamma <= 1):
		return bad("gamma", p.Gamma, "a number in [0, 1] (0: no target)")
	case !(p.Relax >= 0 && p.Relax <= 1):
		return bad("relax", p.Relax, "a number in (0, 1] (0: 1)")
	case p.Batch < 0:
		return bad("batch", p.Batch, ">= 0 (0: full batch)")
	case p.MaxEpochs < 0:
		return bad("max-epochs", p.MaxEpochs, ">= 0 (0: no limit)")
	case IsSplit(algo) && !(p.Step > 0):
		return fmt.Errorf("%w: %s needs a step size > 0 (--step)", ErrParams, algo)
	}
	return nil
}

// Effective is p as the family trains it: fedavg is the local solve
// without a proximal term, whatever mu says. The aggregator announces it;
// a site and simulate apply the same rule again (Prepare).
func (p Params) Effective(algo string) Params {
	if algo == FedAvg || algo == Scaffold {
		p.Mu = 0
	}
	return p
}
