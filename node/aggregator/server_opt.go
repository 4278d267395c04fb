package aggregator

import (
	"errors"
	"fmt"

	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
)

// The server optimiser (learn/serveropt) takes the FedAvg/FedProx
// families' aggregate, under central DP the noisy mean, or under --secagg
// the uniform mean of the secure sum (with --dp distributed, noise
// included), as x + Delta and steps from the global model x with Delta as
// its pseudo-gradient: post-processing of what the aggregator learns
// anyway, so secure aggregation's and DP's guarantees are unchanged.
// Its state (the step count and the moments m, v) is the aggregator's own,
// kept with the round's checkpoint in one transaction (aggstore.Round.Opt)
// like the robust FedSplit step's: a restart or a rollback to round n
// resumes with the state as round n opened, so the run continues bit for
// bit. The sites never see it: they train from the announced global model
// as without an optimiser.

// serverOpt is the optimiser of the run and its state as of the open
// round; next is the closing round's, until its checkpoint is stored.
type serverOpt struct {
	params serveropt.Params
	state  serveropt.State
	next   *serveropt.State
}

// checkServerOpt refuses an optimiser where the server step is not the
// mean of the sites' deltas: the FedSplit family (under --secagg its sum
// mode, whose step is FedSplit's over the secure sum of the z_j).
func (cfg *ServerConfig) checkServerOpt(d *derived) error {
	p := cfg.ServerOpt
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: %w", coordinator.ErrConfig, err)
	}
	if !p.On() {
		return nil
	}
	if isSplit(d.fam) {
		return fmt.Errorf("%w: --server-opt %s with %s: the FedSplit family's server step is not a mean of deltas (hint: fedavg or fedprox)", coordinator.ErrConfig, p.Kind, d.fam)
	}
	return nil
}

// optStep replaces the aggregate next (x + Delta) with the optimiser's
// step from the global model, keeping the new state for the checkpoint.
func (s *Server) optStep(round int, next []float64) error {
	if !s.opt.params.On() {
		return nil
	}
	st := s.opt.state // Step replaces the moments, never writes through
	if err := serveropt.Step(s.opt.params, &st, s.global, next, next); err != nil {
		if errors.Is(err, serveropt.ErrNonFinite) {
			return fmt.Errorf("aggregator: round %d: server optimiser %s produced a non-finite value: %w", round, s.opt.params, err)
		}
		return fmt.Errorf("aggregator: round %d: %w", round, err)
	}
	s.opt.next = &st
	return nil
}

// optBytes is the state to store with the next round's checkpoint (the
// closing round's when it aggregated now, else the state as it was).
func (s *Server) optBytes() []byte {
	if !s.opt.params.On() {
		return nil
	}
	if s.opt.next != nil {
		return s.opt.next.Marshal()
	}
	return s.opt.state.Marshal()
}

// optAdvance makes the stored next state current (after its checkpoint).
func (s *Server) optAdvance() {
	if s.opt.next != nil {
		s.opt.state = *s.opt.next
	}
	s.opt.next = nil
}

// restoreOpt reads the optimiser's state stored with the current round.
func (s *Server) restoreOpt(cur aggstore.Round) error {
	if !s.opt.params.On() {
		return nil
	}
	st, err := serveropt.Unmarshal(cur.Opt, s.dim)
	if err != nil {
		return fmt.Errorf("%w: %s: round %d: %w", storage.ErrCorrupt, s.cfg.StatePath, cur.Number, err)
	}
	s.opt.state, s.opt.next = st, nil
	return nil
}

// optText names an optimiser for the resume check.
func optText(p *serveropt.Params) string {
	if p == nil {
		return string(serveropt.None)
	}
	return p.String()
}
