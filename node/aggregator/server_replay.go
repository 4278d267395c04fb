package aggregator

import (
	"encoding/json"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"math"
	"time"

	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// The shell's side of the log replay (coordinator_replay.go): on restart,
// the messages the replay log names are decoded as they were stored and
// handed to the restored coordinator in log order, before anything is
// announced. A new kind of stored site message becomes replayable with a
// case in replayEvent giving the event it was proposed as (through the same
// function the live path uses, like updateEvent), once its store method
// appends a replay log entry (node/aggstore/log.go).

// replayEvent is the coordinator's event for a logged message: the event
// it was proposed as, at its stored time.
func replayEvent(e aggstore.Logged, lim wire.Limits) (coordinator.Event, error) {
	switch e.Kind {
	case aggstore.LogUpdate:
		m, err := wire.DecodeUpdate(e.Msg, lim)
		if err != nil {
			return nil, err
		}
		return updateEvent(m, e.StoredAt), nil
	case aggstore.LogStatistics:
		m, err := wire.DecodeStatistics(e.Msg, lim)
		if err != nil {
			return nil, err
		}
		return statisticsEvent(m, e.StoredAt), nil
	case aggstore.LogEval:
		m, err := wire.DecodeEvaluation(e.Msg, lim)
		if err != nil {
			return nil, err
		}
		return evalEvent(m, e.StoredAt), nil
	case aggstore.LogSecAgg:
		m, err := wire.DecodeSecAgg(e.Msg, lim)
		if err != nil {
			return nil, err
		}
		return secAggEvent(m, e.StoredAt), nil
	}
	return nil, fmt.Errorf("%w: log entry %d of kind %v", storage.ErrCorrupt, e.Index, e.Kind)
}

// replayResult counts what a replay did.
type replayResult struct {
	replayed, reflected, refused int
	evalDone                     []int // EvalComplete rounds the replay reached
	moved                        bool  // a replayed batch decided more than its accept
}

// replay hands every message of the store's replay log to c.
func replay(c *coordinator.Coordinator, store *aggstore.AggStore, lim wire.Limits, log func(msg string, args ...any)) (replayResult, error) {
	var res replayResult
	last, entries, err := store.Log()
	if err != nil {
		return res, err
	}
	if c.Applied() > last {
		return res, fmt.Errorf("%w: the stored state reflects replay log entry %d, but only %d were ever appended", storage.ErrCorrupt, c.Applied(), last)
	}
	for _, e := range entries {
		ev, err := replayEvent(e, lim)
		if err != nil {
			return res, fmt.Errorf("%w: the stored %s (%d, %q) named by replay log entry %d: %w", storage.ErrCorrupt, e.Kind, e.Round, e.ClientID, e.Index, err)
		}
		ds := c.Replay(ev, e.Index)
		switch {
		case len(ds) == 0:
			res.reflected++
		case !coordinator.HasAccept(ds):
			res.refused++
			log("a stored message is not accepted on replay (the configuration changed?): not counted", "kind", e.Kind.String(),
				"client", e.ClientID, "round", e.Round, "answer", fmt.Sprintf("%+v", ds[0]))
		default:
			res.replayed++
			res.moved = res.moved || len(ds) > 1
			for _, d := range coordinator.OfType[coordinator.EvalComplete](ds) {
				res.evalDone = append(res.evalDone, d.Round)
			}
		}
	}
	return res, nil
}

// replayLog replays the round log's stored messages into the restored
// coordinator (restore, before anything is read from its state).
func (s *Server) replayLog() (replayResult, error) {
	res, err := replay(s.coord, s.store, s.lim, func(msg string, args ...any) { s.log.Warn(msg, args...) })
	if err != nil {
		return res, fmt.Errorf("aggregator: %s: %w", s.cfg.StatePath, err)
	}
	if res.replayed+res.reflected+res.refused > 0 {
		s.log.Info("stored messages replayed into the restored round state", "replayed", res.replayed,
			"already_applied", res.reflected, "not_accepted", res.refused, "changed_the_round", res.moved)
	}
	return res, nil
}

// StoredState is the coordinator's state a restart of the aggregator on
// store resumes from: the stored state with the stored messages of the
// replay log applied, as the coordinator accepted them. It only reads. The
// replay runs in a coordinator that closes no round and draws no selection
// (the file does not hold the run's K, quorum or deadlines, and a lone
// accept needs none): a message whose batch the crash cut off after it
// would have closed its round shows as received, and the round closes when
// the aggregator starts.
func StoredState(store *aggstore.AggStore) (coordinator.State, error) {
	var st coordinator.State
	cur, err := store.CurrentRound()
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(cur.State, &st); err != nil {
		return st, fmt.Errorf("aggregator: state of round %d: %w", cur.Number, err)
	}
	var sc storedConfig
	if first, err := store.Round(1); err == nil {
		_ = json.Unmarshal(first.Config, &sc) // unknown: no late updates, no schema, no DP
	}
	const never = 1 << 30 // a quorum no round reaches
	cfg := coordinator.Config{K: never, Quorum: never, RoundTimeout: time.Hour, StoreLate: isSplit(sc.Family) && sc.DP == nil && sc.SecAgg == nil, StatsSites: never, DP: sc.DP}
	if sa := sc.SecAgg; sa != nil {
		// The secure aggregation's state and its messages' replay need
		// it; its threshold bounds K (t > K/2): K = quorum = t, and with
		// no Tick replayed, a phase or round still closes only when every
		// site it waits for is in, as it would live.
		cfg.K, cfg.Quorum = sa.Threshold, sa.Threshold
		cfg.SecAgg = &coordinator.SecAggConfig{Threshold: sa.Threshold, Timeout: max(sa.Timeout, time.Second)}
	}
	if sc.SchemaDigest != "" {
		// Every eval round a logged report names was asked for.
		cfg.Statistics, cfg.Evaluate, cfg.EvalEvery = true, true, 1
		// A --dp run with a schema has one that declares its
		// preprocessing (ServerConfig.Validate refuses any other).
		cfg.DeclaredTransform = sc.DP != nil
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		return st, err
	}
	if err := c.Restore(st); err != nil {
		return st, err
	}
	// The run's own limits are not in the file; the stored messages passed
	// them once.
	lim := wire.DefaultLimits
	lim.MaxMessageBytes = math.MaxInt32
	if _, err := replay(c, store, lim, func(string, ...any) {}); err != nil {
		return st, err
	}
	return c.Snapshot(), nil
}
