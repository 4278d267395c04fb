package coordinator

import "slices"

// Log replay (raft's: a snapshot plus the log entries after it).
//
// The shell writes the coordinator's whole state (MarshalState) only after a
// batch that changed it in a way no stored message can reproduce: a round
// opened, closed, extended or re-selected, a status applied, a timer, a
// phase change, a rejection counted. A batch that is a lone accept (the
// Accept, AcceptLate, AcceptStatistics or AcceptEval of a message stored
// with a replay log entry, and nothing else: Replayable) writes nothing
// more than the message itself: its transaction also appends the message to
// the round log's replay log (storage: PutUpdate, PutStatistics, PutEval
// return its index), and every state write clears that log. On restart the
// shell restores the stored state and hands every logged message to Replay,
// in log order, as the event it proposed (its stored time as At), before it
// carries out Resume.
//
// The invariant: the stored state, plus the logged messages replayed in
// order, is exactly the state the coordinator had when it last applied a
// stored message (the state before the crash, or that state plus the one
// message whose Stored the crash cut off). It holds because
//   - Step is deterministic, and Replay applies a message exactly as
//     Stored applies a proposal (the same judgement, the same Step, the same
//     event time);
//   - between the stored state and the crash only lone accepts went
//     unwritten, and each is in the log in the order it was applied (the
//     loop steps Stored one message at a time, with the index the message
//     gets in the log; under group commit before the group's transaction,
//     but nothing visible depends on a message until it is written, so a
//     crash before the write leaves the state before the group);
//   - the state is written before anything visible outside (persist before
//     send), so nothing the sites saw depends on an unwritten state: a lone
//     accept's only visible effect is its receipt, sent after the message
//     is durable, and after a crash a re-sent copy is answered DUPLICATE.
//
// An entry already reflected in the state (index <= State.Applied; a state
// write clears the log in its own transaction, so this only guards against
// a state written without clearing it) is a silent no-op: no decision, no
// counter. A logged message the restored coordinator would not accept (only
// when the configuration changed between runs in a way that matters, e.g.
// --eval-every) is not applied and not counted as a rejection: Replay
// returns the rejection for the shell's log line. A replay's other decisions
// (the crash cut off the batch of a message that closed its round, say) are
// not carried out: the state they leave is written and Resume carries it
// out, as after any restart. FedSplit's late updates (AcceptLate) replay
// like any other accept (the client's invitations, its last round and the
// round's late count move again); the z_j a message set is stored with it
// in the same transaction and never re-derived, so replay touches no z.
// Replay has no effect outside the coordinator; the shell's only outside
// work for it is idempotent (a latest bundle rewritten by EvalComplete).

// Replay applies a message the round log stored, with replay log entry
// index, after the state the coordinator was restored from, and returns the
// decisions that causes (not to be carried out: see Resume). It is for the
// shell's restart only; a pending proposal is dropped.
func (c *Coordinator) Replay(ev Event, index uint64) []Decision {
	c.proposal = nil
	if index <= c.applied {
		return nil // reflected in the state already
	}
	d := c.judge(ev)
	if !isAccept(d) {
		c.applied = index
		if d == nil {
			return nil
		}
		return []Decision{d}
	}
	c.proposal = ev
	out, _ := c.settle(Stored{At: ev.eventTime(), Index: index})
	return out
}

// Replayable says whether ds, the batch Stored returned, is a lone accept:
// a batch whose change to the state a replay of its message reproduces
// with no visible decision, so the shell need not write the state after
// it (when the message has a replay log entry).
func Replayable(ds []Decision) bool { return len(ds) == 1 && isAccept(ds[0]) }

// HasAccept says whether a batch holds an accept (a replay's batch is its
// rejection alone otherwise; the accept is first but for the statistics
// phase's announcement, which a first event carries before it).
func HasAccept(ds []Decision) bool { return slices.ContainsFunc(ds, isAccept) }

// Applied is the replay log index of the last stored message applied.
func (c *Coordinator) Applied() uint64 { return c.applied }
