package aggregator

import (
	"bytes"
	"errors"
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
// (the global learning rate 1; --server-opt sgd sets eta_g, server_opt.go);
// the control variate c is this server's
// own state: announced in full with every round (RoundAnnouncement.control,
// with the global model's codec), kept as announced (the codec's round
// trip applied, so a site's c is this c bit for bit), and stored with the
// round's checkpoint in one transaction (aggstore.Round.Control), so that
// a restart or a rollback to round n resumes with c as round n opened.
// c moves by (1/N) sum_k delta c_k over the round's counted updates (in
// client-id order), N the sites known when the round closes
// (coordinator.Population): a site's c_i is what it has sent, so c stays
// the mean of every known site's c_i.
//
// A rollback to round E (Rollback) gives the run a new run id, on which
// every site clears its c_i (edgestore.StartRun), and records E as the
// control epoch (storedConfig.ControlEpoch, announced as control_epoch).
// Round E's stored updates may include some of the run rolled back, whose
// control deltas were computed against c_i that no longer exist; so c is 0
// for round E (restoreControl) and set back to 0 when round E closes
// (scaffoldStep), and the sites do not add round E's delta c to their c_i
// (node/agent). From round E on, c is again the mean of the sites' c_i:
// all zero at E + 1, then moving by the counted deltas as before.

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

// otherRun drops, without a receipt, a SCAFFOLD update of another run
// than this one (its run_id): one a site re-sends from its outbox after a
// rollback, before it has seen the new run. Its control delta belongs to
// a c_i the site clears when it does, so it must not be counted; and a
// rejection receipt could reach the site after it has committed this
// run's update of the same round, and drop that one. The site clears the
// entry itself with the new run (edgestore.StartRun). Logged and counted
// (rejected{reason="other_run"}).
func (s *Server) otherRun(u *wire.ClientUpdate) bool {
	if s.fam != AlgoScaffold || s.stored.RunID == "" || u.RunId == s.stored.RunID {
		return false
	}
	s.reject(u.ClientId, "other_run")
	s.log.Warn("update of another run ignored (a rollback started this one; the site clears it when it sees this run)",
		"client", u.ClientId, "round", u.Round, "update_run_id", u.RunId, "run_id", s.stored.RunID)
	return true
}

// countedCopy reports whether u, refused because its round has closed,
// is a copy of the update its site's round log holds for that round (the
// same bytes): one this aggregator counted, re-sent because its receipt
// was lost (a crash of either side, a dropped connection) after the round
// closed. Under SCAFFOLD the answer must say so (an accepted DUPLICATE
// receipt, as within the round), for a site puts back its c_i on a
// rejection (node/agent/scaffold.go): a rejection of a counted update
// would take its delta c out of c_i and leave it in c. An update the log
// does not hold was never counted and stays rejected. The coordinator's
// own duplicate rule covers the round it last stored from the site; this
// covers the earlier ones. The round log keeps every round's updates (the
// daemon prunes none; a rollback removes the rounds after it and starts a
// run whose sites clear their c_i and outbox). A read error is returned
// (the caller answers INTERNAL: the site re-sends later).
func (s *Server) countedCopy(u *inUpdate, d coordinator.Reject) (bool, error) {
	if s.fam != AlgoScaffold || (d.Reason != coordinator.StaleRound && d.Reason != coordinator.RoundClosed) {
		return false, nil
	}
	st, err := s.store.GetUpdate(u.msg.Round, u.msg.ClientId)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return bytes.Equal(st.Msg, u.raw), nil
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
	if len(cur.Control) == 0 || cur.Number == s.stored.ControlEpoch {
		return nil // round E of a rollback: the sites' c_i are cleared
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

// controlEpoch is the announcement's control_epoch: the round the last
// rollback reopened (0 outside SCAFFOLD or without one).
func (s *Server) controlEpoch() uint64 {
	if s.fam != AlgoScaffold {
		return 0
	}
	return s.stored.ControlEpoch
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
	if uint64(cr.Round) == s.stored.ControlEpoch {
		// The rollback's round: its deltas (checked above) are not
		// counted, nor added to c_i by the sites.
		next = make([]float64, s.dim)
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
