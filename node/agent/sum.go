package agent

import (
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
	"math/rand/v2"
)

// FedSplit's sum mode at the site (RoundAnnouncement.split_sum;
// docs/privacy.md, "FedSplit"; the rule is package uplink's): the update is
// the clipped delta of z_j against the site's own record c_j of what it
// has contributed to the aggregator's sum (a join against x while it has
// none), committed with what it will add to that sum
// (edgestore.SumPending); the record advances by exactly that, once, when
// the accepted receipt comes (sumStore.Ack, edgestore.EdgeStore.AckSum). A
// site sends its next update only once the previous one is receipted
// (ActionWaiting): its sends are then in round order, so the aggregator's
// duplicate rule (an update of the round it last stored from the site)
// tells a re-send of a counted update (DUPLICATE: the record advances)
// from one it never counted (rejected: it does not).

// sumMode reports whether ann runs the FedSplit family in sum mode.
func sumMode(ann *wire.RoundAnnouncement) bool {
	return ann.SplitSum && (ann.Algorithm == AlgoFedSplit || ann.Algorithm == AlgoFedProxSplit)
}

// sumUplink encodes a sum-mode update (uplink.EncodeSum) against the
// site's record, or as a join while it has none.
func (sr *siteRules) sumUplink(v StoreView, p *prepared, z []float64, rng *rand.Rand) (uplink.Frame, error) {
	r := p.round
	u := uplink.SumUpdate{Round: r, Z: z, Global: p.x, Initial: p.initial, Clip: p.clip, Tamper: poison}
	cr, c, err := v.Contribution()
	switch {
	case err == nil:
		u.Record = &uplink.Record{Round: cr, C: c}
	case !errors.Is(err, storage.ErrNotFound):
		return uplink.Frame{}, diskErrAt(v, roundErr(r, err))
	}
	f, err := p.task.EncodeSum(u, rng)
	if err != nil {
		return f, roundErr(r, err)
	}
	return f, nil
}

// sumInitial is x_0 of a fixed roster, decoded from the announcement's
// split_initial with the codec that decodes its global model; nil without
// a roster. Under central DP a sum-mode announcement without a roster is
// refused: the aggregator would count this site on its first update and
// so publish, through m, the round it was first drawn in.
func sumInitial(ann *wire.RoundAnnouncement, c *quant.Codec, dim int) ([]float64, error) {
	if ann.SplitRoster == 0 {
		if d := ann.GetDp(); d != nil && d.Mode == wire.DPMode_DP_MODE_CENTRAL {
			return nil, errNoRoster
		}
		return nil, nil
	}
	v := ann.SplitInitial
	if v == nil || int64(v.Dimension) != int64(dim) {
		return nil, fmt.Errorf("the initial model of the FedSplit roster has dimension %d, the model %d", v.GetDimension(), dim)
	}
	x0, err := c.Decode(v.Payload, nil)
	if err != nil || len(x0) != dim {
		return nil, fmt.Errorf("the initial model of the FedSplit roster (%d values): %w", len(x0), err)
	}
	return x0, nil
}

// errNoRoster refuses a central-DP FedSplit round from an aggregator that
// counts sites on their first update (an older version).
var errNoRoster = errors.New("a FedSplit round under central differential privacy without a fixed roster (split_roster): refused (hint: upgrade the aggregator)")

// sumStore is the edge store with the session's acknowledgement of an
// accepted update receipt (planAck, commitAck): a sum-mode update's
// advances the site's record (uplink.Advance, edgestore.EdgeStore.AckSum)
// in the transaction that drops its outbox entry; other updates are
// acknowledged as before. The shell's tests use it as "the receipt came".
type sumStore struct{ *edgestore.EdgeStore }

// HasPending reports whether round's outbox entry carries a sum-mode
// pending contribution (the session keeps such an entry until the round's
// UPDATE receipt, also under secure aggregation).
func (s sumStore) HasPending(round uint64) (bool, error) {
	_, ok, err := s.Pending(round)
	return ok, err
}

// Ack acknowledges round's accepted update receipt.
func (s sumStore) Ack(round uint64) (bool, error) {
	act, err := planAck(s.EdgeStore, &wire.Receipt{Round: round, Accepted: true})
	if err != nil {
		return false, err
	}
	return commitAck(s.EdgeStore, act)
}
