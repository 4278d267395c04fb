package aggregator

import "github.com/edgefl/edgefl/node/aggregator/coordinator"

// The phase and stop-reason names of the aggregator's status (Status.Phase,
// ServerView.StopReason), which the coordinator package defines: readers of
// the status (broker-agg status, the console, simulate) need not import it.
type Phase = coordinator.Phase

const (
	PhaseWaiting    = coordinator.PhaseWaiting
	PhaseCollecting = coordinator.PhaseCollecting
	PhaseStalled    = coordinator.PhaseStalled
	PhaseClosing    = coordinator.PhaseClosing
	PhaseFinished   = coordinator.PhaseFinished
	PhaseStatistics = coordinator.PhaseStatistics
	PhaseFitting    = coordinator.PhaseFitting
	PhaseFinishing  = coordinator.PhaseFinishing
	PhaseSecAgg     = coordinator.PhaseSecAgg

	// StopDPBudget: the privacy budget ended the run.
	StopDPBudget = coordinator.StopDPBudget
)
