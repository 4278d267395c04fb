package coordinator

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The coordinator's part of secure aggregation (Config.SecAgg;
// docs/privacy.md, "Round flow"). A round under secagg runs the four rounds
// of Bonawitz et al. as phases of one training round:
//
//   - advertise: the round's selection is announced as today (with the
//     deadline, extension and re-selection of the package doc); a selected
//     site solves, then sends AdvertiseKeys, which counts as its update
//     (Accept, the received set, the quorum). Only the sites of the
//     selection in force are accepted (an earlier selection's site would
//     push the sum past the quantiser's MaxSites, and its headroom);
//   - when the advertise phase would close (every selected site in, or its
//     deadline at quorum), the coordinator decides SecAggAdvance instead of
//     CloseRound; the shell advances the secagg.Server, stores its state
//     and steps SecAggAdvanced with the sites the next phase expects (U1,
//     U2, U3) or the error that aborted the session;
//   - share keys, masked input and unmask each get Config.SecAgg.Timeout
//     (PhaseSecAgg): AnnounceSecAgg re-publishes the announcement with the
//     phase, the phase closes when every expected site has sent its message
//     or at its deadline, and SecAggAdvance follows;
//   - after the unmask phase the sum over U3 is known: CloseRound with U3
//     as the contributors, and the round ends as any other;
//   - a session the server aborts (fewer than the threshold left, a
//     tampered share) has no sum and never produces one: its messages are
//     void, the round starts a new session (SecAggAbort, then a new
//     selection announced with the next attempt, which names the session)
//     and the operator sees why (the decision's reason, a counter).
//
// The secure-aggregation messages go through Propose like updates: a
// message is stored (and handed to the secagg.Server) before the
// coordinator counts it.

// PhaseSecAgg: the round's secure aggregation is past its advertise phase
// (share keys, masked input or unmask); see coordinator_secagg.go.
const PhaseSecAgg Phase = "secagg"

// SecAggConfig turns on secure aggregation (Config.SecAgg).
type SecAggConfig struct {
	// Threshold is the secagg threshold t (>= 2, <= K, more than K/2): the
	// advertise phase needs at least t sites, so the coordinator's quorum
	// is at least t.
	Threshold int
	// Timeout is the deadline of each of the three phases after the
	// advertise phase (> 0).
	Timeout time.Duration
}

// The secure-aggregation phases, as the wire's SecAggPhase numbers them.
const (
	SecAggAdvertise = 0
	SecAggShareKeys = 1
	SecAggMasked    = 2
	SecAggUnmask    = 3
	// SecAggConsistency comes between SecAggMasked and SecAggUnmask when
	// every key of the session's KeyList was signed (signed secure
	// aggregation's consistency round, uplink.CheckSurvivors): the
	// survivors sign the survivor set (kind 9) before anyone unmasks.
	SecAggConsistency = 4
)

// nextSecAggPhase is the phase after p: the consistency round between the
// masked inputs and the unmask in a signed session, where the sites
// refuse to unmask without it.
func (c *Coordinator) nextSecAggPhase(p int) int {
	switch {
	case p == SecAggMasked && c.sa.listed > 0 && c.sa.signed == c.sa.listed:
		return SecAggConsistency
	case p == SecAggConsistency:
		return SecAggUnmask
	}
	return p + 1
}

// SecAggKind is the secagg.Kind a site sends in phase p (1, 3, 5, 7; 9 in
// the consistency round).
func SecAggKind(p int) int { return 2*p + 1 }

// secAggKindOrder orders a site's kinds as the phases come: the
// consistency round's 9 between the masked input (5) and the unmask (7).
func secAggKindOrder(kind int) int {
	if kind == SecAggKind(SecAggConsistency) {
		return SecAggKind(SecAggMasked) + 1
	}
	return kind
}

// SecAggArrived: a decoded and validated secure-aggregation message of a
// site (its kind, the round and the session's attempt).
type SecAggArrived struct {
	Client  string
	Round   int
	Attempt int
	Kind    int
	At      time.Time
}

// SecAggAdvanced: the shell advanced the secagg.Server past Phase of
// (Round, Attempt) and stored its state. Next are the sites the next phase
// expects (sorted; after the unmask phase, U3, whose sum is known); Err,
// when not empty, is why the server aborted the session (no sum).
type SecAggAdvanced struct {
	Round   int
	Attempt int
	Phase   int
	Next    []string
	Err     string
	// Signed and Listed, after the advertise phase: how many of the
	// KeyList's Listed sites signed their keys (signed secure
	// aggregation; the status's model).
	Signed, Listed int
	At             time.Time
}

func (e SecAggArrived) eventTime() time.Time  { return e.At }
func (e SecAggAdvanced) eventTime() time.Time { return e.At }

// AcceptSecAgg: store the message (Kind of Client for Round, Attempt) and
// hand it to the secagg.Server, then receipt it.
type AcceptSecAgg struct {
	Round   int
	Attempt int
	Kind    int
	Client  string
}

// RejectSecAgg: do not store; receipt with the reason's code (Duplicate:
// an accepted receipt, and for a ShareKeys in the masked phase the site's
// ShareList again). Closed: the message is of a closed round, and the
// reason says whether the site's input is in that round's sum (Duplicate)
// or not (StaleRound): in FedSplit's sum mode the shell answers with the
// round's UPDATE receipt too (server_secagg_sum.go).
type RejectSecAgg struct {
	Round  int
	Kind   int
	Client string
	Reason Reason
	Closed bool
}

// SecAggAdvance: close Phase of (Round, Attempt): advance the
// secagg.Server (unless its stored state is past Phase already: a restart),
// store its state, then step SecAggAdvanced.
type SecAggAdvance struct {
	Round   int
	Attempt int
	Phase   int
}

// AnnounceSecAgg: re-publish the round's announcement in Phase (with the
// server's broadcast: the KeyList, the UnmaskRequest) and, in the masked
// phase, each expected site's ShareList; Deadline is the phase's.
type AnnounceSecAgg struct {
	Round    int
	Attempt  int
	Phase    int
	Selected []string
	Deadline time.Time
}

// SecAggAbort: the session Attempt of Round aborted without a sum (Reason);
// the round starts a new session.
type SecAggAbort struct {
	Round   int
	Attempt int
	Reason  string
}

func (AcceptSecAgg) decision()   {}
func (RejectSecAgg) decision()   {}
func (SecAggAdvance) decision()  {}
func (AnnounceSecAgg) decision() {}
func (SecAggAbort) decision()    {}

// secAggState is the open round's secure aggregation.
type secAggState struct {
	attempt   int             // the session: aborted sessions of this round
	phase     int             // in PhaseSecAgg: SecAggShareKeys..SecAggConsistency
	advancing bool            // SecAggAdvance emitted, SecAggAdvanced not yet stepped
	expect    []string        // the sites the phase expects (sorted)
	got       map[string]bool // the sites whose message of the phase is stored
	deadline  time.Time       // the phase's
	lastAbort string          // why the last session aborted (any round)
	// signed of listed sites of the last KeyList signed their keys (any
	// round; the status's model).
	signed, listed int
}

// SecAggState is the secure aggregation in State (absent without
// Config.SecAgg).
type SecAggState struct {
	Attempt   int       `json:"attempt"`
	Phase     int       `json:"phase"`
	Advancing bool      `json:"advancing,omitempty"`
	Expect    []string  `json:"expect,omitempty"`
	Got       []string  `json:"got,omitempty"`
	Deadline  time.Time `json:"deadline"`
	LastAbort string    `json:"last_abort,omitempty"`
	// SignedKeys of ListedKeys sites of the last KeyList signed their keys.
	SignedKeys int `json:"signed_keys,omitempty"`
	ListedKeys int `json:"listed_keys,omitempty"`
}

func (c Config) validateSecAgg() error {
	s := c.SecAgg
	if s == nil {
		return nil
	}
	switch {
	case s.Threshold < 2 || s.Threshold > c.K || 2*s.Threshold <= c.K:
		return fmt.Errorf("%w: secure aggregation threshold %d: want 2 <= t <= K (%d) and t > K/2", ErrConfig, s.Threshold, c.K)
	case c.Quorum < s.Threshold:
		return fmt.Errorf("%w: secure aggregation needs a quorum (%d) of at least its threshold (%d)", ErrConfig, c.Quorum, s.Threshold)
	case s.Timeout <= 0:
		return fmt.Errorf("%w: secure aggregation phase timeout %v, want > 0", ErrConfig, s.Timeout)
	case c.StoreLate:
		return fmt.Errorf("%w: secure aggregation refuses late updates (a late site's input is in no sum)", ErrConfig)
	case c.Statistics:
		return fmt.Errorf("%w: secure aggregation with a federation schema: the statistics and evaluation reports are per site", ErrConfig)
	}
	return nil
}

// SecAggSession is the open round's secure-aggregation session (the
// announcement's attempt) and phase (SecAggAdvertise..SecAggUnmask); ok is
// false without Config.SecAgg.
func (c *Coordinator) SecAggSession() (attempt, phase int, ok bool) {
	if c.cfg.SecAgg == nil {
		return 0, 0, false
	}
	p := SecAggAdvertise
	if c.phase == PhaseSecAgg {
		p = c.sa.phase
	}
	return c.sa.attempt, p, true
}

// SecAggLastAbort is why the last secure-aggregation session aborted ("":
// none since the start).
func (c *Coordinator) SecAggLastAbort() string { return c.sa.lastAbort }

// SecAggCounted reports whether the coordinator counted client's message
// of kind in the open session (the shell's restore takes only those again).
func (c *Coordinator) SecAggCounted(client string, kind int) bool {
	switch {
	case c.cfg.SecAgg == nil:
		return false
	case kind == SecAggKind(SecAggAdvertise) && c.phase != PhaseSecAgg:
		return hasKey(c.received, client)
	case c.phase == PhaseSecAgg && kind == SecAggKind(c.sa.phase):
		return c.sa.got[client]
	}
	return false
}

func (c *Coordinator) resetSecAgg() {
	c.sa = secAggState{lastAbort: c.sa.lastAbort}
}

// judgeSecAgg is the answer to a site's secagg message without changing
// anything: AcceptSecAgg or RejectSecAgg.
func (c *Coordinator) judgeSecAgg(e SecAggArrived) Decision {
	rej := func(r Reason) Decision {
		return RejectSecAgg{Round: e.Round, Kind: e.Kind, Client: e.Client, Reason: r}
	}
	cl := c.clients[e.Client]
	switch {
	case cl == nil:
		return rej(UnknownClient)
	case c.cfg.SecAgg == nil:
		return rej(NotSelected)
	case e.Round < c.round || (e.Round == c.round && c.phase == PhaseFinished):
		d := RejectSecAgg{Round: e.Round, Kind: e.Kind, Client: e.Client, Reason: StaleRound, Closed: true}
		if cl.lastRound == e.Round {
			// Its input is in that round's sum: a re-send (after a
			// restart) is answered as a duplicate, so the site clears it.
			d.Reason = Duplicate
		}
		return d
	case e.Round > c.round, c.phase == PhaseStatistics, c.phase == PhaseFitting:
		return rej(FutureRound)
	case e.Attempt < c.sa.attempt:
		return rej(StaleRound)
	case e.Attempt > c.sa.attempt:
		return rej(FutureRound)
	}
	counted := func() Decision {
		if _, ok := c.received[e.Client]; ok {
			return rej(Duplicate)
		}
		return rej(NotSelected)
	}
	switch c.phase {
	case PhaseCollecting, PhaseStalled:
		switch {
		case e.Kind != SecAggKind(SecAggAdvertise):
			return rej(FutureRound)
		case hasKey(c.received, e.Client):
			return rej(Duplicate)
		case !c.isSelected(e.Client):
			return rej(NotSelected)
		}
		return AcceptSecAgg{Round: e.Round, Attempt: e.Attempt, Kind: e.Kind, Client: e.Client}
	case PhaseSecAgg:
		want := secAggKindOrder(SecAggKind(c.sa.phase))
		switch {
		case secAggKindOrder(e.Kind) < want:
			return counted()
		case secAggKindOrder(e.Kind) > want:
			return rej(FutureRound)
		case c.sa.got[e.Client]:
			return rej(Duplicate)
		case c.sa.advancing:
			return rej(RoundClosed)
		case !slices.Contains(c.sa.expect, e.Client):
			return rej(NotSelected)
		}
		return AcceptSecAgg{Round: e.Round, Attempt: e.Attempt, Kind: e.Kind, Client: e.Client}
	case PhaseClosing:
		return counted()
	}
	// Waiting (a new session is being drawn): nothing of this session is
	// taken.
	return rej(StaleRound)
}

func hasKey(m map[string]bool, k string) bool {
	_, ok := m[k]
	return ok
}

// secAggArrived applies an accepted (stored) secagg message, or rejects one.
func (c *Coordinator) secAggArrived(e SecAggArrived, at time.Time) []Decision {
	switch d := c.judgeSecAgg(e).(type) {
	case RejectSecAgg:
		if c.counters.Rejected == nil {
			c.counters.Rejected = map[Reason]uint64{}
		}
		c.counters.Rejected[d.Reason]++
		return []Decision{d}
	case AcceptSecAgg:
		c.counters.SecAggMessages++
		out := []Decision{d}
		if c.phase != PhaseSecAgg {
			// An AdvertiseKeys is the site's update: it counts for the
			// quorum as one does. (The registry records the round as the
			// site's once its input is in the sum: secAggAdvanced.)
			c.receive(e.Client, false)
			c.counters.Accepted++
			if c.closable() {
				out = c.close(at, out)
			}
			return out
		}
		c.sa.got[e.Client] = true
		return c.secAggCheck(out)
	}
	panic("aggregator: judgeSecAgg answered neither accept nor reject")
}

// secAggCheck closes the open phase once every site it expects has sent
// its message, gone offline (its status, or its last will) or reported a
// site error (it cannot answer: for example it refused the session's key
// list under signed secure aggregation): waiting for
// the deadline would only delay the round, since an offline site cannot
// answer, and the protocol recovers from its dropout (or aborts below the
// threshold). A site that comes back later has missed the phase, as a
// dropout does.
func (c *Coordinator) secAggCheck(out []Decision) []Decision {
	if c.phase != PhaseSecAgg || c.sa.advancing {
		return out
	}
	for _, id := range c.sa.expect {
		if cl := c.clients[id]; !c.sa.got[id] && cl != nil && cl.online && !cl.failing && !cl.refused {
			return out
		}
	}
	return c.secAggAdvance(out)
}

// startSecAgg is close() of a secagg round's advertise phase: the secagg
// server is advanced past it instead of the round closing.
func (c *Coordinator) startSecAgg(out []Decision) []Decision {
	c.phase = PhaseSecAgg
	c.sa.phase = SecAggAdvertise
	c.sa.expect = nil
	c.sa.got = map[string]bool{}
	c.deadline = time.Time{}
	return c.secAggAdvance(out)
}

func (c *Coordinator) secAggAdvance(out []Decision) []Decision {
	c.sa.advancing = true
	return append(out, SecAggAdvance{Round: c.round, Attempt: c.sa.attempt, Phase: c.sa.phase})
}

// secAggAdvanced opens the next phase, closes the round with U3's sum, or
// starts a new session after an abort.
func (c *Coordinator) secAggAdvanced(e SecAggAdvanced, at time.Time) []Decision {
	if c.phase != PhaseSecAgg || !c.sa.advancing || e.Round != c.round || e.Attempt != c.sa.attempt || e.Phase != c.sa.phase {
		c.counters.Ignored++
		return nil
	}
	c.sa.advancing = false
	if e.Phase == SecAggAdvertise && e.Listed > 0 {
		c.sa.signed, c.sa.listed = e.Signed, e.Listed
	}
	next := slices.Compact(slices.Sorted(slices.Values(e.Next)))
	if e.Err == "" {
		e.Err = c.checkNext(e.Phase, next)
	}
	if e.Err != "" || e.Phase == SecAggUnmask {
		// The session ends: a refusal was of this session only.
		for _, cl := range c.clients {
			cl.refused = false
		}
	}
	if e.Err != "" {
		c.counters.SecAggAborts++
		c.sa.lastAbort = e.Err
		abort := SecAggAbort{Round: c.round, Attempt: c.sa.attempt, Reason: e.Err}
		// The session's inputs are void: a new session, a new selection
		// (the next attempt; Step draws it now if it can).
		c.sa = secAggState{attempt: c.sa.attempt + 1, lastAbort: e.Err, signed: c.sa.signed, listed: c.sa.listed}
		c.setReceived(map[string]bool{})
		c.phase = PhaseWaiting
		c.waitingSince = at
		c.extended, c.overdue = false, false
		c.deadline = time.Time{}
		return []Decision{abort}
	}
	if e.Phase == SecAggUnmask {
		// The sum over U3 is known: U3 are the round's contributors.
		received := make(map[string]bool, len(next))
		for _, id := range next {
			if cl := c.clients[id]; cl != nil && c.invited[id] {
				received[id] = false
				c.stored(cl, UpdateArrived{Client: id, Round: c.round, Loss: math.NaN()})
			}
		}
		c.setReceived(received)
		c.sa.expect, c.sa.got = nil, nil
		return c.close(at, nil)
	}
	c.sa.phase = c.nextSecAggPhase(e.Phase)
	c.sa.expect = next
	c.sa.got = map[string]bool{}
	c.sa.deadline = at.Add(c.cfg.SecAgg.Timeout)
	return []Decision{c.announceSecAgg()}
}

// checkNext is why the sites the shell reports for the phase after phase
// cannot be right ("" when they can): fewer than the threshold, a site that
// did not send the phase's message, or, after the unmask phase, other
// sites than U3. The secagg.Server aborts in these cases itself; the
// coordinator does not rely on it: a round never closes below the
// threshold or with contributors it did not count.
func (c *Coordinator) checkNext(phase int, next []string) string {
	t := c.cfg.SecAgg.Threshold
	switch {
	case len(next) < t:
		return fmt.Sprintf("secagg: %d sites for the next phase, threshold %d", len(next), t)
	case phase == SecAggUnmask:
		if !slices.Equal(next, c.sa.expect) {
			return fmt.Sprintf("secagg: the sum is over %v, the survivors were %v", next, c.sa.expect)
		}
		return ""
	case phase == SecAggConsistency:
		// The survivor set stays; fewer than t signatures of it and no
		// signing site would unmask.
		if !slices.Equal(next, c.sa.expect) {
			return fmt.Sprintf("secagg: the survivors changed from %v to %v in the consistency round", c.sa.expect, next)
		}
		if len(c.sa.got) < t {
			return fmt.Sprintf("secagg: %d survivors signed the survivor set, threshold %d", len(c.sa.got), t)
		}
		return ""
	}
	for _, id := range next {
		sent := c.sa.got[id]
		if phase == SecAggAdvertise {
			sent = hasKey(c.received, id)
		}
		if !sent {
			return fmt.Sprintf("secagg: site %s is in the next phase without a stored message of this one", id)
		}
	}
	return ""
}

func (c *Coordinator) announceSecAgg() AnnounceSecAgg {
	return AnnounceSecAgg{Round: c.round, Attempt: c.sa.attempt, Phase: c.sa.phase, Selected: slices.Clone(c.selected), Deadline: c.sa.deadline}
}

// secAggTick closes a phase at its deadline.
func (c *Coordinator) secAggTick(at time.Time, out []Decision) []Decision {
	if c.sa.advancing || at.Before(c.sa.deadline) {
		return out
	}
	return c.secAggAdvance(out)
}

// resumeSecAgg is Resume in PhaseSecAgg.
func (c *Coordinator) resumeSecAgg() Decision {
	if c.sa.advancing {
		return SecAggAdvance{Round: c.round, Attempt: c.sa.attempt, Phase: c.sa.phase}
	}
	return c.announceSecAgg()
}

func (c *Coordinator) SnapshotSecAgg() *SecAggState {
	if c.cfg.SecAgg == nil {
		return nil
	}
	s := &SecAggState{Attempt: c.sa.attempt, Phase: c.sa.phase, Advancing: c.sa.advancing, Expect: slices.Clone(c.sa.expect),
		Deadline: c.sa.deadline, LastAbort: c.sa.lastAbort, SignedKeys: c.sa.signed, ListedKeys: c.sa.listed}
	for id := range c.sa.got {
		s.Got = append(s.Got, id)
	}
	slices.Sort(s.Got)
	return s
}

func (c *Coordinator) restoreSecAgg(s *SecAggState, phase Phase) error {
	if c.cfg.SecAgg == nil {
		if phase == PhaseSecAgg {
			return fmt.Errorf("%w: a round in secure aggregation, and this run has no --secagg", ErrBadState)
		}
		return nil
	}
	if s == nil {
		if phase == PhaseSecAgg {
			return fmt.Errorf("%w: phase %s without its secure-aggregation state", ErrBadState, phase)
		}
		c.sa = secAggState{}
		return nil
	}
	if s.Attempt < 0 || s.Phase < SecAggAdvertise || s.Phase > SecAggConsistency || (phase == PhaseSecAgg && !s.Advancing && s.Phase == SecAggAdvertise) {
		return fmt.Errorf("%w: secure aggregation attempt %d phase %d in %s", ErrBadState, s.Attempt, s.Phase, phase)
	}
	exp := make(map[string]bool, len(s.Expect))
	for _, id := range s.Expect {
		if exp[id] {
			return fmt.Errorf("%w: secure aggregation expects %q twice", ErrBadState, id)
		}
		exp[id] = true
	}
	got := make(map[string]bool, len(s.Got))
	for _, id := range s.Got {
		if !exp[id] || got[id] {
			return fmt.Errorf("%w: secure aggregation message of %q not expected or listed twice", ErrBadState, id)
		}
		got[id] = true
	}
	c.sa = secAggState{attempt: s.Attempt, phase: s.Phase, advancing: s.Advancing, expect: slices.Sorted(slices.Values(s.Expect)),
		got: got, deadline: norm(s.Deadline), lastAbort: s.LastAbort, signed: s.SignedKeys, listed: s.ListedKeys}
	return nil
}
