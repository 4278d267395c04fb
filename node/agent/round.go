package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/proto/round"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// Algorithm families a round announcement names. Any other name (an
// aggregator such as "fedsim" or "median") trains like FedProx.
const (
	AlgoFedAvg       = "fedavg"       // local solve without a proximal term (mu = 0)
	AlgoFedProx      = "fedprox"      // gamma-inexact prox solve anchored at the global model
	AlgoFedSplit     = "fedsplit"     // FedSplit; the prox is the local solve with mu = 1/step
	AlgoFedProxSplit = "fedproxsplit" // the same client step, under the work budget
	AlgoScaffold     = "scaffold"     // SGD shifted by the control variates c - c_i (scaffold.go)
)

// Errors of the round handler.
var (
	// ErrBadAnnouncement is wrapped when a round announcement cannot be used:
	// another federation, an unknown model, a global model of the wrong
	// dimension or with a bad frame, parameters out of range, data that
	// do not fit the model. Nothing was written.
	ErrBadAnnouncement = errors.New("agent: unusable round announcement")
	// ErrPreempted is the cancel cause that stops a local solve early because
	// a newer round was announced: the partial work is committed and sent
	// (stop reason SIGNAL). Any other cancellation aborts the round without
	// writing anything, and the retained announcement restarts it later.
	ErrPreempted = errors.New("agent: preempted by a newer round")
	// ErrNewRun is the cancellation cause when the aggregator announces a
	// new run while a round of the old one is solved: that round is
	// abandoned, nothing is committed (the new run's state starts over).
	ErrNewRun = errors.New("agent: the aggregator started a new run")
)

// Action says what Handle did with an announcement.
type Action int

const (
	// ActionNotSelected: the round does not select this site; only the
	// seen round was recorded.
	ActionNotSelected Action = iota + 1
	// ActionSolved: the local round ran and was committed; publish Msg.
	ActionSolved
	// ActionResend: the round was applied before and its update is still
	// unreceipted; publish Msg (the stored bytes) again.
	ActionResend
	// ActionDone: the round was applied and receipted; nothing to do.
	ActionDone
	// ActionStale: an announcement older than one already seen.
	ActionStale
	// ActionStatistics: a statistics phase; the site's statistics are in
	// Result.Out.
	ActionStatistics
	// ActionFinishing: the run has ended but its final bundle is not
	// announced yet (a final evaluation, if asked, is in Result.Out).
	ActionFinishing
	// ActionFinished: the run has ended; with a schema its final bundle is
	// now stored and written to ModelOut (Result.Final). Nothing more is
	// solved or sent for this run.
	ActionFinished
	// ActionIgnored: an announcement of a run whose end this site has
	// handled (the Agent drops it without calling Handle).
	ActionIgnored
	// ActionSecAgg: under secure aggregation, the site's message of the
	// session's phase (Result.SecAggKind) is committed as the round's
	// outbox entry; publish Msg (node/agent/core_secagg.go).
	ActionSecAgg
	// ActionWaiting: FedSplit in sum mode or SCAFFOLD, an earlier update of this site
	// awaits its receipt; nothing was solved or written, and the session
	// hands the round over again once that receipt comes (node/agent/sum.go).
	ActionWaiting
)

func (a Action) String() string {
	switch a {
	case ActionNotSelected:
		return "not-selected"
	case ActionSolved:
		return "solved"
	case ActionResend:
		return "resend"
	case ActionDone:
		return "done"
	case ActionStale:
		return "stale"
	case ActionStatistics:
		return "statistics"
	case ActionFinishing:
		return "finishing"
	case ActionFinished:
		return "finished"
	case ActionIgnored:
		return "ignored"
	case ActionSecAgg:
		return "secagg"
	case ActionWaiting:
		return "waiting"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Result is the outcome of one round announcement.
type Result struct {
	Round  uint64
	Action Action
	// Msg is the encoded wire update to publish on updates/<id>
	// (ActionSolved, ActionResend), nil otherwise.
	Msg []byte
	// Update is the update Msg encodes (ActionSolved only).
	Update *wire.ClientUpdate
	// Sent is the vector the aggregator will hold once it applies the
	// update: x + the decoded delta (w as received) for the FedProx family,
	// its new copy of z_j (also committed as the site's copy) for FedSplit;
	// in sum mode what the update adds to the aggregator's sum (committed
	// as pending until its receipt) (ActionSolved only).
	Sent []float64
	// Report is the local solve's report (ActionSolved only).
	Report proxsolver.Report

	// Out are the statistics and evaluation reports the announcement
	// produced, already handed to RoundHandler.Emit when it is set.
	Out []Outgoing
	// SampleCount is the number of training rows the federation's schema
	// gives this site (0: no schema, or the data could not be read).
	SampleCount int
	// Healthy: the site's data, solve and disk served this announcement
	// (statistics computed, an evaluation made, a round solved, the final
	// bundle stored): a site error reported earlier is over.
	Healthy bool
	// Final is the final bundle stored (ActionFinished with a schema).
	Final *edgestore.Final
	// SecAggKind is the kind of the secagg message in Msg (ActionSecAgg,
	// and ActionResend of a ShareKeys in the masked phase).
	SecAggKind secagg.Kind
	// Waiting is the earlier round whose unreceipted entry a sum-mode round
	// waits for (ActionWaiting); under secure aggregation Msg is then that
	// entry, re-sent: the aggregator answers it with the earlier round's
	// UPDATE receipt once that round has closed (docs/privacy.md, "FedSplit
	// under secure aggregation").
	Waiting uint64
}

// RoundHandler runs the edge side of a round over an EdgeStore, without any
// networking: Handle turns a validated round announcement into the bytes to
// publish, with every durable effect done by then. It is the shell's
// executor of the site core (core.go): it commits the records the core's
// plans ask for, runs the solve and steps its outcome back in. It is what
// Agent runs for each announcement, and what tests drive directly.
//
// A RoundHandler is not safe for concurrent use (the Agent calls it from one
// goroutine).
type RoundHandler struct {
	ClientID   string
	InstanceID string // this installation's (edgestore.Identity), carried by every update
	Federation string
	Store      *edgestore.EdgeStore
	// Data is the training data of a federation without a schema (loaded
	// at start; N = 0 when the site's data can only be read by a schema).
	Data   model.Data
	Clock  clock.Clock // nil = the wall clock
	Local  Local
	Limits wire.Limits
	Seed   uint64
	Log    *slog.Logger // nil = slog.Default()

	// DataFile is the CSV a federation schema reads (Config.Data's path;
	// "" = this site has none), EvalFile the optional separate held-out
	// CSV (Config.EvalData), DataLabel the label= of Config.Data (only
	// compared with the schema's, for a warning).
	DataFile, EvalFile, DataLabel string
	// ModelOut is where the final bundle is written (Config.ModelOut).
	ModelOut string
	// WriteFile writes model_out (nil = bundle.WriteFileAtomic): tests
	// inject a full disk with it.
	WriteFile func(path string, data []byte) error
	// Emit, when set, is called with every statistics and evaluation
	// message the announcement produced, by the executor once the rules
	// returned it (an evaluation before the round's solve starts); they
	// are in Result.Out either way.
	Emit func(Outgoing)
	// Receipted, when set, reports whether the aggregator has receipted
	// this site's statistics or evaluation report of (run, round):
	// Handle then neither computes nor emits it again. The Agent sets it
	// to a copy of the session's receipts as each solve starts.
	Receipted func(subject wire.ReceiptSubject, runID string, round uint64) bool
	// SecAggRand, when set, is the randomness of round's secure
	// aggregation (keys, shares, stochastic rounding) instead of
	// crypto/rand: for the test that compares a live run with simulate
	// (sim/live_test.go), never for a deployment.
	SecAggRand func(round uint64) io.Reader
	// SecAggNoiseKey, when set, replaces the site's secret distributed-DP
	// noise key (drawn from crypto/rand into the edge store): for the test
	// that compares a live run with simulate, never for a deployment.
	SecAggNoiseKey *[32]byte
	// SecAggIdentity, when set, makes this site's secure aggregation the
	// signed one (docs/privacy.md, "Threat model per mode"): it signs its
	// key advertisements with its client certificate's key and refuses a
	// key list with a key not signed by its site's certificate of the
	// federation CA. Nil (password-only authentication): the
	// honest-but-curious aggregator's model, as before.
	SecAggIdentity *uplink.SecAggIdentity

	site siteCache
	// emitted counts the messages of the current announcement's Result.Out
	// handed to Emit (flush).
	emitted int
}

func (h *RoundHandler) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}

func (h *RoundHandler) clock() clock.Clock {
	if h.Clock == nil {
		return clock.Real{}
	}
	return h.Clock
}

// Handle processes one round announcement:
//
//   - an announcement of another aggregator run (run id) than the stored
//     state's: the round state starts over (edgestore.EdgeStore.StartRun);
//   - not selected: record the seen round, nothing else;
//   - a round already applied (CommitRound's applied round): never solved
//     again; if its update is still in the outbox, return it for re-sending;
//   - otherwise: check everything (model, data, parameters, the global
//     model's frame and dimension) before writing anything, SetGlobal, run
//     the local solve under min(device, round) budget and the round's
//     deadline, encode the update with the uplink codec, and commit z (for
//     FedSplit), the applied round and the outbox entry in ONE transaction.
//     Only then is the update returned for publishing.
//
// An unusable announcement returns an error wrapping ErrBadAnnouncement and
// leaves the store untouched. A canceled ctx (cause other than
// ErrPreempted) aborts the round without committing.
func (h *RoundHandler) Handle(ctx context.Context, ann *wire.RoundAnnouncement) (Result, error) {
	return h.HandleInvited(ctx, ann, false)
}

// HandleInvited is Handle for an announcement whose selection is private
// (wire RoundAnnouncement.private_selection): invited says that the
// aggregator invited this site to ann's round and run on its receipts
// topic (the session rules match the two, node/agent/session.go), and then the
// site takes part as if ann listed it.
func (h *RoundHandler) HandleInvited(ctx context.Context, ann *wire.RoundAnnouncement, invited bool) (Result, error) {
	h.emitted = 0
	res, err := h.handle(ctx, ann, invited)
	h.flush(res)
	return res, err
}

func (h *RoundHandler) handle(ctx context.Context, ann *wire.RoundAnnouncement, invited bool) (Result, error) {
	res, recs, err := h.rules().begin(h.Store, ann)
	if err != nil {
		return res, err
	}
	if res, stop, err := h.commit(recs, res); stop {
		return res, err
	}
	if ann.GetPhase() != wire.Phase_PHASE_TRAIN || len(ann.GetSchema()) > 0 {
		return h.handleFederated(ctx, ann, res, invited)
	}
	if h.Data.N == 0 {
		// data = csv:PATH without label=: nothing was loaded at start.
		return res, &sitedata.SiteError{Reason: sitedata.ReasonData, File: h.DataFile,
			Problem: "this federation announces no schema", Expected: "data = csv:PATH:label=COLUMN (a csv source without label= is read by a federation schema only)"}
	}
	return h.train(ctx, ann, h.Data, res, invited)
}

// rules is the site core's configuration (core.go) from the handler's.
func (h *RoundHandler) rules() *siteRules {
	return &siteRules{ClientID: h.ClientID, InstanceID: h.InstanceID, Federation: h.Federation,
		Local: h.Local, Limits: h.Limits, Seed: h.Seed, Log: h.Log, Clock: h.clock(), SecAgg: h.secAggConfig()}
}

// commit is the shell's half of a plan's records: each is committed in
// its own transaction, in order; one the store refuses is stepped back
// into the core (siteRules.commitFailed), which says whether the plan
// stops there and with what outcome.
func (h *RoundHandler) commit(recs []change, base Result) (Result, bool, error) {
	for _, rec := range recs {
		if err := h.apply(rec); err != nil {
			if res, stop, err := h.rules().commitFailed(h.Store, rec, err, base); stop {
				return res, true, err
			}
		}
	}
	return base, false, nil
}

// apply commits one record.
func (h *RoundHandler) apply(rec change) error {
	switch rec.kind {
	case recStartRun:
		rs, err := h.Store.StartRunAt(rec.run, rec.since)
		if err == nil && rs.Reset {
			// Only the aggregator may publish on the round topic (the
			// broker's ACL), so a new run id is its word: its round log
			// is new and its rounds start over.
			h.log().Warn("the aggregator started a new run: this site's round state starts over",
				"run_id", rec.run, "previous_run_id", rs.Previous, "round", rec.round, "unreceipted_updates_dropped", rs.Dropped)
		}
		return err
	case recSeen:
		return h.Store.SetSeenRound(rec.round)
	case recGlobal:
		return h.Store.SetGlobal(rec.round, rec.vec)
	case recInitZ:
		_, err := h.Store.InitZ(rec.round, rec.vec)
		return err
	case recCommit:
		return h.Store.Commit(rec.commit)
	case recFinal:
		return h.Store.SetFinal(rec.final)
	case recSecAgg:
		return h.Store.SetSecAgg(rec.round, rec.commit.SecAgg, rec.commit.Msg)
	case recNoiseKey:
		return h.Store.InitNoiseKey(rec.key)
	}
	return fmt.Errorf("agent: unknown record kind %d", rec.kind)
}

// train carries out a training round over d (the site's training data):
// the core's plan (siteRules.round) is committed, its solve run under ctx,
// and the solve's outcome stepped back in (siteRules.solved), whose
// commit of the update comes before the session publishes it.
func (h *RoundHandler) train(ctx context.Context, ann *wire.RoundAnnouncement, d model.Data, res Result, invited bool) (Result, error) {
	sr := h.rules()
	pl := sr.round(h.Store, ann, d, invited, h.clock().Now(), res)
	for {
		if res, stop, err := h.commit(pl.records, pl.base); stop {
			return res, err
		}
		if pl.err != nil || pl.solve == nil {
			return pl.res, pl.err
		}
		p := pl.solve
		h.flush(res) // an evaluation goes out before the solve
		sent, rep, stop, err := solve(ctx, p, sr.rng(p.round, streams.SiteSolve), h.log())
		if err != nil {
			return res, err
		}
		if ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrPreempted) {
			return res, fmt.Errorf("agent: round %d aborted, nothing committed: %w", ann.Round, context.Cause(ctx))
		}
		pl = sr.solved(h.Store, ann, p, solveOutcome{sent: sent, rep: rep, stop: stop}, h.clock().Now(), res)
	}
}

// rng is the round's random stream s (siteRules.rng).
func (h *RoundHandler) rng(round uint64, s streams.SiteStream) *rand.Rand {
	return h.rules().rng(round, s)
}

// budget is the core's budget of ann's solve, read through the clock.
func (h *RoundHandler) budget(ann *wire.RoundAnnouncement) proxsolver.Budget {
	return h.rules().budget(ann, h.clock().Now())
}

// solve runs the local work of the round (round.Work.Solve: the prox
// solve, and FedSplit's client step from the stored z_j) and returns the
// vector to send (w, or the new z_j), the report and the stop reason.
func solve(ctx context.Context, p *prepared, rng *rand.Rand, lg *slog.Logger) ([]float64, proxsolver.Report, wire.StopReason, error) {
	lg = lg.With("round", p.round, "algorithm", p.algo, "solver", p.work.Solver.Solver)
	var z []float64
	if p.split {
		z = p.z // the stored z_j, or the initial one the round committed (siteRules.round)
	}
	res, err := p.work.Solve(ctx, p.m, p.data, p.x, z, p.budget, rng, p.sketch)
	if err != nil {
		return nil, res.Report, 0, solveErr(ctx, roundErr(p.round, err))
	}
	if res.Diverged != nil {
		// No step is taken: the received model (FedProx family) or z_j
		// (FedSplit) is sent, and kept, unchanged, with stop reason ERROR.
		lg.Error("local solve diverged; sending the received model or z unchanged", "err", res.Diverged)
		return res.Vec, res.Report, wire.StopReason_STOP_REASON_ERROR, nil
	}
	return res.Vec, res.Report, stopReason(res.Report.Stop), nil
}

// partialWhy is the agent's one-line explanation of a partial report
// (wire.PartialMeans): the stop reason and the achieved against the
// target gamma.
func partialWhy(r *wire.WorkReport, target float64) string {
	by := strings.ToLower(strings.TrimPrefix(r.StopReason.String(), "STOP_REASON_"))
	switch r.StopReason {
	case wire.StopReason_STOP_REASON_MAX_EPOCHS:
		by = "the epoch budget (max_epochs)"
	case wire.StopReason_STOP_REASON_MAX_GRAD_EVALS:
		by = "the gradient-evaluation budget"
	case wire.StopReason_STOP_REASON_DEADLINE:
		by = "the round's deadline or the time budget"
	case wire.StopReason_STOP_REASON_SIGNAL:
		by = "a newer round (pre-empted)"
	case wire.StopReason_STOP_REASON_ERROR:
		return "the local solve diverged; the received model is sent back unchanged"
	}
	return fmt.Sprintf("stopped by %s before reaching the target gamma %g (achieved %.3g); the work is sent and used", by, target, r.AchievedGamma)
}

// work is the core's training parameters of ann for samples
// (siteRules.work).
func (h *RoundHandler) work(ann *wire.RoundAnnouncement, samples int) (round.Work, error) {
	return h.rules().work(ann, samples)
}
