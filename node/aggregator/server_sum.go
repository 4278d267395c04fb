package aggregator

import (
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"time"

	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The FedSplit family under differential privacy runs in sum mode
// (docs/privacy.md, "FedSplit"; the rules are uplink's, sum.go): the
// aggregator keeps S, m and who is counted (uplink.SumState), never a
// site's z_j, and publishes x = S/m.
//
//   - Who is counted: the roster, fixed when round 1 is drawn (every site
//     registered then: the coordinator's Config.FixedRoster), from round 1
//     on, each with x_0 as its record (S = m x_0): m is the roster's size
//     and never changes, so the published models' noise scale z C/m says
//     nothing about who was drawn (it did when m grew by the sites drawn
//     for the first time). A site first seen after that draw is never
//     drawn in this run. The announcement carries m and x_0
//     (split_roster, split_initial): a site without a record starts from
//     x_0, and its first update (base round 0) is a delta against x_0
//     that adds only the delta.
//   - An update is stored only if it fits (uplink.SumState.Check against
//     the state as of the open round): a second first update, a delta from
//     a site that never started, and a first update from a new
//     installation of a site that has contributed (its state file lost:
//     its old record is in S and m is fixed) are refused (BASE_MISMATCH).
//     (Under secure aggregation, whose participants are published anyway,
//     a site is counted from its join instead, m += 1: server_secagg_sum.go.)
//   - When the round closes, the contributors' stored updates are
//     re-clipped, summed in client order, noised from the round's key
//     stream and added to S with the joins (uplink.SumState.CloseCentral);
//     the new S and m are stored with the next round's checkpoint in one
//     transaction (aggstore.Round.Sum, OpenRound), so a restart that finds
//     the checkpoint finds the S that produced it, and one that does not
//     redoes the close from the S before it, drawing the same noise.
//   - No late updates, no re-selection (as for the FedProx family under
//     DP), no robust server step (uplink.ErrSplitRobustDP).
//   - The duplicate rule makes an accepted receipt mean "in S": the
//     coordinator answers DUPLICATE only for the round it last stored from
//     the site, and a site in sum mode sends its next update only after
//     the previous one is receipted (node/agent/sum.go), so a re-send of a
//     counted update is a DUPLICATE and one never counted is rejected.

// storeSumUpdate stores an accepted sum-mode update once it fits the sum
// (uplink.SumState.Check) with its replay log entry, and returns the
// entry's index; a copy stored before the replay log existed is index 0.
func (s *Server) storeSumUpdate(u *inUpdate, now time.Time) (uint64, error) {
	m := u.msg
	if _, err := s.store.GetUpdate(m.Round, m.ClientId); err == nil {
		return 0, nil
	} else if !errors.Is(err, storage.ErrNotFound) {
		return 0, err
	}
	if m.Kind != wire.UpdateKind_UPDATE_KIND_SUM_DELTA {
		return 0, fmt.Errorf("%w: a %v in sum mode", errOutOfRange, m.Kind) // handleUpdate refuses it first
	}
	if err := s.sum.open().Check(m.ClientId, m.InstanceId, uplink.IsJoin(uplink.HeaderOf(m))); err != nil {
		return 0, err
	}
	return s.store.PutUpdate(aggstore.Update{Round: m.Round, ClientID: m.ClientId, StoredAt: now,
		SampleCount: m.SampleCount, Loss: 0, Msg: u.raw}, nil)
}

// sumAggregate is the closed round's sum-mode step: the contributors'
// deltas re-clipped, summed, noised and added to S with the joins; the new
// state waits in sumMode.next for the checkpoint's transaction.
func (s *Server) sumAggregate(cr coordinator.CloseRound) ([]float64, aggregate.Report, error) {
	clip := s.coord.DPClip()
	// Streamed: one decoded delta at a time, in the round log's order
	// (client ids: ClippedSum's order), re-clipped and summed.
	cs := uplink.NewClipSum(len(s.global), clip)
	var joins []uplink.Joiner
	var bits []bool
	var buf []float64
	err := s.forClosedInto(cr, &buf, func(u aggstore.Update, m *wire.ClientUpdate, d []float64) error {
		if m.GetKind() != wire.UpdateKind_UPDATE_KIND_SUM_DELTA {
			return fmt.Errorf("stored update of %q is a %v, not a sum-mode delta", u.ClientID, m.GetKind())
		}
		if uplink.IsJoin(uplink.HeaderOf(m)) {
			joins = append(joins, uplink.Joiner{Client: u.ClientID, Instance: m.InstanceId})
		}
		bits = append(bits, m.ClipBit == 1)
		return cs.Add(u.ClientID, d)
	})
	if err != nil {
		return nil, aggregate.Report{}, err
	}
	next := s.sum.open().Clone()
	if next.Fixed && next.M == 0 {
		x0, err := s.store.Checkpoint(1)
		if err != nil {
			return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: the initial model: %w", cr.Round, err)
		}
		if err := next.StartRoster(s.coord.Roster(), x0); err != nil {
			return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
		}
	}
	out, err := next.CloseCentralSum(uint64(cr.Round), s.global, cs.Sum(), joins, uplink.Private{Clip: clip, Noise: s.cfg.DP.UpdateNoise()}, dp.NoiseRand(s.noiseKey(), uint64(cr.Round)))
	if err != nil {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	if err := s.estimateClip(cr, bits, denominatorOf(cr)); err != nil {
		return nil, aggregate.Report{}, err
	}
	if len(joins) > 0 {
		s.log.Info("sites' first updates in the FedSplit sum", "round", cr.Round, "first", len(joins), "counted", next.M)
	}
	s.sum.next = next
	return out, aggregate.Report{Metrics: map[string]float64{"split_counted": float64(next.M), "split_joined": float64(len(joins)), "dp_clip": clip}}, nil
}

// sumBytes is st as stored with a round (nil outside sum mode).
func (s *Server) sumBytes(st *uplink.SumState) ([]byte, error) {
	if st == nil {
		return nil, nil
	}
	b, err := st.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	return b, nil
}

// rosterAnnounced is what an announcement says of a fixed roster: m and
// x_0's frame (round 1's checkpoint encoded as round 1 published it).
func (s *Server) rosterAnnounced() (uint32, *wire.Vector, error) {
	roster := s.coord.Roster()
	if len(roster) == 0 {
		return 0, nil, errors.New("aggregator: a FedSplit round under DP announced before its roster was fixed")
	}
	if s.sum.initFrame == nil {
		x0, err := s.store.Checkpoint(1)
		if err != nil {
			return 0, nil, fmt.Errorf("aggregator: the initial model: %w", err)
		}
		if s.sum.initFrame, err = s.down.Encode(nil, x0, nil, nil); err != nil {
			return 0, nil, fmt.Errorf("aggregator: encode the initial model with %s: %w", s.down, err)
		}
	}
	return uint32(len(roster)), &wire.Vector{Codec: s.down.String(), Dimension: uint32(s.dim), Payload: s.sum.initFrame}, nil
}

// errSumCounting refuses a round log whose FedSplit sum counts sites
// another way than this version does under the run's mode.
var errSumCounting = errors.New("this round log's FedSplit sum counts sites on their first update: cannot convert a run in progress (hint: finish it with the version that started it)")

// restoreSum reads the sum-mode state stored with the current round cur
// (nothing to read outside sum mode, or once the run has finished).
func (s *Server) restoreSum(cur aggstore.Round) error {
	// cur is the newest round record. Usually it is the round the state
	// resumes in; after a restart between the checkpoint's transaction
	// (which opens round globalR+1 with S after globalR's close) and the
	// coordinator's next state, the state still closes round globalR and
	// the close is not redone (closeRound uses the stored checkpoint), so
	// S is round globalR+1's: read it too, or every site looks uncounted
	// and the next round stalls (TestSumModeKills caught it under load).
	if s.sum == nil || (s.globalR != int(cur.Number) && s.globalR+1 != int(cur.Number)) {
		return nil
	}
	return s.sum.restore(cur, s.cfg.StatePath, s.dim)
}

// sumMode is the FedSplit family's sum-mode state: S, m and who is
// counted as of the open round, the closing round's until its checkpoint
// is stored, and x_0's frame as announced under a fixed roster. Its
// configuration is whether the roster is fixed (central DP, not under
// secure aggregation).
type sumMode struct {
	cur  *uplink.SumState // as of the open round
	next *uplink.SumState // the closing round's, until its checkpoint is stored
	// initFrame is x_0's frame as round 1 published it, announced under a
	// fixed roster (split_initial), once read.
	initFrame []byte
}

func newSumMode(fixedRoster bool) *sumMode {
	return &sumMode{cur: &uplink.SumState{Fixed: fixedRoster}}
}

// open is the state as of the open round (nil outside sum mode).
func (m *sumMode) open() *uplink.SumState {
	if m == nil {
		return nil
	}
	return m.cur
}

// closing is the closing round's state, to be stored with its checkpoint
// (nil outside sum mode, or when the round was aggregated before a
// restart).
func (m *sumMode) closing() *uplink.SumState {
	if m == nil {
		return nil
	}
	return m.next
}

// advance: the checkpoint with the closing round's state is stored; it is
// the open round's now.
func (m *sumMode) advance() {
	if m != nil && m.next != nil {
		m.cur = m.next
	}
}

// dropClosing forgets the closing round's state (stored or not).
func (m *sumMode) dropClosing() {
	if m != nil {
		m.next = nil
	}
}

// restore reads the state stored with round cur of the round log at path
// (a model of dim values), checking it against the run's mode.
func (m *sumMode) restore(cur aggstore.Round, path string, dim int) error {
	fixed := m.cur.Fixed
	if len(cur.Sum) == 0 {
		return fmt.Errorf("%w: %s: round %d of a FedSplit run under differential privacy has no sum state", storage.ErrCorrupt, path, cur.Number)
	}
	if err := m.cur.UnmarshalBinary(cur.Sum); err != nil {
		return fmt.Errorf("%w: %s: round %d: %w", storage.ErrCorrupt, path, cur.Number, err)
	}
	if m.cur.Fixed != fixed {
		m.cur.Fixed = fixed
		if !fixed {
			return fmt.Errorf("%w: %s: round %d: a FedSplit sum with a fixed roster, outside central DP", storage.ErrCorrupt, path, cur.Number)
		}
		return fmt.Errorf("%w: %s: %w", coordinator.ErrConfig, path, errSumCounting)
	}
	if fixed && cur.Number > 1 && m.cur.M == 0 {
		return fmt.Errorf("%w: %s: round %d of a FedSplit run under DP has no roster", storage.ErrCorrupt, path, cur.Number)
	}
	if m.cur.M > 0 && len(m.cur.S) != dim {
		return fmt.Errorf("%w: %s: round %d: a sum of %d values, the model has %d", storage.ErrCorrupt, path, cur.Number, len(m.cur.S), dim)
	}
	return nil
}
