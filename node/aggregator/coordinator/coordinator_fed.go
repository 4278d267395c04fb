package coordinator

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/edgefl/edgefl/learn/dp"
)

// The protocol of a run with a federation schema, as part of the
// same deterministic state machine:
//
//   - Statistics phase (Config.Statistics), before round 1 (with
//     Config.DeclaredTransform it closes at the first event, FitTransform of
//     no sites: the schema declares the preprocessing): the first event
//     announces it (AnnounceStatistics, with a deadline RoundTimeout later);
//     each site's first valid statistics are accepted (AcceptStatistics:
//     store durably, then receipt), a copy is a Duplicate. At StatsSites
//     sites, or at the deadline with Quorum (and from then on at Quorum),
//     FitTransform names the sites whose statistics make the federation's
//     preprocessing: the shell fits it, creates and checkpoints the initial
//     model, persists, and steps TransformFitted, which opens round 1 as
//     usual (waiting for Settle and Quorum). Below Quorum at the deadline
//     the phase goes on and StatsOverdue tells the shell (which names the
//     missing sites and why). Statistics that arrive after the phase
//     closed are rejected as StaleRound.
//   - Evaluation (Config.Evaluate): announcement r asks for eval round r-1
//     (EvalAt). EvalArrived for a requested eval round from a known client
//     is accepted (AcceptEval: store idempotently, receipt); once every
//     evaluation site (evalSites: the statistics sites, or with a declared
//     transform the sites with an accepted update) has reported the
//     latest requested eval round,
//     EvalComplete tells the shell (log it, write the latest bundle).
//   - Stopping (StopPatience/StopTol on the federated losses the shell
//     hands in with AggregatedRound, StopDelta on the model's change) and
//     the end: Finish (announce the end, with the final model) and, with
//     Evaluate, the finishing phase: the final evaluation reports (eval
//     round = Rounds done) until every awaited site reported (awaited: the
//     statistics sites and every site online without a site error) or
//     RoundTimeout passed, then Finished, naming the awaited sites that
//     did not report (Missing).

// StatisticsArrived: a decoded and validated SiteStatistics of Client.
// Samples is its training rows (statisticsEvent): the site's sample count
// from the statistics on, so that round 1's FedSplit steps (Population)
// do not depend on whether the site's status with its count arrived
// before the draw.
type StatisticsArrived struct {
	Client  string
	Samples int
	At      time.Time
}

// TransformFitted: the shell fitted the preprocessing from FitTransform's
// sites and durably stored it with the initial model.
type TransformFitted struct{ At time.Time }

// EvalArrived: a decoded and validated evaluation report of Client for
// eval round Round (the number of aggregations of the model it evaluated).
type EvalArrived struct {
	Client string
	Round  int
	At     time.Time
}

func (e StatisticsArrived) eventTime() time.Time { return e.At }
func (e TransformFitted) eventTime() time.Time   { return e.At }
func (e EvalArrived) eventTime() time.Time       { return e.At }

// AnnounceStatistics: publish the retained statistics-phase announcement
// (round 0) with this deadline.
type AnnounceStatistics struct{ Deadline time.Time }

// AcceptStatistics: store the client's statistics durably, then receipt.
type AcceptStatistics struct{ Client string }

// RejectStatistics: do not store; receipt with the reason (Duplicate: an
// accepted receipt, as for updates).
type RejectStatistics struct {
	Client string
	Reason Reason
}

// FitTransform: fit the federation's preprocessing from the stored
// statistics of Sites (sorted), create the model and its initial
// parameters, store them (skip if stored already: a restart), then step
// TransformFitted.
type FitTransform struct {
	Sites []string
	At    time.Time
}

// StatsOverdue: the statistics phase passed its deadline with fewer
// than Quorum sites' statistics (Sites, sorted); it now closes as soon as
// Quorum have sent theirs. The shell tells the operator which sites are
// missing and why.
type StatsOverdue struct {
	Deadline time.Time
	Sites    []string
	Quorum   int
}

// AcceptEval: store the evaluation report (Round, Client) unless stored
// already (then it is a duplicate), then receipt.
type AcceptEval struct {
	Round  int
	Client string
}

// RejectEval: do not store; receipt with the reason.
type RejectEval struct {
	Round  int
	Client string
	Reason Reason
}

// EvalComplete: every statistics site has reported eval round Round.
type EvalComplete struct{ Round int }

// Finish: the run has ended after Rounds rounds (Reason: "rounds",
// "stop_delta" or "stop_patience"): announce it with the final model
// (asking for its evaluation with Config.Evaluate, whose reports are
// awaited until Deadline; zero without Evaluate, and Finished follows at
// once).
type Finish struct {
	Rounds   int
	Deadline time.Time
	Reason   string
}

func (AnnounceStatistics) decision() {}
func (AcceptStatistics) decision()   {}
func (RejectStatistics) decision()   {}
func (FitTransform) decision()       {}
func (StatsOverdue) decision()       {}
func (AcceptEval) decision()         {}
func (RejectEval) decision()         {}
func (EvalComplete) decision()       {}
func (Finish) decision()             {}

// Stop reasons (Finish.Reason, Coordinator.StopReason).
const (
	StopRounds   = "rounds"
	StopDelta    = "stop_delta"
	StopPatience = "stop_patience"
)

// fedState is the coordinator's part of the schema-run protocol.
type fedState struct {
	stats      map[string]bool // sites whose statistics were accepted
	statsIDs   []string        // stats' ids in the order accepted (addStats; only grows, as receivedIDs)
	evalRound  int             // the latest eval round asked for (0: none)
	evalGot    map[string]bool // who reported evalRound
	evalDone   bool            // EvalComplete (or Finished) sent for evalRound
	bestLoss   float64
	hasBest    bool
	sinceBest  int // evaluations since the best one
	stopReason string
}

func (f *fedState) reset() {
	f.stats = map[string]bool{}
	f.statsIDs = nil
	f.evalGot = map[string]bool{}
}

// addStats records that id's statistics were accepted.
func (f *fedState) addStats(id string) {
	if !f.stats[id] {
		f.statsIDs = append(f.statsIDs, id)
	}
	f.stats[id] = true
}

func (f *fedState) statsList() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for id := range f.stats {
			if !yield(id) {
				return
			}
		}
	})
}

// evalSites are the sites an evaluation waits for, sorted: those whose
// statistics were accepted, or with a declared transform (no statistics)
// those that have had an update accepted in the run.
func (c *Coordinator) evalSites() []string {
	if !c.cfg.DeclaredTransform {
		return c.fed.statsList()
	}
	var ids []string
	for id, cl := range c.clients {
		if cl.lastRound > 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// validateFedDP: differential privacy with a federation schema needs the
// schema's declared preprocessing (no site sends statistics) and no
// patience rule (the run's length would then depend on the sites'
// evaluation losses, which the guarantee does not cover; docs/privacy.md,
// "Evaluation under DP").
func (c Config) validateFedDP() error {
	switch {
	case c.Statistics && !c.DeclaredTransform:
		return fmt.Errorf("%w: differential privacy with a federation schema needs the schema to declare its preprocessing (hint: docs/privacy.md, \"Preprocessing under DP\")", ErrConfig)
	case c.StopPatience > 0:
		return fmt.Errorf("%w: differential privacy with the patience rule: the sites' losses would decide the stop (hint: --stop-delta watches the released models only)", ErrConfig)
	}
	return nil
}

// checkRates checks a restored charging history against the accountant's
// rounds (a run started before the history was kept has none).
func checkRates(rs []dp.Rate, rounds uint64) error {
	for _, r := range rs {
		if !(r.Q >= 0 && r.Q <= 1) || !(r.Noise > 0) || math.IsInf(r.Noise, 0) || r.Rounds < 1 {
			return fmt.Errorf("%w: the DP charging history has a rate %+v", ErrBadState, r)
		}
	}
	if n := dp.RatesRounds(rs); len(rs) > 0 && n != rounds {
		return fmt.Errorf("%w: the DP charging history records %d rounds, the accountant %d", ErrBadState, n, rounds)
	}
	return nil
}

// StatisticsSites lists the sites whose statistics were accepted, sorted.
func (c *Coordinator) StatisticsSites() []string { return c.fed.statsList() }

// StopReason says why the run ended ("" while it runs).
func (c *Coordinator) StopReason() string { return c.fed.stopReason }

// EvalAt reports whether the announcement of round asks for an evaluation
// of its global model (eval round round-1).
func (c *Coordinator) EvalAt(round int) bool {
	e := c.cfg.EvalEvery
	return c.cfg.Evaluate && e > 0 && round > 1 && (round-1)%e == 0
}

// EvalRequested reports whether eval round e has been asked for: by an
// announcement published (round e+1) or by the end of the run.
func (c *Coordinator) EvalRequested(e int) bool {
	if !c.cfg.Evaluate || e < 1 {
		return false
	}
	ended := c.phase == PhaseFinishing || c.phase == PhaseFinished
	if ended && e == c.round {
		return true
	}
	if !c.EvalAt(e + 1) {
		return false
	}
	switch {
	case e+1 < c.round || ended:
		return e+1 <= c.round
	case e+1 == c.round:
		return c.attempts > 0 // announced
	}
	return false
}

// stepStatistics is Step in the statistics and fitting phases.
func (c *Coordinator) stepStatistics(ev Event) []Decision {
	at := norm(ev.eventTime())
	var out []Decision
	if !c.started {
		c.started, c.waitingSince = true, at
	}
	if c.phase == PhaseStatistics && c.attempts == 0 && c.cfg.DeclaredTransform {
		// Nothing to collect: the schema declares the preprocessing.
		c.attempts = 1
		out = c.fit(at, out)
	}
	if c.phase == PhaseStatistics && c.attempts == 0 {
		// The first event announces the phase.
		c.attempts = 1
		c.deadline = at.Add(c.cfg.RoundTimeout)
		out = append(out, AnnounceStatistics{Deadline: c.deadline})
	}
	switch e := ev.(type) {
	case ClientOnline:
		out = append(out, c.clientOnline(e)...)
	case ClientOffline:
		out = append(out, c.clientOffline(e)...)
	case UpdateArrived:
		out = append(out, c.update(e, at)...)
	case StatisticsArrived:
		out = append(out, c.statistics(e, at)...)
	case EvalArrived:
		out = append(out, c.evalArrived(e, at)...)
	case Tick:
		if c.phase == PhaseStatistics && !c.overdue && !at.Before(c.deadline) {
			if len(c.fed.stats) >= c.cfg.Quorum {
				out = c.fit(at, out)
			} else {
				c.overdue = true // close as soon as Quorum have sent theirs
				out = append(out, StatsOverdue{Deadline: c.deadline, Sites: c.fed.statsList(), Quorum: c.cfg.Quorum})
			}
		}
	case TransformFitted:
		if c.phase != PhaseFitting {
			c.counters.Ignored++
			break
		}
		c.resetRound(1)
		c.waitingSince = at
		out = c.trySelect(at, out)
	default:
		c.counters.Ignored++
	}
	return c.timerDecision(out)
}

// judgeStatistics is the answer to statistics in the statistics and
// fitting phases, without changing anything: AcceptStatistics,
// RejectStatistics, or nil for a malformed event.
func (c *Coordinator) judgeStatistics(e StatisticsArrived) Decision {
	switch {
	case e.Client == "":
		return nil
	case c.fed.stats[e.Client]:
		return RejectStatistics{Client: e.Client, Reason: Duplicate}
	case c.phase != PhaseStatistics:
		return RejectStatistics{Client: e.Client, Reason: StaleRound}
	}
	return AcceptStatistics{Client: e.Client}
}

func (c *Coordinator) statistics(e StatisticsArrived, at time.Time) []Decision {
	switch d := c.judgeStatistics(e).(type) {
	case nil:
		c.counters.Ignored++
		return nil
	case RejectStatistics:
		return []Decision{d}
	}
	// A site may send its statistics before its status arrives (MQTT does
	// not order topics): it becomes known, offline until its status says.
	if cl := c.register(e.Client); e.Samples > 0 {
		cl.samples = e.Samples
	}
	c.fed.addStats(e.Client)
	c.counters.StatsAccepted++
	out := []Decision{AcceptStatistics{Client: e.Client}}
	if n := len(c.fed.stats); n >= c.cfg.StatsSites || (c.overdue && n >= c.cfg.Quorum) {
		out = c.fit(at, out)
	}
	return out
}

// lateStatistics answers statistics once the phase is over.
func (c *Coordinator) lateStatistics(e StatisticsArrived) []Decision {
	if c.fed.stats[e.Client] {
		return []Decision{RejectStatistics{Client: e.Client, Reason: Duplicate}}
	}
	return []Decision{RejectStatistics{Client: e.Client, Reason: StaleRound}}
}

func (c *Coordinator) fit(at time.Time, out []Decision) []Decision {
	c.phase = PhaseFitting
	c.closedAt = at
	c.deadline = time.Time{}
	c.overdue = false
	return append(out, FitTransform{Sites: c.fed.statsList(), At: at})
}

// judgeEval is the answer to an evaluation report, without changing
// anything: AcceptEval or RejectEval.
func (c *Coordinator) judgeEval(e EvalArrived) Decision {
	switch {
	case c.clients[e.Client] == nil:
		return RejectEval{Round: e.Round, Client: e.Client, Reason: UnknownClient}
	case !c.EvalRequested(e.Round):
		r := StaleRound
		if e.Round >= c.round {
			r = FutureRound
		}
		return RejectEval{Round: e.Round, Client: e.Client, Reason: r}
	}
	return AcceptEval{Round: e.Round, Client: e.Client}
}

func (c *Coordinator) evalArrived(e EvalArrived, at time.Time) []Decision {
	d := c.judgeEval(e)
	if _, ok := d.(AcceptEval); !ok {
		return []Decision{d}
	}
	c.counters.EvalsAccepted++
	out := []Decision{d}
	if e.Round != c.fed.evalRound || c.fed.evalDone {
		return out
	}
	c.fed.evalGot[e.Client] = true
	if len(c.evalMissing()) > 0 {
		return out
	}
	c.fed.evalDone = true
	if c.phase == PhaseFinishing {
		return c.finished(at, out)
	}
	return append(out, EvalComplete{Round: e.Round})
}

// awaited are the sites an evaluation waits for, sorted: evalSites and,
// for the final evaluation (the finishing phase), every site online
// without a site error (the end's announcement asks every site): a site
// that joined after the statistics phase and took part is not left out of
// the final figures because its report came a moment after the others.
// An online site going offline is no longer awaited; a statistics site is
// awaited while offline, until the deadline.
func (c *Coordinator) awaited() []string {
	ids := c.evalSites()
	if c.phase != PhaseFinishing {
		return ids
	}
	for id, cl := range c.clients {
		if cl.online && !cl.failing && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// evalMissing are the awaited sites that have not reported the latest
// requested eval round, sorted.
func (c *Coordinator) evalMissing() []string {
	var out []string
	for _, id := range c.awaited() {
		if !c.fed.evalGot[id] {
			out = append(out, id)
		}
	}
	return out
}

// askEval starts tracking eval round e's reports (called when it is
// asked for).
func (c *Coordinator) askEval(e int) {
	if c.fed.evalRound == e {
		return
	}
	c.fed.evalRound, c.fed.evalDone = e, false
	c.fed.evalGot = map[string]bool{}
}

// stopRule returns why the run ends after the aggregation e ("": it goes
// on), updating the patience rule's memory.
func (c *Coordinator) stopRule(e AggregatedRound) string {
	reason := ""
	if e.HasEval && !math.IsNaN(e.EvalLoss) && !math.IsInf(e.EvalLoss, 0) {
		f := &c.fed
		if !f.hasBest || e.EvalLoss < f.bestLoss-c.cfg.StopTol {
			f.bestLoss, f.hasBest, f.sinceBest = e.EvalLoss, true, 0
		} else {
			f.sinceBest++
		}
		if p := c.cfg.StopPatience; p > 0 && f.sinceBest >= p {
			reason = StopPatience
		}
	}
	if c.cfg.StopDelta > 0 && e.HasChange && e.Change < c.cfg.StopDelta {
		reason = StopDelta
	}
	if c.final() {
		reason = StopRounds
	}
	return reason
}

// finish ends the run after the current round.
func (c *Coordinator) finish(at time.Time, reason string) []Decision {
	c.fed.stopReason = reason
	c.closedAt = at
	c.phase = PhaseFinishing // awaited() counts the online sites in it
	if !c.cfg.Evaluate || len(c.awaited()) == 0 {
		c.phase = PhaseFinished
		return []Decision{Finished{Rounds: c.round, At: at}}
	}
	c.deadline = at.Add(c.cfg.RoundTimeout)
	c.fed.evalRound, c.fed.evalDone = -1, false // askEval resets
	c.askEval(c.round)
	return []Decision{Finish{Rounds: c.round, Deadline: c.deadline, Reason: reason}}
}

func (c *Coordinator) finished(at time.Time, out []Decision) []Decision {
	missing := c.evalMissing() // before the phase changes what is awaited
	c.phase = PhaseFinished
	c.closedAt = at
	c.deadline = time.Time{}
	return append(out, Finished{Rounds: c.round, At: at, Missing: missing})
}

// stepFinishing is Step while the final evaluation reports are awaited.
func (c *Coordinator) stepFinishing(ev Event) []Decision {
	out, ok := c.afterRun(ev)
	switch at := norm(ev.eventTime()); {
	case ok:
		// A site going offline is no longer awaited: the reports of
		// the others may be complete now.
		if _, off := ev.(ClientOffline); off && c.phase == PhaseFinishing && !c.fed.evalDone && len(c.evalMissing()) == 0 {
			c.fed.evalDone = true
			out = c.finished(at, out)
		}
	case isTick(ev):
		if !at.Before(c.deadline) {
			c.fed.evalDone = true
			out = c.finished(at, out)
		}
	default:
		c.counters.Ignored++
	}
	return c.timerDecision(out)
}

func isTick(ev Event) bool { _, ok := ev.(Tick); return ok }
