package aggregator

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The FedSplit family's server step outside sum mode is split.BoundedStep
// (package comment there): each site's step of z_j is bounded by the
// honest sites' steps, a persistent poisoner is set aside. Its state (each
// site's lag and standing, the reference step) is the aggregator's own,
// kept with the round's checkpoint in one transaction (aggstore.Round.Split)
// like sum mode's S: a restart or a rollback to round n resumes with the
// state as round n opened. The sites never see it: a clip changes e_j, the
// z_j the mean counts, never the copy r_j that the site's next delta is
// against (package uplink), so the site and the aggregator keep agreeing on
// r_j bit for bit.

// SiteScreen is what the robust FedSplit step did with one site, for the
// operator (`broker-agg status`, the console, /status).
type SiteScreen struct {
	// Clipped counts the rounds its step was shortened, Aside the rounds
	// it was left out of the mean; AsideNow says it is left out now.
	Clipped  int  `json:"clipped_rounds"`
	Aside    int  `json:"aside_rounds"`
	AsideNow bool `json:"aside_now,omitempty"`
	// Rounds are the last rounds (up to screenRounds) it was clipped or
	// left out in, Reason what happened in the latest of them.
	Rounds []int  `json:"rounds,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// screenRounds is how many rounds SiteScreen.Rounds keeps.
const screenRounds = 20

// robustState is the robust FedSplit step's state as a round opens.
type robustState struct {
	// Ref is split.StepReport.Ref of the last step (0: none).
	Ref float64 `json:"ref,omitempty"`
	// Round is the round of each site's copy r_j that the step has
	// accounted for, and Sites its split.SiteState.
	Round map[string]uint64          `json:"round,omitempty"`
	Sites map[string]split.SiteState `json:"sites,omitempty"`
	// Screen is each site's record for the operator.
	Screen map[string]*SiteScreen `json:"screen,omitempty"`
	// NonFinite counts the steps that produced a value that is not a
	// finite number (the model was kept).
	NonFinite int `json:"non_finite,omitempty"`
	// Watch is the step's divergence watch (split.Watch: the residual of
	// the last step and the steps in a row it grew in), DivergingSince
	// the round it last reported the iterate diverging, until the
	// residual stops growing (0: not diverging).
	Watch          split.Watch `json:"watch,omitempty"`
	DivergingSince int         `json:"diverging_since,omitempty"`
}

// divergeRounds is the number of steps in a row with a growing residual
// that make the FedSplit iterate "diverging" (split.DivergeRounds).
const divergeRounds = split.DivergeRounds

func newRobustState() *robustState {
	return &robustState{Round: map[string]uint64{}, Sites: map[string]split.SiteState{}, Screen: map[string]*SiteScreen{}}
}

// clone returns a deep enough copy: the step replaces states, never edits
// their vectors.
func (r *robustState) clone() *robustState {
	c := &robustState{Ref: r.Ref, NonFinite: r.NonFinite, Watch: r.Watch, DivergingSince: r.DivergingSince, Round: maps.Clone(r.Round), Sites: maps.Clone(r.Sites), Screen: map[string]*SiteScreen{}}
	for id, sc := range r.Screen {
		v := *sc
		v.Rounds = slices.Clone(sc.Rounds)
		c.Screen[id] = &v
	}
	return c
}

// robustBytes encodes st for aggstore.Round.Split (nil: none).
func robustBytes(st *robustState) ([]byte, error) {
	if st == nil {
		return nil, nil
	}
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("aggregator: encode the robust FedSplit state: %w", err)
	}
	return b, nil
}

// decodeRobust decodes a stored state (empty: a fresh one: a round log
// written before the bounded step, or a first round).
func decodeRobust(b []byte) (*robustState, error) {
	st := newRobustState()
	if len(b) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, err
	}
	if st.Round == nil {
		st.Round = map[string]uint64{}
	}
	if st.Sites == nil {
		st.Sites = map[string]split.SiteState{}
	}
	if st.Screen == nil {
		st.Screen = map[string]*SiteScreen{}
	}
	return st, nil
}

// robustActive says the FedSplit server step runs split.BoundedStep (the
// FedSplit family outside sum mode; fedsplit-mean runs it with no bound).
func (s *Server) robustActive() bool { return isSplit(s.fam) && s.sum == nil }

// restoreRobust reads the robust step's state stored with the current
// round cur.
func (s *Server) restoreRobust(cur aggstore.Round) error {
	if !s.robustActive() {
		return nil
	}
	st, err := decodeRobust(cur.Split)
	if err != nil {
		return fmt.Errorf("%w: %s: round %d: the robust FedSplit state: %w", storage.ErrCorrupt, s.cfg.StatePath, cur.Number, err)
	}
	for id, ss := range st.Sites {
		if ss.Lag != nil && len(ss.Lag) != s.dim {
			return fmt.Errorf("%w: %s: round %d: the robust FedSplit lag of %q has %d values, the model %d", storage.ErrCorrupt, s.cfg.StatePath, cur.Number, id, len(ss.Lag), s.dim)
		}
	}
	s.robust = st
	return nil
}

// splitStep is the FedSplit family's server step of the closed round: the
// bounded step over every known client's latest z (sorted by id: a
// deterministic summation order), each client's step made of the updates
// stored since the step last accounted for its copy (the round's own, and
// late ones). Streamed: the step's two passes read each client's z and
// updates from the store as they reach it (splitSite), one client's
// vectors in memory at a time.
func (s *Server) splitStep(cr coordinator.CloseRound, out []float64) (map[string]float64, error) {
	if s.robust == nil {
		s.robust = newRobustState()
	}
	st := s.robust.clone()
	ids, rounds, err := s.splitClients()
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		// Cannot happen (the round closed with a quorum of stored z);
		// keep the model rather than publish nothing.
		copy(out, s.global)
		return nil, nil
	}
	site := func(j int) (split.SiteInput, error) { return s.splitSite(st, ids[j], rounds[j]) }
	rep, kept, err := round.SplitStepFrom(out, s.global, len(ids), site, s.screen, st.Ref, st.Watch)
	if kept {
		// Never publish such a model: x is kept; say so, count it (the
		// updates' range check should make this unreachable).
		st.NonFinite++
		s.nonFinite.Add(1)
		s.log.Error("the FedSplit server step produced a value that is not a finite number: the global model is kept", "round", cr.Round)
		s.nextRobust = st
		return map[string]float64{"clients_with_z": float64(len(ids)), "non_finite": 1}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("aggregator: fedsplit server step: %w", err)
	}
	st.Ref, st.Watch = rep.Ref, rep.Watch
	s.watchDivergence(st, rep, ids, cr.Round)
	clipped, aside := 0, 0
	for i, id := range ids {
		r := rep.Sites[i]
		st.Sites[id], st.Round[id] = r.State, rounds[i]
		if !r.Clipped && !r.State.Aside && !r.Readmitted {
			continue
		}
		s.screenSite(st, id, r, i == rep.Culprit, rep, cr.Round)
		if r.Clipped {
			clipped++
		}
		if r.State.Aside {
			aside++
		}
	}
	s.nextRobust = st
	m := map[string]float64{"clients_with_z": float64(len(ids)), "excluded": float64(aside), "clipped": float64(clipped)}
	if !math.IsInf(rep.Bound, 1) {
		m["step_bound"] = rep.Bound
	}
	return m, nil
}

// splitClients returns the clients with a stored z of the model's
// dimension, sorted by id, and the round of each one's latest z.
func (s *Server) splitClients() ([]string, []uint64, error) {
	zs, err := s.store.LatestZRounds()
	if err != nil {
		return nil, nil, fmt.Errorf("aggregator: %w", err)
	}
	ids := make([]string, 0, len(zs))
	rounds := make([]uint64, 0, len(zs))
	for _, z := range zs {
		if z.Len != s.dim {
			s.log.Error("stored z has the wrong dimension; left out", "client", z.Client, "len", z.Len)
			continue
		}
		ids, rounds = append(ids, z.Client), append(rounds, z.Round)
	}
	return ids, rounds, nil
}

// splitSite is client id's input to the bounded step, read from the
// store: its latest z (of round zr), its state in st and the updates since
// the step last accounted for its copy.
func (s *Server) splitSite(st *robustState, id string, zr uint64) (split.SiteInput, error) {
	r, z, err := s.store.ClientZ(id)
	if err != nil {
		return split.SiteInput{}, fmt.Errorf("aggregator: %w", err)
	}
	if r != zr || len(z) != s.dim {
		return split.SiteInput{}, fmt.Errorf("aggregator: the z of %q changed while the server step read it (round %d, was %d)", id, r, zr)
	}
	in := split.SiteInput{Z: z, State: st.Sites[id]}
	if zr != st.Round[id] { // else no update since the last step
		in.Delta, in.Reset = s.stepSince(id, st.Round[id], zr, z)
	}
	return in, nil
}

// watchDivergence records the divergence watch's verdict in st: when the
// iterate started diverging (warned of, naming the site set aside for
// it), or that it no longer is.
func (s *Server) watchDivergence(st *robustState, rep split.StepReport, ids []string, round int) {
	switch {
	case rep.Diverging:
		if st.DivergingSince == 0 {
			st.DivergingSince = round
		}
		s.diverging.Add(1)
		msg := "the FedSplit iterate is diverging: the sites' steps of z grew in each of the last rounds" // honest convex sites' never do
		if rep.Culprit >= 0 {
			s.log.Warn(msg+"; the site with the largest share of the growth is set aside", "round", round, "residual", rep.Watch.Median, "since", st.DivergingSince, "client", ids[rep.Culprit])
		} else {
			s.log.Warn(msg+"; look for a site scaling its updates", "hint", "status shows each site's clipped rounds", "round", round, "residual", rep.Watch.Median, "since", st.DivergingSince)
		}
	case rep.Watch.Growing == 0:
		st.DivergingSince = 0
	}
}

// screenSite records in st what the step did with a site it clipped, set
// aside or took back: the reason the status shows (logged), its counts
// and counters, and its last screened rounds. culprit says the
// divergence watch set it aside.
func (s *Server) screenSite(st *robustState, id string, r split.SiteResult, culprit bool, rep split.StepReport, round int) {
	sc := st.Screen[id]
	if sc == nil {
		sc = &SiteScreen{}
		st.Screen[id] = sc
	}
	sc.AsideNow = r.State.Aside
	switch {
	case r.Readmitted:
		sc.Reason = "taken back into the mean: its updates were within its allowance"
		s.log.Info("a FedSplit site set aside is taken back into the server step", "client", id, "round", round)
		s.readmitted.Inc(id)
	case r.SetAside && culprit:
		sc.Reason = fmt.Sprintf("set aside: the iterate was diverging (the steps of z grew in %d rounds in a row) and its step grew the most (step %.3g)", split.DivergeRounds, r.Step)
	case r.SetAside:
		sc.Reason = fmt.Sprintf("set aside: its step of z was clipped %d times with a growing lag (step %.3g, allowed %.3g = %g x the median step)", split.Patience, r.Step, rep.Bound, s.screen)
		s.log.Warn("a FedSplit site's steps keep growing past the bound: set aside, left out of the server step until its updates are within bounds again",
			"client", id, "round", round, "step", r.Step, "bound", rep.Bound, "median_step", rep.Median)
	case r.State.Aside:
		// Still left out: the reason it was set aside stays (the
		// divergence watch's or the strikes'), with this round's step.
		why, _, _ := strings.Cut(sc.Reason, "; still left out")
		if !strings.HasPrefix(why, "set aside") {
			why = "set aside"
		}
		sc.Reason = fmt.Sprintf("%s; still left out (step %.3g, bound %.3g)", why, r.Step, rep.Bound)
	default:
		sc.Reason = fmt.Sprintf("clipped: step of z %.3g, bound %.3g (%g x the median step %.3g)", r.Step, rep.Bound, s.screen, rep.Median)
		s.log.Warn("a FedSplit site's step of z is longer than the bound: clipped (the rest is applied in later rounds)",
			"client", id, "round", round, "step", r.Step, "bound", rep.Bound, "median_step", rep.Median)
	}
	if r.Clipped {
		sc.Clipped++
		s.clipped.Inc(id)
	}
	if r.State.Aside {
		sc.Aside++
		s.excluded.Inc(id)
	}
	if r.Clipped || r.State.Aside {
		sc.Rounds = append(sc.Rounds, round)
		if len(sc.Rounds) > screenRounds {
			sc.Rounds = slices.Delete(sc.Rounds, 0, len(sc.Rounds)-screenRounds)
		}
	}
}

// stepSince is client id's step since the step last accounted for its copy
// (the copy of round from): the sum of the decoded deltas of its stored
// updates of the rounds after from up to to, restarted at any update
// against x (reset: a join, or a site whose copy was forgotten). An update
// the round log no longer holds (pruned) makes it a reset against the
// current model: z - x.
func (s *Server) stepSince(id string, from, to uint64, z []float64) (delta []float64, reset bool) {
	var acc []float64
	for r := from + 1; r <= to; r++ {
		u, err := s.store.GetUpdate(r, id)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		var m *wire.ClientUpdate
		var d []float64
		if err == nil {
			if m, err = wire.DecodeUpdate(u.Msg, s.lim); err == nil {
				d, err = s.loopQ.Decode(m.Vector.Payload, nil)
			}
		}
		if err != nil || len(d) != s.dim {
			acc = nil
			break
		}
		switch uplink.BaseOf(uplink.HeaderOf(m)) {
		case uplink.BaseCopy:
			if acc == nil {
				acc = make([]float64, s.dim)
			}
		case uplink.BaseGlobal:
			acc, reset = make([]float64, s.dim), true
		default: // a FULL z: measured against the current model below
			acc = nil
		}
		if acc == nil {
			break
		}
		for i, v := range d {
			acc[i] += v
		}
	}
	if acc == nil || (!reset && from == 0) {
		acc, reset = make([]float64, s.dim), true
		for i := range acc {
			acc[i] = z[i] - s.global[i]
		}
	}
	return acc, reset
}

// screenOf is the status view of the robust step's records (nil: none).
func screenOf(st *robustState) map[string]SiteScreen {
	if st == nil || len(st.Screen) == 0 {
		return nil
	}
	out := make(map[string]SiteScreen, len(st.Screen))
	for id, sc := range st.Screen {
		out[id] = *sc
	}
	return out
}
