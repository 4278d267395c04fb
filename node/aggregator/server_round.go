package aggregator

import (
	"context"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"math"
	"slices"
	"time"

	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// announcement builds the round message for the current global model.
func (s *Server) announcement(round int, selected []string, deadline time.Time) (*wire.RoundAnnouncement, error) {
	if round != s.globalR {
		return nil, fmt.Errorf("aggregator: announcing round %d with the global model of round %d", round, s.globalR)
	}
	if s.frame == nil {
		f, err := s.down.Encode(nil, s.global, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("aggregator: encode the global model of round %d: %w", round, err)
		}
		s.frame = f
	}
	popM, popN := s.coord.Population()
	var err error
	ms := wire.ModelSpec{Kind: s.spec.Kind, Inputs: uint32(s.spec.Inputs), Classes: uint32(s.spec.Classes),
		Activation: s.spec.Activation, L2: s.spec.L2}
	if s.spec.Hidden > 0 {
		ms.Hidden = []uint32{uint32(s.spec.Hidden)}
	}
	params, budget := s.cfg.Params.ToWire(population(popM, popN))
	a := &wire.RoundAnnouncement{
		Federation:      s.cfg.Federation,
		Round:           uint64(round),
		Algorithm:       s.cfg.Algorithm,
		Params:          params,
		Model:           &ms,
		Budget:          budget,
		DeadlineUnixMs:  deadline.UnixMilli(),
		Selected:        slices.Clone(selected),
		SplitSum:        s.sum != nil,
		Global:          &wire.Vector{Codec: s.down.String(), Dimension: uint32(s.dim), Payload: s.frame},
		UplinkCodec:     s.cfg.Codec,
		CreatedAtUnixMs: s.clock.Now().UnixMilli(),
		AnchorSketch:    s.cfg.AnchorSketch,
		RunId:           s.stored.RunID,
		Dp:              s.dpParams(),
	}
	if s.cfg.DP != nil && !s.secAgg.on() {
		// Private selection (docs/privacy.md, "Sampling rate"): the
		// retained announcement names nobody; Invite decisions tell each
		// selected site on its own receipts topic (server_invite.go).
		// Not under --secagg, whose KeyList names the sites anyway.
		a.Selected, a.PrivateSelection = nil, true
	}
	if s.cfg.DP != nil {
		// The total sample count is a function of the sites' data (one
		// patient's row changes it) and is not inside the guarantee: under
		// DP it is not announced, and a FedSplit site's step is then s
		// (docs/privacy.md, "What the guarantee covers").
		a.Params.TotalSamples = 0
	}
	if s.sum != nil && s.sum.open().Fixed {
		if a.SplitRoster, a.SplitInitial, err = s.rosterAnnounced(); err != nil {
			return nil, err
		}
	}
	if !isSplit(s.fam) {
		a.Aggregator = s.aggSpec
	}
	if a.Control, err = s.controlVector(); err != nil {
		return nil, err
	}
	a.ControlEpoch = s.controlEpoch()
	if attempt, _, ok := s.coord.SecAggSession(); ok {
		a.Secagg = s.secAgg.spec(attempt)
	}
	if fit := s.fed.fitted(); fit != nil {
		a.Schema, a.Transform = s.fed.canonical(), fit.Transform
		if s.coord.EvalAt(round) {
			a.Evaluate, a.EvalRound = true, uint32(round-1)
		}
	}
	return a, nil
}

// population is the sample weighting of FedSplit's steps: m sites
// holding n samples.
func population(m int, n int64) round.Population {
	return round.Population{Clients: uint64(max(m, 0)), TotalSamples: uint64(max(n, 0))}
}

// announce publishes the retained round message (attempt < 0: an
// extension).
func (s *Server) announce(round, attempt int, selected []string, deadline time.Time) error {
	a, err := s.announcement(round, selected, deadline)
	if err != nil {
		return err
	}
	if err := s.publishRunSpec(a); err != nil {
		return err
	}
	b, err := wire.Encode(a)
	if err != nil {
		return fmt.Errorf("aggregator: encode announcement of round %d: %w", round, err)
	}
	s.hist.startRound(round, s.clock.Now(), s.bytesInTotal.Load())
	s.mu.Lock()
	online := s.view.online
	s.mu.Unlock()
	s.hist.sent(uint64(len(b)) * uint64(max(online, 1)))
	if attempt >= 0 {
		s.log.Info("round announced", "round", round, "attempt", attempt, "selected", selected,
			"deadline", deadline.UTC().Format(time.RFC3339), "bytes", len(b))
	}
	s.publish(s.topics.Round(), true, b, "round announcement")
	return nil
}

// closeRound aggregates the closed round, checkpoints the result as the
// next round's global model (in the same transaction that opens the next
// round), then steps AggregatedRound. After a restart the checkpoint may
// exist already: then the aggregation is not redone.
func (s *Server) closeRound(ctx context.Context, cr coordinator.CloseRound) error {
	start := s.clock.Now()
	r := cr.Round
	next, err := s.store.Checkpoint(uint64(r + 1))
	var rep aggregate.Report
	redo := errors.Is(err, storage.ErrNotFound)
	if err == nil && (s.sum != nil || s.fam == AlgoScaffold) && !cr.Final && s.storeR == uint64(r) {
		// A checkpoint without its round: the sum that goes with it is
		// computed again (the same noise, the same model).
		redo = true
	}
	switch {
	case redo:
		if next, rep, err = s.aggregate(cr); err != nil {
			return err
		}
		if next, err = s.downlinked(next); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("aggregator: checkpoint of round %d: %w", r+1, err)
	default:
		s.log.Info("round was aggregated before a restart; using its checkpoint", "round", r)
	}
	now, err := s.checkpoint(cr, next, redo)
	if err != nil {
		return err
	}
	// The close read the round's updates back through the store's map:
	// without this its pages stay in the RSS, a round log's worth per
	// round (31 MB at 1,000 sites of 7,850 fp32 values).
	if err := s.store.ReleaseMapped(); err != nil {
		s.log.Warn("releasing the state file's mapped pages", "round", r, "err", err)
	}
	s.receiptSumSecAgg(cr) // after S is stored with the checkpoint: persist before send
	agg := coordinator.AggregatedRound{Round: r, At: now}
	hr := RoundRecord{Round: r, AggregatedAt: now, Participants: len(cr.Contributors), Late: cr.Late,
		Partial: slices.Clone(cr.Partial), Stragglers: slices.Clone(cr.Stragglers)}
	hr.BytesUp, hr.BytesDown, hr.OpenedAt = s.hist.endRound(r, s.bytesInTotal.Load())
	if len(next) == len(s.global) {
		hr.DeltaNorm, hr.RelChange = deltaOf(s.global, next)
		if hr.RelChange != nil {
			agg.Change, agg.HasChange = *hr.RelChange, true
		}
	}
	if fit := s.fed.fitted(); fit != nil && s.coord.EvalAt(r) {
		// The evaluation this round's announcement asked for (of the
		// model before this aggregation) is as complete as it gets.
		s.finalizeEval(r - 1)
		if fig, err := evalFigures(s.store, fit.schema, r-1, s.lim); err != nil {
			s.log.Error("combining the evaluation reports", "round", r-1, "err", err)
		} else if fig != nil && fig.Federation.N > 0 {
			agg.EvalLoss, agg.HasEval = fig.Federation.Loss, true
		}
	}
	s.global, s.globalR, s.frame = next, r+1, nil
	dur := s.clock.Since(start)

	rr := RoundReport{Round: r, Contributors: cr.Contributors, Partial: cr.Partial, Stragglers: cr.Stragglers,
		Late: cr.Late, Duration: dur, EvalLoss: math.NaN(), EvalScore: math.NaN(), Metrics: rep.Metrics, Global: next}
	if ev := s.eval; ev != nil && ev.N > 0 {
		rr.EvalLoss = s.model.LossGrad(next, *ev, nil)
		rr.EvalScore = s.model.Score(next, *ev)
	}
	hr.Seconds = dur.Seconds()
	s.hist.addRound(hr)
	if s.fed.fitted() == nil && !math.IsNaN(rr.EvalLoss) {
		score := rr.EvalScore
		s.hist.addEval(EvalPoint{Round: r, Federation: EvalFigures{N: int64(s.eval.N), Loss: rr.EvalLoss, Score: &score}})
	}
	s.mu.Lock()
	s.view.last = rr
	s.view.aggSeconds += dur.Seconds()
	s.view.aggCount++
	s.mu.Unlock()
	args := []any{"round", r, "contributors", len(cr.Contributors), "partial", len(cr.Partial),
		"stragglers", cr.Stragglers, "aggregation", dur.Round(time.Microsecond)}
	if len(cr.Partial) > 0 {
		args = append(args, "partial_means", wire.PartialMeans)
	}
	if s.eval != nil {
		args = append(args, "eval_loss", rr.EvalLoss, "eval_score", rr.EvalScore)
	}
	if agg.HasChange && s.cfg.StopDelta > 0 {
		args = append(args, "change", agg.Change)
	}
	if eps, _, ok := s.coord.Privacy(); ok {
		siteEps, siteRounds, _ := s.coord.SitePrivacy()
		rr.Epsilon, rr.EpsilonUnamplified = eps, siteEps
		args = append(args, "epsilon", eps, "delta", s.cfg.DP.Delta, "epsilon_unamplified", siteEps, "max_site_rounds", siteRounds)
	}
	s.log.Info("round aggregated", args...)
	if s.cfg.OnRound != nil {
		s.cfg.OnRound(rr)
	}
	return s.step(ctx, agg)
}

// checkpoint stores what closing round cr decided: the coordinator's state
// (with adaptive clipping's next clip norm, server_dp.go) and next as the
// next round's checkpoint, opening that round with the sum-mode state
// (server_sum.go) in one transaction; after the last round, the final
// checkpoint (when it was computed now: redo) and the round closed. It
// returns the time it stored them.
func (s *Server) checkpoint(cr coordinator.CloseRound, next []float64, redo bool) (time.Time, error) {
	r := cr.Round
	if clip := s.privacy.takeClip(); clip > 0 {
		// Adaptive clipping: the next round's clip norm is stored with
		// its checkpoint (ClipEstimated, server_dp.go).
		s.coord.Step(coordinator.ClipEstimated{Round: r, Clip: clip, At: s.clock.Now()})
	}
	state, err := s.encodeState()
	if err != nil {
		return time.Time{}, err
	}
	now := s.clock.Now()
	if cr.Final {
		if redo {
			if err := s.store.PutCheckpoint(uint64(r+1), next); err != nil {
				return time.Time{}, fmt.Errorf("aggregator: %w", err)
			}
		}
		if err := s.store.CloseRound(uint64(r), now, state); err != nil {
			return time.Time{}, fmt.Errorf("aggregator: %w", err)
		}
	} else if s.storeR == uint64(r) {
		sum, err := s.sumBytes(s.sum.closing())
		if err != nil {
			return time.Time{}, err
		}
		rob := s.nextRobust
		if rob == nil {
			rob = s.robust // aggregated before a restart: the state as it was
		}
		robust, err := robustBytes(rob)
		if err != nil {
			return time.Time{}, err
		}
		if err := s.store.OpenRound(aggstore.Round{Number: uint64(r + 1), OpenedAt: now, Config: s.conf, State: state, Sum: sum, Split: robust, Opt: s.optBytes(), Control: s.controlBytes()}, next); err != nil {
			return time.Time{}, fmt.Errorf("aggregator: %w", err)
		}
		s.optAdvance() // the optimiser's state moves with the checkpoint
		if s.nextControl != nil {
			s.control = s.nextControl // c moves with the checkpoint, in its transaction
		}
		s.storeR = uint64(r + 1)
		s.sum.advance() // S moves with the checkpoint, in its transaction
		if s.nextRobust != nil {
			s.robust = s.nextRobust // so does the robust step's state
		}
	} else if cr.Final && s.nextRobust != nil {
		s.robust = s.nextRobust // the final step's records, for the status of the running daemon
	}
	s.sum.dropClosing()
	s.nextRobust, s.nextControl = nil, nil
	s.opt.next = nil
	s.lastSt = state
	return now, nil
}

// aggregate computes the next global model from the closed round.
func (s *Server) aggregate(cr coordinator.CloseRound) ([]float64, aggregate.Report, error) {
	if s.secAgg.on() {
		// With --dp distributed, the noise is in the sum; the optimiser
		// steps on its uniform mean (server_opt.go).
		next, rep, err := s.secAggAggregate(cr)
		if err == nil {
			err = s.optStep(cr.Round, next)
		}
		return next, rep, err
	}
	if s.cfg.DP != nil {
		// The optimiser steps on the noisy mean: post-processing of the
		// release, inside the guarantee (server_opt.go).
		next, rep, err := s.privateAggregate(cr)
		if err == nil {
			err = s.optStep(cr.Round, next)
		}
		return next, rep, err
	}
	out := make([]float64, s.dim)
	if isSplit(s.fam) {
		m, err := s.splitStep(cr, out)
		if err != nil {
			return nil, aggregate.Report{}, err
		}
		return out, aggregate.Report{Metrics: m}, nil
	}
	s.samplesCapped = map[string][2]uint64{}
	rep, err := s.aggregateUpdates(cr, out)
	capped := s.samplesCapped
	s.samplesCapped = nil
	for id, c := range capped {
		s.capped.Inc(id)
		s.log.Warn("a site reported more samples than it first did: weighted by its first count", "client", id, "round", cr.Round,
			"reported", c[0], "first", c[1])
	}
	if err != nil {
		return nil, rep, err
	}
	if err := s.scaffoldStep(cr); err != nil {
		return nil, rep, err
	}
	// FedAvg's cap on a site's count relative to the others' median
	// (aggregate.FedAvg; simulate applies the same): counted and shown
	// per site, logged once per round and site.
	for _, c := range rep.Capped {
		s.log.Warn("a site's sample count is far above the other sites': weighted as the cap's multiple of their median",
			"client", c.Client, "round", cr.Round, "reported", c.Claimed, "counted", c.Counted, "aggregator", s.agg.Name())
		s.medianCapped.Inc(c.Client)
	}
	for i, v := range out {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, rep, fmt.Errorf("aggregator: round %d: %s produced a non-finite value at %d", cr.Round, s.agg.Name(), i)
		}
	}
	if err := s.optStep(cr.Round, out); err != nil {
		return nil, rep, err
	}
	return out, rep, nil
}

// errPruned: a closed round's updates are no longer in the round log.
var errPruned = errors.New("updates pruned")

// closedUpdates loads the stored updates of a closed round's contributors
// as the aggregator takes them: w_k, deltas added to x, the round's global
// model.
func (s *Server) closedUpdates(cr coordinator.CloseRound, x []float64) ([]aggregate.Update, error) {
	var ups []aggregate.Update
	first, err := s.firstCounts(cr)
	if err != nil {
		return nil, err
	}
	err = s.forClosed(cr, func(u aggstore.Update, m *wire.ClientUpdate, d []float64) error {
		vec, err := uplink.Receive(uplink.HeaderOf(m), d, x, nil)
		if err != nil {
			return fmt.Errorf("stored update of %q: %w", u.ClientID, err)
		}
		ups = append(ups, aggregate.Update{Client: u.ClientID, Params: vec, Samples: s.countOf(u, first),
			AnchorGrad: m.AnchorGrad, Loss: u.Loss})
		return nil
	})
	return ups, err
}

// firstCounts is each known site's first reported sample count.
func (s *Server) firstCounts(cr coordinator.CloseRound) (map[string]uint64, error) {
	cs, err := s.store.Clients()
	if err != nil {
		return nil, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	first := make(map[string]uint64, len(cs))
	for _, c := range cs {
		first[c.ID] = c.FirstSampleCount
	}
	return first, nil
}

// countOf is the sample count stored update u is weighted by. A site's
// weight rests on its own word: it may not claim more samples than it
// first reported (docs/aggregators.md, "What a site can do to the
// weights"); a capped count is noted in s.samplesCapped.
func (s *Server) countOf(u aggstore.Update, first map[string]uint64) int {
	n := u.SampleCount
	if f := first[u.ClientID]; f > 0 && n > f {
		if s.samplesCapped != nil {
			s.samplesCapped[u.ClientID] = [2]uint64{n, f}
		}
		n = f
	}
	return int(min(n, math.MaxInt32))
}

// forClosed calls fn with each stored update of a closed round's
// contributors, its message and its decoded vector, and checks that every
// contributor's update was there.
func (s *Server) forClosed(cr coordinator.CloseRound, fn func(u aggstore.Update, m *wire.ClientUpdate, d []float64) error) error {
	return s.forClosedInto(cr, nil, fn)
}

// forClosedInto is forClosed decoding every vector into *buf (grown as
// needed): fn must not keep d. A streamed close holds one decoded update
// at a time.
func (s *Server) forClosedInto(cr coordinator.CloseRound, buf *[]float64, fn func(u aggstore.Update, m *wire.ClientUpdate, d []float64) error) error {
	want := make(map[string]bool, len(cr.Contributors))
	for _, id := range cr.Contributors {
		want[id] = true
	}
	n := 0
	err := s.store.ForEachUpdate(uint64(cr.Round), func(u aggstore.Update) error {
		if !want[u.ClientID] {
			return nil // stored just before a crash, not counted by the coordinator
		}
		m, err := wire.DecodeUpdate(u.Msg, s.lim)
		if err != nil {
			return fmt.Errorf("stored update of %q: %w", u.ClientID, err)
		}
		var dst []float64
		if buf != nil {
			dst = *buf
		}
		d, err := s.loopQ.Decode(m.Vector.Payload, dst)
		if err != nil || len(d) != s.dim {
			return fmt.Errorf("stored update of %q: vector: %w", u.ClientID, err)
		}
		if buf != nil {
			*buf = d
		}
		n++
		return fn(u, m, d)
	})
	if err != nil {
		return fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	if n == 0 && len(cr.Contributors) > 0 {
		return fmt.Errorf("aggregator: round %d: %w", cr.Round, errPruned)
	}
	if n != len(cr.Contributors) {
		return fmt.Errorf("aggregator: round %d: %d contributors but %d stored updates", cr.Round, len(cr.Contributors), n)
	}
	return nil
}

// receiptCodes maps the coordinator's reasons to receipt codes.
var receiptCodes = map[coordinator.Reason]wire.ReceiptCode{
	coordinator.StaleRound:    wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND,
	coordinator.FutureRound:   wire.ReceiptCode_RECEIPT_CODE_FUTURE_ROUND,
	coordinator.NotSelected:   wire.ReceiptCode_RECEIPT_CODE_NOT_SELECTED,
	coordinator.UnknownClient: wire.ReceiptCode_RECEIPT_CODE_UNKNOWN_CLIENT,
	coordinator.RoundClosed:   wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND,
}

func (s *Server) rejectByCoordinator(u *inUpdate, d coordinator.Reject) {
	if u == nil {
		return
	}
	counted, err := s.countedCopy(u, d)
	if err != nil {
		s.log.Error("store read failed; the site retries", "client", d.Client, "round", d.Round, "err", err)
		s.receipt(u.msg, false, wire.ReceiptCode_RECEIPT_CODE_INTERNAL, "server could not read its round log; retry", time.Time{})
		return
	}
	if d.Reason == coordinator.Duplicate || counted {
		// Accepted earlier: an accepted receipt again, so that the client
		// clears its outbox.
		at := s.clock.Now()
		if st, err := s.store.GetUpdate(u.msg.Round, u.msg.ClientId); err == nil {
			at = st.StoredAt
		}
		d.Reason = coordinator.Duplicate
		s.hist.reject(d.Client, d.Reason.String())
		s.log.Info("duplicate update ignored", "client", d.Client, "round", d.Round)
		s.receipt(u.msg, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE, "duplicate: stored earlier", at)
		return
	}
	s.hist.reject(d.Client, d.Reason.String())
	s.log.Warn("update rejected", "client", d.Client, "round", d.Round, "reason", d.Reason.String(), "current_round", s.coord.Round())
	s.receipt(u.msg, false, receiptCodes[d.Reason], d.Reason.String(), time.Time{})
}

// receipt publishes a receipt for m.
func (s *Server) receipt(m *wire.ClientUpdate, accepted bool, code wire.ReceiptCode, reason string, storedAt time.Time) {
	r := &wire.Receipt{ClientId: m.ClientId, Round: m.Round, Accepted: accepted, Reason: reason, Code: code, UpdateSeq: m.Seq}
	if at := s.sendReceipt(r, storedAt, "receipt"); !at.IsZero() {
		s.receipts.put(receiptKey{m.ClientId, m.Round}, at)
	}
}

// sendReceipt publishes r on its site's receipts topic, what naming it in
// the log and the published-message counts. An accepted receipt says when
// the message was stored (storedAt; zero: now, for a copy stored earlier),
// which it returns (zero for a refusal or a receipt not sent).
func (s *Server) sendReceipt(r *wire.Receipt, storedAt time.Time, what string) time.Time {
	topic, err := s.topics.Receipt(r.ClientId)
	if err != nil {
		return time.Time{} // the id was validated on the way in
	}
	if r.Accepted {
		if storedAt.IsZero() {
			storedAt = s.clock.Now()
		}
		r.StoredAtUnixMs = max(storedAt.UnixMilli(), 1)
	} else {
		storedAt = time.Time{}
	}
	b, err := wire.Encode(r)
	if err != nil {
		s.log.Error("encoding a "+what, "client", r.ClientId, "err", err)
		return time.Time{}
	}
	s.hist.sent(uint64(len(b)))
	s.publish(topic, false, b, what)
	return storedAt
}

// norm2 is the Euclidean norm.
func norm2(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v * v
	}
	return math.Sqrt(s)
}
