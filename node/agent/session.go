package agent

import (
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// This file is the agent's session rules as a deterministic state machine
// (ARCHITECTURE.md, "Core and shell"): which announcement is solved next
// and when a solve is pre-empted, what a new run resets, what a receipt
// does to the outbox, when an unreceipted message is sent again and after
// which backoff, what the site's status says. session.step takes an event
// and returns the actions the shell (agent.go) carries out. It does no I/O
// but reads of the edge state (sessionStore, read-only), starts no
// goroutine and reads no clock: a timer is an action (actArm, a duration)
// whose firing comes back as an event naming the generation it was armed
// with, so a timer that fires after the state moved on is recognised and
// ignored. What a receipt removes from the outbox is an action too
// (actAck): the shell commits it and steps the outcome back in (acked)
// before it carries out the actions that follow it.

// sessionStore is what the session rules read of the edge state
// (*edgestore.EdgeStore); they never write it.
type sessionStore interface {
	Outbox() ([]edgestore.OutboxEntry, error)
	Pending(round uint64) (edgestore.SumPending, bool, error)
	Contribution() (round uint64, c []float64, err error)
}

// ackStore is what the shell commits of an actAck (*edgestore.EdgeStore).
type ackStore interface {
	Ack(round uint64) (bool, error)
	AckRejected(round uint64) (bool, error)
	AckIf(round uint64, match func(msg []byte) bool) (bool, error)
	AckSum(round, prev uint64, c []float64) (bool, error)
}

// pendingKey names a message re-sent until the aggregator receipts it: an
// update (subject UPDATE, its round), the statistics (round 0) or an
// evaluation report (its eval round). It also names that message's timer.
type pendingKey struct {
	subject wire.ReceiptSubject
	round   uint64
}

func updateKey(round uint64) pendingKey {
	return pendingKey{subject: wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE, round: round}
}

// session is the state the session rules decide on. The shell calls step
// under one lock.
type session struct {
	store      sessionStore
	federation string
	// backoffMin and backoffMax bound the re-send backoff (Config's
	// ReconnectMin and ReconnectMax).
	backoffMin, backoffMax time.Duration

	closing bool
	// pending is the newest announcement waiting for the solver; solving
	// the one being handled (nil when idle); deferred a sum-mode round
	// handed back (ActionWaiting) until an update receipt comes; latest the
	// newest announcement seen (what an invitation arriving after it
	// applies to).
	pending, solving, deferred, latest *wire.RoundAnnouncement
	// invite is the newest private invitation received (wire receipt
	// subject INVITATION; docs/privacy.md "Sampling rate"): an announcement
	// with private_selection is solved as selecting this site only if it
	// names the same round and run. Not durable: the aggregator invites
	// again whenever this site comes online while it is selected.
	invite *invitation
	// shareList is the newest secure-aggregation ShareList waiting for
	// the solver (node/agent/secagg.go).
	shareList *wire.SecAggMessage
	// finished: the run finishedRun has ended and its end was handled;
	// announcements of that run are ignored until another run's arrives.
	finished    bool
	finishedRun string
	// run is the newest aggregator run seen and runSince the creation time
	// of its oldest announcement seen (Unix ms, 0: unknown): the run order
	// (leftRun). Loaded from the edge state at start (storage RunOrder);
	// the round handler records it there as it starts a run.
	run      string
	runSince int64
	// siteErr is why this site cannot take part (nil: it can), carried by
	// its statuses.
	siteErr *sitedata.SiteError
	// retries are the updates an INTERNAL receipt asked to re-send, by
	// round; uplinks the statistics and evaluation reports sent and not
	// yet receipted; receipted those receipted, with their run id.
	retries   map[uint64]*retryState
	uplinks   map[pendingKey]*pendingUplink
	receipted map[pendingKey]string
	// modelOut is the re-write of model_out after a failed write (a site
	// error wrapping ErrModelOut), nil when none is due; its timer is
	// modelOutKey.
	modelOut *retryState
	// gen numbers the timers armed.
	gen uint64
}

// modelOutKey names the model_out re-write's timer: a subject no receipt
// has, so that it is no message's key.
var modelOutKey = pendingKey{subject: -1}

// invitation is an invitation's round and run.
type invitation struct {
	run   string
	round uint64
}

// invites says whether inv invites this site to ann's round.
func (inv *invitation) invites(ann *wire.RoundAnnouncement) bool {
	return inv != nil && ann.GetPrivateSelection() && inv.round == ann.Round && inv.run == ann.RunId
}

// leftRun reports whether ann is of an aggregator run this site has left:
// another run than run, announced before since (the creation time of the
// oldest announcement seen of run). Runs are ordered by their
// announcements' creation times: an aggregator starts a new run after the
// previous run's announcements were made, so an older one can only be a
// stale copy (a broker restarted from an old persistence file, a retained
// message re-delivered) and going back to it would abandon this run's
// work. An unknown time (0, an older aggregator) orders nothing. The
// session and the round handler both decide by it.
func leftRun(run string, since int64, ann *wire.RoundAnnouncement) bool {
	at := ann.GetCreatedAtUnixMs()
	return ann.GetRunId() != "" && run != "" && ann.GetRunId() != run && since > 0 && at > 0 && at < since
}

// seeRun moves the run order to ann's run (not one left: see leftRun).
func (s *session) seeRun(ann *wire.RoundAnnouncement) {
	at := max(ann.GetCreatedAtUnixMs(), 0)
	switch {
	case ann.RunId == "":
	case ann.RunId != s.run:
		s.run, s.runSince = ann.RunId, at
	case at > 0 && (s.runSince == 0 || at < s.runSince):
		s.runSince = at
	}
}

// retryState is the re-send timer of an unreceipted update: after an
// INTERNAL receipt (attempts of them so far), and from its first publish
// until its receipt (untilReceipt, sends re-sends so far; armUpdate).
type retryState struct {
	attempts     int
	sends        int
	untilReceipt bool
	gen          uint64 // of its armed timer, 0 for none
}

// pendingUplink is a statistics or evaluation message awaiting its receipt.
type pendingUplink struct {
	run      string
	msg      []byte
	attempts int
	gen      uint64
}

// Events of the session.
type (
	sessionEvent interface{ sessionEvent() }

	// announced: a valid round announcement arrived.
	announced struct{ ann *wire.RoundAnnouncement }
	// idle: the solver is free and asks for the next announcement.
	idle struct{}
	// solveDone: RoundHandler.Handle returned for ann; shutdown says the
	// agent's run was canceled meanwhile.
	solveDone struct {
		ann      *wire.RoundAnnouncement
		res      Result
		err      error
		shutdown bool
	}
	// receiptArrived: a receipt for this site.
	receiptArrived struct{ r *wire.Receipt }
	// timerFired: the timer armed for key with generation gen fired.
	timerFired struct {
		key pendingKey
		gen uint64
	}
	// connected: a connection is up (subscribed, status published).
	connected struct{}
	// modelOutDone: the shell wrote the stored final bundle of run to
	// model_out again (actWriteModelOut); err is why it still could not.
	modelOutDone struct {
		run string
		err error
	}
	// emitted: the round handler produced a statistics or evaluation
	// message.
	emitted struct{ out Outgoing }
	// finalRestored: at start, the state file holds the final bundle of
	// run (and writing it to model_out failed with siteErr, if not nil).
	finalRestored struct {
		run     string
		siteErr *sitedata.SiteError
	}
	// closed: the agent is shutting down.
	closed struct{}
	// shareListArrived: the aggregator's secagg ShareList for this site.
	shareListArrived struct{ msg *wire.SecAggMessage }
	// shareListDone: RoundHandler.HandleShareList returned for msg.
	shareListDone struct {
		msg *wire.SecAggMessage
		res Result
		err error
	}
	// acked: the shell committed act (an actAck); had says whether the
	// outbox entry was there, err why the commit failed.
	acked struct {
		act action
		had bool
		err error
	}
)

func (announced) sessionEvent()      {}
func (idle) sessionEvent()           {}
func (solveDone) sessionEvent()      {}
func (receiptArrived) sessionEvent() {}
func (timerFired) sessionEvent()     {}
func (connected) sessionEvent()      {}
func (modelOutDone) sessionEvent()   {}
func (emitted) sessionEvent()        {}
func (finalRestored) sessionEvent()  {}
func (closed) sessionEvent()         {}

func (shareListArrived) sessionEvent() {}
func (shareListDone) sessionEvent()    {}
func (acked) sessionEvent()            {}

// actionKind says what an action asks of the shell.
type actionKind int

const (
	actStartSolve       actionKind = iota + 1 // hand ann to RoundHandler.HandleInvited (invited)
	actPreempt                                // cancel the running solve of ann with cause err
	actWake                                   // wake the solver: an announcement waits
	actIgnored                                // ann is of the finished run: dropped
	actRoundDone                              // a handled announcement: log and count (class, ann, res, err)
	actPublishUpdate                          // publish msg as the update of key.round (why)
	actPublishUplink                          // publish msg, the statistics or evaluation of key (why, attempt)
	actArm                                    // (re)arm key's timer: fire timerFired{key, gen} after d
	actStop                                   // stop key's timer
	actReceipt                                // a receipt was handled (receipt, outcome, had, after)
	actStoreFailed                            // the edge store failed (what, err)
	actSiteError                              // the site error is se (same: unchanged)
	actSiteErrorCleared                       // the site error se is over
	actFinished                               // the run of ann ended (res)
	actStartShareList                         // hand msg (a secagg ShareList) to RoundHandler.HandleShareList
	actShareListDone                          // a handled ShareList: log and count (res, err)
	actInvited                                // an invitation arrived (receipt; had: it was new)
	actLeftRun                                // ann is of a run this site has left: dropped (leftRun)
	actWriteModelOut                          // write the stored final bundle to model_out again (attempt); report modelOutDone
	actAck                                    // commit what receipt removes from the outbox (ack); step acked back in
)

// ackKind is what an actAck commits (ackStore).
type ackKind int

const (
	ackUpdate   ackKind = iota + 1 // an accepted update: its outbox entry leaves (Ack)
	ackSum                         // an accepted sum-mode update: its entry leaves and the record advances to vec (AckSum, from prev)
	ackRejected                    // a rejected update: its entry leaves, the aggregator's copy of z is forgotten (AckRejected)
	ackSecAgg                      // a secagg receipt: the entry leaves if it is the message answered, unless keep or sum (AckIf)
)

// why says why an update or uplink is published.
type why int

const (
	sendFirst     why = iota + 1 // solved, or the handler emitted it
	sendAgain                    // its round was announced again (ActionResend)
	sendReconnect                // a connection came up
	sendRetry                    // its re-send timer fired
)

// roundClass classifies a handled announcement for the shell's log and
// counters.
type roundClass int

const (
	roundOK          roundClass = iota + 1 // no error: res.Action says what was done
	roundBad                               // ErrBadAnnouncement
	roundDamaged                           // the state file is damaged: Run stops
	roundShutdown                          // abandoned at shutdown
	roundNewRun                            // abandoned for a new run
	roundRunFinished                       // abandoned: the run finished
	roundSiteError                         // a site error
	roundFailed                            // any other local failure
)

// receiptOutcome is what a receipt did.
type receiptOutcome int

const (
	receiptAccepted     receiptOutcome = iota + 1 // stored or duplicate: dropped from the outbox
	receiptRetry                                  // INTERNAL: kept, re-sent after a backoff
	receiptRejected                               // any other rejection: dropped
	receiptRejectedKept                           // a secagg message rejected in sum mode: the contribution stays pending
)

// action is one thing the shell must do, in the order step returns them.
type action struct {
	kind    actionKind
	ann     *wire.RoundAnnouncement
	solving uint64 // actPreempt: the round being solved
	res     Result
	class   roundClass
	key     pendingKey
	gen     uint64
	after   time.Duration
	msg     []byte
	why     why
	attempt int
	receipt *wire.Receipt
	outcome receiptOutcome
	had     bool
	what    string
	err     error
	se      *sitedata.SiteError
	same    bool
	share   *wire.SecAggMessage
	invited bool
	// actAck: what is committed; prev and vec the sum-mode record's
	// advance (ackSum); keep and sum what leaves a secagg entry in place.
	ack  ackKind
	prev uint64
	// receipted (actStartSolve) is a copy of the statistics and
	// evaluation reports receipted when the solve starts: what the round
	// handler reads to skip making one again (RoundHandler.Receipted).
	receipted receiptedSet
	vec       []float64
	keep, sum bool
}

// step applies ev and returns the actions it decides.
func (s *session) step(ev sessionEvent) []action {
	switch ev := ev.(type) {
	case announced:
		return s.announced(ev.ann)
	case idle:
		return s.take()
	case solveDone:
		return s.solveDone(ev)
	case receiptArrived:
		switch ev.r.GetSubject() {
		case wire.ReceiptSubject_RECEIPT_SUBJECT_INVITATION:
			return s.invited(ev.r)
		case wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE:
			return s.updateReceipt(ev.r)
		case wire.ReceiptSubject_RECEIPT_SUBJECT_SECAGG:
			return s.secAggReceipt(ev.r)
		}
		return s.uplinkReceipt(ev.r)
	case shareListArrived:
		if s.closing {
			return nil
		}
		s.shareList = ev.msg
		return []action{{kind: actWake}}
	case acked:
		return s.acked(ev)
	case shareListDone:
		acts := []action{{kind: actShareListDone, share: ev.msg, res: ev.res, err: ev.err}}
		if ev.err == nil && (ev.res.Action == ActionSecAgg || ev.res.Action == ActionResend) {
			acts = append(acts, action{kind: actPublishUpdate, key: updateKey(ev.msg.Round), msg: ev.res.Msg, why: sendFirst})
		}
		return acts
	case timerFired:
		return s.timerFired(ev.key, ev.gen)
	case connected:
		return s.connected()
	case emitted:
		return s.emitted(ev.out)
	case finalRestored:
		s.finished, s.finishedRun = true, ev.run
		if ev.siteErr != nil {
			s.siteErr = ev.siteErr
		}
		return s.retryModelOut(ev.siteErr)
	case modelOutDone:
		return s.modelOutDone(ev.run, ev.err)
	case closed:
		s.closing = true
		s.shareList = nil
		var acts []action
		rounds := make([]uint64, 0, len(s.retries))
		for r := range s.retries {
			rounds = append(rounds, r)
		}
		// sort.Slice, not slices.Sort: the only []uint64 sort in
		// edge-agent, whose generic instantiation costs 3.9 kB of text.
		sort.Slice(rounds, func(i, j int) bool { return rounds[i] < rounds[j] })
		for _, r := range rounds {
			acts = append(acts, action{kind: actStop, key: updateKey(r)})
			delete(s.retries, r)
		}
		if s.modelOut != nil {
			s.modelOut = nil
			acts = append(acts, action{kind: actStop, key: modelOutKey})
		}
		return s.dropUplinks(acts, func(string) bool { return true })
	}
	return nil
}

// announced keeps ann for the solver (only the newest waits) and pre-empts
// a solve it supersedes.
func (s *session) announced(ann *wire.RoundAnnouncement) []action {
	if s.finished && ann.RunId == s.finishedRun && ann.Federation == s.federation {
		// The run is over and its end handled: stay quiet until another
		// run is announced.
		return []action{{kind: actIgnored, ann: ann}}
	}
	if leftRun(s.run, s.runSince, ann) {
		return []action{{kind: actLeftRun, ann: ann}}
	}
	s.seeRun(ann)
	// An announcement of another aggregator run supersedes whatever waits
	// or runs, whatever its round number (the new run counts from 1).
	if p := s.pending; p == nil || ann.Round >= p.Round || (ann.RunId != "" && ann.RunId != p.RunId) {
		s.pending = ann
		if d := s.deferred; d != nil && (ann.Round >= d.Round || ann.RunId != d.RunId) {
			s.deferred = nil // superseded: the new one is handled instead
		}
	}
	if l := s.latest; l == nil || ann.Round >= l.Round || (ann.RunId != "" && ann.RunId != l.RunId) {
		s.latest = ann
	}
	var acts []action
	if cur := s.solving; cur != nil && ann.Federation == s.federation {
		var cause error
		switch {
		case ann.RunId != "" && ann.RunId != cur.RunId:
			cause = ErrNewRun
		case ann.GetPhase() == wire.Phase_PHASE_FINISHED:
			cause = ErrFinished
		case ann.Round > cur.Round:
			cause = ErrPreempted
		}
		if cause != nil {
			acts = append(acts, action{kind: actPreempt, ann: ann, solving: cur.Round, err: cause})
		}
	}
	return append(acts, action{kind: actWake})
}

// take hands the waiting announcement to the solver. An announcement with
// a run id drops the messages of other runs and ends the "finished" quiet
// of another run.
func (s *session) take() []action {
	ann := s.pending
	if ann == nil {
		if sl := s.shareList; sl != nil {
			s.shareList = nil
			return []action{{kind: actStartShareList, share: sl}}
		}
		return nil
	}
	s.pending, s.solving = nil, ann
	var acts []action
	if ann.RunId != "" {
		acts = s.dropUplinks(acts, func(run string) bool { return run != ann.RunId })
		if s.finished && s.finishedRun != ann.RunId {
			s.finished, s.finishedRun = false, ""
		}
	}
	return append(acts, action{kind: actStartSolve, ann: ann, invited: s.invite.invites(ann), receipted: maps.Clone(s.receipted)})
}

// invited keeps the invitation r (the newest one: of another run, or of a
// later round) and, when the newest announcement is the round it invites
// to, hands that announcement to the solver again: it was handled (or is
// being handled) as not selecting this site. A repeated invitation does
// the same: the solver finds the round applied and re-sends its update if
// it is not receipted yet, as for a repeated announcement.
func (s *session) invited(r *wire.Receipt) []action {
	inv := &invitation{run: r.RunId, round: r.Round}
	fresh := s.invite == nil || *s.invite != *inv
	if s.invite == nil || inv.run != s.invite.run || inv.round >= s.invite.round {
		s.invite = inv
	}
	acts := []action{{kind: actInvited, receipt: r, had: fresh}}
	if l := s.latest; s.invite.invites(l) && !s.closing {
		s.pending = l
		acts = append(acts, action{kind: actWake})
	}
	return acts
}

// solveDone classifies what Handle returned and decides what follows:
// publish the update, the site error shown or cleared, the run's end.
func (s *session) solveDone(ev solveDone) []action {
	s.solving = nil
	ann, res, err := ev.ann, ev.res, ev.err
	done := action{kind: actRoundDone, ann: ann, res: res, err: err, class: roundOK}
	var se *sitedata.SiteError
	switch {
	case errors.Is(err, ErrBadAnnouncement):
		done.class = roundBad
	case errors.Is(err, storage.ErrCorrupt):
		done.class = roundDamaged
	case err != nil && ev.shutdown:
		done.class = roundShutdown
	case errors.Is(err, ErrNewRun):
		done.class = roundNewRun
	case errors.Is(err, ErrFinished):
		done.class = roundRunFinished
	case errors.As(err, &se):
		done.class = roundSiteError
	case err != nil:
		done.class = roundFailed
	}
	acts := []action{done}
	switch {
	case done.class == roundSiteError:
		same := s.siteErr != nil && s.siteErr.Reason == se.Reason && s.siteErr.Public() == se.Public()
		s.siteErr = se
		acts = append(acts, action{kind: actSiteError, ann: ann, se: se, same: same})
		acts = append(acts, s.retryModelOut(se)...)
	case err != nil:
	case res.Action == ActionSolved:
		acts = append(acts, action{kind: actPublishUpdate, key: updateKey(ann.Round), msg: res.Msg, why: sendFirst})
		acts = append(acts, s.armUpdate(ann.Round, true)...)
	case res.Action == ActionResend:
		acts = append(acts, action{kind: actPublishUpdate, key: updateKey(ann.Round), msg: res.Msg, why: sendAgain})
		acts = append(acts, s.armUpdate(ann.Round, true)...)
	case res.Action == ActionSecAgg:
		acts = append(acts, action{kind: actPublishUpdate, key: updateKey(ann.Round), msg: res.Msg, why: sendFirst})
	case res.Action == ActionWaiting:
		if res.Msg != nil {
			// Secure aggregation: the earlier round's last message again,
			// which the aggregator answers with that round's UPDATE
			// receipt once the round has closed.
			acts = append(acts, action{kind: actPublishUpdate, key: updateKey(res.Waiting), msg: res.Msg, why: sendAgain})
		}
		// The receipt may have come while the handler looked at the
		// outbox: then the round goes back to the solver now.
		if s.olderUnreceipted(ann.Round) {
			s.deferred = ann
		} else if s.pending == nil {
			s.pending = ann
			acts = append(acts, action{kind: actWake})
		}
	case res.Action == ActionFinished:
		s.finished, s.finishedRun = true, ann.RunId
		acts = s.dropUplinks(acts, func(string) bool { return true })
		acts = append(acts, action{kind: actFinished, ann: ann, res: res})
	}
	// Storing the final bundle proves the disk and the aggregator's
	// messages, not this site's data: a data error stays on show.
	if old := s.siteErr; err == nil && res.Healthy && old != nil && !(res.Action == ActionFinished && dataError(old.Reason)) {
		s.siteErr = nil
		acts = append(acts, action{kind: actSiteErrorCleared, se: old})
	}
	return acts
}

// updateReceipt: accepted drops the outbox entry (a sum-mode update's
// advances the site's record); INTERNAL keeps it and re-sends it after a
// backoff; any other rejection drops it and forgets the aggregator's
// FedSplit copy of z, which assumed it would be applied. A sum-mode round
// deferred for the receipt goes back to the solver once the entry is gone.
func (s *session) updateReceipt(r *wire.Receipt) []action {
	acts := s.receiptOutcome(r)
	if d := s.deferred; d != nil && (r.Accepted || r.Code != wire.ReceiptCode_RECEIPT_CODE_INTERNAL) {
		s.deferred = nil
		if s.pending == nil {
			s.pending = d
			acts = append(acts, action{kind: actWake})
		}
	}
	return acts
}

// olderUnreceipted reports whether the outbox holds an update of a round
// before round (a store error counts as yes: the next receipt retries).
func (s *session) olderUnreceipted(round uint64) bool {
	out, err := s.store.Outbox()
	if err != nil {
		return true
	}
	return slices.ContainsFunc(out, func(e edgestore.OutboxEntry) bool { return e.Round < round })
}

func (s *session) receiptOutcome(r *wire.Receipt) []action {
	var acts []action
	switch {
	case r.Accepted:
		acts = s.cancelRetry(r.Round)
		ack, err := planAck(s.store, r)
		if err != nil {
			return append(acts, action{kind: actStoreFailed, what: "ack receipt", err: err})
		}
		return append(acts, ack)
	case r.Code == wire.ReceiptCode_RECEIPT_CODE_INTERNAL:
		var d time.Duration
		if arm := s.armUpdate(r.Round, false); len(arm) > 0 {
			d = arm[0].after
			acts = append(acts, arm...)
		}
		return append(acts, action{kind: actReceipt, receipt: r, outcome: receiptRetry, after: d})
	default:
		acts = s.cancelRetry(r.Round)
		return append(acts, action{kind: actAck, ack: ackRejected, receipt: r})
	}
}

// planAck is the acknowledgement of r, an accepted update receipt: its
// outbox entry leaves; a sum-mode update's also advances the site's record
// by what it added to the aggregator's sum (uplink.Advance), in the same
// transaction (edgestore.EdgeStore.AckSum).
func planAck(v sessionStore, r *wire.Receipt) (action, error) {
	act := action{kind: actAck, ack: ackUpdate, receipt: r}
	p, ok, err := v.Pending(r.Round)
	if err != nil || !ok {
		return act, err
	}
	var rec *uplink.Record
	cr, c, err := v.Contribution()
	switch {
	case err == nil:
		rec = &uplink.Record{Round: cr, C: c}
	case !errors.Is(err, storage.ErrNotFound):
		return act, err
	}
	next, err := uplink.Advance(rec, r.Round, uplink.Pending{Join: p.Join, V: p.V})
	if err != nil {
		return act, fmt.Errorf("agent: the receipt of round %d: %w", r.Round, err)
	}
	act.ack, act.prev, act.vec = ackSum, cr, next.C
	return act, nil
}

// commitAck is the shell's commit of an actAck; it reports whether the
// outbox entry was there.
func commitAck(st ackStore, act action) (bool, error) {
	round := act.receipt.Round
	switch act.ack {
	case ackSum:
		return st.AckSum(round, act.prev, act.vec)
	case ackRejected:
		return st.AckRejected(round)
	case ackSecAgg:
		kind := act.receipt.SecaggKind
		return st.AckIf(round, func(msg []byte) bool { return !act.keep && !act.sum && secAggKindOf(msg) == kind })
	}
	return st.Ack(round)
}

// acked is the step of a committed acknowledgement: the receipt's outcome,
// or the store's failure.
func (s *session) acked(ev acked) []action {
	r := ev.act.receipt
	switch ev.act.ack {
	case ackRejected:
		if ev.err != nil {
			return []action{{kind: actStoreFailed, what: "ack rejected update", err: ev.err}}
		}
		return []action{{kind: actReceipt, receipt: r, outcome: receiptRejected}}
	case ackSecAgg:
		if ev.err != nil {
			return []action{{kind: actStoreFailed, what: "ack secagg receipt", err: ev.err}}
		}
		var acts []action
		if ev.had || ev.act.sum {
			acts = s.cancelRetry(r.Round)
		}
		outcome := receiptAccepted
		switch {
		case !r.Accepted && ev.act.sum:
			outcome = receiptRejectedKept
		case !r.Accepted:
			outcome = receiptRejected
		}
		return append(acts, action{kind: actReceipt, receipt: r, outcome: outcome, had: ev.had})
	}
	if ev.err != nil {
		return []action{{kind: actStoreFailed, what: "ack receipt", err: ev.err}}
	}
	return []action{{kind: actReceipt, receipt: r, outcome: receiptAccepted, had: ev.had}}
}

// secAggReceipt: a receipt of a secure-aggregation message removes the
// round's outbox entry only if the entry is the message it answers (the
// entry holds the session's latest message; a late receipt of an earlier
// one must not drop it); INTERNAL re-sends the entry after a backoff, as
// for an update.
func (s *session) secAggReceipt(r *wire.Receipt) []action {
	if r.Code == wire.ReceiptCode_RECEIPT_CODE_INTERNAL && !r.Accepted {
		return s.updateReceipt(r)
	}
	// A stored ShareKeys stays in the outbox until the ShareList it asks
	// for arrives (the masked input then replaces it): re-sent on every
	// connection, it is how a site that missed its ShareList gets it again
	// (the aggregator answers a duplicate with it). Any other accepted
	// message, and every rejected one, leaves.
	keep := r.Accepted && r.SecaggKind == wire.SecAggKindShareKeys
	// FedSplit's sum mode (docs/privacy.md, "FedSplit under secure
	// aggregation"): the entry carries what the site's input adds to its
	// record, and only the round's UPDATE receipt says whether the input
	// is in the round's sum. A secagg receipt, accepted or rejected (an
	// aborted session's message), leaves it: it is re-sent on the next
	// connection and with the next round's announcement, which the
	// aggregator answers with that UPDATE receipt once the round closed.
	_, sum, err := s.store.Pending(r.Round)
	if err != nil {
		return []action{{kind: actStoreFailed, what: "read the pending contribution", err: err}}
	}
	return []action{{kind: actAck, ack: ackSecAgg, receipt: r, keep: keep, sum: sum}}
}

// uplinkReceipt: accepted (stored or duplicate) ends a statistics or
// evaluation message's re-sending and remembers it receipted; INTERNAL
// keeps it (its backoff goes on); another rejection drops it.
func (s *session) uplinkReceipt(r *wire.Receipt) []action {
	k := pendingKey{subject: r.GetSubject(), round: r.Round}
	p := s.uplinks[k]
	var acts []action
	outcome := receiptRetry
	if r.Accepted || r.Code != wire.ReceiptCode_RECEIPT_CODE_INTERNAL {
		outcome = receiptRejected
		if r.Accepted {
			outcome = receiptAccepted
		}
		if p != nil {
			acts = append(acts, action{kind: actStop, key: k})
			delete(s.uplinks, k)
			if r.Accepted {
				if s.receipted == nil {
					s.receipted = map[pendingKey]string{}
				}
				s.receipted[k] = p.run
			}
		}
	}
	return append(acts, action{kind: actReceipt, receipt: r, outcome: outcome, had: p != nil})
}

// timerFired re-sends what key's timer was armed for, unless the state
// moved on since (receipted, replaced, re-armed, shutting down).
func (s *session) timerFired(k pendingKey, gen uint64) []action {
	if s.closing {
		return nil
	}
	if k == modelOutKey {
		if m := s.modelOut; m == nil || m.gen != gen {
			return nil
		}
		return []action{{kind: actWriteModelOut, attempt: s.modelOut.attempts}}
	}
	if k.subject == wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE {
		if rt := s.retries[k.round]; rt == nil || rt.gen != gen {
			return nil
		}
		out, err := s.store.Outbox()
		if err != nil {
			return []action{{kind: actStoreFailed, what: "read outbox", err: err}}
		}
		for _, e := range out {
			if e.Round == k.round {
				acts := []action{{kind: actPublishUpdate, key: k, msg: e.Msg, why: sendRetry}}
				if s.retries[k.round].untilReceipt { // again after the next backoff
					acts = append(acts, s.armUpdate(k.round, true)...)
				}
				return acts
			}
		}
		delete(s.retries, k.round) // receipted, or dropped with its run
		return nil
	}
	p := s.uplinks[k]
	if p == nil || p.gen != gen {
		return nil
	}
	arm := s.armUplink(k, p)
	return []action{arm, {kind: actPublishUplink, key: k, msg: p.msg, why: sendRetry, attempt: p.attempts}}
}

// connected re-sends every unreceipted update (unless the run is over:
// nothing more is sent) and every unreceipted statistics and evaluation
// message.
func (s *session) connected() []action {
	out, err := s.store.Outbox()
	var acts []action
	switch {
	case err != nil:
		acts = append(acts, action{kind: actStoreFailed, what: "read outbox", err: err})
	case !s.finished: // a finished run's outbox is empty anyway (SetFinal)
		for _, e := range out {
			acts = append(acts, action{kind: actPublishUpdate, key: updateKey(e.Round), msg: e.Msg, why: sendReconnect})
		}
	}
	for _, k := range s.uplinkKeys() {
		p := s.uplinks[k]
		acts = append(acts, action{kind: actPublishUplink, key: k, msg: p.msg, why: sendReconnect, attempt: p.attempts})
	}
	return acts
}

// emitted sends a statistics or evaluation message and keeps it until the
// aggregator receipts it: re-sent after a backoff doubling from backoffMin
// to backoffMax, and on every connection. (The announcement asking for it
// is retained: after a restart it is made again.)
func (s *session) emitted(o Outgoing) []action {
	if s.closing {
		return nil
	}
	k := pendingKey{subject: o.Subject, round: o.Round}
	if s.uplinks == nil {
		s.uplinks = map[pendingKey]*pendingUplink{}
	}
	p := &pendingUplink{run: o.RunID, msg: o.Msg}
	s.uplinks[k] = p
	return []action{s.armUplink(k, p), {kind: actPublishUplink, key: k, msg: o.Msg, why: sendFirst, attempt: 0}}
}

// armUplink arms p's next re-send.
func (s *session) armUplink(k pendingKey, p *pendingUplink) action {
	d := s.backoff(p.attempts)
	p.attempts++
	p.gen = s.nextGen()
	return action{kind: actArm, key: k, gen: p.gen, after: d}
}

// retryModelOut arms the re-write of model_out when se says the final
// bundle is stored but model_out could not be written (ErrModelOut: disk
// full, read-only), unless one is armed: freeing space is then enough.
func (s *session) retryModelOut(se *sitedata.SiteError) []action {
	if se == nil || !errors.Is(se, ErrModelOut) || s.modelOut != nil || s.closing {
		return nil
	}
	s.modelOut = &retryState{}
	return []action{s.armModelOut()}
}

func (s *session) armModelOut() action {
	m := s.modelOut
	d := s.backoff(m.attempts)
	m.attempts++
	m.gen = s.nextGen()
	return action{kind: actArm, key: modelOutKey, gen: m.gen, after: d}
}

// modelOutDone: written, the re-write is over, the site error it caused
// is cleared and, unless another run has been announced since, run's end
// is handled as when the write succeeds at once (quiet until another
// run); still failing for the same reason, it is armed again after a
// longer backoff; failing otherwise (the stored bundle is gone or
// damaged), it stops and the error stays.
func (s *session) modelOutDone(run string, err error) []action {
	if s.modelOut == nil || s.closing {
		return nil
	}
	if err != nil {
		if errors.Is(err, ErrModelOut) {
			return []action{s.armModelOut()}
		}
		s.modelOut = nil
		return nil
	}
	s.modelOut = nil
	var acts []action
	if run != "" && (s.run == "" || s.run == run) && !s.finished {
		s.finished, s.finishedRun = true, run
		acts = s.dropUplinks(acts, func(string) bool { return true })
	}
	if old := s.siteErr; old != nil && errors.Is(old, ErrModelOut) {
		s.siteErr = nil
		acts = append(acts, action{kind: actSiteErrorCleared, se: old})
	}
	return acts
}

// backoff is the delay before re-send number attempts+1: backoffMin,
// doubled with every attempt, at most backoffMax.
func (s *session) backoff(attempts int) time.Duration {
	d := s.backoffMin
	for i := 0; i < attempts && d < s.backoffMax; i++ {
		d *= 2
	}
	return min(d, s.backoffMax)
}

func (s *session) nextGen() uint64 {
	s.gen++
	return s.gen
}

// armUpdate arms the next re-send of round's update, which stays in the
// outbox until its receipt, after a backoff doubling from backoffMin to
// backoffMax (Config's ReconnectMin and ReconnectMax): untilReceipt, from
// the update's publish on and again after each re-send, until a receipt
// stops it; otherwise once, after an INTERNAL receipt (its own doubling
// sequence). An update lost on its way (a publish the broker dropped over
// the site's rate limit without a PUBACK, a message the aggregator's
// limit dropped) used to be sent again only on a reconnection or when its
// round was announced again at its deadline. The aggregator answers a
// copy of an update it stored with a DUPLICATE receipt, which stops the
// timer as any receipt does. Secure-aggregation messages keep their own
// rules (an INTERNAL receipt only).
func (s *session) armUpdate(round uint64, untilReceipt bool) []action {
	if s.closing {
		return nil
	}
	rt := s.retries[round]
	if rt == nil {
		rt = &retryState{}
		if s.retries == nil {
			s.retries = map[uint64]*retryState{}
		}
		s.retries[round] = rt
	}
	var d time.Duration
	if untilReceipt {
		rt.untilReceipt = true
		d = s.backoff(rt.sends)
		rt.sends++
	} else {
		d = s.backoff(rt.attempts)
		rt.attempts++
	}
	rt.gen = s.nextGen()
	return []action{{kind: actArm, key: updateKey(round), gen: rt.gen, after: d}}
}

func (s *session) cancelRetry(round uint64) []action {
	if _, ok := s.retries[round]; !ok {
		return nil
	}
	delete(s.retries, round)
	return []action{{kind: actStop, key: updateKey(round)}}
}

// dropUplinks forgets the pending and receipted messages of the runs drop
// says, appending the stops of their timers to acts.
func (s *session) dropUplinks(acts []action, drop func(run string) bool) []action {
	for _, k := range s.uplinkKeys() {
		if drop(s.uplinks[k].run) {
			acts = append(acts, action{kind: actStop, key: k})
			delete(s.uplinks, k)
		}
	}
	for k, run := range s.receipted {
		if drop(run) {
			delete(s.receipted, k)
		}
	}
	return acts
}

// uplinkKeys are the pending uplinks' keys in order (subject, round), so
// that the actions of a step do not depend on map order.
func (s *session) uplinkKeys() []pendingKey {
	keys := make([]pendingKey, 0, len(s.uplinks))
	for k := range s.uplinks {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return a.subject < b.subject || a.subject == b.subject && a.round < b.round
	})
	return keys
}

// isReceipted reports whether the aggregator receipted the statistics or
// evaluation report (subject, round) of run.
func (s *session) isReceipted(subject wire.ReceiptSubject, run string, round uint64) bool {
	return receiptedSet(s.receipted).has(subject, run, round)
}

// receiptedSet is the statistics and evaluation reports receipted, by key,
// with their run.
type receiptedSet map[pendingKey]string

// has reports whether the report (subject, round) of run is in r.
func (r receiptedSet) has(subject wire.ReceiptSubject, run string, round uint64) bool {
	got, ok := r[pendingKey{subject: subject, round: round}]
	return ok && got == run
}
