package coordinator

import "time"

// Accept, then advance (the shell's path for messages it must store).
//
// Step applies an event at once. A message the coordinator accepts must be
// durable before the coordinator counts it, and storing it can fail (the
// disk, a value the downlink cannot carry, a FedSplit delta against a copy
// the aggregator does not hold), so the shell does not Step a site's
// message: it Proposes it. Propose answers a message it would accept with
// the accept alone (Accept, AcceptLate, AcceptStatistics or AcceptEval)
// and changes nothing; the shell stores the message and steps Stored, which
// applies the held event exactly as Step would have and returns its whole
// batch (the accept first, now to be receipted), or StoreFailed, which drops
// it: the state is what it was before the message, and the next event
// proceeds from there. State only moves forward; nothing is rolled back.
// This is etcd raft's order (a proposal is applied once it is durable).

// Stored: the message of the pending proposal is durable; apply it. Index
// is the message's entry in the round log's replay log (aggstore.Logged;
// 0: not logged, a copy stored earlier): the state's Applied moves to it,
// so a replay of the same entry after a restart is recognised as applied
// (coordinator_replay.go).
type Stored struct {
	At    time.Time
	Index uint64
}

// StoreFailed: the message of the pending proposal was not stored (the
// shell answers it itself); forget it.
type StoreFailed struct{ At time.Time }

func (e Stored) eventTime() time.Time      { return e.At }
func (e StoreFailed) eventTime() time.Time { return e.At }

// Propose is Step for a site's message (UpdateArrived, StatisticsArrived,
// EvalArrived, SecAggArrived): a message it would accept is held, not applied, and the
// accept alone is returned; the shell then steps Stored or StoreFailed
// before any other event. Every other event, and a message it rejects, is
// stepped at once (Step).
func (c *Coordinator) Propose(ev Event) []Decision {
	d := c.judge(ev)
	if isAccept(d) {
		c.proposal = ev
		return []Decision{d}
	}
	return c.Step(ev)
}

// judge is the answer Step would give a site's message first, without
// changing anything (nil: not a site's message, or one Step answers in a
// phase where nothing is accepted).
func (c *Coordinator) judge(ev Event) Decision {
	switch e := ev.(type) {
	case UpdateArrived:
		if c.phase != PhaseFinished && c.phase != PhaseFinishing {
			return c.judgeUpdate(e)
		}
	case StatisticsArrived:
		if c.phase == PhaseStatistics || c.phase == PhaseFitting {
			return c.judgeStatistics(e)
		}
	case EvalArrived:
		return c.judgeEval(e)
	case SecAggArrived:
		if c.phase != PhaseFinished && c.phase != PhaseFinishing {
			return c.judgeSecAgg(e)
		}
	}
	return nil
}

// isAccept says whether d accepts a site's message (to be stored).
func isAccept(d Decision) bool {
	switch d.(type) {
	case Accept, AcceptLate, AcceptStatistics, AcceptEval, AcceptSecAgg:
		return true
	}
	return false
}

// Pending reports whether a proposal awaits Stored or StoreFailed.
func (c *Coordinator) Pending() bool { return c.proposal != nil }

// settle handles Stored and StoreFailed; ok is false for other events.
func (c *Coordinator) settle(ev Event) (out []Decision, ok bool) {
	switch e := ev.(type) {
	case Stored:
		p := c.proposal
		c.proposal = nil
		if p == nil {
			c.counters.Ignored++
			return nil, true
		}
		if e.Index > c.applied {
			c.applied = e.Index
		}
		return c.Step(p), true
	case StoreFailed:
		if c.proposal == nil {
			c.counters.Ignored++
		}
		c.proposal = nil
		return nil, true
	}
	return nil, false
}
