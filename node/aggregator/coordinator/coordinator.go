// Package aggregator is the on-prem round coordinator of broker-agg.
//
// The Coordinator is a deterministic state machine in the style of etcd raft's
// core: the I/O shell feeds it events (client online/offline, update arrived,
// timer tick, round aggregated) and carries out the decisions it returns
// (announce, extend, accept/reject, close, set timer, finished). It starts no
// goroutines, does no I/O and never reads a clock: every event carries its
// time, so deadlines and stragglers are tested with plain time values.
//
// # Round life cycle
//
// A round is announced once at least Quorum online clients can be selected
// and nobody is expected (settleUntil): the first draw waits Config.Settle
// from the first event, so that the burst of retained status messages at
// start-up arrives before it (or until every site of Config.Expected is
// online); later draws wait up to Settle from the previous
// round's aggregation only while a client that was online at the previous
// draw is offline (it may be reconnecting), and otherwise follow the
// aggregation at once. With fewer than Quorum clients online the round waits, with no timer,
// until enough come online. Once announced, the round closes as soon as
// every selected client has reported, or at the deadline if at least Quorum
// have; a selected client that went offline is simply a straggler then.
// Below quorum at the deadline the round is extended once (Extend); below
// quorum at the extended deadline the clients are re-selected for the same
// round number (Announce with Attempt > 0): updates already received are
// kept, their senders stay in the selection, and K minus their number are
// drawn from the other online clients; clients dropped from the selection
// may still report. From the first missed deadline on, the round is overdue
// and closes the moment it has Quorum updates. After Config.MaxReselections
// re-selections the round stalls: it keeps its selection, sets no timer and
// closes when enough invited clients report. It never closes below quorum:
// a global model made of one or two hospitals' models would publish those
// sites' models to everyone. A Sampler selector (Poisson, differential
// privacy only) draws rounds of random size; their quorum is a fraction of
// the draw, and an empty draw closes at once (coordinator_select.go): the
// noise, not the quorum, protects the sites then.
//
// # Updates
//
// Every UpdateArrived gets exactly one answer, first in its batch: Accept
// (an invited client, the open round, first copy), AcceptLate (FedSplit
// family: the newest update of a client for a round it was invited to that
// has closed) or Reject with a Reason. Unsolicited updates are rejected
// (NotSelected) in every family.
//
// # Ordering contract with the shell
//
// Hand a site's message to Propose, not Step: a message the coordinator
// accepts is held until the shell has stored it and steps Stored (or
// StoreFailed: it is forgotten, and the state is what it was before it);
// see coordinator_propose.go. Carry out each batch's decisions in order,
// and persist the state (MarshalState) before doing anything visible
// outside (publishing an announcement, sending a receipt), except after a
// lone accept (Replayable) of a message stored with a replay log entry:
// its only visible decision is its receipt, and the log rebuilds the state
// it changed (coordinator_replay.go). Like raft's "persist before send",
// this guarantees that a restarted coordinator never announces a different
// selection for a round and attempt that the clients have already seen,
// and never counts an update it does not hold. CloseRound ends a round; the shell
// aggregates, checkpoints, persists and only then steps AggregatedRound, which
// opens the next round (or emits Finished), so the closed round is durable
// before the next announcement is published.
//
// # Restart
//
// The shell restores the stored State (the open round's received set as of
// its last write) with Restore, hands the messages stored since, from the
// round log's replay log, to Replay in the order they were stored, and
// carries out Resume(): the current announcement and timer, or the pending
// CloseRound. The invariant (coordinator_replay.go gives the argument): the
// stored state plus the stored messages not yet reflected in it, replayed in
// order at their stored times, is exactly the state the coordinator had when
// it last applied a stored message; a replayed message the state already
// reflects (its index at or below State.Applied) is a silent no-op, not a
// counted duplicate; a replay has no effect outside the coordinator. Ticks
// for deadlines that passed while the process was down are handled as late
// ticks.
package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
)

// Config sets the coordinator's policy. The zero value is not valid: see New.
type Config struct {
	// K is the number of clients selected per round (>= 1).
	K int
	// Quorum is the minimum number of updates a round closes with
	// (1 <= Quorum <= K); QuorumOf derives it from a fraction of K.
	Quorum int
	// RoundTimeout is the time from an announcement to its deadline (> 0).
	RoundTimeout time.Duration
	// Extension is how long the single extension lasts; 0 means RoundTimeout.
	Extension time.Duration
	// MaxReselections bounds the re-selections per round; negative means
	// unlimited (one every RoundTimeout+Extension while below quorum).
	MaxReselections int
	// Settle is how long a draw waits for expected clients that are not
	// online (>= 0; settleUntil says who is expected); 0 draws as soon as
	// Quorum are online.
	Settle time.Duration
	// Expected are the sites the deployment expects (the aggregator's
	// roster: --sites, the password file's users, the PKI's site
	// certificates); may be empty. The first draw after a start waits
	// Settle only until every one of them is online: with nobody else to
	// wait for, waiting longer changes nothing but the wall time.
	Expected []string
	// Rounds is the total number of rounds; 0 runs forever.
	Rounds int
	// Seed derives each selection's random source, together with the round
	// number and the attempt, so a restarted coordinator selects the same.
	Seed uint64
	// SelectionKey, when set, replaces Seed as the selection's source: a
	// secret key (streams.Secret), so that nobody who knows the public seed
	// predicts the draw (differential privacy; docs/privacy.md, "Sampling
	// rate"). The shell keeps it in its state file.
	SelectionKey *[32]byte
	// Invitations: the selection is not published (the shell announces
	// rounds without it); the coordinator emits an Invite for every
	// selected client with the announcement, again with an extension and
	// whenever an invited client that has not reported comes online, and
	// Resume repeats them (differential privacy; coordinator_select.go).
	Invitations bool
	// FixedRoster: the sites that can be drawn are fixed at the run's first
	// draw, as every site registered then (a status seen, online or not);
	// a site first seen later is never drawn in this run. FedSplit's sum
	// mode under central DP counts the roster from round 1 so that its
	// divisor m does not reveal who was drawn (docs/privacy.md, "As built
	// (FedSplit)"); Roster reports it.
	FixedRoster bool
	// Selector picks clients; nil means aggregate.Uniform. A Sampler
	// (aggregate.Poisson) draws rounds of random size, possibly empty:
	// the round's quorum is then Quorum/K of its selection, and an empty
	// round closes at once, or at its deadline with DP.FixedRounds
	// (coordinator_select.go); it needs DP. A selector that
	// keeps state between rounds must implement json.Marshaler and
	// json.Unmarshaler for Snapshot/Restore to carry that state; otherwise a
	// restarted coordinator's selector starts afresh.
	Selector aggregate.Selector
	// StoreLate is true for the FedSplit family: an update that arrives after
	// its round closed becomes the client's latest z (AcceptLate). FedAvg and
	// FedProx ignore late updates (Reject with StaleRound or RoundClosed).
	StoreLate bool

	// The federated-preprocessing and evaluation protocol of a run with a
	// federation schema (coordinator_fed.go).
	//
	// Statistics: round 1 is preceded by a statistics phase. StatsSites:
	// it closes once this many distinct sites sent statistics (0: K), or
	// at its deadline (RoundTimeout from its announcement) once Quorum
	// have, and from then on as soon as Quorum have.
	Statistics bool
	StatsSites int
	// DeclaredTransform (with Statistics): the schema declares the
	// preprocessing, so no site sends statistics: the first event closes
	// the phase at once with FitTransform of no sites, and the evaluation
	// waits for the sites that have had an update accepted instead of the
	// statistics sites (coordinator_fed.go).
	DeclaredTransform bool
	// Evaluate: the run asks every site for an evaluation report of the
	// global model in announcement r when r > 1 and (r-1) % EvalEvery == 0
	// (EvalEvery 0: never during the run), and of the final model when it
	// ends (the finishing phase waits up to RoundTimeout for them).
	Evaluate  bool
	EvalEvery int
	// Stopping rules, checked at each aggregation (0: off): StopPatience
	// evaluations in a row whose federated loss did not improve on the best
	// by more than StopTol; a relative change of the global model below
	// StopDelta (AggregatedRound.Change).
	StopPatience int
	StopTol      float64
	StopDelta    float64

	// DP is central differential privacy's accountant and budget
	// (coordinator_dp.go; nil: off). It needs MaxReselections = 0, no
	// StoreLate and, with a federation schema, DeclaredTransform and no
	// StopPatience (coordinator_fed.go).
	DP *dp.Config
	// SecAgg is secure aggregation's phases (coordinator_secagg.go; nil:
	// off). It needs a quorum of at least its threshold, no StoreLate, no
	// federation schema and no DP.
	SecAgg *SecAggConfig
}

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("aggregator: invalid config")

// QuorumOf returns ceil(fraction*k) clamped to [1, k]. A tolerance absorbs
// float error, so QuorumOf(10, 0.7) is 7, not 8.
func QuorumOf(k int, fraction float64) int {
	if k < 1 {
		return 1
	}
	q := int(math.Ceil(fraction*float64(k) - 1e-9))
	return min(max(q, 1), k)
}

func (c Config) Validate() error {
	switch {
	case c.K < 1:
		return fmt.Errorf("%w: K = %d, want >= 1", ErrConfig, c.K)
	case c.Quorum < 1 || c.Quorum > c.K:
		return fmt.Errorf("%w: Quorum = %d, want 1..K (%d)", ErrConfig, c.Quorum, c.K)
	case c.RoundTimeout <= 0:
		return fmt.Errorf("%w: RoundTimeout = %v, want > 0", ErrConfig, c.RoundTimeout)
	case c.Extension < 0:
		return fmt.Errorf("%w: Extension = %v, want >= 0", ErrConfig, c.Extension)
	case c.Settle < 0:
		return fmt.Errorf("%w: Settle = %v, want >= 0", ErrConfig, c.Settle)
	case c.Rounds < 0:
		return fmt.Errorf("%w: Rounds = %d, want >= 0", ErrConfig, c.Rounds)
	case c.StatsSites < 0 || c.EvalEvery < 0 || c.StopPatience < 0:
		return fmt.Errorf("%w: StatsSites %d, EvalEvery %d, StopPatience %d: want >= 0", ErrConfig, c.StatsSites, c.EvalEvery, c.StopPatience)
	case !(c.StopTol >= 0) || !(c.StopDelta >= 0) || math.IsInf(c.StopTol, 0) || math.IsInf(c.StopDelta, 0):
		return fmt.Errorf("%w: StopTol %v, StopDelta %v: want finite and >= 0", ErrConfig, c.StopTol, c.StopDelta)
	case c.Evaluate && !c.Statistics:
		return fmt.Errorf("%w: Evaluate needs the statistics phase (the sites it waits for)", ErrConfig)
	case c.DeclaredTransform && !c.Statistics:
		return fmt.Errorf("%w: DeclaredTransform is a way through the statistics phase: it needs Statistics", ErrConfig)
	}
	if err := c.validateSecAgg(); err != nil {
		return err
	}
	return c.validateDP()
}

// Phase is where the current round is in its life cycle.
type Phase string

const (
	// PhaseWaiting: the round (or its re-selection) waits for Settle to pass
	// and Quorum clients to be online; no announcement is in force.
	PhaseWaiting Phase = "waiting"
	// PhaseCollecting: a selection is announced and its deadline is armed.
	PhaseCollecting Phase = "collecting"
	// PhaseStalled: re-selections are exhausted below quorum; the round
	// waits, without a timer, for invited clients to report.
	PhaseStalled Phase = "stalled"
	// PhaseClosing: CloseRound was emitted; waiting for AggregatedRound.
	PhaseClosing Phase = "closing"
	// PhaseFinished: the last round is aggregated; Step does nothing more.
	PhaseFinished Phase = "finished"
	// PhaseStatistics: before round 1, sites send statistics of their
	// training rows (Config.Statistics).
	PhaseStatistics Phase = "statistics"
	// PhaseFitting: FitTransform was emitted; waiting for TransformFitted.
	PhaseFitting Phase = "fitting"
	// PhaseFinishing: the run has ended (Finish was emitted); waiting for
	// the sites' evaluation reports of the final model, or the deadline.
	PhaseFinishing Phase = "finishing"
)

// Phases lists every phase, for metrics.
func Phases() []Phase {
	return []Phase{PhaseWaiting, PhaseCollecting, PhaseStalled, PhaseClosing, PhaseFinished, PhaseStatistics, PhaseFitting, PhaseFinishing, PhaseSecAgg}
}

// Event is an input to Step: ClientOnline, ClientOffline, UpdateArrived, Tick
// or AggregatedRound, passed by value.
type Event interface{ eventTime() time.Time }

// ClientOnline: a client's status says it is online (also fed from retained
// status messages at start-up). Samples is its n_k.
type ClientOnline struct {
	ID      string
	Samples int
	// Conn is the status's connection number (wire.ClientStatus.Connection;
	// 0 = unnumbered). See StatusStale.
	Conn uint64
	// Failing: the status carries a site error (wire ClientStatus
	// error_reason): the site is online but cannot take part, so it is not
	// selected until a status without an error arrives.
	Failing bool
	// Refused: the status says the site refused the open secure-aggregation
	// session (site error secagg_refused: a key list it could not verify,
	// docs/privacy.md "Threat model per mode"). It stays selectable (the
	// next session may be sound), but the open phase stops waiting for it.
	Refused bool
	At      time.Time
}

// ClientOffline: a client's status (or last will) says it is offline. An
// unknown ID is registered as a known, offline client.
type ClientOffline struct {
	ID   string
	Conn uint64 // as in ClientOnline
	At   time.Time
}

// UpdateArrived: a decoded and validated update. Partial is the work
// report's partial flag; Loss is its anchor loss (the client's loss at the
// round's global model, fed to loss-based selectors), NaN when unknown.
type UpdateArrived struct {
	Client  string
	Round   int
	Partial bool
	Loss    float64
	At      time.Time
}

// Tick: the timer the coordinator asked for (SetTimer) fired. Early or
// spurious ticks are harmless.
type Tick struct{ At time.Time }

// AggregatedRound: the shell aggregated and durably checkpointed the round
// that CloseRound closed. For the stopping rules it carries, when HasEval,
// the federated evaluation loss of the eval round the closed round's
// announcement asked for, and, when HasChange, the relative change of the
// global model ||x_new - x_old|| / ||x_old||.
type AggregatedRound struct {
	Round     int
	At        time.Time
	EvalLoss  float64
	HasEval   bool
	Change    float64
	HasChange bool
}

func (e ClientOnline) eventTime() time.Time    { return e.At }
func (e ClientOffline) eventTime() time.Time   { return e.At }
func (e UpdateArrived) eventTime() time.Time   { return e.At }
func (e Tick) eventTime() time.Time            { return e.At }
func (e AggregatedRound) eventTime() time.Time { return e.At }

// Decision is an output of Step, to be carried out in order.
type Decision interface{ decision() }

// Announce: publish the retained round message for Round with this selection
// and deadline. Attempt is 0 for the first selection and counts
// re-selections; a re-selection keeps the clients whose updates were already
// received in Selected. Selected is sorted.
type Announce struct {
	Round    int
	Attempt  int
	Selected []string
	Deadline time.Time
}

// Extend: republish the round message with the extended deadline and the
// selection in force (sorted).
type Extend struct {
	Round    int
	Selected []string
	Deadline time.Time
}

// Accept: store the update for (Round, Client) durably, then receipt it.
type Accept struct {
	Round   int
	Client  string
	Partial bool
}

// AcceptLate (FedSplit family only): store the update as the client's latest
// z, durably, then receipt it. It is not a contributor of Round: Round is
// closed (or closing, and its CloseRound.Contributors is what it aggregates).
type AcceptLate struct {
	Round   int
	Client  string
	Partial bool
}

// Reject: do not store; receipt with the reason's code.
type Reject struct {
	Round  int
	Client string
	Reason Reason
}

// CloseRound: aggregate Round from exactly the Contributors' updates (the
// FedSplit family: from every known client's latest z), checkpoint, then step
// AggregatedRound. Stragglers were invited but did not report; Partial lists
// contributors that sent partial work. All lists are sorted. Final: Round is
// the run's last (Config.Rounds), so no round opens after it. Late counts
// the late updates (AcceptLate) stored since the previous aggregation.
type CloseRound struct {
	Round        int
	Contributors []string
	Partial      []string
	Stragglers   []string
	At           time.Time
	Final        bool
	Late         int
	// Denominator is a DP round's fixed denominator m
	// (aggregate.DPDenominator, fixed when the round was drawn); 0
	// without DP, or in a state written before it was kept (then the
	// invited sites, contributors and stragglers, are m).
	Denominator int
}

// SetTimer: (re)arm the single timer to fire a Tick at At; the zero time
// cancels it.
type SetTimer struct{ At time.Time }

// StaleStatus: the client status (ClientOnline or ClientOffline) was set
// aside as older than one already applied (see StatusStale): keep the
// registry's newer status.
type StaleStatus struct {
	ID     string
	Conn   uint64
	Online bool
}

// Finished: the run is over (the last round, Rounds, is aggregated and,
// with Config.Evaluate, the final evaluation is in or timed out); no
// decision follows. Coordinator.StopReason says why the run ended.
type Finished struct {
	Rounds int
	At     time.Time
	// Missing are the sites whose final evaluation was awaited and had
	// not come at the deadline (sorted; the figures cover the others).
	Missing []string
}

func (Announce) decision()    {}
func (Extend) decision()      {}
func (Accept) decision()      {}
func (AcceptLate) decision()  {}
func (Reject) decision()      {}
func (CloseRound) decision()  {}
func (SetTimer) decision()    {}
func (Finished) decision()    {}
func (StaleStatus) decision() {}

// Reason says why an update was rejected; its String is the metric label.
type Reason int

const (
	// StaleRound: for a round before the current one (FedAvg/FedProx ignore
	// late updates; FedSplit too when it holds a newer update of the client
	// or the client was not invited to that round).
	StaleRound Reason = iota + 1
	// FutureRound: for a round not announced yet.
	FutureRound
	// NotSelected: for the current round from a client never invited to it.
	NotSelected
	// Duplicate: (round, client) is already stored; this copy is ignored.
	Duplicate
	// UnknownClient: the client was never seen in a status message.
	UnknownClient
	// RoundClosed: for the current round after CloseRound (FedAvg/FedProx).
	RoundClosed
)

var reasonNames = map[Reason]string{
	StaleRound:    "stale_round",
	FutureRound:   "future_round",
	NotSelected:   "not_selected",
	Duplicate:     "duplicate",
	UnknownClient: "unknown_client",
	RoundClosed:   "round_closed",
}

// Reasons lists every Reason, for exporting zero-valued metrics.
func Reasons() []Reason {
	return []Reason{StaleRound, FutureRound, NotSelected, Duplicate, UnknownClient, RoundClosed}
}

func (r Reason) String() string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// MarshalText makes Reason a readable JSON map key.
func (r Reason) MarshalText() ([]byte, error) {
	if _, ok := reasonNames[r]; !ok {
		return nil, fmt.Errorf("aggregator: unknown reason %d", int(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalText parses a name written by MarshalText.
func (r *Reason) UnmarshalText(b []byte) error {
	for k, v := range reasonNames {
		if v == string(b) {
			*r = k
			return nil
		}
	}
	return fmt.Errorf("aggregator: unknown reason %q", b)
}

// Counters are monotonic totals for metrics; they survive Snapshot/Restore.
type Counters struct {
	Accepted       uint64            `json:"accepted"`
	AcceptedLate   uint64            `json:"accepted_late"`
	PartialUpdates uint64            `json:"partial_updates"` // accepted (incl. late) with partial work
	Rejected       map[Reason]uint64 `json:"rejected,omitempty"`
	Stragglers     uint64            `json:"stragglers"` // invited, not reported, summed over closed rounds
	Extensions     uint64            `json:"extensions"`
	Reselections   uint64            `json:"reselections"`
	Stalls         uint64            `json:"stalls"` // rounds that ran out of re-selections
	RoundsClosed   uint64            `json:"rounds_closed"`
	Ignored        uint64            `json:"ignored"`        // malformed or out-of-place events
	StaleStatuses  uint64            `json:"stale_statuses"` // statuses StatusStale set aside
	StatsAccepted  uint64            `json:"stats_accepted,omitempty"`
	EvalsAccepted  uint64            `json:"evals_accepted,omitempty"`  // evaluation reports (copies included)
	SecAggMessages uint64            `json:"secagg_messages,omitempty"` // secure-aggregation messages accepted
	SecAggAborts   uint64            `json:"secagg_aborts,omitempty"`   // sessions aborted without a sum
}

func (c Counters) clone() Counters {
	if len(c.Rejected) == 0 {
		c.Rejected = nil // as JSON gives it back
	} else {
		m := make(map[Reason]uint64, len(c.Rejected))
		for k, v := range c.Rejected {
			m[k] = v
		}
		c.Rejected = m
	}
	return c
}

// client is the registry entry of one known client.
type client struct {
	samples   int
	online    bool
	failing   bool    // online with a site error: not selectable
	refused   bool    // refused the open secagg session (ClientOnline.Refused); cleared when a session ends
	loss      float64 // NaN when unknown
	lastRound int     // latest round whose update from this client is stored
	pending   []int   // rounds invited to and not reported, ascending, at most maxPending
	// conn is the highest connection number among the statuses applied
	// (0: none numbered). It is not part of State: after a restart the
	// broker's retained statuses set it again.
	conn uint64
	// droppedAt is when the client last went offline (zero: never seen
	// offline); settleUntil waits for a client that dropped after the
	// previous draw.
	droppedAt time.Time
}

// maxPending bounds the invitations remembered per client: a late update for
// an older round is rejected as stale (the client has been asked for newer
// work since).
const maxPending = 8

func (cl *client) invite(round int) {
	if n := len(cl.pending); n > 0 && cl.pending[n-1] == round {
		return // picked again by a re-selection
	}
	cl.pending = append(cl.pending, round)
	if n := len(cl.pending); n > maxPending {
		cl.pending = slices.Delete(cl.pending, 0, n-maxPending)
	}
}

// Coordinator is the round state machine. It is not safe for concurrent use:
// the shell steps it from one goroutine.
type Coordinator struct {
	cfg     Config
	sel     aggregate.Selector
	clients map[string]*client

	phase    Phase
	round    int
	attempts int             // selections announced for this round
	selected []string        // current selection, sorted
	invited  map[string]bool // union of this round's selections
	roster   map[string]bool // Config.FixedRoster, once fixed
	received map[string]bool // client -> partial, this round's contributors
	// receivedIDs lists received's ids in the order they came (receive,
	// setReceived). It only grows within a round and is replaced, never
	// truncated, so Summary hands out a prefix of it without a copy.
	receivedIDs []string
	// online and ready count the clients online and those online and not
	// failing (setPresence), so that neither a status view nor the
	// waiting phase's "can a round be drawn" walks the registry per
	// event.
	online, ready int
	deadline      time.Time
	extended      bool // the current selection's deadline was extended
	overdue       bool // a deadline passed below quorum: close on quorum
	started       bool // waitingSince is set
	waitingSince  time.Time
	// lastDraw is when the last selection was drawn (zero: none yet);
	// settleUntil uses it.
	lastDraw time.Time
	closedAt time.Time // CloseRound's or Finished's time
	timer    time.Time // last SetTimer sent
	late     int       // late updates (AcceptLate) since the last aggregation
	counters Counters
	proposal Event       // an accepted message awaiting Stored or StoreFailed (coordinator_propose.go)
	applied  uint64      // the replay log index of the last stored message applied (coordinator_replay.go)
	fed      fedState    // the statistics phase, evaluations, stopping rules
	dp       dpState     // the accountant (Config.DP)
	sa       secAggState // the round's secure aggregation (Config.SecAgg)
}

// New returns a coordinator waiting to announce round 1. The waiting (for
// Settle) starts with the first event stepped.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Extension == 0 {
		cfg.Extension = cfg.RoundTimeout
	}
	sel := cfg.Selector
	if sel == nil {
		sel = aggregate.Uniform{}
	}
	if cfg.StatsSites == 0 {
		cfg.StatsSites = cfg.K
	}
	c := &Coordinator{cfg: cfg, sel: sel, clients: map[string]*client{}}
	if cfg.DP != nil {
		c.dp.acc = dp.NewAccountant(nil)
	}
	c.resetRound(1)
	c.fed.reset()
	if cfg.Statistics {
		c.phase = PhaseStatistics
	}
	return c, nil
}

func (c *Coordinator) resetRound(r int) {
	c.phase = PhaseWaiting
	c.round = r
	c.attempts = 0
	c.selected = nil
	c.invited = map[string]bool{}
	c.setReceived(map[string]bool{})
	c.deadline = time.Time{}
	c.extended, c.overdue = false, false
	c.resetSecAgg()
}

// Round is the current round number (the last one once finished).
func (c *Coordinator) Round() int { return c.round }

// Phase is the current round's phase.
func (c *Coordinator) Phase() Phase { return c.phase }

// Population returns how many registered clients have a positive sample
// count and the sum of those counts: FedSplit's per-client step
// s_j = s m n_j / n needs them so that the mean of the z_j has the minimiser
// of the sample-weighted objective as its fixed point.
func (c *Coordinator) Population() (clients int, samples int64) {
	for _, cl := range c.clients {
		if cl.samples > 0 {
			clients++
			samples += int64(cl.samples)
		}
	}
	return clients, samples
}

// final says whether the current round is the run's last (Config.Rounds).
func (c *Coordinator) final() bool { return c.cfg.Rounds > 0 && c.round >= c.cfg.Rounds }

// NextDeadline is when the coordinator wants a Tick; zero when it does not.
// It equals the At of the last SetTimer decision.
func (c *Coordinator) NextDeadline() time.Time { return c.timer }

// Counters returns a copy of the metric totals.
func (c *Coordinator) Counters() Counters { return c.counters.clone() }

// norm strips the monotonic reading and the location: the coordinator
// compares wall times only, as it must after a restart restored its
// deadlines from storage.
func norm(t time.Time) time.Time { return t.Round(0).UTC() }

// Step applies one event and returns the decisions it causes, in the order
// the shell must carry them out. After Finished it returns nil.
func (c *Coordinator) Step(ev Event) []Decision {
	if ev == nil {
		return nil
	}
	if out, ok := c.settle(ev); ok {
		return out
	}
	if c.clipEstimated(ev) {
		return nil
	}
	switch c.phase {
	case PhaseFinished:
		return c.stepFinished(ev)
	case PhaseFinishing:
		return c.stepFinishing(ev)
	case PhaseStatistics, PhaseFitting:
		return c.stepStatistics(ev)
	}
	at := norm(ev.eventTime())
	if !c.started {
		c.started, c.waitingSince = true, at
	}
	var out []Decision
	switch e := ev.(type) {
	case ClientOnline:
		out = c.secAggCheck(c.clientOnline(e))
	case ClientOffline:
		out = c.secAggCheck(c.clientOffline(e))
	case UpdateArrived:
		out = c.update(e, at)
	case Tick:
		if c.phase == PhaseCollecting && !at.Before(c.deadline) {
			out = c.deadlinePassed(at, out)
		} else if c.phase == PhaseSecAgg {
			out = c.secAggTick(at, out)
		}
	case SecAggArrived:
		out = c.secAggArrived(e, at)
	case SecAggAdvanced:
		out = c.secAggAdvanced(e, at)
	case AggregatedRound:
		out = c.aggregated(e, at)
	case EvalArrived:
		out = c.evalArrived(e, at)
	case StatisticsArrived:
		out = c.lateStatistics(e)
	default:
		c.counters.Ignored++
	}
	if c.phase == PhaseWaiting {
		// Any event may have made a selection possible (or Settle may have
		// passed); trying on every event keeps this in one place.
		out = c.trySelect(at, out)
	}
	return c.timerDecision(out)
}

// timerDecision appends SetTimer when the wanted timer changed.
func (c *Coordinator) timerDecision(out []Decision) []Decision {
	if want := c.wantTimer(); !want.Equal(c.timer) {
		c.timer = want
		out = append(out, SetTimer{At: want})
	}
	return out
}

// stepFinished is Step once the run has finished.
func (c *Coordinator) stepFinished(ev Event) []Decision {
	out, _ := c.afterRun(ev)
	return out
}

// afterRun answers the events that still get an answer once the run has
// ended (finished, or awaiting the final evaluation reports); ok is false
// for any other event. No round changes any more, but an update still gets
// its answer, so that the site clears its outbox instead of re-sending;
// presence is still tracked, so that status after the run shows the sites
// that went offline as offline (they decide nothing); evaluation reports
// are taken and statistics are late.
func (c *Coordinator) afterRun(ev Event) (out []Decision, ok bool) {
	switch e := ev.(type) {
	case UpdateArrived:
		return c.afterFinish(e), true
	case ClientOnline:
		return c.clientOnline(e), true
	case ClientOffline:
		return c.clientOffline(e), true
	case EvalArrived:
		return c.evalArrived(e, norm(e.At)), true
	case StatisticsArrived:
		return c.lateStatistics(e), true
	case SecAggArrived:
		return c.secAggArrived(e, norm(e.At)), true
	}
	return nil, false
}

// afterFinish answers an update that arrives once the federation finished:
// a copy of one it stored is a duplicate, anything else is too late.
func (c *Coordinator) afterFinish(u UpdateArrived) []Decision {
	cl := c.clients[u.Client]
	switch {
	case cl == nil:
		return c.reject(u, UnknownClient)
	case cl.lastRound == u.Round:
		return c.reject(u, Duplicate)
	case u.Round > c.round:
		return c.reject(u, FutureRound)
	}
	return c.reject(u, RoundClosed)
}

// setPresence sets cl's online and failing flags and keeps the counts
// (Coordinator.online, ready) in step: the one place they change.
func (c *Coordinator) setPresence(cl *client, online, failing bool) {
	c.online += b2i(online) - b2i(cl.online)
	c.ready += b2i(online && !failing) - b2i(cl.online && !cl.failing)
	cl.online, cl.failing = online, failing
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// receive adds id to the round's contributors (partial: its work was
// partial).
func (c *Coordinator) receive(id string, partial bool) {
	if _, ok := c.received[id]; !ok {
		c.receivedIDs = append(c.receivedIDs, id)
	}
	c.received[id] = partial
}

// setReceived replaces the round's contributors with m (receivedIDs in id
// order).
func (c *Coordinator) setReceived(m map[string]bool) {
	c.received = m
	c.receivedIDs = slices.Sorted(maps.Keys(m))
}

func (c *Coordinator) register(id string) *client {
	cl := c.clients[id]
	if cl == nil {
		cl = &client{loss: math.NaN()}
		c.clients[id] = cl
	}
	return cl
}

// StatusStale reports whether a status of client id with connection number
// conn is older than what the coordinator has applied, and so to be set
// aside: a smaller number than the highest seen, or an online status whose
// connection's offline status (its last will) was already applied. The
// outcome does not depend on the order statuses arrive in, which MQTT does
// not fix here: paho hands messages to concurrent handlers, a resumed
// session's queued statuses mix with the retained one, and the will of a
// half-open connection is published when a newer connection takes it over.
// An unnumbered status (conn 0, older agents) is never stale.
func (c *Coordinator) StatusStale(id string, conn uint64, online bool) bool {
	cl := c.clients[id]
	if cl == nil || conn == 0 {
		return false
	}
	return conn < cl.conn || (conn == cl.conn && online && !cl.online)
}

func (c *Coordinator) clientOnline(e ClientOnline) []Decision {
	if e.ID == "" {
		c.counters.Ignored++
		return nil
	}
	if c.StatusStale(e.ID, e.Conn, true) {
		c.counters.StaleStatuses++
		return []Decision{StaleStatus{ID: e.ID, Conn: e.Conn, Online: true}}
	}
	cl := c.register(e.ID)
	c.setPresence(cl, true, e.Failing)
	cl.refused = e.Refused
	cl.samples = max(e.Samples, 0)
	cl.conn = max(cl.conn, e.Conn)
	return c.reinvite(e.ID)
}

func (c *Coordinator) clientOffline(e ClientOffline) []Decision {
	if e.ID == "" {
		c.counters.Ignored++
		return nil
	}
	if c.StatusStale(e.ID, e.Conn, false) {
		c.counters.StaleStatuses++
		return []Decision{StaleStatus{ID: e.ID, Conn: e.Conn}}
	}
	// An offline selected client stays selected: it may come back before the
	// deadline, and at the deadline it is simply a straggler.
	cl := c.register(e.ID)
	if cl.online {
		cl.droppedAt = norm(e.At)
	}
	c.setPresence(cl, false, cl.failing)
	cl.conn = max(cl.conn, e.Conn)
	return nil
}

func (c *Coordinator) reject(u UpdateArrived, r Reason) []Decision {
	if c.counters.Rejected == nil {
		c.counters.Rejected = map[Reason]uint64{}
	}
	c.counters.Rejected[r]++
	return []Decision{Reject{Round: u.Round, Client: u.Client, Reason: r}}
}

func (c *Coordinator) stored(cl *client, u UpdateArrived) {
	cl.lastRound = u.Round
	// Invitations up to this round are answered or obsolete.
	cl.pending = slices.DeleteFunc(cl.pending, func(r int) bool { return r <= u.Round })
	if !math.IsNaN(u.Loss) && !math.IsInf(u.Loss, 0) {
		cl.loss = u.Loss
	}
	if u.Partial {
		c.counters.PartialUpdates++
	}
}

// judgeUpdate is the answer to an update in the open phases, without
// changing anything: Accept (an invited client, the open round, first
// copy), AcceptLate or Reject.
func (c *Coordinator) judgeUpdate(u UpdateArrived) Decision {
	rej := func(r Reason) Decision { return Reject{Round: u.Round, Client: u.Client, Reason: r} }
	cl := c.clients[u.Client]
	switch {
	case cl == nil:
		return rej(UnknownClient)
	case c.cfg.SecAgg != nil:
		// Under secure aggregation a site sends secagg messages only: a
		// plain update would reach the aggregator unmasked.
		return rej(NotSelected)
	case u.Round > c.round, c.phase == PhaseStatistics, c.phase == PhaseFitting:
		return rej(FutureRound)
	case u.Round < 1:
		return rej(StaleRound)
	case u.Round == c.round && c.phase != PhaseClosing:
		if _, dup := c.received[u.Client]; dup {
			return rej(Duplicate)
		}
		if !c.invited[u.Client] {
			// An unsolicited update is refused in every family: accepting
			// it would let a site bypass the selection policy (and, for
			// FedSplit, step its z more often than the others).
			return rej(NotSelected)
		}
		return Accept{Round: u.Round, Client: u.Client, Partial: u.Partial}
	}
	// The update's round is closed (or closing).
	switch {
	case cl.lastRound == u.Round:
		return rej(Duplicate)
	case c.cfg.StoreLate && slices.Contains(cl.pending, u.Round):
		// The client was asked for this round and we hold nothing newer
		// from it (pending only keeps rounds after lastRound): its z is
		// the newest we can have.
		return AcceptLate{Round: u.Round, Client: u.Client, Partial: u.Partial}
	case u.Round == c.round:
		return rej(RoundClosed)
	default:
		return rej(StaleRound)
	}
}

func (c *Coordinator) update(u UpdateArrived, at time.Time) []Decision {
	switch d := c.judgeUpdate(u).(type) {
	case Accept:
		c.receive(u.Client, u.Partial)
		c.stored(c.clients[u.Client], u)
		c.counters.Accepted++
		out := []Decision{d}
		if c.closable() {
			out = c.close(at, out)
		}
		return out
	case AcceptLate:
		c.stored(c.clients[u.Client], u)
		c.counters.AcceptedLate++
		c.late++
		return []Decision{d}
	case Reject:
		return c.reject(u, d.Reason)
	}
	panic("aggregator: judgeUpdate answered neither Accept nor Reject")
}

// closable says whether the open round can close now.
func (c *Coordinator) closable() bool {
	if len(c.received) < c.quorum() {
		return false
	}
	if c.phase == PhaseCollecting && c.cfg.DP != nil && c.cfg.DP.FixedRounds {
		// Fixed-length rounds close at their deadline (deadlinePassed),
		// so when a round ends tells nobody how many were drawn.
		return false
	}
	if c.overdue {
		return true
	}
	if c.phase != PhaseCollecting || len(c.received) < len(c.selected) {
		// Every selected client has reported only if at least as many
		// have reported as are selected: without the walk below, which
		// after every update made a round of K updates quadratic.
		return false
	}
	for _, id := range c.selected {
		if _, ok := c.received[id]; !ok {
			return false
		}
	}
	return true
}

func (c *Coordinator) close(at time.Time, out []Decision) []Decision {
	if c.cfg.SecAgg != nil && c.phase != PhaseSecAgg {
		return c.startSecAgg(out)
	}
	c.phase = PhaseClosing
	c.closedAt = at
	c.dpCharge()
	cr := c.closeDecision()
	c.counters.Stragglers += uint64(len(cr.Stragglers))
	c.counters.RoundsClosed++
	return append(out, cr)
}

func (c *Coordinator) closeDecision() CloseRound {
	cr := CloseRound{Round: c.round, At: c.closedAt, Contributors: []string{}, Partial: []string{}, Stragglers: []string{},
		Final: c.final(), Late: c.late, Denominator: c.dp.m}
	for id, partial := range c.received {
		cr.Contributors = append(cr.Contributors, id)
		if partial {
			cr.Partial = append(cr.Partial, id)
		}
	}
	for id := range c.invited {
		if _, ok := c.received[id]; !ok {
			cr.Stragglers = append(cr.Stragglers, id)
		}
	}
	slices.Sort(cr.Contributors)
	slices.Sort(cr.Partial)
	slices.Sort(cr.Stragglers)
	return cr
}

func (c *Coordinator) deadlinePassed(at time.Time, out []Decision) []Decision {
	if len(c.received) >= c.quorum() {
		return c.close(at, out)
	}
	c.overdue = true
	if !c.extended {
		c.extended = true
		c.deadline = at.Add(c.cfg.Extension)
		c.counters.Extensions++
		out = c.invite(out, c.waitingFor())
		return append(out, Extend{Round: c.round, Selected: slices.Clone(c.selected), Deadline: c.deadline})
	}
	if m := c.cfg.MaxReselections; m >= 0 && c.attempts-1 >= m {
		c.phase = PhaseStalled
		c.counters.Stalls++
		return out
	}
	// Step re-selects now if it can, or when clients come online.
	c.phase = PhaseWaiting
	c.waitingSince = at
	return out
}

// Roster is the fixed roster, sorted (Config.FixedRoster; nil until the
// run's first draw fixes it).
func (c *Coordinator) Roster() []string {
	if c.roster == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(c.roster))
}

// InRoster says whether id may be drawn under the fixed roster
// (Config.FixedRoster): true when no roster is fixed (yet).
func (c *Coordinator) InRoster(id string) bool {
	return c.roster == nil || c.roster[id]
}

// pool lists the online clients that have not reported this round, sorted
// (only the roster's, once it is fixed).
func (c *Coordinator) pool() []string {
	var ids []string
	for id, cl := range c.clients {
		if c.roster != nil && !c.roster[id] {
			continue
		}
		if _, done := c.received[id]; cl.online && !cl.failing && !done {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// poolSize is len(c.pool()), from the counts when nothing narrows the
// online clients (no report yet this round, no fixed roster): the waiting
// phase asks it after every status.
func (c *Coordinator) poolSize() int {
	if len(c.received) == 0 && c.roster == nil {
		return c.ready
	}
	return len(c.pool())
}

// selectable says whether a selection from a pool of n can reach quorum.
func (c *Coordinator) selectable(n int) bool {
	return n > 0 && len(c.received)+n >= c.cfg.Quorum && (c.attempts > 0 || c.dpFits(n))
}

func (c *Coordinator) trySelect(at time.Time, out []Decision) []Decision {
	if at.Before(c.settleUntil()) || !c.selectable(c.poolSize()) {
		return out
	}
	pool := c.pool()
	c.lastDraw = at
	if c.cfg.FixedRoster && c.roster == nil {
		c.roster = make(map[string]bool, len(c.clients))
		for id := range c.clients {
			c.roster[id] = true
		}
	}
	attempt := c.attempts
	if attempt == 0 && c.EvalAt(c.round) {
		c.askEval(c.round - 1)
	}
	picks := c.pick(pool, c.cfg.K-len(c.received), attempt)
	if attempt == 0 {
		c.dpDrawn(len(pool))
	}
	c.attempts++
	if attempt > 0 {
		c.counters.Reselections++
	}
	sel := make([]string, 0, len(c.received)+len(picks))
	for id := range c.received {
		sel = append(sel, id)
	}
	for _, id := range picks {
		sel = append(sel, id)
		c.invited[id] = true
		c.clients[id].invite(c.round)
	}
	slices.Sort(sel)
	if len(sel) == 0 {
		sel = nil // an empty Poisson draw, as Restore gives it back
	}
	c.selected = sel
	c.phase = PhaseCollecting
	c.deadline = at.Add(c.cfg.RoundTimeout)
	c.extended = false
	out = c.invite(out, picks)
	out = append(out, Announce{Round: c.round, Attempt: attempt, Selected: slices.Clone(sel), Deadline: c.deadline})
	if c.closable() {
		// An empty Poisson draw: the round is released at once (under DP,
		// noise only; coordinator_select.go), or at its deadline with
		// fixed-length rounds.
		out = c.close(at, out)
	}
	return out
}

// pick asks the selector for k of pool. A selector's answer is trusted only
// as far as it is valid: out-of-range and repeated indices are dropped, and a
// short answer is topped up in ID order, so a buggy selector cannot break
// the quorum invariant or panic the coordinator.
func (c *Coordinator) pick(pool []string, k, attempt int) []string {
	k = min(k, len(pool))
	cands := make([]aggregate.Candidate, len(pool))
	for i, id := range pool {
		cl := c.clients[id]
		cands[i] = aggregate.Candidate{ID: id, Samples: cl.samples, Loss: cl.loss}
	}
	idx := c.sel.Select(c.round, cands, k, streams.Selection(c.cfg.Seed, c.cfg.SelectionKey, c.round, attempt))
	if c.sampled() {
		// A Sampler's selection is its whole answer, of any size: never
		// capped at k or topped up.
		k = len(pool)
	}
	taken := make([]bool, len(pool))
	picks := make([]string, 0, k)
	for _, i := range idx {
		if len(picks) == k {
			break
		}
		if i >= 0 && i < len(pool) && !taken[i] {
			taken[i] = true
			picks = append(picks, pool[i])
		}
	}
	for i := 0; len(picks) < k && !c.sampled(); i++ {
		if !taken[i] {
			taken[i] = true
			picks = append(picks, pool[i])
		}
	}
	return picks
}

func (c *Coordinator) aggregated(e AggregatedRound, at time.Time) []Decision {
	if c.phase != PhaseClosing || e.Round != c.round {
		c.counters.Ignored++
		return nil
	}
	c.late = 0
	if reason := c.stopRule(e); reason != "" {
		return c.finish(at, reason)
	}
	if c.dpExhausted() {
		return c.finish(at, StopDPBudget)
	}
	c.resetRound(c.round + 1)
	c.waitingSince = at
	return nil
}

// settleUntil is when the draw stops waiting for Settle; zero when it need
// not wait. Settle waits for sites that are expected but not online yet:
// after the coordinator starts or restarts (when the sites' retained
// statuses arrive in a burst and the coordinator cannot know who is still
// coming) the first draw waits the whole Settle, or until every expected
// site (Config.Expected) is online; after that a draw waits
// only while a site that was online at the previous draw is offline (a
// reconnect, an agent restart), and never longer than Settle from the start
// of the wait. A round whose expected sites are all online is drawn the
// moment the previous one closes; a site already offline at the previous
// draw is not waited for again.
func (c *Coordinator) settleUntil() time.Time {
	end := c.waitingSince.Add(c.cfg.Settle)
	if c.lastDraw.IsZero() {
		if c.expectedOnline() {
			return time.Time{}
		}
		return end
	}
	for _, cl := range c.clients {
		if !cl.online && cl.droppedAt.After(c.lastDraw) {
			return end
		}
	}
	return time.Time{}
}

// expectedOnline says whether Config.Expected is not empty and every one
// of its sites is online.
func (c *Coordinator) expectedOnline() bool {
	for _, id := range c.cfg.Expected {
		if cl := c.clients[id]; cl == nil || !cl.online {
			return false
		}
	}
	return len(c.cfg.Expected) > 0
}

// wantTimer is when the current phase needs a Tick.
func (c *Coordinator) wantTimer() time.Time {
	switch c.phase {
	case PhaseCollecting:
		return c.deadline
	case PhaseWaiting:
		if c.selectable(c.poolSize()) {
			return c.settleUntil()
		}
	case PhaseStatistics:
		if c.attempts > 0 && !c.overdue {
			return c.deadline
		}
	case PhaseFinishing:
		return c.deadline
	case PhaseSecAgg:
		if !c.sa.advancing {
			return c.sa.deadline
		}
	}
	return time.Time{}
}

// Resume returns the decisions that re-establish the outside world after
// Restore, for the shell to carry out idempotently: the current announcement
// and timer while collecting (the announcement alone when stalled), the
// timer while waiting, the CloseRound again while closing (skip the
// aggregation if its checkpoint exists, then step AggregatedRound), Finished
// when finished. It changes nothing.
func (c *Coordinator) Resume() []Decision {
	var out []Decision
	switch c.phase {
	case PhaseCollecting, PhaseStalled:
		out = c.invite(out, c.waitingFor())
		out = append(out, Announce{Round: c.round, Attempt: c.attempts - 1, Selected: slices.Clone(c.selected), Deadline: c.deadline})
	case PhaseClosing:
		out = append(out, c.closeDecision())
	case PhaseSecAgg:
		out = append(out, c.resumeSecAgg())
	case PhaseFinished:
		return []Decision{Finished{Rounds: c.round, At: c.closedAt}}
	case PhaseStatistics:
		if c.attempts > 0 {
			out = append(out, AnnounceStatistics{Deadline: c.deadline})
		}
	case PhaseFitting:
		out = append(out, FitTransform{Sites: c.fed.statsList(), At: c.closedAt})
	case PhaseFinishing:
		out = append(out, Finish{Rounds: c.round, Deadline: c.deadline, Reason: c.fed.stopReason})
	}
	if !c.timer.IsZero() {
		out = append(out, SetTimer{At: c.timer})
	}
	return out
}

// OfType lists the decisions of type T in ds.
func OfType[T Decision](ds []Decision) []T {
	var out []T
	for _, d := range ds {
		if v, ok := d.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// EventTime is the time an event carries (its At): the shell logs and
// stamps with it.
func EventTime(ev Event) time.Time { return ev.eventTime() }
