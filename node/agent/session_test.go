package agent

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// The session rules without MQTT, bbolt or goroutines: each scenario steps
// the state machine through events and a fake clock and checks the actions
// it decides, written as short strings (see render).

// memStore is a sessionStore in memory.
type memStore struct {
	outbox   map[uint64][]byte
	pending  map[uint64]bool // rounds with a sum-mode pending contribution
	rejected []uint64        // rounds AckRejected
	err      error           // returned by every call when set
}

func (m *memStore) Outbox() ([]edgestore.OutboxEntry, error) {
	if m.err != nil {
		return nil, m.err
	}
	var out []edgestore.OutboxEntry
	for _, r := range slices.Sorted(maps.Keys(m.outbox)) {
		out = append(out, edgestore.OutboxEntry{Round: r, Msg: m.outbox[r]})
	}
	return out, nil
}

func (m *memStore) Ack(round uint64) (bool, error) {
	if m.err != nil {
		return false, m.err
	}
	_, had := m.outbox[round]
	delete(m.outbox, round)
	delete(m.pending, round)
	return had, nil
}

func (m *memStore) AckIf(round uint64, match func([]byte) bool) (bool, error) {
	if m.err != nil {
		return false, m.err
	}
	msg, had := m.outbox[round]
	if !had || !match(msg) {
		return false, nil
	}
	delete(m.outbox, round)
	return true, nil
}

// Pending reports a round marked pending as a join of one value.
func (m *memStore) Pending(round uint64) (edgestore.SumPending, bool, error) {
	if !m.pending[round] {
		return edgestore.SumPending{}, false, m.err
	}
	return edgestore.SumPending{Join: true, V: []float64{1}}, true, m.err
}

func (m *memStore) Contribution() (uint64, []float64, error) {
	if m.err != nil {
		return 0, nil, m.err
	}
	return 0, nil, storage.ErrNotFound
}

func (m *memStore) AckSum(round, _ uint64, _ []float64) (bool, error) {
	return m.Ack(round)
}

func (m *memStore) AckRejected(round uint64) (bool, error) {
	had, err := m.Ack(round)
	if err == nil {
		m.rejected = append(m.rejected, round)
	}
	return had, err
}

// sessionHarness carries out a session's timer actions on a fake clock, as
// the shell does, except that it never stops a timer: a timer the state
// has moved past still fires, and the session must ignore it.
type sessionHarness struct {
	s     *session
	store *memStore
	clk   *clock.Fake
	got   []string // the actions of the current step, rendered
}

func newSessionHarness() *sessionHarness {
	st := &memStore{outbox: map[uint64][]byte{}}
	return &sessionHarness{
		s:     &session{store: st, federation: testFed, backoffMin: 100 * time.Millisecond, backoffMax: time.Second},
		store: st,
		clk:   clock.NewFake(t0),
	}
}

// carry steps ev as the shell does: an actAck is committed on the
// memStore and its outcome stepped back in, its actions following it.
func (h *sessionHarness) carry(ev sessionEvent) []action {
	acts := h.s.step(ev)
	for i := 0; i < len(acts); i++ {
		if acts[i].kind == actAck {
			had, err := commitAck(h.store, acts[i])
			acts = slices.Insert(acts, i+1, h.s.step(acked{act: acts[i], had: had, err: err})...)
		}
	}
	return acts
}

func (h *sessionHarness) step(ev sessionEvent) {
	for _, a := range h.carry(ev) {
		if a.kind == actAck {
			continue // carried out: its outcome follows
		}
		h.got = append(h.got, render(a))
		if a.kind == actArm {
			k, gen := a.key, a.gen
			h.clk.AfterFunc(a.after, func() { h.step(timerFired{key: k, gen: gen}) })
		}
	}
}

func keyName(k pendingKey) string {
	if k == modelOutKey {
		return "model_out"
	}
	switch k.subject {
	case wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE:
		return fmt.Sprintf("update/%d", k.round)
	case wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS:
		return fmt.Sprintf("statistics/%d", k.round)
	case wire.ReceiptSubject_RECEIPT_SUBJECT_SECAGG:
		return fmt.Sprintf("secagg/%d", k.round)
	}
	return fmt.Sprintf("evaluation/%d", k.round)
}

var (
	whyNames     = map[why]string{sendFirst: "first", sendAgain: "again", sendReconnect: "reconnect", sendRetry: "retry"}
	outcomeNames = map[receiptOutcome]string{receiptAccepted: "accepted", receiptRetry: "retry", receiptRejected: "rejected", receiptRejectedKept: "rejected-kept"}
	classNames   = map[roundClass]string{roundBad: "bad", roundDamaged: "damaged", roundShutdown: "shutdown", roundNewRun: "new-run",
		roundRunFinished: "run-finished", roundSiteError: "site-error", roundFailed: "failed"}
)

// render writes an action as the scenarios expect it.
func render(a action) string {
	switch a.kind {
	case actStartSolve:
		if a.invited {
			return fmt.Sprintf("start %s/%d invited", a.ann.RunId, a.ann.Round)
		}
		return fmt.Sprintf("start %s/%d", a.ann.RunId, a.ann.Round)
	case actPreempt:
		return fmt.Sprintf("preempt %d by %d: %v", a.solving, a.ann.Round, a.err)
	case actWake:
		return "wake"
	case actIgnored:
		return fmt.Sprintf("ignored %d", a.ann.Round)
	case actRoundDone:
		if a.class == roundOK {
			return fmt.Sprintf("done %d %s", a.ann.Round, a.res.Action)
		}
		return fmt.Sprintf("done %d %s", a.ann.Round, classNames[a.class])
	case actPublishUpdate, actPublishUplink:
		msg := string(a.msg)
		if k := secAggKindOf(a.msg); k != 0 {
			msg = fmt.Sprintf("sa%d", k) // a secagg message of that kind
		}
		s := fmt.Sprintf("publish %s %s %s", keyName(a.key), msg, whyNames[a.why])
		if a.kind == actPublishUplink && a.why == sendRetry {
			s += fmt.Sprintf(" #%d", a.attempt)
		}
		return s
	case actArm:
		return fmt.Sprintf("arm %s %v", keyName(a.key), a.after)
	case actStop:
		return "stop " + keyName(a.key)
	case actReceipt:
		s := fmt.Sprintf("receipt %s %s", keyName(pendingKey{a.receipt.GetSubject(), a.receipt.Round}), outcomeNames[a.outcome])
		if a.had {
			s += " had"
		}
		if a.outcome == receiptRetry && a.receipt.GetSubject() == wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE {
			s += fmt.Sprintf(" in %v", a.after)
		}
		return s
	case actStoreFailed:
		return "store failed: " + a.what
	case actSiteError:
		if a.same {
			return "site error " + a.se.Reason + " (same)"
		}
		return "site error " + a.se.Reason
	case actSiteErrorCleared:
		return "site error cleared " + a.se.Reason
	case actFinished:
		return fmt.Sprintf("finished %d", a.ann.Round)
	case actStartShareList:
		return fmt.Sprintf("start share-list %d", a.share.Round)
	case actShareListDone:
		if a.err != nil {
			return fmt.Sprintf("share-list %d failed", a.share.Round)
		}
		return fmt.Sprintf("share-list %d %s", a.share.Round, a.res.Action)
	case actWriteModelOut:
		return fmt.Sprintf("write model_out #%d", a.attempt)
	case actLeftRun:
		return fmt.Sprintf("left-run %s/%d", a.ann.RunId, a.ann.Round)
	case actInvited:
		if a.had {
			return fmt.Sprintf("invited %s/%d", a.receipt.RunId, a.receipt.Round)
		}
		return fmt.Sprintf("invited %s/%d again", a.receipt.RunId, a.receipt.Round)
	}
	return fmt.Sprintf("action(%d)", a.kind)
}

// Events of the scenarios.

func ann(run string, round uint64) *wire.RoundAnnouncement {
	return &wire.RoundAnnouncement{Federation: testFed, Round: round, RunId: run}
}

// annAt is ann created at Unix ms at (the run order: leftRun).
func annAt(run string, round uint64, at int64) *wire.RoundAnnouncement {
	a := ann(run, round)
	a.CreatedAtUnixMs = at
	return a
}

func annPhase(run string, round uint64, p wire.Phase) *wire.RoundAnnouncement {
	a := ann(run, round)
	a.Phase = p
	return a
}

func solved(a *wire.RoundAnnouncement, msg string) solveDone {
	return solveDone{ann: a, res: Result{Round: a.Round, Action: ActionSolved, Msg: []byte(msg), Healthy: true}}
}

func handled(a *wire.RoundAnnouncement, act Action, healthy bool) solveDone {
	return solveDone{ann: a, res: Result{Round: a.Round, Action: act, Healthy: healthy}}
}

func failed(a *wire.RoundAnnouncement, err error) solveDone {
	return solveDone{ann: a, res: Result{Round: a.Round}, err: err}
}

func rcpt(subject wire.ReceiptSubject, round uint64, code wire.ReceiptCode) receiptArrived {
	ok := code == wire.ReceiptCode_RECEIPT_CODE_STORED || code == wire.ReceiptCode_RECEIPT_CODE_DUPLICATE
	return receiptArrived{r: &wire.Receipt{ClientId: testSite, Round: round, Subject: subject, Code: code, Accepted: ok}}
}

const (
	subjUpdate = wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE
	subjStats  = wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS
	subjEval   = wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION
	codeOK     = wire.ReceiptCode_RECEIPT_CODE_STORED
	codeRetry  = wire.ReceiptCode_RECEIPT_CODE_INTERNAL
	codeStale  = wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND
)

func emit(subject wire.ReceiptSubject, run string, round uint64, msg string) emitted {
	return emitted{out: Outgoing{Subject: subject, RunID: run, Round: round, Msg: []byte(msg)}}
}

// sessionStep is one step of a scenario: an event, or (ev nil) moving the
// clock by advance; want are the actions it decides, timers fired
// included; check, when set, looks at the state afterwards.
type sessionStep struct {
	ev      sessionEvent
	advance time.Duration
	want    []string
	check   func(t *testing.T, h *sessionHarness)
}

func receipted(subject wire.ReceiptSubject, run string, round uint64, want bool) func(*testing.T, *sessionHarness) {
	return func(t *testing.T, h *sessionHarness) {
		t.Helper()
		if got := h.s.isReceipted(subject, run, round); got != want {
			t.Errorf("isReceipted(%s, %s, %d) = %v, want %v", keyName(pendingKey{subject, round}), run, round, got, want)
		}
	}
}

func TestSessionRules(t *testing.T) {
	schemaErr := &sitedata.SiteError{Reason: sitedata.ReasonSchema, Problem: "no column age"}
	diskErr := &sitedata.SiteError{Reason: sitedata.ReasonDisk, Problem: "disk full"}
	modelOutErr := sitedata.NewError(sitedata.ReasonDisk, "/var/lib/edgefl/final.bundle.json", fmt.Errorf("%w: no space left on device", ErrModelOut))
	tests := []struct {
		name   string
		outbox map[uint64][]byte
		steps  []sessionStep
	}{
		{name: "a newer round pre-empts the solve, the same round does not", steps: []sessionStep{
			{ev: announced{ann("A", 1)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/1"}},
			{ev: announced{ann("A", 1)}, want: []string{"wake"}},
			{ev: announced{ann("A", 2)}, want: []string{"preempt 1 by 2: " + ErrPreempted.Error(), "wake"}},
			{ev: announced{ann("A", 1)}, want: []string{"wake"}}, // older: round 2 still waits
			{ev: solved(ann("A", 1), "u1"), want: []string{"done 1 solved", "publish update/1 u1 first", "arm update/1 100ms"}},
			{ev: idle{}, want: []string{"start A/2"}},
			{ev: idle{}, want: nil},
		}},
		{name: "the same round announced again is handled again, idempotently", steps: []sessionStep{
			{ev: announced{ann("A", 3)}, want: []string{"wake"}},
			{ev: announced{ann("A", 3)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/3"}},
			{ev: idle{}, want: nil},
			{ev: announced{ann("A", 3)}, want: []string{"wake"}},
			{ev: solved(ann("A", 3), "u3"), want: []string{"done 3 solved", "publish update/3 u3 first", "arm update/3 100ms"}},
			{ev: idle{}, want: []string{"start A/3"}},
			{ev: solveDone{ann: ann("A", 3), res: Result{Round: 3, Action: ActionResend, Msg: []byte("u3")}},
				want: []string{"done 3 resend", "publish update/3 u3 again", "arm update/3 200ms"}},
			{ev: idle{}, want: nil},
			{ev: announced{ann("A", 3)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/3"}},
			{ev: handled(ann("A", 3), ActionDone, false), want: []string{"done 3 done"}},
		}},
		{name: "a new run pre-empts and resets", steps: []sessionStep{
			{ev: announced{annPhase("A", 0, wire.Phase_PHASE_STATISTICS)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/0"}},
			{ev: emit(subjStats, "A", 0, "s"), want: []string{"arm statistics/0 100ms", "publish statistics/0 s first"}},
			{ev: emit(subjEval, "A", 4, "e"), want: []string{"arm evaluation/4 100ms", "publish evaluation/4 e first"}},
			{ev: rcpt(subjEval, 4, codeOK), want: []string{"stop evaluation/4", "receipt evaluation/4 accepted had"},
				check: receipted(subjEval, "A", 4, true)},
			{ev: handled(annPhase("A", 0, wire.Phase_PHASE_STATISTICS), ActionStatistics, true), want: []string{"done 0 statistics"}},
			{ev: announced{ann("A", 5)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/5"}},
			{ev: announced{ann("B", 1)}, want: []string{"preempt 5 by 1: " + ErrNewRun.Error(), "wake"}},
			{ev: announced{ann("A", 6)}, want: []string{"preempt 5 by 6: " + ErrPreempted.Error(), "wake"}}, // replaces B's
			{ev: announced{ann("B", 1)}, want: []string{"preempt 5 by 1: " + ErrNewRun.Error(), "wake"}},
			{ev: failed(ann("A", 5), fmt.Errorf("round 5: %w", ErrNewRun)), want: []string{"done 5 new-run"}},
			{ev: idle{}, want: []string{"stop statistics/0", "start B/1"}, check: receipted(subjEval, "A", 4, false)},
			{advance: time.Second, want: nil}, // the dropped statistics' timer
		}},
		{name: "the end of a run: pre-empted, quiet until another run", steps: []sessionStep{
			{ev: announced{ann("A", 7)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/7"}},
			{ev: emit(subjEval, "A", 6, "e"), want: []string{"arm evaluation/6 100ms", "publish evaluation/6 e first"}},
			{ev: announced{annPhase("A", 7, wire.Phase_PHASE_FINISHED)}, want: []string{"preempt 7 by 7: " + ErrFinished.Error(), "wake"}},
			{ev: failed(ann("A", 7), ErrFinished), want: []string{"done 7 run-finished"}},
			{ev: idle{}, want: []string{"start A/7"}},
			{ev: handled(annPhase("A", 7, wire.Phase_PHASE_FINISHED), ActionFinished, true),
				want: []string{"done 7 finished", "stop evaluation/6", "finished 7"}},
			{ev: announced{annPhase("A", 7, wire.Phase_PHASE_FINISHED)}, want: []string{"ignored 7"}},
			{ev: connected{}, want: nil},
			{advance: time.Second, want: nil},
			{ev: announced{ann("B", 1)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start B/1"}},
			// No longer the finished run: another run's announcement.
			{ev: announced{annPhase("A", 7, wire.Phase_PHASE_FINISHED)}, want: []string{"preempt 1 by 7: " + ErrNewRun.Error(), "wake"}},
		}},
		{name: "a run left is never returned to: a stale retained announcement of it is dropped", steps: []sessionStep{
			{ev: announced{annAt("A", 5, 1000)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/5"}},
			{ev: announced{annAt("A", 4, 900)}, want: []string{"wake"}}, // an older round of A: the same run
			{ev: announced{annAt("B", 1, 5000)}, want: []string{"preempt 5 by 1: " + ErrNewRun.Error(), "wake"}},
			{ev: failed(annAt("A", 5, 1000), ErrNewRun), want: []string{"done 5 new-run"}},
			{ev: idle{}, want: []string{"start B/1"}},
			// Mosquitto restarted from an autosave holding A's announcements.
			{ev: announced{annAt("A", 6, 1200)}, want: []string{"left-run A/6"}},
			{ev: announced{annAt("B", 2, 6000)}, want: []string{"preempt 1 by 2: " + ErrPreempted.Error(), "wake"}},
			{ev: announced{annAt("A", 7, 4999)}, want: []string{"left-run A/7"}},
			{ev: solved(annAt("B", 1, 5000), "u1"), want: []string{"done 1 solved", "publish update/1 u1 first", "arm update/1 100ms"}},
			{ev: idle{}, want: []string{"start B/2"}},
			// A genuinely newer run is taken, whatever its round number.
			{ev: announced{annAt("C", 1, 9000)}, want: []string{"preempt 2 by 1: " + ErrNewRun.Error(), "wake"}},
			{ev: announced{annAt("B", 3, 8000)}, want: []string{"left-run B/3"}},
		}},
		{name: "the run order comes from the state file: a restarted agent does not go back either", steps: []sessionStep{
			{check: func(_ *testing.T, h *sessionHarness) { h.s.run, h.s.runSince = "B", 5000 }},
			{ev: announced{annAt("A", 9, 4000)}, want: []string{"left-run A/9"}},
			{ev: announced{annAt("B", 3, 7000)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start B/3"}},
		}},
		{name: "model_out not written (disk full): written again on a backoff until it is, then the run's end", steps: []sessionStep{
			{ev: announced{annPhase("A", 5, wire.Phase_PHASE_FINISHED)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/5"}},
			{ev: emit(subjEval, "A", 5, "e"), want: []string{"arm evaluation/5 100ms", "publish evaluation/5 e first"}},
			{ev: failed(annPhase("A", 5, wire.Phase_PHASE_FINISHED), modelOutErr),
				want: []string{"done 5 site-error", "site error disk", "arm model_out 100ms"}},
			// The same failure again (a re-delivered announcement) does not arm twice.
			{ev: announced{annPhase("A", 5, wire.Phase_PHASE_FINISHED)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/5"}},
			{ev: failed(annPhase("A", 5, wire.Phase_PHASE_FINISHED), modelOutErr), want: []string{"done 5 site-error", "site error disk (same)"}},
			{advance: 100 * time.Millisecond, want: []string{"arm evaluation/5 200ms", "publish evaluation/5 e retry #2", "write model_out #1"}},
			{ev: modelOutDone{run: "A", err: modelOutErr}, want: []string{"arm model_out 200ms"}},
			{advance: 200 * time.Millisecond, want: []string{"arm evaluation/5 400ms", "publish evaluation/5 e retry #3", "write model_out #2"}},
			// Space freed: written; the error clears and the run is over.
			{ev: modelOutDone{run: "A"}, want: []string{"stop evaluation/5", "site error cleared disk"}},
			{advance: 10 * time.Second, want: nil},
			{ev: announced{annPhase("A", 5, wire.Phase_PHASE_FINISHED)}, want: []string{"ignored 5"}},
		}},
		{name: "model_out not written at start: written again; shutdown stops it", steps: []sessionStep{
			{ev: finalRestored{run: "A", siteErr: modelOutErr}, want: []string{"arm model_out 100ms"}},
			{advance: 100 * time.Millisecond, want: []string{"write model_out #1"}},
			{ev: modelOutDone{run: "A", err: modelOutErr}, want: []string{"arm model_out 200ms"}},
			{ev: closed{}, want: []string{"stop model_out"}},
			{advance: time.Second, want: nil},
			{ev: modelOutDone{run: "A"}, want: nil},
		}},
		{name: "another disk error is not a model_out re-write", steps: []sessionStep{
			{ev: announced{ann("A", 2)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/2"}},
			{ev: failed(ann("A", 2), diskErr), want: []string{"done 2 site-error", "site error disk"}},
			{advance: time.Second, want: nil},
		}},
		{name: "a finished run restored at start is ignored", steps: []sessionStep{
			{ev: finalRestored{run: "A"}, want: nil},
			{ev: announced{ann("A", 9)}, want: []string{"ignored 9"}},
			{ev: announced{ann("B", 1)}, want: []string{"wake"}},
		}},
		// An update lost on its way (dropped over the site's rate limit,
		// say) used to wait for its round's re-announcement at the
		// deadline: now it is re-sent until a receipt comes.
		{name: "an update without a receipt is re-sent after a doubling backoff until one comes", outbox: map[uint64][]byte{1: []byte("u1")}, steps: []sessionStep{
			{ev: announced{ann("A", 1)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/1"}},
			{ev: solved(ann("A", 1), "u1"), want: []string{"done 1 solved", "publish update/1 u1 first", "arm update/1 100ms"}},
			{advance: 99 * time.Millisecond, want: nil},
			{advance: time.Millisecond, want: []string{"publish update/1 u1 retry", "arm update/1 200ms"}},
			{advance: 200 * time.Millisecond, want: []string{"publish update/1 u1 retry", "arm update/1 400ms"}},
			{advance: 400 * time.Millisecond, want: []string{"publish update/1 u1 retry", "arm update/1 800ms"}},
			{advance: 800 * time.Millisecond, want: []string{"publish update/1 u1 retry", "arm update/1 1s"}},
			{advance: time.Second, want: []string{"publish update/1 u1 retry", "arm update/1 1s"}},
			// A copy the aggregator had stored: DUPLICATE, which is a receipt.
			{ev: rcpt(subjUpdate, 1, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE), want: []string{"stop update/1", "receipt update/1 accepted had"}},
			{advance: 10 * time.Second, want: nil},
		}},
		{name: "a receipt before the backoff stops the re-send; INTERNAL keeps its own backoff", outbox: map[uint64][]byte{1: []byte("u1"), 2: []byte("u2")}, steps: []sessionStep{
			{ev: announced{ann("A", 1)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/1"}},
			{ev: solved(ann("A", 1), "u1"), want: []string{"done 1 solved", "publish update/1 u1 first", "arm update/1 100ms"}},
			{ev: rcpt(subjUpdate, 1, codeOK), want: []string{"stop update/1", "receipt update/1 accepted had"}},
			{advance: time.Second, want: nil},
			{ev: announced{ann("A", 2)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/2"}},
			{ev: solved(ann("A", 2), "u2"), want: []string{"done 2 solved", "publish update/2 u2 first", "arm update/2 100ms"}},
			{ev: rcpt(subjUpdate, 2, codeRetry), want: []string{"arm update/2 100ms", "receipt update/2 retry in 100ms"}},
			{advance: 100 * time.Millisecond, want: []string{"publish update/2 u2 retry", "arm update/2 200ms"}},
			{ev: rcpt(subjUpdate, 2, codeOK), want: []string{"stop update/2", "receipt update/2 accepted had"}},
			{advance: time.Second, want: nil},
		}},
		{name: "an accepted receipt clears the outbox and the retry", outbox: map[uint64][]byte{1: []byte("u1")}, steps: []sessionStep{
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 100ms", "receipt update/1 retry in 100ms"}},
			{ev: rcpt(subjUpdate, 1, codeOK), want: []string{"stop update/1", "receipt update/1 accepted had"}},
			{advance: time.Second, want: nil}, // the retry's timer fires after the receipt: ignored
			{ev: rcpt(subjUpdate, 1, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE), want: []string{"receipt update/1 accepted"}},
		}},
		{name: "INTERNAL receipts re-send after a doubling backoff", outbox: map[uint64][]byte{1: []byte("u1"), 2: []byte("u2")}, steps: []sessionStep{
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 100ms", "receipt update/1 retry in 100ms"}},
			{advance: 99 * time.Millisecond, want: nil},
			{advance: time.Millisecond, want: []string{"publish update/1 u1 retry"}},
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 200ms", "receipt update/1 retry in 200ms"}},
			{advance: 200 * time.Millisecond, want: []string{"publish update/1 u1 retry"}},
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 400ms", "receipt update/1 retry in 400ms"}},
			// Re-armed before it fired: the 400 ms timer is stale.
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 800ms", "receipt update/1 retry in 800ms"}},
			{advance: 400 * time.Millisecond, want: nil},
			{advance: 400 * time.Millisecond, want: []string{"publish update/1 u1 retry"}},
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 1s", "receipt update/1 retry in 1s"}},
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 1s", "receipt update/1 retry in 1s"}},
			// Each round has its own backoff.
			{ev: rcpt(subjUpdate, 2, codeRetry), want: []string{"arm update/2 100ms", "receipt update/2 retry in 100ms"}},
			{advance: time.Second, want: []string{"publish update/2 u2 retry", "publish update/1 u1 retry"}},
		}},
		{name: "a rejection drops the update and its retry", outbox: map[uint64][]byte{1: []byte("u1")}, steps: []sessionStep{
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 100ms", "receipt update/1 retry in 100ms"}},
			{ev: rcpt(subjUpdate, 1, codeStale), want: []string{"stop update/1", "receipt update/1 rejected"},
				check: func(t *testing.T, h *sessionHarness) {
					if !slices.Equal(h.store.rejected, []uint64{1}) || len(h.store.outbox) != 0 {
						t.Errorf("rejected %v, outbox %v", h.store.rejected, h.store.outbox)
					}
				}},
			{advance: time.Second, want: nil},
		}},
		{name: "a retry whose outbox entry is gone sends nothing", outbox: map[uint64][]byte{1: []byte("u1")}, steps: []sessionStep{
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 100ms", "receipt update/1 retry in 100ms"}},
			{check: func(_ *testing.T, h *sessionHarness) { delete(h.store.outbox, 1) }},
			{advance: 100 * time.Millisecond, want: nil},
		}},
		{name: "a connection re-sends the outbox and the pending uplinks", outbox: map[uint64][]byte{1: []byte("u1"), 2: []byte("u2")}, steps: []sessionStep{
			{ev: emit(subjEval, "A", 2, "e"), want: []string{"arm evaluation/2 100ms", "publish evaluation/2 e first"}},
			{ev: emit(subjStats, "A", 0, "s"), want: []string{"arm statistics/0 100ms", "publish statistics/0 s first"}},
			{ev: connected{}, want: []string{"publish update/1 u1 reconnect", "publish update/2 u2 reconnect",
				"publish statistics/0 s reconnect", "publish evaluation/2 e reconnect"}},
			{ev: rcpt(subjUpdate, 1, codeOK), want: []string{"receipt update/1 accepted had"}},
			{ev: rcpt(subjStats, 0, codeOK), want: []string{"stop statistics/0", "receipt statistics/0 accepted had"}},
			{ev: connected{}, want: []string{"publish update/2 u2 reconnect", "publish evaluation/2 e reconnect"}},
		}},
		{name: "statistics and evaluations are re-sent until receipted", steps: []sessionStep{
			{ev: emit(subjEval, "A", 2, "e"), want: []string{"arm evaluation/2 100ms", "publish evaluation/2 e first"}},
			{advance: 100 * time.Millisecond, want: []string{"arm evaluation/2 200ms", "publish evaluation/2 e retry #2"}},
			{ev: rcpt(subjEval, 2, codeRetry), want: []string{"receipt evaluation/2 retry had"}}, // the backoff goes on
			{advance: 200 * time.Millisecond, want: []string{"arm evaluation/2 400ms", "publish evaluation/2 e retry #3"}},
			{advance: 400 * time.Millisecond, want: []string{"arm evaluation/2 800ms", "publish evaluation/2 e retry #4"}},
			{advance: 800 * time.Millisecond, want: []string{"arm evaluation/2 1s", "publish evaluation/2 e retry #5"}},
			{advance: time.Second, want: []string{"arm evaluation/2 1s", "publish evaluation/2 e retry #6"}},
			// Emitted again (the announcement re-delivered): the backoff starts over.
			{ev: emit(subjEval, "A", 2, "e2"), want: []string{"arm evaluation/2 100ms", "publish evaluation/2 e2 first"}},
			{advance: 100 * time.Millisecond, want: []string{"arm evaluation/2 200ms", "publish evaluation/2 e2 retry #2"}},
			{ev: rcpt(subjEval, 2, codeOK), want: []string{"stop evaluation/2", "receipt evaluation/2 accepted had"},
				check: receipted(subjEval, "A", 2, true)},
			{advance: time.Second, want: nil},
			{ev: emit(subjStats, "A", 0, "s"), want: []string{"arm statistics/0 100ms", "publish statistics/0 s first"}},
			{ev: rcpt(subjStats, 0, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE), want: []string{"stop statistics/0", "receipt statistics/0 rejected had"},
				check: receipted(subjStats, "A", 0, false)},
			{advance: time.Second, want: nil},
		}},
		{name: "store failures are reported", outbox: map[uint64][]byte{1: []byte("u1")}, steps: []sessionStep{
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 100ms", "receipt update/1 retry in 100ms"},
				check: func(_ *testing.T, h *sessionHarness) { h.store.err = storage.ErrCorrupt }},
			{advance: 100 * time.Millisecond, want: []string{"store failed: read outbox"}},
			{ev: rcpt(subjUpdate, 1, codeOK), want: []string{"stop update/1", "store failed: ack receipt"}},
			{ev: rcpt(subjUpdate, 1, codeStale), want: []string{"store failed: ack rejected update"}},
			{ev: connected{}, want: []string{"store failed: read outbox"}},
		}},
		{name: "how a handled announcement is classified", steps: []sessionStep{
			{ev: failed(ann("A", 1), fmt.Errorf("%w: bad dimension", ErrBadAnnouncement)), want: []string{"done 1 bad"}},
			{ev: failed(ann("A", 1), fmt.Errorf("agent: %w", storage.ErrCorrupt)), want: []string{"done 1 damaged"}},
			{ev: solveDone{ann: ann("A", 1), err: errors.New("canceled"), shutdown: true}, want: []string{"done 1 shutdown"}},
			{ev: solveDone{ann: ann("A", 1), err: schemaErr, shutdown: true}, want: []string{"done 1 shutdown"}},
			{ev: failed(ann("A", 1), errors.New("encode")), want: []string{"done 1 failed"}},
			{ev: handled(ann("A", 1), ActionNotSelected, false), want: []string{"done 1 not-selected"}},
		}},
		{name: "the site error: shown once, cleared by a healthy announcement", steps: []sessionStep{
			{ev: failed(ann("A", 0), schemaErr), want: []string{"done 0 site-error", "site error schema_mismatch"}},
			{ev: failed(ann("A", 0), &sitedata.SiteError{Reason: sitedata.ReasonSchema, Problem: "no column age"}),
				want: []string{"done 0 site-error", "site error schema_mismatch (same)"}},
			{ev: handled(ann("A", 0), ActionNotSelected, false), want: []string{"done 0 not-selected"}},
			{ev: handled(ann("A", 0), ActionStatistics, true), want: []string{"done 0 statistics", "site error cleared schema_mismatch"}},
			// Storing the final bundle clears a disk error, not a data error.
			{ev: failed(ann("A", 1), diskErr), want: []string{"done 1 site-error", "site error disk"}},
			{ev: handled(ann("A", 2), ActionFinished, true), want: []string{"done 2 finished", "finished 2", "site error cleared disk"}},
			{ev: failed(ann("B", 1), schemaErr), want: []string{"done 1 site-error", "site error schema_mismatch"}},
			{ev: handled(ann("B", 2), ActionFinished, true), want: []string{"done 2 finished", "finished 2"}},
		}},
		{name: "after closing nothing is armed or sent", outbox: map[uint64][]byte{1: []byte("u1")}, steps: []sessionStep{
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"arm update/1 100ms", "receipt update/1 retry in 100ms"}},
			{ev: emit(subjStats, "A", 0, "s"), want: []string{"arm statistics/0 100ms", "publish statistics/0 s first"}},
			{ev: closed{}, want: []string{"stop update/1", "stop statistics/0"}},
			{advance: time.Second, want: nil},
			{ev: emit(subjStats, "A", 0, "s"), want: nil},
			{ev: rcpt(subjUpdate, 1, codeRetry), want: []string{"receipt update/1 retry in 0s"}},
			{advance: time.Second, want: nil},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newSessionHarness()
			maps.Copy(h.store.outbox, tc.outbox)
			h.run(t, tc.steps)
		})
	}
}

// run steps each event (or advances the clock) and checks the actions the
// shell carried out, and the step's own check.
func (h *sessionHarness) run(t *testing.T, steps []sessionStep) {
	t.Helper()
	for i, st := range steps {
		h.got = nil
		if st.ev != nil {
			h.step(st.ev)
		} else {
			h.clk.Advance(st.advance)
		}
		if !slices.Equal(h.got, st.want) {
			t.Fatalf("step %d (%s):\n got  %s\n want %s", i, stepName(st), strings.Join(h.got, "; "), strings.Join(st.want, "; "))
		}
		if st.check != nil {
			st.check(t, h)
		}
	}
}

func stepName(st sessionStep) string {
	if st.ev == nil {
		return fmt.Sprintf("advance %v", st.advance)
	}
	return fmt.Sprintf("%T%+v", st.ev, st.ev)
}
