package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/proto/round"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// This file is the site core: the rules of a round announcement as a pure
// step, in the manner of etcd's raft. A step takes the event (an
// announcement, a solve's outcome, a record's commit failing) and a
// read-only view of the edge state (StoreView) and returns a plan: the
// records to commit, in order, then either the solve to start or the
// outcome (the update to publish, or nothing). The shell
// (RoundHandler.HandleInvited, which the Agent runs on its solver
// goroutine) carries a plan out in that order, commit before publish, and
// steps the results back in: the state only moves forward, and what a
// step reads is what the previous plans committed. The core opens no
// file, reads no clock (the shell passes the time in) and starts nothing;
// the solve is a job the shell runs (solve), with the context that
// pre-empts it.

// StoreView is what the site core reads of the edge state; it never
// writes it (*edgestore.EdgeStore is one; its tests and fuzzer use an
// in-memory state, core_test.go).
type StoreView interface {
	RunOrder() (id string, since int64, err error)
	AppliedRound() (uint64, error)
	Z() (round uint64, z []float64, err error)
	ServerZ() (round uint64, z []float64, err error)
	Residual(name string) ([]float64, error)
	Contribution() (round uint64, c []float64, err error)
	Outbox() ([]edgestore.OutboxEntry, error)
	Final() (edgestore.Final, error)
	// Secure aggregation's (core_secagg.go): the session's record, a
	// sum-mode round's pending contribution, the distributed-DP noise key.
	SecAgg() ([]byte, error)
	Pending(round uint64) (edgestore.SumPending, bool, error)
	NoiseKey() ([32]byte, error)
	// Path names the state file in errors ("" when unknown).
	Path() string
}

// recordKind is what a record commits.
type recordKind int

const (
	recStartRun recordKind = iota + 1 // the round state belongs to run (since): storage StartRunAt
	recSeen                           // the seen round: storage SetSeenRound
	recGlobal                         // the round's global model vec: storage SetGlobal
	recInitZ                          // FedSplit's initial z vec, if none is stored: storage InitZ
	recCommit                         // the solved round with its outbox entry: storage Commit
	recFinal                          // the run's verified final bundle: storage SetFinal
	recSecAgg                         // the secagg session's record commit.SecAgg with its next message commit.Msg (nil: none): storage SetSecAgg
	recNoiseKey                       // the distributed-DP noise key drawn for the run: storage InitNoiseKey
)

// change is one record the core decides to make durable; the shell
// commits each in one transaction, in the plan's order.
type change struct {
	kind   recordKind
	round  uint64
	run    string
	since  int64
	vec    []float64
	commit edgestore.Commit
	final  edgestore.Final
	key    [32]byte
}

// plan is what one step of the core decides. The shell commits records in
// order; then, if solve is set, it runs that solve and steps its outcome
// in (siteRules.solved); otherwise res and err are the outcome (the
// session publishes res.Msg). When a record fails to commit, the core
// decides what that means from base (siteRules.commitFailed).
type plan struct {
	records []change
	solve   *prepared
	// bundle is the final bundle to write to model_out once the records
	// are committed; restore a stored one to make sure of on disk;
	// finalEval: the run finished without its bundle yet and asks for the
	// final evaluation (the shell reads the site's held-out rows).
	bundle    []byte
	restore   *edgestore.Final
	finalEval bool
	res, base Result
	err       error
}

// solveOutcome is what the shell's solve returns, stepped into
// siteRules.solved.
type solveOutcome struct {
	sent []float64
	rep  proxsolver.Report
	stop wire.StopReason
}

// siteRules is the core's configuration: who the site is and what its
// device allows. RoundHandler.rules makes it from the handler's fields.
type siteRules struct {
	ClientID   string
	InstanceID string
	Federation string
	Local      Local
	Limits     wire.Limits
	Seed       uint64
	Log        *slog.Logger
	// Clock is the clock a solve's budget counts its deadline on; the
	// core hands it to the solver and never reads it (the shell passes
	// the time into a step).
	Clock clock.Clock
	// SecAgg is secure aggregation's randomness and signing identity,
	// the shell's (secagg.go).
	SecAgg secAggConfig
}

func (sr *siteRules) log() *slog.Logger {
	if sr.Log == nil {
		return slog.Default()
	}
	return sr.Log
}

// rng is the random stream of one round (streams.Site): seeded by Seed, the
// client id (so that sites with the same Seed still draw independently:
// QSGD's noise must not be correlated across clients), the round and the
// stream.
func (sr *siteRules) rng(r uint64, s streams.SiteStream) *rand.Rand {
	return round.Rand(sr.Seed, sr.ClientID, r, s)
}

// diskErrAt is a site error "disk" for a failure of the state file v.
func diskErrAt(v StoreView, err error) error {
	if errors.Is(err, storage.ErrCorrupt) {
		return err // a damaged state file stops the agent (failIfDamaged)
	}
	file := v.Path()
	if file == "" {
		file = "state file" // closed under us: bbolt forgets the path
	}
	return sitedata.NewError(sitedata.ReasonDisk, file, err)
}

// begin checks an announcement before anything else and returns the
// record that makes its run the one the round state belongs to (storage
// StartRunAt, a no-op for the run the state belongs to; none for an
// announcement without a run id), with the result so far. An announcement
// of a run this site has left is refused.
func (sr *siteRules) begin(v StoreView, ann *wire.RoundAnnouncement) (Result, []change, error) {
	if err := ann.Validate(sr.Limits); err != nil {
		return Result{}, nil, fmt.Errorf("%w: %w", ErrBadAnnouncement, err)
	}
	res := Result{Round: ann.Round}
	if ann.Federation != sr.Federation {
		return res, nil, bad(ann.Round, "federation %q, this site belongs to %q", ann.Federation, sr.Federation)
	}
	if ann.RunId == "" {
		return res, nil, nil
	}
	run, since, err := v.RunOrder()
	if err != nil {
		return res, nil, diskErrAt(v, fmt.Errorf("agent: round %d: storage: start run: %w", ann.Round, err))
	}
	if leftRun(run, since, ann) {
		// The session drops these; one that got here anyway (a race
		// with the run's start) must not reset the round state either.
		return res, nil, bad(ann.Round, "run %s was announced at %d ms, before run %s this site is in (since %d ms): a run it has left", ann.RunId, ann.CreatedAtUnixMs, run, since)
	}
	return res, []change{{kind: recStartRun, round: ann.Round, run: ann.RunId, since: ann.CreatedAtUnixMs}}, nil
}

// round is the step of a training round over d (the site's training data):
// not selected (record the seen round), already applied (re-send its
// outbox entry, or the secure-aggregation phase), waiting (sum mode), or
// checked and ready: record the global model (and FedSplit's initial z)
// and start the solve. Nothing it refuses leaves a record.
func (sr *siteRules) round(v StoreView, ann *wire.RoundAnnouncement, d model.Data, invited bool, now time.Time, res Result) *plan {
	r := ann.Round
	fail := func(err error) *plan { return &plan{res: res, err: err} }
	if !Selected(ann, sr.ClientID) && !(invited && ann.GetPrivateSelection()) {
		pl := &plan{records: []change{{kind: recSeen, round: r}}, res: res, base: res}
		pl.res.Action = ActionNotSelected
		return pl
	}
	applied, err := v.AppliedRound()
	if err != nil {
		return fail(diskErrAt(v, roundErr(r, err)))
	}
	if r <= applied {
		if ann.Secagg != nil {
			return sr.secAggPhase(v, ann, now, res)
		}
		res, err := sr.resend(v, res)
		return &plan{res: res, err: err}
	}
	if ann.Secagg != nil && ann.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_ADVERTISE {
		// The session's keys were advertised without this site: it
		// cannot join until the next round (or session).
		res.Action = ActionDone
		return &plan{res: res}
	}
	if sumMode(ann) || ann.Algorithm == AlgoScaffold {
		if w, msg, err := waitingFor(v, r); err != nil {
			return fail(diskErrAt(v, roundErr(r, err)))
		} else if w > 0 {
			res.Action, res.Waiting = ActionWaiting, w
			if secAggKindOf(msg) != 0 {
				res.Msg = msg
			}
			return &plan{res: res}
		}
	}
	p, err := sr.prepare(ann, d, now)
	if err != nil {
		return fail(err)
	}
	if p.scaffold {
		if err := scaffoldLoad(v, p); err != nil {
			return fail(diskErrAt(v, roundErr(r, err)))
		}
	}
	if err := contrastModel(v, p); err != nil {
		return fail(err)
	}
	pl := &plan{records: []change{{kind: recGlobal, round: r, vec: p.x}}, solve: p, res: res, base: res}
	if p.split {
		z0 := p.x // z_j starts at the first global model the site sees
		if p.initial != nil {
			z0 = p.initial // or at x_0, where a fixed roster counts it from
		}
		switch _, z, err := v.Z(); {
		case errors.Is(err, storage.ErrNotFound):
			p.z = z0
			pl.records = append(pl.records, change{kind: recInitZ, round: r, vec: z0})
		case err != nil:
			return fail(diskErrAt(v, roundErr(r, err)))
		case len(z) != len(p.x):
			return fail(fmt.Errorf("agent: round %d: the stored FedSplit z has dimension %d but the model has %d: the federation changed its model; this site's state file %s belongs to the old one",
				r, len(z), len(p.x), v.Path()))
		default:
			p.z = z
		}
	}
	return pl
}

// commitFailed is the step of a record the store refused: a seen round
// older than one recorded is no matter, a global model older than the
// stored one makes the announcement stale, an update of a round already
// applied (another announcement's solve committed it first) is re-sent
// from the outbox; anything else is a disk error.
// It returns the outcome, and whether the plan stops there (false: go
// on with the next record).
func (sr *siteRules) commitFailed(v StoreView, rec change, err error, base Result) (Result, bool, error) {
	switch {
	case rec.kind == recSeen && errors.Is(err, storage.ErrStale):
		return base, false, nil
	case rec.kind == recGlobal && errors.Is(err, storage.ErrStale):
		base.Action = ActionStale
		return base, true, nil
	case rec.kind == recCommit && errors.Is(err, storage.ErrAlreadyApplied):
		res, err := sr.resend(v, base)
		return res, true, err
	case rec.kind == recFinal:
		return base, true, diskErrAt(v, err)
	}
	return base, true, diskErrAt(v, roundErr(rec.round, err))
}

// waitingFor is the round of an unreceipted update older than round in the
// outbox and its entry (0: none): a sum-mode or SCAFFOLD site answers round
// only after that update's receipt (sum.go, scaffold.go).
func waitingFor(v StoreView, round uint64) (uint64, []byte, error) {
	out, err := v.Outbox()
	if err != nil {
		return 0, nil, err
	}
	for _, e := range out {
		if e.Round < round {
			return e.Round, e.Msg, nil
		}
	}
	return 0, nil, nil
}

// solved is the step of a finished solve: it encodes the round's update
// (the uplink's rules, the work report, the clip bit) and returns the
// commit of the update with its outbox entry, and the update to publish
// once that commit is done: after it the update survives any crash
// (ARCHITECTURE.md, "Commit, then publish, at the edge"). now is the
// update's timestamp. Under secure aggregation the update is the session's
// input instead (secAggSolved).
func (sr *siteRules) solved(v StoreView, ann *wire.RoundAnnouncement, p *prepared, o solveOutcome, now time.Time, res Result) *plan {
	if ann.Secagg != nil {
		return sr.secAggSolved(v, ann, p, o, now, res)
	}
	r := ann.Round
	d, sent, rep, stop := p.data, o.sent, o.rep, o.stop
	rng := sr.rng(r, streams.SiteCodec)
	up, err := sr.uplink(v, p, sent, rng)
	if err != nil {
		return &plan{res: res, err: err}
	}
	var control *wire.Vector
	var ci []float64
	if p.scaffold {
		if control, ci, err = scaffoldUplink(p, sent, rep.Steps, rng); err != nil {
			return &plan{res: res, err: roundErr(r, err)}
		}
	}
	u := &wire.ClientUpdate{
		ClientId:     sr.ClientID,
		Round:        r,
		Kind:         up.Kind,
		BaseRound:    up.BaseRound,
		Vector:       &wire.Vector{Codec: p.task.CodecName, Dimension: uint32(len(sent)), Payload: up.Payload},
		SampleCount:  claimedSamples(uint64(d.N)),
		Report:       workReport(rep, stop, p.work.Solver.Gamma, p.clip > 0),
		SentAtUnixMs: now.UnixMilli(),
		Seq:          r,
		InstanceId:   sr.InstanceID,
		ControlDelta: control,
	}
	if p.scaffold {
		u.RunId = ann.RunId // its delta c belongs to this run's c_i
	}
	if s := ann.AnchorSketch; s != nil {
		u.AnchorGrad = sr.anchorGrad(r, rep.AnchorGrad, s)
	}
	if ann.GetDp().GetAdaptive() != nil && !up.Clipped.Clipped {
		u.ClipBit = 1 // adaptive clipping: the norm was within the clip norm
	}
	msg, err := wire.Encode(u)
	if err != nil {
		return &plan{res: res, err: fmt.Errorf("agent: round %d: encode update: %w", r, err)}
	}
	if lim := sr.Limits.MaxMessageBytes; lim > 0 && len(msg) > lim {
		return &plan{res: res, err: fmt.Errorf("agent: round %d: update is %d bytes, over the %d-byte message limit", r, len(msg), lim)}
	}
	c := edgestore.Commit{Round: r, Residual: up.Residual, Control: ci, Msg: msg}
	if p.scaffold {
		c.ControlUndo = scaffoldUndo(p, len(ci))
	}
	switch {
	case p.sum:
		c.Z, c.Pending = sent, &edgestore.SumPending{Join: up.Sum.Join, V: up.Sum.V}
	case p.split:
		c.Z, c.ServerZ = sent, up.Applied
	case p.contrast.Kind != "":
		c.Local = sent // the next round's previous local model
	}
	pl := &plan{records: []change{{kind: recCommit, round: r, commit: c}}, base: res, res: res}
	pl.res.Action, pl.res.Msg, pl.res.Update, pl.res.Sent, pl.res.Report = ActionSolved, msg, u, up.Applied, rep
	if up.Sum != nil {
		pl.res.Sent = up.Sum.V
	}
	pl.res.Healthy = true
	return pl
}

// uplink encodes the round's result as a delta (package uplink;
// ARCHITECTURE.md, Uplink encoding), with what the store holds: the
// error-feedback residual (FedProx family, lossy codecs) or this site's
// record of the aggregator's copy of z_j (FedSplit).
func (sr *siteRules) uplink(v StoreView, p *prepared, sent []float64, rng *rand.Rand) (uplink.Frame, error) {
	if p.sum {
		return sr.sumUplink(v, p, sent, rng)
	}
	r := p.round
	u := uplink.Update{Split: p.split, Round: r, Sent: sent, Global: p.x, Clip: p.clip, Tamper: poison}
	if p.split {
		br, zs, err := v.ServerZ()
		switch {
		case err == nil:
			u.Copy = &uplink.Copy{Round: br, Z: zs}
		case !errors.Is(err, storage.ErrNotFound):
			return uplink.Frame{}, roundErr(r, err)
		}
	} else if !p.task.Lossless {
		old, err := v.Residual(edgestore.ResidualUplink)
		switch {
		case err == nil:
			u.Residual = old // of another model: none (uplink.Encode)
		case !errors.Is(err, storage.ErrNotFound):
			return uplink.Frame{}, roundErr(r, err)
		}
	}
	f, err := p.task.Encode(u, rng)
	if err != nil {
		return f, roundErr(r, err)
	}
	if f.CopyUnused {
		sr.log().Warn("the stored copy of the aggregator's z does not fit this round; sending a delta against the global model", "round", r, "copy_round", u.Copy.Round, "len", len(u.Copy.Z))
	}
	return f, nil
}

// resend looks for the outbox entry of an applied round.
func (sr *siteRules) resend(v StoreView, res Result) (Result, error) {
	out, err := v.Outbox()
	if err != nil {
		return res, roundErr(res.Round, err)
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
	task   *round.Task // the checked announcement (round.Open: model, x, codec, work)
	work   round.Work  // the solver's configuration and FedSplit's steps (round.Prepare)
	budget proxsolver.Budget
	sketch bool // the round asks for the anchor gradient
	// clip is the announced DP clip norm (0: no DP): the update is
	// clipped before it is encoded and the loss fields are sent as 0.
	clip float64
	// initial is x_0 under a fixed roster (split_initial; sum.go): the
	// record and z_j a site without a record starts from. nil otherwise.
	initial []float64
	// z is FedSplit's z_j the client step starts from: the stored one, or
	// the initial z the round's records commit (recInitZ).
	z []float64
	// SCAFFOLD (scaffold.go): the announced c and the stored c_i (nil:
	// zero).
	scaffold    bool
	control, ci []float64
	// epochRound: SCAFFOLD's round E after a rollback (control_epoch =
	// round): c_i counts as zero and the site keeps zero (scaffold.go).
	epochRound bool
	// contrast is the contrastive objective of MOON and FedSiam-DA (Kind
	// "": none); m is then that objective over the stored previous local
	// model (contrastModel), and the commit stores the new one.
	contrast model.ContrastConfig
}

// prepare checks everything about ann that can be checked before writing:
// nothing it rejects leaves a trace.
func (sr *siteRules) prepare(ann *wire.RoundAnnouncement, d model.Data, now time.Time) (*prepared, error) {
	r := ann.Round
	p := &prepared{round: r, algo: ann.Algorithm, data: d}
	p.split = round.IsSplit(ann.Algorithm)
	p.sum = sumMode(ann)

	t, err := round.Open(ann, d, round.Params{Solver: sr.Local.Solver, LR: sr.Local.LR, Batch: sr.Local.Batch})
	if err != nil {
		return nil, bad(r, "%v", err)
	}
	p.task, p.m, p.x, p.codec, p.work = &t, t.Model, t.X, t.Codec, t.Work
	dim := len(p.x)
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
	if ann.Algorithm == AlgoScaffold {
		if err := scaffoldPrepare(ann, p); err != nil {
			return nil, bad(r, "%v", err)
		}
	}
	if err := contrastConfig(ann, p); err != nil {
		return nil, bad(r, "%v", err)
	}
	p.budget = sr.budget(ann, now)
	p.sketch = ann.AnchorSketch != nil
	if err := round.CheckBudget(p.budget); err != nil {
		return nil, bad(r, "%v", err)
	}
	return p, nil
}

// work resolves the round's training parameters for this site's samples
// (round.Prepare: the one check and the one rule of the sites and
// simulate) with the device's overrides of the solver, the learning rate
// and the batch.
func (sr *siteRules) work(ann *wire.RoundAnnouncement, samples int) (round.Work, error) {
	p, pop := round.FromWire(ann)
	return round.Prepare(ann.Algorithm, p, pop, round.Params{Solver: sr.Local.Solver, LR: sr.Local.LR, Batch: sr.Local.Batch}, samples)
}

// budget is min(device budget, round budget) and the round's deadline less
// the margin, counted from now. A solve nothing limits gets
// Local.FallbackSeconds.
func (sr *siteRules) budget(ann *wire.RoundAnnouncement, now time.Time) proxsolver.Budget {
	loc := sr.Local.withDefaults()
	b := proxsolver.Budget{Clock: sr.Clock}
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

// finish is the step of the run's end (PHASE_FINISHED): without a schema
// there is nothing to store; a bundle stored before for this run (a
// re-delivered announcement) is only made sure of on disk; without the
// bundle yet the site waits (and evaluates, when asked); the bundle is
// verified (bundle.Unmarshal checks its digest; the federation's schema,
// the run) before the plan stores it and writes it to model_out.
func (sr *siteRules) finish(v StoreView, ann *wire.RoundAnnouncement, res Result) *plan {
	if len(ann.GetSchema()) == 0 {
		res.Action = ActionFinished // nothing to store: no bundle without a schema
		return &plan{res: res}
	}
	if f, err := v.Final(); err == nil && f.RunID == ann.RunId {
		done := res
		done.Action, done.Final = ActionDone, &f
		return &plan{restore: &f, res: done, base: res}
	} else if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return &plan{res: res, err: diskErrAt(v, err)}
	}
	raw := ann.GetBundle()
	if len(raw) == 0 {
		res.Action = ActionFinishing
		return &plan{res: res, finalEval: ann.GetEvaluate()}
	}
	b, err := bundle.Unmarshal(raw)
	if err != nil {
		return &plan{res: res, err: badTransform("final model bundle", err)}
	}
	s, err := schema.Parse(ann.GetSchema())
	if err != nil {
		return &plan{res: res, err: badTransform("schema", err)}
	}
	if got, want := b.Schema.Digest(), s.Digest(); got != want {
		return &plan{res: res, err: badTransform("final model bundle", fmt.Errorf("its schema %.12s is not the federation's %.12s", got, want))}
	}
	if id := b.Provenance.RunID; id != "" && ann.RunId != "" && id != ann.RunId {
		return &plan{res: res, err: badTransform("final model bundle", fmt.Errorf("it is of run %s, the announcement of run %s", id, ann.RunId))}
	}
	f := edgestore.Final{RunID: ann.RunId, Round: ann.Round, Digest: b.Digest, Bundle: slices.Clone(raw)}
	pl := &plan{records: []change{{kind: recFinal, round: ann.Round, final: f}}, bundle: raw, res: res, base: res}
	pl.res.Action, pl.res.Final, pl.res.Healthy = ActionFinished, &f, true
	return pl
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
			return 0, fmt.Errorf("differential privacy in the distributed mode: %d noise shares, but a sum may hold only the secagg threshold's %d inputs, too little noise: refused", d.NoiseShares, sp.Threshold)
		}
		q, err := secagg.NewQuantizer(sp.Clip, int(sp.ScaleBits), int(sp.MaxSites))
		if err != nil {
			return 0, wrap("secagg", err)
		}
		if err := uplink.CheckSecAggDP(q, d.ClipNorm, d.NoiseMultiplier, int(d.NoiseShares)); err != nil {
			return 0, err
		}
	}
	return d.ClipNorm, nil
}

// anchorGrad is what the round's SketchSpec asks for (round.AnchorGrad);
// a sketch longer than the gradient is not sent, with a warning.
func (sr *siteRules) anchorGrad(r uint64, g []float64, s *wire.SketchSpec) []float64 {
	v, long := round.AnchorGrad(g, s)
	if long {
		sr.log().Warn("anchor sketch longer than the gradient: not sent", "round", r, "sketch", s.Dimension, "gradient", len(g))
	}
	return v
}

// statisticsRefused refuses the statistics phase of a schema that
// declares its preprocessing: there is nothing to fit, and a --dp run
// relies on no statistics being sent (docs/privacy.md, "Preprocessing
// under DP").
func statisticsRefused(s *schema.Schema) error {
	if s.Declared() {
		return badTransform("statistics phase", errors.New("the schema declares its preprocessing: this site sends no statistics"))
	}
	return nil
}

// statistics is the step of the statistics phase over the site's data
// read by s: the site's SiteStatistics, in Result.Out, unless the
// aggregator has receipted them (done). now is their timestamp.
func (sr *siteRules) statistics(ann *wire.RoundAnnouncement, s *schema.Schema, site *sitedata.Site, done bool, now time.Time, res Result) (Result, error) {
	res.SampleCount = len(site.Train)
	if done {
		res.Action, res.Healthy = ActionDone, true
		return res, nil
	}
	stats, err := site.Statistics()
	if err != nil {
		return res, err
	}
	raw, err := json.Marshal(stats)
	if err != nil {
		return res, wrap("agent: statistics", err)
	}
	msg, err := wire.Encode(&wire.SiteStatistics{
		ClientId: sr.ClientID, RunId: ann.RunId, SchemaDigest: s.Digest(), Stats: raw,
		SentAtUnixMs: max(now.UnixMilli(), 0),
	})
	if err != nil {
		return res, wrap("agent: statistics", err)
	}
	if err := sr.fits(msg, "statistics"); err != nil {
		return res, err
	}
	res.Out = append(res.Out, Outgoing{Subject: wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, RunID: ann.RunId, Msg: msg})
	res.Action, res.Healthy = ActionStatistics, true
	return res, nil
}

// evaluation is the step of an evaluation: the EvalReport of the
// announced global model on the held-out rows, named by the
// announcement's eval round, added to res.Out, unless the aggregator has
// receipted it (done). now is its timestamp.
func (sr *siteRules) evaluation(ann *wire.RoundAnnouncement, holdout model.Data, done bool, now time.Time, res *Result) error {
	er := uint64(ann.GetEvalRound())
	if done {
		res.Healthy = true
		return nil
	}
	spec, err := round.ModelSpec(ann)
	if err != nil {
		return bad(ann.Round, "%v", err)
	}
	m, err := model.New(spec)
	if err != nil {
		return bad(ann.Round, "%v", err)
	}
	x, err := decodeGlobal(ann, m.NumParams())
	if err != nil {
		return err
	}
	rep, err := sitedata.Evaluate(spec, x, holdout)
	if err != nil {
		return bad(ann.Round, "evaluation of the global model: %v", err)
	}
	raw, err := json.Marshal(rep)
	if err != nil {
		return wrap("agent: evaluation", err)
	}
	msg, err := wire.Encode(&wire.EvalReport{
		ClientId: sr.ClientID, RunId: ann.RunId, Round: er, Report: raw,
		SentAtUnixMs: max(now.UnixMilli(), 0),
	})
	if err != nil {
		return wrap("agent: evaluation", err)
	}
	if err := sr.fits(msg, "evaluation report"); err != nil {
		return err
	}
	res.Out = append(res.Out, Outgoing{Subject: wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, RunID: ann.RunId, Round: er, Msg: msg})
	sr.log().Info("evaluation sent", "eval_round", er, "n", rep.N, "loss", rep.Loss, "accuracy", rep.Accuracy)
	res.Healthy = true
	return nil
}

// decodeGlobal decodes the announced global model of a model with dim
// parameters (the frame says its codec).
func decodeGlobal(ann *wire.RoundAnnouncement, dim int) ([]float64, error) {
	r := ann.Round
	if int64(ann.Global.GetDimension()) != int64(dim) {
		return nil, bad(r, "global model has dimension %d, the %s model has %d parameters", ann.Global.GetDimension(), ann.Model.GetKind(), dim)
	}
	info, err := quant.Inspect(ann.Global.GetPayload())
	if err != nil {
		return nil, bad(r, "global model frame: %v", err)
	}
	if info.Dim != dim {
		return nil, bad(r, "global model frame has dimension %d, want %d", info.Dim, dim)
	}
	c, err := quant.ParseWithLimits("fp32", quant.Limits{MaxDim: dim})
	if err != nil {
		return nil, err
	}
	x, err := c.Decode(ann.Global.GetPayload(), nil)
	if err != nil || len(x) != dim {
		return nil, bad(r, "global model frame: %d values, %v", len(x), err)
	}
	return x, nil
}

// fits checks an encoded message against the message size limit.
func (sr *siteRules) fits(msg []byte, what string) error {
	if lim := sr.Limits.MaxMessageBytes; lim > 0 && len(msg) > lim {
		return fmt.Errorf("agent: %s is %d bytes, over the %d-byte message limit", what, len(msg), lim)
	}
	return nil
}

// roundErr prefixes err with the round it happened in. It is one
// out-of-line call so that the many error paths of the round code do not
// each carry their own copy of the fmt.Errorf argument boxing (edge-agent's
// size budget).
//
//go:noinline
func roundErr(r uint64, err error) error {
	return fmt.Errorf("agent: round %d: %w", r, err)
}

// wrap is fmt.Errorf(prefix+": %w", err), out of line for the same reason
// as roundErr.
//
//go:noinline
func wrap(prefix string, err error) error {
	return fmt.Errorf("%s: %w", prefix, err)
}
