package aggregator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The FedSplit family under secure aggregation runs in sum mode
// (docs/privacy.md, "FedSplit under secure aggregation"; the rules are
// uplink's, sum.go and secagg_sum.go): the aggregator keeps S, m and who is
// counted, never a site's z_j, and adds the unmasked sum of the round's
// quantised deltas (U3's) to S; x = S/m.
//
//   - Join or delta: a site's AdvertiseKeys names the round of its record
//     (base_round; 0: a join) and its installation. It is checked against
//     S's members before the secagg.Server takes it (uplink.SumState.Check:
//     BASE_MISMATCH otherwise), and stays stored with its session (storage
//     PutSecAggServer keeps a session's AdvertiseKeys), so the round's
//     close knows U3's joiners.
//   - The close: uplink.SecAggSumClose (joins with x on the quantiser's
//     grid, the dequantised sum, exact in integers of 2^-f), stored with
//     the next round's checkpoint in one transaction (sumMode.next, as under
//     central DP).
//   - "In the sum": only the round's close decides whether a site's input
//     is in S (a session can still abort after a site's last message). So
//     a site keeps its round's entry, with what it adds to its record,
//     until an UPDATE receipt of that round: sent to U3 (accepted) and to
//     the final session's other selected sites (rejected) once the
//     checkpoint holding S is stored, and again as the answer to any
//     secagg message of a closed round (accepted iff the coordinator
//     counted the site in that round: the duplicate rule).

// checkSumSecAgg refuses, in sum mode, an AdvertiseKeys that does not fit
// S (uplink.SumState.Check, an error wrapping uplink.ErrBaseMismatch).
func (s *Server) checkSumSecAgg(m *wire.SecAggMessage) error {
	if s.sum == nil || m.Kind != wire.SecAggKindAdvertiseKeys {
		return nil
	}
	return s.sum.open().Check(m.ClientId, m.InstanceId, m.BaseRound == 0)
}

// secAggSumAggregate is the closed round's sum-mode step: U3's joiners
// (from their stored AdvertiseKeys) counted with x on the grid and the
// unmasked sum added to S; the new state waits in s.nextSum for the
// checkpoint's transaction.
func (s *Server) secAggSumAggregate(cr coordinator.CloseRound, attempt int, q secagg.Quantizer, sum []uint32) ([]float64, aggregate.Report, error) {
	recs, err := s.store.SecAggMessages(uint64(cr.Round), uint32(attempt))
	if err != nil {
		return nil, aggregate.Report{}, err
	}
	var joins []uplink.Joiner
	seen := map[string]bool{}
	for _, rec := range recs {
		if rec.Kind != uint8(secagg.KindAdvertiseKeys) || !slices.Contains(cr.Contributors, rec.ClientID) {
			continue
		}
		m, err := wire.DecodeSecAgg(rec.Msg, s.lim)
		if err != nil {
			return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: the stored AdvertiseKeys of %q: %w", cr.Round, rec.ClientID, err)
		}
		seen[rec.ClientID] = true
		if m.BaseRound == 0 {
			joins = append(joins, uplink.Joiner{Client: rec.ClientID, Instance: m.InstanceId})
		}
	}
	if len(seen) != len(cr.Contributors) {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %d of the %d contributors have a stored AdvertiseKeys", cr.Round, len(seen), len(cr.Contributors))
	}
	slices.SortFunc(joins, func(a, b uplink.Joiner) int { return strings.Compare(a.Client, b.Client) })
	next := s.sum.open().Clone()
	out, err := uplink.SecAggSumClose(q, next, uint64(cr.Round), s.global, sum, joins)
	if err != nil {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	if len(joins) > 0 {
		s.log.Info("sites counted in the FedSplit sum", "round", cr.Round, "joined", len(joins), "counted", next.M)
	}
	s.sum.next = next
	return out, aggregate.Report{Metrics: map[string]float64{"secagg_sites": float64(len(cr.Contributors)),
		"split_counted": float64(next.M), "split_joined": float64(len(joins))}}, nil
}

// receiptSumSecAgg sends, once round cr's S is stored with its checkpoint,
// the round's UPDATE receipt to every contributor (its input is in S: its
// record advances) and to the other sites selected for the final session
// (it is not: their pending contribution goes out again in their next
// delta). Nothing outside sum mode.
func (s *Server) receiptSumSecAgg(cr coordinator.CloseRound) {
	if s.sum == nil || !s.secAgg.on() {
		return
	}
	for _, id := range cr.Contributors {
		s.receipt(&wire.ClientUpdate{ClientId: id, Round: uint64(cr.Round)}, true, wire.ReceiptCode_RECEIPT_CODE_STORED, "in the round's secure sum", time.Time{})
	}
	for _, id := range cr.Stragglers {
		if !slices.Contains(cr.Contributors, id) {
			s.receipt(&wire.ClientUpdate{ClientId: id, Round: uint64(cr.Round)}, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND, "not in the round's secure sum", time.Time{})
		}
	}
}

// answerClosedSum answers, in sum mode, a secagg message of a closed round
// with that round's UPDATE receipt: accepted if the site's input is in the
// round's sum (the coordinator's Duplicate), rejected otherwise.
func (s *Server) answerClosedSum(d coordinator.RejectSecAgg) {
	u := &wire.ClientUpdate{ClientId: d.Client, Round: uint64(d.Round)}
	if d.Reason == coordinator.Duplicate {
		s.receipt(u, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE, "in the round's secure sum", time.Time{})
		return
	}
	s.receipt(u, false, receiptCodes[d.Reason], "not in the round's secure sum", time.Time{})
}
