package aggregator

import (
	"fmt"

	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// A streamed close: the weighted means (FedAvg, FedProx's mean) are
// sum_k c_k w_k with c_k from the sample counts alone
// (aggregate.Summable), so the close reads the round's sample counts
// first, then decodes the stored updates one at a time from the round log
// and folds each into a running sum (aggregate.Sum), in the round log's
// order, the order the in-memory aggregation summed them in: the same
// bits, one decoded update in memory instead of K (8 d bytes, not 8 K d).
// The other aggregators (median, trimmed mean, norm bounding, the
// similarity weightings) need every update at once and load them all
// (closedUpdates).

// aggregateUpdates aggregates the closed round's updates into out with
// s.agg: streamed when it is a weighted mean.
func (s *Server) aggregateUpdates(cr coordinator.CloseRound, out []float64) (aggregate.Report, error) {
	if a, ok := aggregate.AsSummable(s.agg); ok {
		return s.streamAggregate(cr, a, out)
	}
	ups, err := s.closedUpdates(cr, s.global)
	if err != nil {
		return aggregate.Report{}, err
	}
	rep, err := s.agg.Aggregate(s.global, ups, out)
	if err != nil {
		return rep, fmt.Errorf("aggregator: round %d: %s: %w", cr.Round, s.agg.Name(), err)
	}
	return rep, nil
}

// streamAggregate is the streamed close of a weighted mean a: the
// coefficients from the contributors' stored sample counts, then one pass
// over their updates into the sum (and a second one for the coordinates
// that rounded past the float64 range, as Aggregate does).
func (s *Server) streamAggregate(cr coordinator.CloseRound, a aggregate.Summable, out []float64) (aggregate.Report, error) {
	counts, err := s.closedCounts(cr)
	if err != nil {
		return aggregate.Report{}, err
	}
	if len(counts) == 0 {
		// Nothing stored (pruned) or nobody: the in-memory path's
		// errors, word for word.
		ups, err := s.closedUpdates(cr, s.global)
		if err != nil {
			return aggregate.Report{}, err
		}
		return a.Aggregate(s.global, ups, out)
	}
	fail := func(err error) (aggregate.Report, error) {
		return aggregate.Report{}, fmt.Errorf("aggregator: round %d: %s: %w", cr.Round, a.Name(), err)
	}
	rep, err := a.Weights(counts)
	if err != nil {
		return fail(err)
	}
	if err := aggregate.CheckGlobal(s.global, out); err != nil {
		return fail(err)
	}
	sum := aggregate.NewSum(out)
	var buf []float64
	pass := func(fold func(c float64, u aggregate.Update) error) error {
		k := 0
		return s.forClosedInto(cr, &buf, func(u aggstore.Update, m *wire.ClientUpdate, d []float64) error {
			if k >= len(counts) || counts[k].Client != u.ClientID {
				return fmt.Errorf("stored update of %q: not the one whose sample count was read (the round log changed while it was read)", u.ClientID)
			}
			// In place: d is the pass's decode buffer, read once.
			vec, err := uplink.ReceiveInto(d, uplink.HeaderOf(m), d, s.global, nil)
			if err != nil {
				return fmt.Errorf("stored update of %q: %w", u.ClientID, err)
			}
			c := rep.Weights[k]
			k++
			return fold(c, aggregate.Update{Client: u.ClientID, Params: vec})
		})
	}
	if err := pass(func(c float64, u aggregate.Update) error {
		if err := sum.Add(c, u); err != nil {
			return fmt.Errorf("%s: %w", a.Name(), err)
		}
		return nil
	}); err != nil {
		return aggregate.Report{}, err
	}
	if sum.Overflowed() {
		if err := pass(func(c float64, u aggregate.Update) error { sum.Redo(c, u.Params); return nil }); err != nil {
			return aggregate.Report{}, err
		}
		sum.Finish()
	}
	return rep, nil
}

// closedCounts are the closed round's contributors' updates as the
// weights see them (client, counted samples, loss), in the round log's
// order, without their vectors.
func (s *Server) closedCounts(cr coordinator.CloseRound) ([]aggregate.Update, error) {
	first, err := s.firstCounts(cr)
	if err != nil {
		return nil, err
	}
	want := make(map[string]bool, len(cr.Contributors))
	for _, id := range cr.Contributors {
		want[id] = true
	}
	counts := make([]aggregate.Update, 0, len(cr.Contributors))
	err = s.store.ForEachUpdateMeta(uint64(cr.Round), func(u aggstore.Update) error {
		if want[u.ClientID] {
			counts = append(counts, aggregate.Update{Client: u.ClientID, Samples: s.countOf(u, first), Loss: u.Loss})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	return counts, nil
}
