package round

import (
	"math"

	"github.com/edgefl/edgefl/proto/wire"
)

// Population is what a FedSplit site needs to weigh its step by its share
// of the samples: m clients holding n samples in all (zeros: unweighted,
// every site's step is s).
type Population struct {
	Clients      uint64
	TotalSamples uint64
}

// ToWire is p's part of a round announcement: the parameters (with the
// population of the sample weighting) and the work budget.
func (p Params) ToWire(pop Population) (*wire.Params, *wire.WorkBudget) {
	return &wire.Params{Mu: p.Mu, Step: p.Step, Relax: p.Relax, Solver: p.Solver, Gamma: p.Gamma,
			Lr: p.LR, Batch: clampUint32(p.Batch), Tau: p.Tau,
			Clients: uint32(min(pop.Clients, math.MaxUint32)), TotalSamples: pop.TotalSamples},
		&wire.WorkBudget{MaxEpochs: clampUint32(p.MaxEpochs), MaxSeconds: p.MaxSeconds,
			MaxGradEvals: p.MaxGradEvals}
}

// clampUint32 is n clamped to [0, MaxUint32], computed in int64 so that it
// compiles where int is 32 bits (linux/arm, edge-agent's armv7 target).
func clampUint32(n int) uint32 { return uint32(min(max(int64(n), 0), math.MaxUint32)) }

// FromWire reads the parameters and the population of an announcement
// (absent messages read as zeros). The result is unchecked: Prepare
// validates it.
func FromWire(a *wire.RoundAnnouncement) (Params, Population) {
	w, b := a.GetParams(), a.GetBudget()
	p := Params{Mu: w.GetMu(), Step: w.GetStep(), Relax: w.GetRelax(), Solver: w.GetSolver(), Gamma: w.GetGamma(),
		LR: w.GetLr(), Batch: int(min(w.GetBatch(), math.MaxInt32)), Tau: w.GetTau(),
		MaxEpochs: int(min(b.GetMaxEpochs(), math.MaxInt32)), MaxSeconds: b.GetMaxSeconds(), MaxGradEvals: b.GetMaxGradEvals()}
	return p, Population{Clients: uint64(w.GetClients()), TotalSamples: w.GetTotalSamples()}
}
