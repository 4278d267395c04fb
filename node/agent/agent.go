package agent

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/mqttstore"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// Deps are the agent's injectable collaborators. Every field is optional.
type Deps struct {
	// Clock reads the time for the local solve's deadline and the
	// timestamps, and arms the re-send timers (nil = the wall clock).
	Clock clock.Clock
	// Logger receives the agent's log (nil = a text logger on stderr at
	// Config.LogLevel). The agent adds a "site" attribute.
	Logger *slog.Logger
	// Data is this site's training data, used as is instead of loading
	// Config.Data (for running many agents in one process).
	Data *model.Data
	// NewClient makes the MQTT client from the options the agent built
	// (nil = mqtt.NewClient).
	NewClient func(*mqtt.ClientOptions) mqtt.Client
	// Observe, when set, is called after every event the agent handled, from
	// the goroutine that handled it; it must not block.
	Observe func(Event)
	// SecAggRand, when set, replaces crypto/rand as the randomness of a
	// round's secure aggregation (RoundHandler.SecAggRand): tests only.
	SecAggRand func(round uint64) io.Reader
	// SecAggNoiseKey, when set, replaces the site's distributed-DP noise
	// key (RoundHandler.SecAggNoiseKey): tests only.
	SecAggNoiseKey *[32]byte
	// WriteModelOut, when set, writes model_out instead of
	// bundle.WriteFileAtomic (RoundHandler.WriteFile): tests only (a full
	// disk).
	WriteModelOut func(path string, data []byte) error
	// SecAggIdentity, when set, is the site's signing identity for signed
	// secure aggregation (RoundHandler.SecAggIdentity) instead of the one
	// made from Config's client certificate and CA: tests only.
	SecAggIdentity *uplink.SecAggIdentity
}

// EventKind classifies an Event.
type EventKind int

// Event kinds.
const (
	EventConnected  EventKind = iota + 1 // subscribed, status published, outbox re-sent
	EventHandling                        // the round loop took an announcement (Round)
	EventRound                           // a round announcement was handled (Action, Err)
	EventReceipt                         // a receipt was handled (Round, Accepted)
	EventBadMessage                      // an inbound message was dropped (Err)
	EventPublished                       // the broker acknowledged an update (Round)
	EventUplink                          // a statistics or evaluation message was published (Subject, Round)
	EventSiteError                       // the site error changed (Err: the new one, nil = cleared)
	EventFinished                        // the run's end was handled (Round; Err set if the bundle was refused)
)

// Event is what Deps.Observe sees.
type Event struct {
	Kind     EventKind
	Round    uint64
	Action   Action // EventRound
	Accepted bool   // EventReceipt
	Err      error  // EventRound, EventBadMessage, EventSiteError
	// Subject is what an EventReceipt or EventUplink is about.
	Subject wire.ReceiptSubject
	// SecAggKind is the secagg kind an EventReceipt of subject SECAGG
	// answers, or the kind of the message an EventRound (ActionSecAgg)
	// committed.
	SecAggKind uint32
}

// Stats are the agent's counters since New.
type Stats struct {
	Connects         uint64 // successful (re)connections
	BadMessages      uint64 // inbound messages dropped: topic, size, version, schema, client id
	BadAnnouncements uint64 // valid messages announcing a round this site cannot run
	RoundsSolved     uint64 // rounds solved and committed
	RoundErrors      uint64 // rounds that failed for a local reason (storage, encoding)
	Resent           uint64 // outbox entries published again
	Published        uint64 // update publishes acknowledged by the broker
	PublishErrors    uint64 // update publishes that failed or timed out
	ReceiptsAccepted uint64 // receipts of stored or duplicate updates
	ReceiptsRejected uint64 // receipts rejecting an update (acked and dropped)
	ReceiptsRetry    uint64 // INTERNAL rejections, kept in the outbox for a re-send
	StatisticsSent   uint64 // statistics publishes (re-sends included)
	EvaluationsSent  uint64 // evaluation report publishes (re-sends included)
	LeftRuns         uint64 // announcements of a run this site has left, ignored
	SecAggRefusals   uint64 // secure-aggregation sessions refused (site error secagg_refused: a key list, view or survivor set that failed its check)
}

type counters struct {
	connects, badMessages, badAnnouncements, roundsSolved, roundErrors, resent,
	published, publishErrors, receiptsAccepted, receiptsRejected, receiptsRetry,
	statisticsSent, evaluationsSent, leftRuns, secAggRefusals atomic.Uint64
}

// Agent is the edge daemon: one MQTT session, one state file, one site's data.
type Agent struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	clock   clock.Clock
	data    model.Data
	topics  wire.Topics
	limits  wire.Limits
	tStatus string
	tUpdate string
	tRcpt   string
	stats   counters
	// bodies holds the schema and transform bodies received on the run
	// topic, by digest; waiting is the newest announcement that names a
	// body by a digest not (yet) in bodies: it is handled when the run spec
	// with that body arrives (wire RunSpec).
	bodies  wire.BodyCache
	waitMu  sync.Mutex
	waiting *wire.RoundAnnouncement
	spec    *wire.RunSpec // the newest run spec received
	// toldNotIn is the run whose preprocessing this site was told it is
	// not in (tellNotInPreprocessing), so that it is said once.
	toldNotIn string
	// instance is this installation's id (the state file's), set by Run
	// before the first status; every status and update carries it.
	instance string
	// conn is the number of the current (or pending) connection attempt:
	// the last will set for it and the statuses sent on it carry it.
	conn atomic.Uint64
	// samples is the sample count the status reports: the data loaded at
	// start, or the training rows the federation's schema gives.
	samples atomic.Int64

	// mu guards the session state machine and what the shell keeps for
	// it: the solve's cancellation and the armed timers.
	mu      sync.Mutex
	running bool
	runCtx  context.Context
	stop    context.CancelFunc // ends Run (a fatal error)
	fatal   error              // why Run stopped by itself
	store   *edgestore.EdgeStore
	client  mqtt.Client
	handler *RoundHandler
	// sess is the session rules (session.go); its actions are carried out
	// by step.
	sess session
	// solveCtx is the context of the solve the session started last and
	// preempt cancels it.
	solveCtx context.Context
	preempt  context.CancelCauseFunc
	timers   map[pendingKey]clock.Timer
	inflight sync.WaitGroup
	wake     chan struct{}
}

// New checks cfg and deps.Data and returns an agent ready to Run. It
// opens no file and no connection, and loads no data: the caller hands
// the site's data in (Deps.Data), or Run loads Config.Data (LoadData)
// before it opens the state file.
func New(cfg Config, deps Deps) (*Agent, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, deps: deps, clock: deps.Clock, wake: make(chan struct{}, 1)}
	a.sess = session{federation: cfg.Federation, backoffMin: cfg.ReconnectMin, backoffMax: cfg.ReconnectMax}
	if a.clock == nil {
		a.clock = clock.Real{}
	}
	lg := deps.Logger
	if lg == nil {
		lvl, _ := ParseLevel(cfg.LogLevel)
		lg = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	}
	a.log = lg.With("site", cfg.SiteID)
	if deps.Data != nil {
		if err := a.useData(*deps.Data); err != nil {
			return nil, err
		}
	}
	var err error
	if a.topics, err = wire.ForFederation(cfg.Federation); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	a.tStatus, _ = a.topics.Status(cfg.SiteID)
	a.tUpdate, _ = a.topics.Update(cfg.SiteID)
	a.tRcpt, _ = a.topics.Receipt(cfg.SiteID)
	a.limits = wire.Limits{MaxMessageBytes: cfg.MaxMessageBytes}
	return a, nil
}

// useData checks d and makes it the site's training data.
func (a *Agent) useData(d model.Data) error {
	if d.N <= 0 {
		return configErr("the site has no training samples")
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%w: data: %w", ErrConfig, err)
	}
	a.data = d
	a.samples.Store(int64(d.N))
	return nil
}

// loadData loads Config.Data when the caller handed no data in (Run, before
// it opens the state file). A csv source without label= loads nothing: the
// federation's schema reads it when a round announces it.
func (a *Agent) loadData() error {
	if a.deps.Data != nil || schemaOnly(a.cfg) {
		return nil
	}
	d, err := LoadData(a.cfg)
	if err != nil {
		return err
	}
	return a.useData(d)
}

// Data returns the site's training data (Deps.Data, or what Run loaded).
func (a *Agent) Data() model.Data { return a.data }

// Stats returns a snapshot of the counters.
func (a *Agent) Stats() Stats {
	c := &a.stats
	return Stats{
		Connects: c.connects.Load(), BadMessages: c.badMessages.Load(), BadAnnouncements: c.badAnnouncements.Load(),
		RoundsSolved: c.roundsSolved.Load(), RoundErrors: c.roundErrors.Load(), Resent: c.resent.Load(),
		Published: c.published.Load(), PublishErrors: c.publishErrors.Load(),
		ReceiptsAccepted: c.receiptsAccepted.Load(), ReceiptsRejected: c.receiptsRejected.Load(), ReceiptsRetry: c.receiptsRetry.Load(),
		StatisticsSent: c.statisticsSent.Load(), EvaluationsSent: c.evaluationsSent.Load(), LeftRuns: c.leftRuns.Load(),
		SecAggRefusals: c.secAggRefusals.Load(),
	}
}

func (a *Agent) observe(e Event) {
	if a.deps.Observe != nil {
		a.deps.Observe(e)
	}
}

// Run opens the state file, connects (retrying until the broker answers),
// and serves rounds until ctx is canceled. It then publishes the offline
// status, disconnects cleanly, waits for its handlers and closes the state
// file, and returns nil. A solve in progress at cancellation is abandoned
// without committing anything: the retained announcement restarts it after
// the next start. Errors are returned only for what prevents running at all
// (state file, identity, TLS files).
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return errors.New("agent: Run called twice")
	}
	a.running = true
	a.mu.Unlock()

	if err := a.loadData(); err != nil {
		return err
	}
	store, err := a.openState()
	if err != nil {
		return err
	}
	defer store.Close()
	opts, err := a.clientOptions(store)
	if err != nil {
		if errors.Is(err, storage.ErrCorrupt) {
			return stateFileErr(err)
		}
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	newClient := a.deps.NewClient
	if newClient == nil {
		newClient = mqtt.NewClient
	}
	client := newClient(opts)
	if err := a.startShell(runCtx, cancel, store, client); err != nil {
		return err
	}
	if err := a.restoreFinal(store); err != nil {
		return stateFileErr(err)
	}

	if n, err := store.Outbox(); err == nil && len(n) > 0 {
		// The rounds tell a reader of the log which updates were
		// acknowledged before a crash that cut off their receipt's line.
		rounds := make([]uint64, len(n))
		for i, e := range n {
			rounds[i] = e.Round
		}
		a.log.Info("unreceipted updates in the outbox; re-sending on connect", "count", len(n), "rounds", rounds)
	}
	a.log.Info("connecting", "brokers", a.cfg.Brokers, "federation", a.cfg.Federation, "samples", a.data.N)
	tok := client.Connect()
	a.inflight.Add(1)
	go func() {
		defer a.inflight.Done()
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				a.log.Error("connect failed", "err", err)
			}
		case <-runCtx.Done():
		}
	}()

	a.loop(runCtx)

	a.step(closed{})
	a.shutdown(client)
	cancel()
	a.inflight.Wait()
	a.mu.Lock()
	fatal := a.fatal
	a.mu.Unlock()
	if fatal != nil {
		a.log.Error("stopped: the state file is damaged", "err", fatal)
		return fatal
	}
	a.log.Info("stopped", "stats", a.Stats())
	return nil
}

// openState checks and opens the state file and reads this installation's
// identity from it (made on the first start).
func (a *Agent) openState() (*edgestore.EdgeStore, error) {
	if err := CheckStateFile(a.cfg); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(a.cfg.StateFile); errors.Is(err, os.ErrNotExist) && a.cfg.FreshState {
		if tr := stateTraces(a.cfg); len(tr) > 0 {
			a.log.Warn("state file missing; starting this site over with a new one as asked (--fresh-state)", "state", a.cfg.StateFile, "traces", tr)
		}
	}
	store, err := edgestore.OpenEdge(a.cfg.StateFile, storage.Options{})
	if err != nil {
		return nil, stateFileErr(err)
	}
	ident, err := store.InitIdentity(a.cfg.SiteID, a.clock.Now())
	if err != nil {
		store.Close()
		if errors.Is(err, storage.ErrCorrupt) {
			return nil, stateFileErr(err)
		}
		return nil, fmt.Errorf("agent: state file %s: %w", a.cfg.StateFile, err)
	}
	// Every status and update says which installation sent it: a second
	// gateway with this site id (a cloned SD card) has another.
	a.instance = ident.InstanceID
	a.log.Info("this installation", "instance", ident.InstanceID, "state", a.cfg.StateFile)
	return store, nil
}

// startShell sets up what the shell keeps for a run: its context, the
// store and client, the session's run order (from the store) and the
// round handler that carries out the site core's plans.
func (a *Agent) startShell(runCtx context.Context, cancel context.CancelFunc, store *edgestore.EdgeStore, client mqtt.Client) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runCtx, a.stop, a.store, a.client = runCtx, cancel, store, client
	a.sess.store = store
	var err error
	if a.sess.run, a.sess.runSince, err = store.RunOrder(); err != nil {
		return stateFileErr(err)
	}
	saIdent, err := a.secAggIdentity()
	if err != nil {
		return err
	}
	a.handler = &RoundHandler{
		ClientID: a.cfg.SiteID, InstanceID: a.instance, Federation: a.cfg.Federation, Store: store, Data: a.data,
		Clock: a.clock, Local: a.cfg.Local, Limits: a.limits, Seed: a.cfg.Seed, Log: a.log,
		EvalFile: evalDataPath(a.cfg.EvalData), ModelOut: a.cfg.ModelOut,
		Emit: a.sendUplink, SecAggRand: a.deps.SecAggRand, SecAggNoiseKey: a.deps.SecAggNoiseKey,
		WriteFile:      a.deps.WriteModelOut,
		SecAggIdentity: saIdent,
	}
	if a.cfg.DataClient < 0 {
		a.handler.DataFile, _ = csvPath(a.cfg.Data)
		if _, l, ok := strings.Cut(a.cfg.Data, ":label="); ok {
			a.handler.DataLabel = strings.TrimSuffix(l, ":regression")
		}
	}
	return nil
}

// ResetState moves the state file at path aside, to path +
// ".damaged-<unix seconds>", so that the next Run starts this site over from
// the aggregator: the site keeps its id (it comes from the configuration)
// and its connection numbers (floored by the clock, see setWill); the
// aggregator sees a site with no copy of its FedSplit z and takes its next
// update in full. Nothing is deleted: the old file stays for inspection. A
// missing file is not an error ("" is returned).
func ResetState(path string, now time.Time) (string, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	aside := fmt.Sprintf("%s.damaged-%d", path, now.Unix())
	if _, err := os.Stat(aside); err == nil {
		return "", fmt.Errorf("agent: reset state: %s already exists", aside)
	}
	if err := os.Rename(path, aside); err != nil {
		return "", wrap("agent: reset state", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return aside, nil
}

// stateFileErr is the one-line error for a state file the agent cannot use,
// with the way out when it is damaged.
func stateFileErr(err error) error {
	if errors.Is(err, storage.ErrCorrupt) {
		return fmt.Errorf("agent: state file: %w; start this site over from the aggregator with `edge-agent run --reset-state` (the damaged file is kept aside, the site keeps its id)", err)
	}
	return wrap("agent: state file", err)
}

// failIfDamaged stops Run when err says the state file is damaged: going
// on would retry the same failing read forever; the process exits non-zero
// and systemd (or the operator, with --reset-state) takes over.
func (a *Agent) failIfDamaged(err error) bool {
	if !errors.Is(err, storage.ErrCorrupt) {
		return false
	}
	a.mu.Lock()
	if a.fatal == nil {
		a.fatal = stateFileErr(err)
	}
	stop := a.stop
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
	return true
}

// enter registers a callback; false once the agent is shutting down.
func (a *Agent) enter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sess.closing || !a.running {
		return false
	}
	a.inflight.Add(1)
	return true
}

func (a *Agent) leave() { a.inflight.Done() }

func (a *Agent) shutdown(client mqtt.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultShutdownTimeout)
	defer cancel()
	if client.IsConnectionOpen() {
		if b, err := a.statusMsg(false, false, a.conn.Load()); err == nil {
			if err := a.await(ctx, client.Publish(a.tStatus, 1, true, b)); err != nil {
				a.log.Warn("offline status not published", "err", err)
			}
		}
	}
	client.Disconnect(defaultQuiesceMillis)
}

// loop hands round announcements to the round handler one at a time
// until ctx is done.
func (a *Agent) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		}
		if ctx.Err() != nil {
			// Both were ready and select chose the wake: nothing new is
			// started once the agent is stopping.
			return
		}
		var ann *wire.RoundAnnouncement
		var share *wire.SecAggMessage
		var receipted receiptedSet
		invited := false
		for _, act := range a.step(idle{}) {
			switch act.kind {
			case actStartSolve:
				ann, invited, receipted = act.ann, act.invited, act.receipted
			case actStartShareList:
				share = act.share
			}
		}
		if share != nil {
			res, err := a.handler.HandleShareList(share)
			a.step(shareListDone{msg: share, res: res, err: err})
			a.observe(Event{Kind: EventRound, Round: share.Round, Action: res.Action, Err: err, SecAggKind: uint32(res.SecAggKind)})
			a.wakeUp() // an announcement may wait
			continue
		}
		if ann == nil {
			continue
		}
		a.mu.Lock()
		solveCtx, cancel := a.solveCtx, a.preempt
		a.mu.Unlock()
		a.observe(Event{Kind: EventHandling, Round: ann.Round})
		a.handler.Receipted = receipted.has // the session's, as the solve starts
		res, err := a.handler.HandleInvited(solveCtx, ann, invited)
		cancel(nil)
		a.step(solveDone{ann: ann, res: res, err: err, shutdown: ctx.Err() != nil})
		if n := int64(res.SampleCount); n > 0 && a.samples.Swap(n) != n {
			a.publishStatus()
		}
		a.observe(Event{Kind: EventRound, Round: ann.Round, Action: res.Action, Err: err, SecAggKind: uint32(res.SecAggKind)})
	}
}

// step runs the session rules on ev under a.mu and carries out the actions
// they decide, in order: those on the shell's own state (the solve's
// context, timers) under the lock, which they never block, the others
// (publishing, the store's failures, logs, events) after it. It returns
// the actions.
func (a *Agent) step(ev sessionEvent) []action {
	a.mu.Lock()
	acts := a.sess.step(ev)
	for i := 0; i < len(acts); i++ {
		if acts[i].kind == actAck {
			// Commit, then step the outcome in: what follows from it
			// comes next, before the actions decided after it.
			had, err := commitAck(a.store, acts[i])
			// (Spliced by hand: slices.Insert, instantiated for action,
			// cost edge-agent 2 kB of text.)
			next := a.sess.step(acked{act: acts[i], had: had, err: err})
			acts = append(acts[:i+1], append(next, acts[i+1:]...)...)
			continue
		}
		a.doLocked(acts[i])
	}
	a.mu.Unlock()
	for _, act := range acts {
		a.do(act)
	}
	return acts
}

// doLocked carries out what act asks of the shell's state (a.mu held).
func (a *Agent) doLocked(act action) {
	switch act.kind {
	case actStartSolve:
		a.solveCtx, a.preempt = context.WithCancelCause(a.runCtx)
	case actPreempt:
		if a.preempt != nil {
			a.preempt(act.err)
		}
	case actArm:
		if a.timers == nil {
			a.timers = map[pendingKey]clock.Timer{}
		}
		if t := a.timers[act.key]; t != nil {
			t.Stop()
		}
		k, gen := act.key, act.gen
		// ReconnectMin > 0 (Config.withDefaults), so a fake clock never
		// runs this callback under a.mu.
		a.timers[k] = a.clock.AfterFunc(act.after, func() {
			if !a.enter() {
				return
			}
			defer a.leave()
			a.step(timerFired{key: k, gen: gen})
		})
	case actStop:
		if t := a.timers[act.key]; t != nil {
			t.Stop()
			delete(a.timers, act.key)
		}
	}
}

// do carries out the rest of act (a.mu not held).
func (a *Agent) do(act action) {
	switch act.kind {
	case actWake:
		a.wakeUp()
	case actPreempt:
		a.logPreempt(act)
	case actIgnored:
		ann := act.ann
		a.log.Debug("announcement of the finished run ignored", "run_id", ann.RunId, "round", ann.Round, "phase", ann.GetPhase().String())
		a.observe(Event{Kind: EventRound, Round: ann.Round, Action: ActionIgnored})
	case actLeftRun:
		ann := act.ann
		a.mu.Lock()
		run, since := a.sess.run, a.sess.runSince
		a.mu.Unlock()
		a.log.Warn("announcement of a run this site has left ignored",
			"why", "it was made before the run this site is in started: a stale copy (a broker restarted from an old persistence file?) or the aggregator's clock went back",
			"run_id", ann.RunId, "round", ann.Round, "phase", ann.GetPhase().String(),
			"created_at", time.UnixMilli(ann.CreatedAtUnixMs).UTC().Format(time.RFC3339Nano),
			"current_run_id", run, "current_run_since", time.UnixMilli(since).UTC().Format(time.RFC3339Nano))
		a.stats.leftRuns.Add(1)
		a.observe(Event{Kind: EventRound, Round: ann.Round, Action: ActionIgnored})
	case actWriteModelOut:
		a.writeModelOut(act.attempt)
	case actRoundDone:
		a.roundDone(act)
	case actPublishUpdate:
		a.sendUpdate(act)
	case actPublishUplink:
		a.sendUplinkMsg(act)
	case actReceipt:
		a.receiptDone(act)
	case actStoreFailed:
		a.log.Error(act.what, "err", act.err)
		a.failIfDamaged(act.err)
	case actSiteError:
		a.siteErrorSet(act.se, act.ann, act.same)
	case actSiteErrorCleared:
		a.siteErrorCleared(act.se)
	case actFinished:
		a.runFinished(act.ann, act.res)
	case actShareListDone:
		a.shareListDone(act)
	case actInvited:
		r := act.receipt
		if act.had {
			a.log.Info("invited to a round (private selection)", "round", r.Round, "run_id", r.RunId)
		} else {
			a.log.Debug("invitation repeated", "round", r.Round, "run_id", r.RunId)
		}
		a.observe(Event{Kind: EventReceipt, Subject: r.GetSubject(), Round: r.Round})
	}
}

// wakeUp wakes the solver loop (it looks for work when woken).
func (a *Agent) wakeUp() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// shareListDone logs what a secagg ShareList came to.
func (a *Agent) shareListDone(act action) {
	lg := a.log.With("round", act.share.Round, "attempt", act.share.Attempt)
	switch {
	case errors.Is(act.err, storage.ErrCorrupt):
		a.failIfDamaged(act.err)
		a.stats.roundErrors.Add(1)
	case act.err != nil:
		a.stats.roundErrors.Add(1)
		lg.Error("secure aggregation: the share list could not be answered", "err", act.err)
	case act.res.Action == ActionSecAgg:
		lg.Info("secure aggregation: masked input sent", "bytes", len(act.res.Msg))
	default:
		lg.Debug("secure aggregation: share list", "action", act.res.Action.String())
	}
}

func (a *Agent) logPreempt(act action) {
	ann := act.ann
	switch act.err {
	case ErrNewRun:
		a.log.Info("the aggregator started a new run; abandoning the local solve", "solving", act.solving, "run_id", ann.RunId)
	case ErrFinished:
		a.log.Info("the aggregator finished the run; abandoning the local solve", "solving", act.solving, "rounds", ann.Round)
	default:
		a.log.Info("newer round announced; stopping the local solve early", "solving", act.solving, "announced", ann.Round)
	}
}

// roundDone logs and counts what an announcement came to.
func (a *Agent) roundDone(act action) {
	ann, res, err := act.ann, act.res, act.err
	lg := a.log.With("round", ann.Round)
	switch act.class {
	case roundBad:
		a.stats.badAnnouncements.Add(1)
		lg.Warn("round announcement rejected", "err", err)
	case roundDamaged:
		a.failIfDamaged(err)
		a.stats.roundErrors.Add(1)
	case roundShutdown:
		lg.Info("round abandoned at shutdown; it restarts from the retained announcement", "err", err)
	case roundNewRun:
		lg.Info("round of the previous run abandoned", "err", err)
	case roundRunFinished:
		lg.Info("round abandoned: the aggregator finished the run", "err", err)
	case roundSiteError:
		a.stats.roundErrors.Add(1)
	case roundFailed:
		a.stats.roundErrors.Add(1)
		lg.Error("round failed", "err", err)
	default:
		switch res.Action {
		case ActionSolved:
			a.stats.roundsSolved.Add(1)
			r := res.Update.Report
			args := []any{"algorithm", ann.Algorithm, "gamma", r.AchievedGamma, "epochs", r.Epochs,
				"grad_evals", r.GradEvals, "seconds", r.Seconds, "loss", r.LocalLoss, "anchor_loss", r.AnchorLoss,
				"stop", r.StopReason.String(), "partial", r.Partial, "bytes", len(res.Msg)}
			if r.Partial {
				// "partial" alone reads as a fault: say what it is.
				args = append(args, "partial_why", partialWhy(r, ann.GetParams().GetGamma()))
			}
			lg.Info("round solved", args...)
		case ActionResend:
			lg.Info("round already applied; re-sending its unreceipted update")
		case ActionSecAgg:
			if res.SecAggKind == 1 {
				a.stats.roundsSolved.Add(1)
				lg.Info("round solved; secure aggregation: keys advertised (the update stays on this site)", "algorithm", ann.Algorithm,
					"epochs", res.Report.Epochs, "seconds", res.Report.Elapsed.Seconds(), "stop", res.Report.Stop, "attempt", ann.GetSecagg().GetAttempt())
			} else {
				lg.Info("secure aggregation: "+res.SecAggKind.String()+" sent", "phase", ann.GetSecaggPhase().String(), "bytes", len(res.Msg))
			}
		case ActionWaiting:
			lg.Info("this site's previous update awaits its receipt (FedSplit sum mode, SCAFFOLD); the round is answered when it comes")
		case ActionStatistics:
			lg.Info("statistics phase: this site's statistics sent", "run_id", ann.RunId, "training_rows", res.SampleCount)
		case ActionFinishing:
			lg.Info("the aggregator finished the run; waiting for the final model", "run_id", ann.RunId, "final_evaluation", len(res.Out) > 0)
		case ActionFinished:
		default:
			lg.Debug("round announcement", "action", res.Action.String())
		}
	}
}

// sendUpdate publishes an update the session decided to send.
func (a *Agent) sendUpdate(act action) {
	round := act.key.round
	switch act.why {
	case sendAgain:
		a.stats.resent.Add(1)
	case sendReconnect:
		a.stats.resent.Add(1)
		a.log.Info("re-sending unreceipted update", "round", round)
	case sendRetry:
		a.stats.resent.Add(1)
		a.log.Info("re-sending an update that has no receipt yet (none came in time, or the aggregator failed to store it)", "round", round)
	}
	a.publishUpdate(round, act.msg)
}

// publishUpdate publishes an update (QoS 1) and tracks its acknowledgement
// in the background; the outbox keeps it until its receipt either way.
func (a *Agent) publishUpdate(round uint64, msg []byte) {
	if !a.enter() {
		return
	}
	a.publishAsync(a.tUpdate, false, msg, func(err error) {
		if err != nil {
			a.stats.publishErrors.Add(1)
			a.log.Warn("update not acknowledged by the broker; the outbox keeps it", "round", round, "err", err)
			return
		}
		a.stats.published.Add(1)
		a.observe(Event{Kind: EventPublished, Round: round})
	})
}

// publishAsync publishes msg on topic (QoS 1) and waits for the broker's
// acknowledgement in the background, then calls done with the outcome;
// not when the agent is shutting down and the wait failed (what must
// survive that is in the outbox or is re-published on the next
// connection). The caller has entered (a.enter); publishAsync leaves.
func (a *Agent) publishAsync(topic string, retained bool, msg []byte, done func(err error)) {
	tok := a.client.Publish(topic, 1, retained, msg)
	go func() {
		defer a.leave()
		ctx, cancel := context.WithTimeout(a.runCtx, a.cfg.PublishTimeout)
		defer cancel()
		err := a.await(ctx, tok)
		if err != nil && a.runCtx.Err() != nil {
			return
		}
		done(err)
	}()
}

// await waits for a paho token without a bare Wait.
func (a *Agent) await(ctx context.Context, tok mqtt.Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// statusMsg is the site's status for connection number conn; a last will
// (written before the connection exists) carries no timestamp.
func (a *Agent) statusMsg(online bool, will bool, conn uint64) ([]byte, error) {
	s := &wire.ClientStatus{
		ClientId: a.cfg.SiteID, Online: online, SampleCount: claimedSamples(uint64(max(a.samples.Load(), 0))),
		Capabilities: a.cfg.Local.capabilities(), SoftwareVersion: a.cfg.SoftwareVersion,
		Connection: conn, InstanceId: a.instance,
	}
	a.mu.Lock()
	if se := a.sess.siteErr; se != nil {
		s.ErrorReason, s.ErrorMessage = se.Reason, se.Public()
	}
	a.mu.Unlock()
	if !will {
		s.TimestampUnixMs = max(a.clock.Now().UnixMilli(), 0)
	}
	return wire.Encode(s)
}

// setWill numbers the next connection attempt and sets its last will. It
// runs before the first connection and, through paho's reconnecting
// handler, before every reconnection attempt, so that the will of an old
// connection (published late, when a new connection takes over a
// half-open one) carries a smaller number than the new connection's
// online status and the aggregator can tell it is stale.
func (a *Agent) setWill(store *edgestore.EdgeStore, o *mqtt.ClientOptions) error {
	n, err := store.NextConnection(uint64(max(a.clock.Now().UnixMilli(), 0)))
	if err != nil {
		return err
	}
	will, err := a.statusMsg(false, true, n)
	if err != nil {
		return wrap("agent: status message", err)
	}
	o.SetBinaryWill(a.tStatus, will, 1, true)
	a.conn.Store(n)
	return nil
}

func (a *Agent) clientOptions(store *edgestore.EdgeStore) (*mqtt.ClientOptions, error) {
	o := mqtt.NewClientOptions()
	if err := a.setWill(store, o); err != nil {
		return nil, err
	}
	for _, b := range a.cfg.Brokers {
		o.AddBroker(b)
	}
	o.SetClientID(a.cfg.SiteID).
		SetCleanSession(false).
		SetStore(mqttstore.New()). // paho's store, without its data race (internal/mqttstore)
		SetOrderMatters(false).
		SetConnectRetry(true).
		SetConnectRetryInterval(a.cfg.ReconnectMin).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(a.cfg.ReconnectMax).
		SetKeepAlive(a.cfg.KeepAlive).
		SetConnectTimeout(a.cfg.ConnectTimeout).
		SetWriteTimeout(a.cfg.PublishTimeout).
		SetReconnectingHandler(func(_ mqtt.Client, o *mqtt.ClientOptions) {
			if err := a.setWill(store, o); err != nil {
				// The attempt goes ahead with the previous number: the
				// aggregator then orders this connection's statuses as
				// the previous one's, which only matters if a stale will
				// of that connection arrives after the new online status.
				a.log.Error("numbering the connection attempt", "err", err)
				a.failIfDamaged(err)
			}
		}).
		SetDefaultPublishHandler(a.onMessage).
		SetOnConnectHandler(a.onConnect).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			a.connTrouble("connection lost; reconnecting", withHint([]any{"err", err}, err, a.cfg)...)
		}).
		SetConnectionNotificationHandler(func(_ mqtt.Client, n mqtt.ConnectionNotification) {
			switch n := n.(type) {
			case mqtt.ConnectionNotificationBrokerFailed:
				a.connTrouble("broker unreachable", withHint([]any{"broker", n.Broker.String(), "err", n.Reason}, n.Reason, a.cfg)...)
			case mqtt.ConnectionNotificationFailed:
				a.connTrouble("connection attempt failed", withHint([]any{"err", n.Reason}, n.Reason, a.cfg)...)
			}
		})
	if a.cfg.Username != "" {
		o.SetUsername(a.cfg.Username)
		o.SetPassword(a.cfg.Password)
	}
	if tc, err := a.tlsConfig(); err != nil {
		return nil, err
	} else if tc != nil {
		o.SetTLSConfig(tc)
	}
	return o, nil
}

// secAggIdentity is the site's signing identity for signed secure
// aggregation (docs/privacy.md, "Threat model per mode"): its mutual-TLS
// client certificate and key, and the CA file as the federation CA, when
// both are configured (`broker-agg pki` issues them); nil otherwise
// (password-only: the honest-but-curious model).
func (a *Agent) secAggIdentity() (*uplink.SecAggIdentity, error) {
	if a.deps.SecAggIdentity != nil {
		return a.deps.SecAggIdentity, nil
	}
	c := a.cfg
	if c.CertFile == "" || c.CAFile == "" {
		return nil, nil
	}
	tc, err := a.tlsConfig()
	if err != nil {
		return nil, err
	}
	pair := tc.Certificates[0]
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || len(pair.Certificate) == 0 {
		return nil, fmt.Errorf("%w: tls client key: a %T cannot sign", ErrConfig, pair.PrivateKey)
	}
	return &uplink.SecAggIdentity{Cert: pair.Certificate[0], Signer: signer, Roots: tc.RootCAs}, nil
}

func (a *Agent) tlsConfig() (*tls.Config, error) {
	c := a.cfg
	if c.CAFile == "" && c.CertFile == "" && c.ServerName == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, wrap("agent: tls ca", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: tls ca %s: no PEM certificate in it", ErrConfig, c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, wrap("agent: tls client certificate", err)
		}
		if err := checkOwnCert(cert, c.CertFile, c.SiteID, c.CAFile, a.clock.Now(), a.log); err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// onConnect runs on every (re)connection: subscribe, announce the online
// status, re-publish the outbox.
func (a *Agent) onConnect(c mqtt.Client) {
	if !a.enter() {
		return
	}
	defer a.leave()
	a.stats.connects.Add(1)
	ctx, cancel := context.WithTimeout(a.runCtx, a.cfg.PublishTimeout)
	defer cancel()
	// The subscription and the online status go out together, and only
	// then are their acknowledgements awaited: a SUBACK that is slow to
	// come (seen once after a Mosquitto restart with a resumed session,
	// whose subscriptions the broker kept anyway) must not hold back the
	// status that makes this site selectable.
	tok := c.SubscribeMultiple(map[string]byte{a.topics.Round(): 1, a.topics.Run(): 1, a.tRcpt: 1}, nil)
	var pub mqtt.Token
	if b, err := a.statusMsg(true, false, a.conn.Load()); err != nil {
		a.log.Error("status message", "err", err)
	} else {
		pub = c.Publish(a.tStatus, 1, true, b)
	}
	if err := a.await(ctx, tok); err != nil {
		a.log.Error("subscribe failed", "err", err)
	} else if st, ok := tok.(*mqtt.SubscribeToken); ok {
		for topic, q := range st.Result() {
			if q > 2 {
				a.log.Error("broker refused the subscription (check its ACL)", "topic", topic)
			}
		}
	}
	if pub != nil {
		if err := a.await(ctx, pub); err != nil {
			a.log.Warn("online status not published", "err", err)
		}
	}
	a.step(connected{})
	a.log.Info("connected")
	a.observe(Event{Kind: EventConnected})
}

// connTrouble logs a connection problem at WARN while a run is on. Once
// the run has finished, the aggregator may well have exited (with its
// embedded broker, exit_when_finished): the site keeps reconnecting so it
// sees the next run, but quietly, at DEBUG.
func (a *Agent) connTrouble(msg string, args ...any) {
	a.mu.Lock()
	finished := a.sess.finished
	a.mu.Unlock()
	if finished {
		a.log.Debug(msg, args...)
		return
	}
	a.log.Warn(msg, args...)
}

// onMessage is the default publish handler: every inbound message comes
// here, including those the persistent session delivers before the
// subscriptions of this connection are acknowledged.
func (a *Agent) onMessage(_ mqtt.Client, m mqtt.Message) {
	if !a.enter() {
		return
	}
	defer a.leave()
	if len(m.Payload()) == 0 && m.Topic() == a.topics.Round() {
		// A fresh aggregator run clears the retained announcement of the
		// previous one: nothing to do until it announces its round 1.
		a.log.Debug("the retained round announcement was cleared")
		return
	}
	if len(m.Payload()) == 0 && m.Topic() == a.topics.Run() {
		a.log.Debug("the retained run spec was cleared")
		return
	}
	kind, msg, err := a.topics.Decode(m.Topic(), m.Payload(), a.limits)
	if err == nil {
		switch kind {
		case wire.KindRound:
			a.announcedByDigest(msg.(*wire.RoundAnnouncement))
			return
		case wire.KindRun:
			a.runSpecArrived(msg.(*wire.RunSpec))
			return
		case wire.KindReceipt:
			switch r := msg.(type) {
			case *wire.Receipt:
				if r.ClientId == a.cfg.SiteID {
					a.step(receiptArrived{r: r})
					return
				}
				err = fmt.Errorf("receipt for another client")
			case *wire.SecAggMessage:
				if r.ClientId == a.cfg.SiteID {
					a.step(shareListArrived{msg: r})
					return
				}
				err = fmt.Errorf("secagg share list for another client")
			}
		default:
			err = fmt.Errorf("unexpected %v message", kind)
		}
	}
	a.stats.badMessages.Add(1)
	a.log.Warn("inbound message dropped", "topic", m.Topic(), "bytes", len(m.Payload()), "err", err)
	a.observe(Event{Kind: EventBadMessage, Err: err})
}

// announcedByDigest hands the announcement to the session once the schema
// and transform it names by digest are filled in from the run topic's
// bodies; until then it waits for the run spec (runSpecArrived). The two
// retained messages arrive in either order (handlers run concurrently).
func (a *Agent) announcedByDigest(ann *wire.RoundAnnouncement) {
	a.waitMu.Lock()
	err := a.bodies.Resolve(ann)
	a.waiting = nil
	if err != nil {
		a.waiting = ann
	}
	spec := a.spec
	a.waitMu.Unlock()
	if err != nil {
		a.specMismatch(ann, spec, err)
		return
	}
	a.step(announced{ann: ann})
}

// runSpecArrived keeps the run spec's bodies (by the digest computed here:
// an altered body never stands for the announced digest) and hands on the
// announcement that was waiting for them.
func (a *Agent) runSpecArrived(spec *wire.RunSpec) {
	if spec.Federation != a.cfg.Federation {
		a.log.Warn("run spec of another federation ignored", "federation", spec.Federation)
		return
	}
	a.tellNotInPreprocessing(spec)
	a.waitMu.Lock()
	a.bodies.Add(spec)
	a.spec = spec
	ann := a.waiting
	var err error
	if ann != nil {
		if err = a.bodies.Resolve(ann); err == nil {
			a.waiting = nil
		}
	}
	a.waitMu.Unlock()
	switch {
	case ann == nil:
	case err != nil:
		a.specMismatch(ann, spec, err)
	default:
		a.step(announced{ann: ann})
	}
}

// tellNotInPreprocessing warns, once per run, when the fitted
// preprocessing of the run spec was made without this site's statistics
// (it joined after the statistics phase), as soon as the site reads it
// rather than with the final bundle.
func (a *Agent) tellNotInPreprocessing(spec *wire.RunSpec) {
	if len(spec.Transform) == 0 || len(spec.StatisticsSites) == 0 || slices.Contains(spec.StatisticsSites, a.cfg.SiteID) {
		return
	}
	a.waitMu.Lock()
	told := a.toldNotIn == spec.RunId
	a.toldNotIn = spec.RunId
	a.waitMu.Unlock()
	if !told {
		a.log.Warn(notInPreprocessingNow, "run", spec.RunId, "statistics_sites", spec.StatisticsSites)
	}
}

// specMismatch reports an announcement whose schema or transform is not
// (yet) on the run topic. When the newest run spec is this run's and holds
// a body other than the one announced (altered, or not the aggregator's),
// it is refused: logged, counted and reported; the announcement waits on.
func (a *Agent) specMismatch(ann *wire.RoundAnnouncement, spec *wire.RunSpec, err error) {
	if !spec.Contradicts(ann) {
		a.log.Info("announcement waits for the run spec", "round", ann.Round, "run", ann.RunId, "err", err)
		return
	}
	a.stats.badMessages.Add(1)
	a.log.Warn("run spec refused: its schema or transform is not the one the announcement names by digest", "round", ann.Round,
		"run", ann.RunId, "err", err)
	a.observe(Event{Kind: EventBadMessage, Err: err})
}

// receiptDone logs, counts and reports a receipt the session handled.
func (a *Agent) receiptDone(act action) {
	r := act.receipt
	lg := a.log.With("round", r.Round, "code", r.Code.String())
	what := "update"
	if r.GetSubject() != wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE {
		what = subjectName(r.GetSubject())
	}
	switch act.outcome {
	case receiptAccepted:
		a.stats.receiptsAccepted.Add(1)
		if what == "update" {
			lg.Info("update receipted", "had_outbox_entry", act.had)
		} else {
			lg.Info(what+" receipted", "had_pending", act.had)
		}
	case receiptRetry:
		a.stats.receiptsRetry.Add(1)
		if what == "update" {
			lg.Warn("aggregator failed to store the update; kept and re-sent later", "reason", r.Reason, "in", act.after)
		} else {
			lg.Warn("aggregator failed to store the "+what+"; re-sent later", "reason", r.Reason)
		}
	case receiptRejectedKept:
		a.stats.receiptsRejected.Add(1)
		lg.Warn(what+" rejected by the aggregator; the round's contribution is kept until its update receipt", "reason", r.Reason)
	default:
		a.stats.receiptsRejected.Add(1)
		lg.Warn(what+" rejected by the aggregator; dropped", "reason", r.Reason)
		if r.GetSubject() == wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS && r.Code == wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND {
			a.log.Warn(notInPreprocessing + " (its statistics came after the statistics phase closed)")
		}
	}
	a.observe(Event{Kind: EventReceipt, Subject: r.GetSubject(), Round: r.Round, Accepted: r.Accepted, SecAggKind: r.SecaggKind})
}
