package aggregator

import (
	"fmt"
	"math"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// SCAFFOLD at the aggregator (the rules are package uplink's,
// scaffold.go). The model's step is the mean aggregator over x + delta y
// (the global learning rate 1); the control variate c is this server's
// own state: announced in full with every round (RoundAnnouncement.control,
// with the global model's codec), kept as announced (the codec's round
// trip applied, so a site's c is this c bit for bit), and stored with the
// round's checkpoint in one transaction (aggstore.Round.Control), so that
// a restart or a rollback to round n resumes with c as round n opened.
// c moves by (1/N) sum_k delta c_k over the round's counted updates (in
// client-id order), N the sites known when the round closes
// (coordinator.Population): a site's c_i is what it has sent, so c stays
// the mean of every known site's c_i.

// scaffoldConfig checks what SCAFFOLD composes with: the mean of the
// updates (a robust aggregator would weigh delta y and delta c apart),
// the SGD solver (option II counts the steps of rate lr), and neither DP
// nor secure aggregation (which clip or sum the model's delta alone).
func (cfg *ServerConfig) scaffoldConfig(d *derived) error {
	if d.fam != AlgoScaffold {
		return nil
	}
	switch {
	case d.aggSpec != "mean":
		return fmt.Errorf("%w: scaffold takes the mean of the updates, not aggregator %q (robust aggregators do not compose with the control variates)", coordinator.ErrConfig, d.aggSpec)
	case cfg.Params.Solver != "" && cfg.Params.Solver != "sgd":
		return fmt.Errorf("%w: scaffold needs the sgd solver, not %q", coordinator.ErrConfig, cfg.Params.Solver)
	case cfg.DP != nil:
		return fmt.Errorf("%w: scaffold does not compose with DP (the clip and the noise cover the model's delta, not delta c)", coordinator.ErrConfig)
	case cfg.SecAgg != nil:
		return fmt.Errorf("%w: scaffold does not compose with secure aggregation (the masked sum carries the model's delta, not delta c)", coordinator.ErrConfig)
	}
	return nil
}

// scaffoldCheck is the ingest check of a SCAFFOLD update's control delta:
// present, of the model's dimension, finite. It returns a rejection
// reason and detail ("" when the update is fine).
func (s *Server) scaffoldCheck(u *wire.ClientUpdate, c *quant.Codec, dim int) (reason, detail string) {
	if s.fam != AlgoScaffold {
		if u.ControlDelta != nil {
			return "unexpected_control", "a control delta in a " + s.fam + " federation"
		}
		return "", ""
	}
	cv := u.ControlDelta
	if cv == nil {
		return "no_control", "a scaffold update needs control_delta"
	}
	if int(cv.Dimension) != dim {
		return "wrong_dimension", fmt.Sprintf("control delta of dimension %d, the model has %d", cv.Dimension, dim)
	}
	d, err := c.Decode(cv.Payload, nil)
	if err != nil {
		return frameReason(err), "control delta: " + err.Error()
	}
	if len(d) != dim {
		return "wrong_dimension", fmt.Sprintf("control delta decoded to %d values, the model has %d", len(d), dim)
	}
	for i, v := range d {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "non_finite", fmt.Sprintf("control delta value %d is %v", i, v)
		}
	}
	return "", ""
}

// restoreControl reads c stored with the current round cur (none: zero).
func (s *Server) restoreControl(cur aggstore.Round) error {
	if s.fam != AlgoScaffold {
		return nil
	}
	s.control = make([]float64, s.dim)
	if len(cur.Control) == 0 {
		return nil
	}
	c, err := storage.DecodeFloats(cur.Control, "control variate")
	if err != nil {
		return fmt.Errorf("aggregator: %s: round %d: %w", s.cfg.StatePath, cur.Number, err)
	}
	if len(c) != s.dim {
		return fmt.Errorf("%w: %s: round %d: the control variate has %d values, the model %d", storage.ErrCorrupt, s.cfg.StatePath, cur.Number, len(c), s.dim)
	}
	s.control = c
	return nil
}

// controlVector is the announcement's control field (nil outside
// SCAFFOLD).
func (s *Server) controlVector() (*wire.Vector, error) {
	if s.fam != AlgoScaffold {
		return nil, nil
	}
	if s.control == nil {
		s.control = make([]float64, s.dim)
	}
	f, err := s.down.Encode(nil, s.control, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("aggregator: encode the control variate: %w", err)
	}
	return &wire.Vector{Codec: s.down.String(), Dimension: uint32(s.dim), Payload: f}, nil
}

// scaffoldStep computes the closed round's next c into s.nextControl
// from its counted updates' control deltas.
func (s *Server) scaffoldStep(cr coordinator.CloseRound) error {
	if s.fam != AlgoScaffold {
		return nil
	}
	if s.control == nil {
		s.control = make([]float64, s.dim)
	}
	// Streamed: one decoded control delta at a time, summed in the round
	// log's order (NextControl's).
	cs := uplink.NewControlSum(s.dim)
	var buf, cbuf []float64
	err := s.forClosedInto(cr, &buf, func(u aggstore.Update, m *wire.ClientUpdate, _ []float64) error {
		cv := m.GetControlDelta()
		if cv == nil {
			return fmt.Errorf("stored update of %q: %w: none", u.ClientID, uplink.ErrControl)
		}
		d, err := s.loopQ.Decode(cv.Payload, cbuf)
		if err != nil || len(d) != s.dim {
			return fmt.Errorf("stored update of %q: %w (%d values): %v", u.ClientID, uplink.ErrControl, len(d), err)
		}
		cbuf = d
		return cs.Add(d)
	})
	if err != nil {
		return err
	}
	n, _ := s.coord.Population()
	next, err := cs.Next(s.control, n)
	if err != nil {
		return fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	if s.nextControl, err = s.downlinked(next); err != nil {
		return err
	}
	return nil
}

// controlBytes is what the next round's record stores: the closing
// round's new c, or, when the round was aggregated before a restart, c
// as it is.
func (s *Server) controlBytes() []byte {
	if s.fam != AlgoScaffold {
		return nil
	}
	c := s.nextControl
	if c == nil {
		c = s.control
	}
	if c == nil {
		return nil
	}
	return storage.EncodeFloats(c)
}
