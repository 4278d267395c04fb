package agent

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// SCAFFOLD at the site (the rules are package uplink's, scaffold.go): the
// round announces the server's control variate c; the site's own c_i is
// in its store (edgestore.ResidualControl; none: zero, as after a reset);
// the local SGD steps are shifted by c - c_i; the update carries delta c,
// and the commit that stores the update stores c_i plus the decoded delta.
//
// A rejected update (any receipt but accepted or INTERNAL: e.g. a
// straggler's, answered STALE_ROUND once its round closed under a quorum
// below 1) is never counted, so its delta c must leave c_i again: the
// commit keeps c_i as it was before the round with the update
// (edgestore.Commit.ControlUndo), and the rejection's acknowledgement puts
// it back in the transaction that drops the outbox entry
// (edgestore.EdgeStore.AckRejected). For that undo to be the whole story, a
// SCAFFOLD site, like one in FedSplit's sum mode, answers a round only
// once its previous update is receipted (ActionWaiting): no later commit
// has built on the delta when the receipt comes, and the aggregator's
// duplicate rule (the round it last stored from the site) tells a re-sent
// copy of a counted update (DUPLICATE, accepted) from one it never counted
// (rejected). The aggregator also answers DUPLICATE to a copy of an update
// its round log holds (node/aggregator/server_scaffold.go, countedCopy).
//
// In the round a rollback reopened (the announcement's control_epoch), the
// aggregator counts no delta c and announces c = 0, so the site solves with
// c_i = 0 and commits c_i = 0 (node/aggregator/server_scaffold.go): after
// it c is the mean of the sites' c_i again.

// scaffoldPrepare checks a SCAFFOLD announcement and decodes its c into
// p.control: SGD only (option II counts the steps of rate lr), and not
// under DP or secure aggregation, which clip or sum the model's delta
// alone.
func scaffoldPrepare(ann *wire.RoundAnnouncement, p *prepared) error {
	p.scaffold = true
	if p.work.Solver.Solver != proxsolver.SGD {
		return fmt.Errorf("scaffold needs the sgd solver, this site runs %s", p.work.Solver.Solver)
	}
	if p.clip > 0 || ann.Secagg != nil {
		return errors.New("scaffold does not run under DP or secure aggregation")
	}
	p.work.Solver.Mu = 0
	cv := ann.Control
	if cv == nil {
		return errors.New("scaffold announcement without its control variate")
	}
	dim := len(p.x)
	if int64(cv.Dimension) != int64(dim) {
		return fmt.Errorf("control variate has dimension %d, the model %d", cv.Dimension, dim)
	}
	c, err := p.codec.Decode(cv.Payload, nil)
	if err != nil || len(c) != dim {
		return fmt.Errorf("control variate frame (%d values): %w", len(c), err)
	}
	p.control = c
	if e := ann.ControlEpoch; e > ann.Round {
		return fmt.Errorf("control_epoch %d is after the round", e)
	}
	p.epochRound = ann.ControlEpoch == ann.Round
	return nil
}

// scaffoldLoad reads the site's c_i (none, or of another model: zero)
// and sets the solve's shift c - c_i.
func scaffoldLoad(v StoreView, p *prepared) error {
	ci, err := v.Residual(edgestore.ResidualControl)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		ci = nil
	case err != nil:
		return err
	case len(ci) != len(p.x), p.epochRound:
		ci = nil
	}
	p.ci = ci
	p.work.Solver.Shift = uplink.Shift(p.control, ci)
	return nil
}

// scaffoldUplink encodes delta c for the steps the solve took and returns
// the update's control_delta and the site's new c_i.
func scaffoldUplink(p *prepared, sent []float64, steps int, rng *rand.Rand) (*wire.Vector, []float64, error) {
	d, err := uplink.ControlDelta(p.control, p.x, sent, steps, p.work.Solver.LR)
	if err != nil {
		return nil, nil, err
	}
	payload, next, err := uplink.EncodeControl(p.codec, p.ci, d, rng)
	if err != nil {
		return nil, nil, err
	}
	if p.epochRound {
		next = make([]float64, len(d)) // not counted: c_i stays zero
	}
	return &wire.Vector{Codec: p.codec.String(), Dimension: uint32(len(d)), Payload: payload}, next, nil
}

// scaffoldUndo is what a rejection of the round's update puts back as c_i:
// c_i as the solve read it (zero, of dimension dim, when the site had
// none, or in a rollback's round).
func scaffoldUndo(p *prepared, dim int) []float64 {
	if len(p.ci) == dim {
		return p.ci
	}
	return make([]float64, dim)
}
