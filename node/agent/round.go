package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"

	"github.com/edgefl/edgefl/learn/sketch"
)

// Algorithm families a round announcement names. Any other name (an
// aggregator such as "fedsim" or "median") trains like FedProx.
const (
	AlgoFedAvg       = round.FedAvg       // local solve without a proximal term (mu = 0)
	AlgoFedProx      = round.FedProx      // gamma-inexact prox solve anchored at the global model
	AlgoFedSplit     = round.FedSplit     // FedSplit; the prox is the local solve with mu = 1/step
	AlgoFedProxSplit = round.FedProxSplit // the same client step, under the work budget
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
	// outbox entry; publish Msg (node/agent/secagg.go).
	ActionSecAgg
	// ActionWaiting: FedSplit in sum mode, an earlier update of this site
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
	Final *storage.Final
	// SecAggKind is the kind of the secagg message in Msg (ActionSecAgg,
	// and ActionResend of a ShareKeys in the masked phase).
	SecAggKind secagg.Kind
	// Waiting is the earlier round whose unreceipted entry a sum-mode round
	// waits for (ActionWaiting); under secure aggregation Msg is then that
	// entry, re-sent: the aggregator answers it with the earlier round's
	// UPDATE receipt once that round has closed (docs/secagg.md, "FedSplit
	// under secure aggregation").
	Waiting uint64
}

// RoundHandler runs the edge side of a round over an EdgeStore, without any
// networking: Handle turns a validated round announcement into the bytes to
// publish, with every durable effect done by then. It is what Agent runs
// for each announcement, and what tests drive directly.
//
// A RoundHandler is not safe for concurrent use (the Agent calls it from one
// goroutine).
type RoundHandler struct {
	ClientID   string
	InstanceID string // this installation's (storage.Identity), carried by every update
	Federation string
	Store      *storage.EdgeStore
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
	// message as soon as it is encoded (an evaluation before the round's
	// solve starts); they are in Result.Out either way.
	Emit func(Outgoing)
	// Receipted, when set, reports whether the aggregator has receipted
	// this site's statistics or evaluation report of (run, round):
	// Handle then neither computes nor emits it again.
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
	// signed one (docs/secagg.md, "Threat model per mode"): it signs its
	// key advertisements with its client certificate's key and refuses a
	// key list with a key not signed by its site's certificate of the
	// federation CA. Nil (password-only authentication): the
	// honest-but-curious aggregator's model, as before.
	SecAggIdentity *uplink.SecAggIdentity

	site siteCache
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

// Selected reports whether ann selects id: an empty list selects everyone,
// except in an announcement with a private selection, which selects only
// the sites it invites on their receipts topics (HandleInvited).
func Selected(ann *wire.RoundAnnouncement, id string) bool {
	if ann.GetPrivateSelection() {
		return false
	}
	return len(ann.GetSelected()) == 0 || slices.Contains(ann.GetSelected(), id)
}

func bad(round uint64, format string, args ...any) error {
	return fmt.Errorf("%w: round %d: %s", ErrBadAnnouncement, round, fmt.Sprintf(format, args...))
}

// Handle processes one round announcement:
//
//   - an announcement of another aggregator run (run id) than the stored
//     state's: the round state starts over (storage.EdgeStore.StartRun);
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
	if err := ann.Validate(h.Limits); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrBadAnnouncement, err)
	}
	r := ann.Round
	res := Result{Round: r}
	if ann.Federation != h.Federation {
		return res, bad(r, "federation %q, this site belongs to %q", ann.Federation, h.Federation)
	}
	if err := h.startRun(ann); err != nil {
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

// startRun makes the announcement's run the one the round state belongs
// to (storage.EdgeStore.StartRun).
func (h *RoundHandler) startRun(ann *wire.RoundAnnouncement) error {
	if ann.RunId == "" {
		return nil
	}
	run, since, err := h.Store.RunOrder()
	if err != nil {
		return h.diskErr(fmt.Errorf("agent: round %d: storage: start run: %w", ann.Round, err))
	}
	if leftRun(run, since, ann) {
		// The session drops these; one that got here anyway (a race
		// with the run's start) must not reset the round state either.
		return bad(ann.Round, "run %s was announced at %d ms, before run %s this site is in (since %d ms): a run it has left", ann.RunId, ann.CreatedAtUnixMs, run, since)
	}
	rs, err := h.Store.StartRunAt(ann.RunId, ann.CreatedAtUnixMs)
	if err != nil {
		return h.diskErr(fmt.Errorf("agent: round %d: %w", ann.Round, err))
	}
	if rs.Reset {
		// Only the aggregator may publish on the round topic (the
		// broker's ACL), so a new run id is its word: its round log is
		// new and its rounds start over.
		h.log().Warn("the aggregator started a new run: this site's round state starts over",
			"run_id", ann.RunId, "previous_run_id", rs.Previous, "round", ann.Round, "unreceipted_updates_dropped", rs.Dropped)
	}
	return nil
}

// train is a training round over d (the site's training data): not
// selected, already applied, or solved and committed (see Handle).
func (h *RoundHandler) train(ctx context.Context, ann *wire.RoundAnnouncement, d model.Data, res Result, invited bool) (Result, error) {
	r := ann.Round
	if !Selected(ann, h.ClientID) && !(invited && ann.GetPrivateSelection()) {
		if err := h.Store.SetSeenRound(r); err != nil && !errors.Is(err, storage.ErrStale) {
			return res, h.diskErr(fmt.Errorf("agent: round %d: %w", r, err))
		}
		res.Action = ActionNotSelected
		return res, nil
	}
	applied, err := h.Store.AppliedRound()
	if err != nil {
		return res, h.diskErr(fmt.Errorf("agent: round %d: %w", r, err))
	}
	if r <= applied {
		if ann.Secagg != nil {
			return h.secAggPhase(ann, res)
		}
		return h.resend(res)
	}
	if ann.Secagg != nil && ann.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_ADVERTISE {
		// The session's keys were advertised without this site: it
		// cannot join until the next round (or session).
		res.Action = ActionDone
		return res, nil
	}
	if sumMode(ann) {
		if w, msg, err := h.waitingFor(r); err != nil {
			return res, h.diskErr(fmt.Errorf("agent: round %d: %w", r, err))
		} else if w > 0 {
			res.Action, res.Waiting = ActionWaiting, w
			if secAggKindOf(msg) != 0 {
				res.Msg = msg
			}
			return res, nil
		}
	}

	p, err := h.prepare(ann, d)
	if err != nil {
		return res, err
	}
	if err := h.Store.SetGlobal(r, p.x); err != nil {
		if errors.Is(err, storage.ErrStale) {
			res.Action = ActionStale
			return res, nil
		}
		return res, h.diskErr(fmt.Errorf("agent: round %d: %w", r, err))
	}

	sent, rep, stop, err := h.solve(ctx, p)
	if err != nil {
		return res, err
	}
	if ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrPreempted) {
		return res, fmt.Errorf("agent: round %d aborted, nothing committed: %w", r, context.Cause(ctx))
	}
	if ann.Secagg != nil {
		res.Report = rep
		return h.secAggCommit(ann, p, sent, res)
	}

	return h.commitUpdate(ann, p, d, sent, rep, stop, res)
}

// commitUpdate encodes the solved round's update (the uplink's rules, the
// work report, the clip bit) and commits it with its outbox entry: after
// this the update survives any crash and is published (ARCHITECTURE.md,
// "Commit, then publish, at the edge").
func (h *RoundHandler) commitUpdate(ann *wire.RoundAnnouncement, p *prepared, d model.Data, sent []float64, rep proxsolver.Report, stop wire.StopReason, res Result) (Result, error) {
	r := ann.Round
	up, err := h.uplink(p, sent)
	if err != nil {
		return res, err
	}
	u := &wire.ClientUpdate{
		ClientId:     h.ClientID,
		Round:        r,
		Kind:         up.Kind,
		BaseRound:    up.BaseRound,
		Vector:       &wire.Vector{Codec: p.codec.String(), Dimension: uint32(len(sent)), Payload: up.Payload},
		SampleCount:  claimedSamples(uint64(d.N)),
		Report:       workReport(rep, stop, p.work.Solver.Gamma, p.clip > 0),
		SentAtUnixMs: h.clock().Now().UnixMilli(),
		Seq:          r,
		InstanceId:   h.InstanceID,
	}
	if s := ann.AnchorSketch; s != nil {
		u.AnchorGrad = h.anchorGrad(r, rep.AnchorGrad, s)
	}
	if ann.GetDp().GetAdaptive() != nil && !up.Clipped.Clipped {
		u.ClipBit = 1 // adaptive clipping: the norm was within the clip norm
	}
	msg, err := wire.Encode(u)
	if err != nil {
		return res, fmt.Errorf("agent: round %d: encode update: %w", r, err)
	}
	if lim := h.Limits.MaxMessageBytes; lim > 0 && len(msg) > lim {
		return res, fmt.Errorf("agent: round %d: update is %d bytes, over the %d-byte message limit", r, len(msg), lim)
	}
	c := storage.Commit{Round: r, Residual: up.Residual, Msg: msg}
	switch {
	case p.sum:
		c.Z, c.Pending = sent, &storage.SumPending{Join: up.Sum.Join, V: up.Sum.V}
	case p.split:
		c.Z, c.ServerZ = sent, up.Applied
	}
	if err := h.Store.Commit(c); err != nil {
		if errors.Is(err, storage.ErrAlreadyApplied) {
			return h.resend(res)
		}
		return res, h.diskErr(fmt.Errorf("agent: round %d: %w", r, err))
	}
	res.Action, res.Msg, res.Update, res.Sent, res.Report = ActionSolved, msg, u, up.Applied, rep
	if up.Sum != nil {
		res.Sent = up.Sum.V
	}
	res.Healthy = true
	return res, nil
}

// uplink encodes the round's result as a delta (package uplink;
// ARCHITECTURE.md, Uplink encoding), with what the store holds: the
// error-feedback residual (FedProx family, lossy codecs) or this site's
// record of the aggregator's copy of z_j (FedSplit).
func (h *RoundHandler) uplink(p *prepared, sent []float64) (uplink.Frame, error) {
	if p.sum {
		return h.sumUplink(p, sent)
	}
	r := p.round
	u := uplink.Update{Split: p.split, Round: r, Sent: sent, Global: p.x, Clip: p.clip, Tamper: poison}
	if p.split {
		br, zs, err := h.Store.ServerZ()
		switch {
		case err == nil:
			u.Copy = &uplink.Copy{Round: br, Z: zs}
		case !errors.Is(err, storage.ErrNotFound):
			return uplink.Frame{}, fmt.Errorf("agent: round %d: %w", r, err)
		}
	} else if !p.codec.Lossless() {
		old, err := h.Store.Residual(storage.ResidualUplink)
		switch {
		case err == nil:
			u.Residual = old // of another model: none (uplink.Encode)
		case !errors.Is(err, storage.ErrNotFound):
			return uplink.Frame{}, fmt.Errorf("agent: round %d: %w", r, err)
		}
	}
	f, err := uplink.Encode(p.codec, u, h.rng(r, streams.SiteCodec))
	if err != nil {
		return f, fmt.Errorf("agent: round %d: %w", r, err)
	}
	if f.CopyUnused {
		h.log().Warn("the stored copy of the aggregator's z does not fit this round; sending a delta against the global model", "round", r, "copy_round", u.Copy.Round, "len", len(u.Copy.Z))
	}
	return f, nil
}

// rng is the random stream of one round (streams.Site): seeded by Seed, the
// client id (so that sites with the same Seed still draw independently:
// QSGD's noise must not be correlated across clients), the round and the
// stream.
func (h *RoundHandler) rng(round uint64, s streams.SiteStream) *rand.Rand {
	return streams.Site(h.Seed, h.ClientID, round, s)
}

// resend looks for the outbox entry of an applied round.
func (h *RoundHandler) resend(res Result) (Result, error) {
	out, err := h.Store.Outbox()
	if err != nil {
		return res, fmt.Errorf("agent: round %d: %w", res.Round, err)
	}
	for _, e := range out {
		if e.Round == res.Round {
			res.Action, res.Msg = ActionResend, e.Msg
			return res, nil
		}
	}
	res.Action = ActionDone
	return res, nil
}

// prepared is a checked announcement, ready to solve.
type prepared struct {
	round  uint64
	data   model.Data // the site's training data
	algo   string
	split  bool
	sum    bool // FedSplit in sum mode (node/agent/sum.go)
	m      model.Model
	x      []float64
	codec  *quant.Codec
	work   round.Work // the solver's configuration and FedSplit's steps
	budget proxsolver.Budget
	sketch bool // the round asks for the anchor gradient
	// clip is the announced DP clip norm (0: no DP): the update is
	// clipped before it is encoded and the loss fields are sent as 0.
	clip float64
	// initial is x_0 under a fixed roster (split_initial; sum.go): the
	// record and z_j a site without a record starts from. nil otherwise.
	initial []float64
}

// prepare checks everything about ann that can be checked before writing:
// nothing it rejects leaves a trace.
func (h *RoundHandler) prepare(ann *wire.RoundAnnouncement, d model.Data) (*prepared, error) {
	r := ann.Round
	p := &prepared{round: r, algo: ann.Algorithm, data: d}
	p.split = round.IsSplit(ann.Algorithm)
	p.sum = sumMode(ann)

	spec, err := modelSpec(ann.Model)
	if err != nil {
		return nil, bad(r, "%v", err)
	}
	if p.m, err = model.New(spec); err != nil {
		return nil, bad(r, "%v", err)
	}
	if err := model.CheckTargets(spec, d); err != nil {
		return nil, bad(r, "this site's data do not fit the announced model: %v", err)
	}
	dim := p.m.NumParams()
	if int64(ann.Global.Dimension) != int64(dim) {
		return nil, bad(r, "global model has dimension %d, the %s model has %d parameters", ann.Global.Dimension, spec.Kind, dim)
	}
	if p.codec, err = quant.ParseWithLimits(ann.UplinkCodec, quant.Limits{MaxDim: dim}); err != nil {
		return nil, bad(r, "uplink codec: %v", err)
	}
	if p.codec.MinDim() > dim {
		return nil, bad(r, "uplink codec %s covers %d parameters, the %s model has %d", p.codec, p.codec.MinDim(), spec.Kind, dim)
	}
	info, err := quant.Inspect(ann.Global.Payload)
	if err != nil {
		return nil, bad(r, "global model frame: %v", err)
	}
	if info.Dim != dim {
		return nil, bad(r, "global model frame has dimension %d, want %d", info.Dim, dim)
	}
	if p.x, err = p.codec.Decode(ann.Global.Payload, nil); err != nil {
		return nil, bad(r, "global model frame: %v", err)
	}
	if len(p.x) != dim { // Inspect and Decode agree; belt and braces
		return nil, bad(r, "global model decodes to %d values, want %d", len(p.x), dim)
	}

	if p.work, err = h.work(ann, d.N); err != nil {
		return nil, bad(r, "%v", err)
	}
	if p.clip, err = dpClip(ann, p.split && !p.sum); err != nil {
		return nil, bad(r, "%v", err)
	}
	if p.sum {
		if p.initial, err = sumInitial(ann, p.codec, dim); err != nil {
			return nil, bad(r, "%v", err)
		}
	}
	if err := secAggRefusals(ann, p.split); err != nil {
		return nil, bad(r, "%v", err)
	}
	p.budget = h.budget(ann)
	p.sketch = ann.AnchorSketch != nil
	if err := p.budget.Validate(); err != nil {
		return nil, bad(r, "%v", err)
	}
	return p, nil
}

// modelSpec converts the announced model. The wire form allows several
// hidden layers; the models have at most one.
func modelSpec(s *wire.ModelSpec) (model.Spec, error) {
	if s == nil {
		return model.Spec{}, errors.New("no model")
	}
	kind := s.Kind
	switch kind { // the wire schema's comment spells two kinds differently
	case "binlogreg":
		kind = model.KindBinaryLogReg
	case "linreg":
		kind = model.KindLinear
	}
	if int64(s.Inputs) > model.MaxParams || int64(s.Classes) > model.MaxParams {
		return model.Spec{}, fmt.Errorf("model %s: %d inputs, %d classes: beyond %d parameters", kind, s.Inputs, s.Classes, model.MaxParams)
	}
	spec := model.Spec{Kind: kind, Inputs: int(s.Inputs), Classes: int(s.Classes), Activation: s.Activation, L2: s.L2}
	switch len(s.Hidden) {
	case 0:
	case 1:
		if int64(s.Hidden[0]) > model.MaxParams {
			return model.Spec{}, fmt.Errorf("model %s: %d hidden units", kind, s.Hidden[0])
		}
		spec.Hidden = int(s.Hidden[0])
	default:
		return model.Spec{}, fmt.Errorf("model %s: %d hidden layers, this agent supports one", kind, len(s.Hidden))
	}
	return spec, nil
}

// work resolves the round's training parameters for this site's samples
// (round.Prepare: the one check and the one rule of the sites and
// simulate) with the device's overrides of the solver, the learning rate
// and the batch.
func (h *RoundHandler) work(ann *wire.RoundAnnouncement, samples int) (round.Work, error) {
	p, pop := round.FromWire(ann)
	return round.Prepare(ann.Algorithm, p, pop, round.Params{Solver: h.Local.Solver, LR: h.Local.LR, Batch: h.Local.Batch}, samples)
}

// budget is min(device budget, round budget) and the round's deadline less
// the margin, all read through the clock. A solve nothing limits gets
// Local.FallbackSeconds.
func (h *RoundHandler) budget(ann *wire.RoundAnnouncement) proxsolver.Budget {
	loc := h.Local.withDefaults()
	b := proxsolver.Budget{Clock: h.clock()}
	minPos := func(a, c int) int {
		switch {
		case a <= 0:
			return c
		case c <= 0:
			return a
		}
		return min(a, c)
	}
	rb := ann.Budget
	b.MaxEpochs = minPos(loc.MaxEpochs, int(min(rb.GetMaxEpochs(), math.MaxInt32)))
	b.MaxGradEvals = int(min(rb.GetMaxGradEvals(), math.MaxInt32))
	secs := loc.MaxSeconds
	if rs := rb.GetMaxSeconds(); rs > 0 && (secs <= 0 || rs < secs) {
		secs = rs
	}
	now := b.Clock.Now()
	var deadline time.Time
	if secs > 0 {
		deadline = now.Add(seconds(secs))
	}
	if ms := ann.DeadlineUnixMs; ms > 0 {
		d := time.UnixMilli(ms).Add(-loc.DeadlineMargin)
		if deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	if deadline.IsZero() && b.MaxEpochs == 0 && b.MaxGradEvals == 0 {
		deadline = now.Add(seconds(loc.FallbackSeconds))
	}
	b.Deadline = deadline
	return b
}

// seconds converts to a Duration, saturating instead of overflowing.
func seconds(s float64) time.Duration {
	const maxSecs = math.MaxInt64/int64(time.Second) - 1
	if s >= float64(maxSecs) {
		return time.Duration(maxSecs) * time.Second
	}
	return time.Duration(s * float64(time.Second))
}

// solve runs the local work of the round and returns the vector to send
// (w, or FedSplit's new z_j), the report and the stop reason.
func (h *RoundHandler) solve(ctx context.Context, p *prepared) ([]float64, proxsolver.Report, wire.StopReason, error) {
	rng := h.rng(p.round, streams.SiteSolve)
	lg := h.log().With("round", p.round, "algorithm", p.algo, "solver", p.work.Solver.Solver)
	var z []float64
	if p.split {
		z0 := p.x // z_j starts at the first global model the site sees
		if p.initial != nil {
			z0 = p.initial // or at x_0, where a fixed roster counts it from
		}
		if _, err := h.Store.InitZ(p.round, z0); err != nil {
			return nil, proxsolver.Report{}, 0, h.diskErr(fmt.Errorf("agent: round %d: %w", p.round, err))
		}
		var err error
		if _, z, err = h.Store.Z(); err != nil {
			return nil, proxsolver.Report{}, 0, h.diskErr(fmt.Errorf("agent: round %d: %w", p.round, err))
		}
		if len(z) != len(p.x) {
			return nil, proxsolver.Report{}, 0, fmt.Errorf("agent: round %d: the stored FedSplit z has dimension %d but the model has %d: the federation changed its model; this site's state file %s belongs to the old one",
				p.round, len(z), len(p.x), h.Store.Path())
		}
	}
	res, err := p.work.Solve(ctx, p.m, p.data, p.x, z, p.budget, rng, p.sketch)
	if err != nil {
		return nil, res.Report, 0, solveErr(ctx, fmt.Errorf("agent: round %d: %w", p.round, err))
	}
	if res.Diverged != nil {
		// No step is taken: the received model (FedProx family) or z_j
		// (FedSplit) is sent, and kept, unchanged, with stop reason ERROR.
		lg.Error("local solve diverged; sending the received model or z unchanged", "err", res.Diverged)
		return res.Vec, res.Report, wire.StopReason_STOP_REASON_ERROR, nil
	}
	return res.Vec, res.Report, stopReason(res.Report.Stop), nil
}

func stopReason(stop string) wire.StopReason {
	switch stop {
	case proxsolver.StopGamma, proxsolver.StopConverged:
		return wire.StopReason_STOP_REASON_GAMMA_REACHED
	case proxsolver.StopEpochs:
		return wire.StopReason_STOP_REASON_MAX_EPOCHS
	case proxsolver.StopGradEvals:
		return wire.StopReason_STOP_REASON_MAX_GRAD_EVALS
	case proxsolver.StopDeadline:
		return wire.StopReason_STOP_REASON_DEADLINE
	case proxsolver.StopCanceled:
		return wire.StopReason_STOP_REASON_SIGNAL
	}
	return wire.StopReason_STOP_REASON_UNSPECIFIED // stalled: no wire code for it
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

// workReport fills the wire report from the solver's. Non-finite values
// (only after a divergence) are sent as 0.
func workReport(rep proxsolver.Report, stop wire.StopReason, target float64, private bool) *wire.WorkReport {
	fin := func(x float64) float64 {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return 0
		}
		return x
	}
	partial := false
	switch stop {
	case wire.StopReason_STOP_REASON_MAX_EPOCHS, wire.StopReason_STOP_REASON_MAX_GRAD_EVALS,
		wire.StopReason_STOP_REASON_DEADLINE, wire.StopReason_STOP_REASON_SIGNAL:
		partial = target > 0
	case wire.StopReason_STOP_REASON_ERROR:
		partial = true
	}
	g := fin(rep.Gamma)
	if g < 0 {
		g = 0
	}
	w := &wire.WorkReport{
		AchievedGamma: g,
		Epochs:        uint64(math.Round(max(fin(rep.Epochs), 0))),
		GradEvals:     uint64(max(rep.GradEvals, 0)),
		Seconds:       max(rep.Elapsed.Seconds(), 0),
		LocalLoss:     fin(rep.Loss),
		AnchorLoss:    fin(rep.AnchorLoss),
		StopReason:    stop,
		Partial:       partial,
	}
	if private {
		// Under DP the losses and the achieved inexactness are computed
		// from the site's data without noise: sent as 0 (docs/privacy.md,
		// "What the guarantee covers").
		w.LocalLoss, w.AnchorLoss, w.AchievedGamma = 0, 0, 0
	}
	return w
}

// dpClip is the clip norm a round's DP parameters ask for (0: none). The
// distributed mode (no secure aggregation yet), the FedSplit family outside
// sum mode (split: the per-site copy of z_j is not privatised) and anchor
// gradients are refused under DP, as the aggregator refuses them.
func dpClip(ann *wire.RoundAnnouncement, split bool) (float64, error) {
	d := ann.GetDp()
	switch {
	case d == nil:
		return 0, nil
	case d.Mode == wire.DPMode_DP_MODE_DISTRIBUTED && ann.Secagg == nil:
		return 0, errors.New("differential privacy in the distributed mode without secure aggregation: refused (the noise shares are only safe inside a secure sum)")
	case d.Mode != wire.DPMode_DP_MODE_CENTRAL && d.Mode != wire.DPMode_DP_MODE_DISTRIBUTED:
		return 0, fmt.Errorf("differential privacy mode %v: unknown to this agent", d.Mode)
	case split:
		return 0, uplink.ErrSplitDP
	case ann.AnchorSketch != nil:
		return 0, errors.New("differential privacy with an anchor gradient: refused (it is neither clipped nor noised)")
	case d.Mode == wire.DPMode_DP_MODE_DISTRIBUTED:
		// The noise share must be fine enough on the announced grid for
		// the shares' sum to be one discrete Gaussian (the check the
		// aggregator makes at start), before anything is solved.
		sp := ann.Secagg
		if d.NoiseShares > sp.Threshold {
			// Every sum holds at least t inputs: shares sized for more than
			// t would leave a sum of t with less than z*C of noise.
			return 0, fmt.Errorf("differential privacy in the distributed mode: the noise is split into %d shares but a sum may hold only the secagg threshold's %d inputs, which would carry less than the announced noise: refused", d.NoiseShares, sp.Threshold)
		}
		q, err := secagg.NewQuantizer(sp.Clip, int(sp.ScaleBits), int(sp.MaxSites))
		if err != nil {
			return 0, fmt.Errorf("secagg: %w", err)
		}
		if err := uplink.CheckSecAggDP(q, d.ClipNorm, d.NoiseMultiplier, int(d.NoiseShares)); err != nil {
			return 0, err
		}
	}
	return d.ClipNorm, nil
}

// anchorGrad is what the round's SketchSpec asks for: the full gradient at
// the anchor (dimension 0) or its random projection. A sketch longer than the
// gradient is refused (it would cost dimension x len(grad) for nothing).
func (h *RoundHandler) anchorGrad(round uint64, g []float64, s *wire.SketchSpec) []float64 {
	for _, v := range g {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
	}
	switch {
	case len(g) == 0:
		return nil
	case s.Dimension == 0:
		return slices.Clone(g)
	case int(s.Dimension) > len(g):
		h.log().Warn("anchor sketch longer than the gradient: not sent", "round", round, "sketch", s.Dimension, "gradient", len(g))
		return nil
	}
	return sketch.Of(g, int(s.Dimension), s.Seed)
}
