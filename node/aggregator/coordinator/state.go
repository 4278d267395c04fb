package coordinator

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// StateVersion is the version of State written by Snapshot.
const StateVersion = 1

// ErrBadState reports a State that Restore refuses.
var ErrBadState = errors.New("aggregator: bad state")

// State is everything the coordinator knows, as plain JSON-serialisable data.
// It includes the open round's received set, so after a kill -9 the shell
// restores it and resumes the round without re-feeding updates from storage
// (it still holds those updates, to aggregate them). It does not include the
// Config: a restarted coordinator uses the Config it was built with.
type State struct {
	Version  int        `json:"version"`
	Phase    Phase      `json:"phase"`
	Round    int        `json:"round"`
	Attempts int        `json:"attempts"` // selections announced for Round
	Selected []string   `json:"selected,omitempty"`
	Invited  []string   `json:"invited,omitempty"` // union of Round's selections
	Received []Received `json:"received,omitempty"`
	Deadline time.Time  `json:"deadline"`
	Extended bool       `json:"extended,omitempty"`
	Overdue  bool       `json:"overdue,omitempty"`
	// Started is false until the first event; WaitingSince is when the
	// round (or its re-selection) started waiting, for Settle.
	Started      bool      `json:"started,omitempty"`
	WaitingSince time.Time `json:"waiting_since"`
	// LastDraw is when the last selection was drawn (zero before the
	// first); between rounds Settle waits only for sites that dropped
	// after it (Coordinator.settleUntil).
	LastDraw time.Time     `json:"last_draw,omitzero"`
	ClosedAt time.Time     `json:"closed_at"`      // when Round closed (or finished)
	Timer    time.Time     `json:"timer"`          // the last SetTimer sent
	Late     int           `json:"late,omitempty"` // late updates since the last aggregation
	Clients  []ClientState `json:"clients,omitempty"`
	Counters Counters      `json:"counters"`
	// SelectorName and Selector hold a stateful selector's own state (see
	// Config.Selector); Restore applies it only to a selector of that name.
	SelectorName string          `json:"selector_name,omitempty"`
	Selector     json.RawMessage `json:"selector,omitempty"`
	// The schema run (coordinator_fed.go); absent without a
	// federation schema.
	StatsSites []string `json:"stats_sites,omitempty"` // statistics accepted from
	EvalRound  int      `json:"eval_round,omitempty"`  // the latest eval round asked for
	EvalGot    []string `json:"eval_got,omitempty"`    // who reported EvalRound
	EvalDone   bool     `json:"eval_done,omitempty"`
	// BestLoss is the best federated evaluation loss (valid when HasBest),
	// SinceBest the evaluations since it (the patience rule).
	BestLoss   float64 `json:"best_loss,omitempty"`
	HasBest    bool    `json:"has_best,omitempty"`
	SinceBest  int     `json:"since_best,omitempty"`
	StopReason string  `json:"stop_reason,omitempty"`
	// DP is the privacy accountant (Config.DP; absent without).
	DP *DPState `json:"dp,omitempty"`
	// SecAgg is the round's secure aggregation (Config.SecAgg; absent
	// without).
	SecAgg *SecAggState `json:"secagg,omitempty"`
	// Roster is the fixed roster (Config.FixedRoster), sorted; absent
	// until the run's first draw fixes it.
	Roster []string `json:"roster,omitempty"`
	// Applied is the replay log index of the last stored message this
	// state reflects (Stored.Index; coordinator_replay.go): a replayed
	// message at or below it is already applied.
	Applied uint64 `json:"applied,omitempty"`
}

// Received is one stored update of the open round.
type Received struct {
	Client  string `json:"client"`
	Partial bool   `json:"partial,omitempty"`
}

// ClientState is one registry entry.
type ClientState struct {
	ID      string `json:"id"`
	Samples int    `json:"samples"`
	Online  bool   `json:"online,omitempty"`
	// Failing: the site's status carries a site error (it cannot take
	// part), so it is not selected.
	Failing bool `json:"failing,omitempty"`
	// Loss is the last reported anchor loss, valid when HasLoss (JSON has
	// no NaN).
	Loss      float64 `json:"loss,omitempty"`
	HasLoss   bool    `json:"has_loss,omitempty"`
	LastRound int     `json:"last_round,omitempty"` // latest round with a stored update
	Pending   []int   `json:"pending,omitempty"`    // rounds invited to, not reported, ascending
	// DroppedAt is when the site last went offline (Coordinator.settleUntil).
	DroppedAt time.Time `json:"dropped_at,omitzero"`
}

// Snapshot returns a deep copy of the state, with every list sorted so that
// equal states serialise to equal bytes.
func (c *Coordinator) Snapshot() State {
	s := State{
		Version:      StateVersion,
		Phase:        c.phase,
		Round:        c.round,
		Attempts:     c.attempts,
		Selected:     slices.Clone(c.selected),
		Deadline:     c.deadline,
		Extended:     c.extended,
		Overdue:      c.overdue,
		Started:      c.started,
		WaitingSince: c.waitingSince,
		LastDraw:     c.lastDraw,
		ClosedAt:     c.closedAt,
		Timer:        c.timer,
		Late:         c.late,
		Counters:     c.counters.clone(),
		StatsSites:   c.fed.statsList(),
		EvalRound:    c.fed.evalRound,
		EvalDone:     c.fed.evalDone,
		BestLoss:     c.fed.bestLoss,
		HasBest:      c.fed.hasBest,
		SinceBest:    c.fed.sinceBest,
		StopReason:   c.fed.stopReason,
		DP:           c.SnapshotDP(),
		SecAgg:       c.SnapshotSecAgg(),
		Applied:      c.applied,
		Roster:       c.Roster(),
	}
	for id := range c.fed.evalGot {
		s.EvalGot = append(s.EvalGot, id)
	}
	slices.Sort(s.EvalGot)
	for id := range c.invited {
		s.Invited = append(s.Invited, id)
	}
	slices.Sort(s.Invited)
	for id, p := range c.received {
		s.Received = append(s.Received, Received{Client: id, Partial: p})
	}
	slices.SortFunc(s.Received, func(a, b Received) int { return cmp.Compare(a.Client, b.Client) })
	for id, cl := range c.clients {
		cs := ClientState{ID: id, Samples: cl.samples, Online: cl.online, Failing: cl.failing, LastRound: cl.lastRound, DroppedAt: cl.droppedAt}
		if len(cl.pending) > 0 { // nil when empty, as JSON gives it back
			cs.Pending = slices.Clone(cl.pending)
		}
		if !math.IsNaN(cl.loss) {
			cs.Loss, cs.HasLoss = cl.loss, true
		}
		s.Clients = append(s.Clients, cs)
	}
	slices.SortFunc(s.Clients, func(a, b ClientState) int { return cmp.Compare(a.ID, b.ID) })
	if m, ok := c.sel.(json.Marshaler); ok {
		// A selector whose state cannot be encoded restarts afresh, as one
		// without state does; selection stays valid either way.
		if b, err := m.MarshalJSON(); err == nil && json.Valid(b) {
			s.SelectorName, s.Selector = c.sel.Name(), b
		}
	}
	return s
}

// Restore replaces the coordinator's state with s, after checking that s is
// consistent; on error the coordinator's own state is unchanged (a stateful
// selector may have been partly restored). Call Resume next.
func (c *Coordinator) Restore(s State) error {
	if err := s.check(); err != nil {
		return err
	}
	if u, ok := c.sel.(json.Unmarshaler); ok && s.Selector != nil && s.SelectorName == c.sel.Name() {
		if err := u.UnmarshalJSON(s.Selector); err != nil {
			return fmt.Errorf("%w: selector %s: %w", ErrBadState, s.SelectorName, err)
		}
	}
	clients := make(map[string]*client, len(s.Clients))
	for _, cs := range s.Clients {
		cl := &client{samples: cs.Samples, online: cs.Online, failing: cs.Failing, loss: math.NaN(), lastRound: cs.LastRound, pending: slices.Clone(cs.Pending), droppedAt: norm(cs.DroppedAt)}
		if cs.HasLoss {
			cl.loss = cs.Loss
		}
		if old := c.clients[cs.ID]; old != nil {
			cl.conn = old.conn // statuses seen stay seen (not part of State)
		}
		clients[cs.ID] = cl
	}
	c.clients = clients
	c.online, c.ready = 0, 0
	for _, cl := range clients {
		online, failing := cl.online, cl.failing
		cl.online, cl.failing = false, false
		c.setPresence(cl, online, failing)
	}
	c.phase = s.Phase
	c.round = s.Round
	c.attempts = s.Attempts
	c.selected = slices.Sorted(slices.Values(s.Selected))
	c.invited = make(map[string]bool, len(s.Invited))
	for _, id := range s.Invited {
		c.invited[id] = true
	}
	received := make(map[string]bool, len(s.Received))
	for _, r := range s.Received {
		received[r.Client] = r.Partial
	}
	c.setReceived(received)
	c.deadline = norm(s.Deadline)
	c.extended, c.overdue = s.Extended, s.Overdue
	c.started = s.Started
	c.waitingSince = norm(s.WaitingSince)
	c.lastDraw = norm(s.LastDraw)
	c.closedAt = norm(s.ClosedAt)
	c.timer = norm(s.Timer)
	c.late = s.Late
	c.proposal = nil
	c.applied = s.Applied
	c.counters = s.Counters.clone()
	c.fed.reset()
	for _, id := range s.StatsSites {
		c.fed.addStats(id)
	}
	for _, id := range s.EvalGot {
		c.fed.evalGot[id] = true
	}
	c.fed.evalRound, c.fed.evalDone = s.EvalRound, s.EvalDone
	c.fed.bestLoss, c.fed.hasBest, c.fed.sinceBest = s.BestLoss, s.HasBest, s.SinceBest
	c.fed.stopReason = s.StopReason
	c.roster = nil
	if len(s.Roster) > 0 {
		c.roster = make(map[string]bool, len(s.Roster))
		for _, id := range s.Roster {
			c.roster[id] = true
		}
	}
	if err := c.restoreSecAgg(s.SecAgg, s.Phase); err != nil {
		return err
	}
	return c.restoreDP(s.DP)
}

// check verifies the invariants Restore relies on, feature by feature: the
// round, the client registry, the round's selection, the federated phases.
// The first broken invariant is the one reported.
func (s State) check() error {
	if err := s.checkRound(); err != nil {
		return err
	}
	known, err := s.checkClients()
	if err != nil {
		return err
	}
	if err := s.checkSelection(known); err != nil {
		return err
	}
	return s.checkFed(known)
}

// badState is check's error: ErrBadState with what is wrong.
func badState(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadState, fmt.Sprintf(format, a...))
}

// checkRound: the version, the phase, the round's counters, and an
// announced selection where the phase needs one.
func (s State) checkRound() error {
	if s.Version != StateVersion {
		return badState("version %d, want %d", s.Version, StateVersion)
	}
	switch s.Phase {
	case PhaseWaiting, PhaseCollecting, PhaseStalled, PhaseClosing, PhaseFinished, PhaseStatistics, PhaseFitting, PhaseFinishing, PhaseSecAgg:
	default:
		return badState("unknown phase %q", s.Phase)
	}
	if s.Round < 1 || s.Attempts < 0 || s.Late < 0 {
		return badState("round %d, attempts %d, late %d", s.Round, s.Attempts, s.Late)
	}
	if (s.Phase == PhaseCollecting || s.Phase == PhaseStalled) && (s.Attempts < 1 || s.Deadline.IsZero()) {
		return badState("phase %s without an announced selection", s.Phase)
	}
	return nil
}

// checkClients: each client listed once, with sane counts and pending
// rounds; it returns the set of known ids.
func (s State) checkClients() (map[string]bool, error) {
	known := make(map[string]bool, len(s.Clients))
	for _, cs := range s.Clients {
		switch {
		case cs.ID == "":
			return nil, badState("client with empty id")
		case known[cs.ID]:
			return nil, badState("client %q listed twice", cs.ID)
		case cs.Samples < 0 || cs.LastRound < 0:
			return nil, badState("client %q has negative counts", cs.ID)
		case len(cs.Pending) > maxPending || !slices.IsSorted(cs.Pending) ||
			len(slices.Compact(slices.Clone(cs.Pending))) != len(cs.Pending) ||
			(len(cs.Pending) > 0 && (cs.Pending[0] <= cs.LastRound || cs.Pending[len(cs.Pending)-1] > s.Round)):
			return nil, badState("client %q has pending rounds %v (last round %d, round %d)", cs.ID, cs.Pending, cs.LastRound, s.Round)
		case cs.HasLoss && (math.IsNaN(cs.Loss) || math.IsInf(cs.Loss, 0)):
			return nil, badState("client %q has a non-finite loss", cs.ID)
		}
		known[cs.ID] = true
	}
	return known, nil
}

// checkSelection: the invited are known clients, the selected and the
// received are invited, each listed once.
func (s State) checkSelection(known map[string]bool) error {
	invited := make(map[string]bool, len(s.Invited))
	for _, id := range s.Invited {
		if !known[id] || invited[id] {
			return badState("invited client %q unknown or listed twice", id)
		}
		invited[id] = true
	}
	seen := make(map[string]bool, len(s.Selected))
	for _, id := range s.Selected {
		if !invited[id] || seen[id] {
			return badState("selected client %q not invited or listed twice", id)
		}
		seen[id] = true
	}
	clear(seen)
	for _, r := range s.Received {
		if !invited[r.Client] || seen[r.Client] {
			return badState("received client %q not invited or listed twice", r.Client)
		}
		seen[r.Client] = true
	}
	return nil
}

// checkFed: the federated phases' sites (statistics, evaluation reports)
// are known clients listed once; the stopping rule's figures are sane; the
// statistics and fitting phases are in round 1 only.
func (s State) checkFed(known map[string]bool) error {
	seen := make(map[string]bool, len(s.StatsSites))
	for _, list := range [][]string{s.StatsSites, s.EvalGot} {
		clear(seen)
		for _, id := range list {
			if !known[id] || seen[id] {
				return badState("statistics or evaluation site %q unknown or listed twice", id)
			}
			seen[id] = true
		}
	}
	switch {
	case s.EvalRound < -1 || s.SinceBest < 0:
		return badState("eval round %d, since best %d", s.EvalRound, s.SinceBest)
	case s.HasBest && (math.IsNaN(s.BestLoss) || math.IsInf(s.BestLoss, 0)):
		return badState("a non-finite best loss")
	case (s.Phase == PhaseStatistics || s.Phase == PhaseFitting) && s.Round != 1:
		return badState("phase %s in round %d", s.Phase, s.Round)
	}
	return nil
}

// MarshalState encodes the state (Snapshot) as JSON, the form the round log
// stores: the shell's one encoding of the state per batch of decisions.
func (c *Coordinator) MarshalState() ([]byte, error) {
	b, err := json.Marshal(c.Snapshot())
	if err != nil {
		return nil, fmt.Errorf("aggregator: encode state: %w", err)
	}
	return b, nil
}

// Summary is what the shell's view and metrics read of the coordinator
// after every batch of decisions: it costs the same at any number of
// sites (no registry walk, no copy or sort of a list; Snapshot has those).
// Its lists share the coordinator's memory and are read only: the
// coordinator replaces a list, never writes into one it handed out, so
// another goroutine may read them (and copy them to sort) after the shell
// hands them over under its own lock.
type Summary struct {
	Round      int
	Phase      Phase
	Deadline   time.Time
	Selected   []string // sorted
	Received   []string // this round's contributors, in the order they came
	Clients    int      // known clients
	Online     int
	Counters   Counters
	StatsSites []string // in the order accepted
	StopReason string
}

// Summary returns the summary of the current state.
func (c *Coordinator) Summary() Summary {
	return Summary{Round: c.round, Phase: c.phase, Deadline: c.deadline, Selected: c.selected[:len(c.selected):len(c.selected)],
		Received: c.receivedIDs[:len(c.receivedIDs):len(c.receivedIDs)], Clients: len(c.clients), Online: c.online,
		Counters: c.counters.clone(), StatsSites: c.fed.statsIDs[:len(c.fed.statsIDs):len(c.fed.statsIDs)],
		StopReason: c.fed.stopReason}
}
