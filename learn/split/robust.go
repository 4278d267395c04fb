package split

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// One authenticated site can publish any z_j it likes. The plain server
// step (the mean of every z_j) lets it move x anywhere, and because z_j is
// the site's persistent state the damage never ends. A first defence left
// out any z_j far from x (more than 20 times the median distance); it
// failed against a mild poisoner: a site scaling each update it sends by 3
// (or -1) drags x a little, every honest z_j follows x, the median
// distance grows with the attack and the poisoner is never the outlier:
// the model's norm doubled every round to a float32 overflow. Any test of
// a z_j against x is relative to a model the attacker moves.
//
// The bounded step (BoundedStep) measures what a site changes instead:
//
//	step_j = r_j - e_j,
//
// r_j the server's copy of z_j (what the site sent, decoded against its
// base by package uplink: one rule, the site keeps the same copy) and e_j
// the z_j the mean counts for the site. For an honest site the step is
// z_j^{t+1} - z_j^t = 2 alpha (z_half - x): it shrinks to 0 as
// Peaceman-Rachford converges, whatever the scale of the model. Each round
//
//	ref   = median_j ||step_j||, at most Growth x the last round's ref
//	allow = max(Mult x ref, min(own_j, MaxRatio x ref), Floor x ||x||)
//	e_j  <- e_j + clip(step_j, allow_j)
//
// (own_j: the longest step the site took within its allowance in its last
// OwnRounds updates; a site whose data makes its steps steadily longer
// than the others' keeps its share). What a clip leaves out is kept as the site's lag L_j = r_j - e_j and
// counted in its later steps, so an honest site clipped now and then
// catches up and the fixed point is the plain mean's; with nobody clipped
// the step is the plain mean of the r_j bit for bit.
//
// Why each rule: the median is set by the honest majority. Growth: the
// Peaceman-Rachford operator is nonexpansive, so honest convex sites'
// steps do not grow together; a poisoner that drags every site along (a x3
// site moves x so that every honest step grows with its own: none is the
// outlier) would grow a bound that followed the median. A site scaling its
// updates by s moves its copy r_j <- r_j + s (z_j - r_j): r_j - z_j is
// multiplied by (1 - s) every round. For s in (0, 2) (0.5, 1.5: under- and
// over-relaxations of the same operator) that contracts and the fixed point
// is unchanged; for s = -1, 3, 10, 1000 it grows geometrically, so the
// site's own updates outgrow its allowance, and a clipped update earns it
// no allowance for the next rounds. A clip of an update that is itself
// beyond the allowance (not only its lag) is a strike; Patience strikes
// without Patience clean rounds in a row between them set the site aside:
// left out of the mean, its e_j frozen, judged on its own updates. It is
// taken back (e_j = r_j) after Patience updates in a row within its
// allowance, if its copy is within DistMult median distances of x (a site
// that parked its copy far away stays out). A site alternating hostile and
// honest rounds strikes in every hostile round and never has the clean
// rounds. Setting a site aside or taking one back moves the fixed point:
// the next round's ref starts again from its own median.
//
// The divergence watch (Watch): a site whose steps stay within the honest
// sites' spread (x1.5, or x3 in alternate rounds, on strongly
// heterogeneous data) is never clipped hard enough to strike, yet can
// drive the iterate away (1e20 in 200 rounds, as the plain mean does). The
// Peaceman-Rachford operator z -> R_F(R_C z) is a composition of two
// reflections, nonexpansive in the stacked Euclidean norm, so for honest
// convex sites with exact proxes the fixed-point residual
// sqrt(sum_j ||step_j||^2) over the sites in the mean never grows. When
// it grows in DivergeRounds steps in a row (by more than rounding), the
// site with the largest share of the growth of the squared residual since
// the window opened is set aside as by strikes, and taken back only after
// Patience x 2^k clean updates (k: the times the watch set it aside), so
// that one re-admitted and diverging again stays out longer each time.
// There is no rollback: the honest sites re-converge from where they are
// (nonexpansive from any start). Under the plain mean the watch only
// reports (StepReport.Diverging).
//
// What it cannot tell apart: a site whose steps are within the honest
// sites' spread and do not make the residual grow (x-1 in alternate
// rounds, on strongly heterogeneous data: 0.048 from the honest model in
// one seed) moves x by at most its allowance per round, like an honest
// site; and an honest site whose own steps outgrow its allowance round
// after round may be set aside for a while. docs/aggregators.md gives the measured
// figures. The rules need MinScreened sites with a step norm; with fewer
// nothing is clipped.

// DefaultMult is the step bound's factor: a site's step may be Mult times
// the median step norm.
const DefaultMult = 4

// Growth is how much the reference step may grow from one round to the
// next.
const Growth = 1.25

// DistMult bounds the distance from x of a set-aside site's copy when it
// is taken back: DistMult times the median distance of the sites' copies.
const DistMult = 20

// Floor is the step, relative to ||x||, below which nothing is clipped:
// far above float64 rounding (1e-16), far below any effect on the model
// (a poisoner can move x by this fraction of its norm per round at most).
const Floor = 1e-9

// OwnRounds and MaxRatio bound a site's own allowance: the longest step it
// took within its allowance in its last OwnRounds updates (an update of its
// own beyond the allowance earns none, and is a strike), never above
// MaxRatio times the reference.
const (
	OwnRounds = 4
	MaxRatio  = 100
)

// Patience is the number of strikes that set a site aside, of clean rounds
// in a row that forgive them, and of updates in a row within its allowance
// that take a set-aside site back.
const Patience = 2

// MinScreened is the number of sites with a step norm below which nothing
// is clipped.
const MinScreened = 3

// SiteState is the bounded step's state of one site at the server (the
// zero value: a site whose every update counted in full).
type SiteState struct {
	// Lag is r_j - e_j, what clips left out and later steps make up; nil
	// when none.
	Lag []float64 `json:"lag,omitempty"`
	// Norm is the norm of the site's latest step, its vote in the median;
	// Voted says it has one.
	Norm  float64 `json:"norm,omitempty"`
	Voted bool    `json:"voted,omitempty"`
	// Applied are the norms of the site's steps in its last OwnRounds
	// updates as far as they were within its allowance (0 for one whose
	// own update was beyond it; its own update while it is set aside),
	// oldest first.
	Applied []float64 `json:"applied,omitempty"`
	// Strikes counts the rounds the site was clipped in with a growing
	// lag since it last had Patience clean rounds in a row; Clean counts
	// its clean rounds in a row (its step within its allowance).
	Strikes int `json:"strikes,omitempty"`
	Clean   int `json:"clean,omitempty"`
	// Aside: the site is left out of the mean.
	Aside bool `json:"aside,omitempty"`
	// From is the site's step norm as the divergence watch's window
	// opened (the last step whose median did not grow); Diverged counts
	// the times the watch set the site aside.
	From     float64 `json:"from,omitempty"`
	Diverged int     `json:"diverged,omitempty"`
}

// Watch is the divergence watch carried from one step to the next (the
// zero value: none yet).
type Watch struct {
	// Median is the last step's median step norm (0: none), Growing the
	// number of steps in a row whose median grew.
	Median  float64 `json:"median,omitempty"`
	Growing int     `json:"growing,omitempty"`
}

// DivergeRounds is the number of steps in a row with a growing median
// step that make the iterate diverging.
const DivergeRounds = 5

// SiteInput is one site's part in a round's bounded step.
type SiteInput struct {
	// Z is r_j, the server's copy of the site's z_j after this round.
	Z []float64
	// Delta is this round's decoded update (nil: the site sent none this
	// round); Reset says it is against x (a join, or a site re-sending
	// after its copy was forgotten: uplink's base round 0), which drops
	// the lag: the step is then Delta itself.
	Delta []float64
	Reset bool
	State SiteState
}

// SiteResult is what a round's bounded step did with one site.
type SiteResult struct {
	State SiteState
	// Step is the norm of the step the site asked for (its lag included);
	// Clipped says it was longer than the bound and was shortened.
	Step    float64
	Clipped bool
	// SetAside: set aside in this round; Readmitted: back in the mean.
	SetAside, Readmitted bool
}

// StepReport is a round's bound and each site's result (in input order).
type StepReport struct {
	// Bound is B (+Inf: nothing is clipped), Median the median step norm.
	Bound, Median float64
	// Ref is the median step the bound used: this round's, or Growth
	// times the previous round's Ref when that is smaller. The caller
	// keeps it for the next round (0: none, after a round that set a
	// site aside or took one back).
	Ref   float64
	Sites []SiteResult
	// Watch is the divergence watch for the next step; Diverging says
	// the median step grew in DivergeRounds steps in a row up to this
	// one, Culprit is the site set aside for it (-1: none).
	Watch     Watch
	Diverging bool
	Culprit   int
}

// ErrNonFinite is returned for a step or a model with a value that is not
// a finite number.
var ErrNonFinite = errors.New("fedsplit: a non-finite value")

// BoundedStep computes the next global model from the sites' copies and
// this round's updates (see the comment above) into dst and returns it with
// the report; x is the round's global model. mult <= 0 means DefaultMult;
// +Inf clips nothing (the plain mean). The inputs are not modified. It is
// Step over inputs held in memory.
func BoundedStep(dst, x []float64, sites []SiteInput, mult, ref float64, w Watch) ([]float64, StepReport, error) {
	st := NewStep(x, len(sites), mult, ref, w)
	for j, in := range sites {
		if err := st.Measure(j, in); err != nil {
			return nil, st.rep, err
		}
	}
	st.Decide()
	for j, in := range sites {
		st.Count(j, in)
	}
	return st.Finish(dst)
}

// Step is BoundedStep in two passes over the sites, for a caller that
// holds one site's vectors at a time (the aggregator reads each z_j and
// update from its store as needed): Measure every site in order, Decide,
// Count every site again in the same order with the same input, Finish.
// The first pass keeps per site only its step norm and its copy's
// distance from x; the second judges each site and adds its e_j to a
// running sum, in ServerStep's order: BoundedStep's result bit for bit.
type Step struct {
	x         []float64
	mult, ref float64
	w         Watch
	rep       StepReport
	dist      []float64
	floor     float64
	distBound float64
	sum       []float64
	counted   int
}

// NewStep starts the step of n sites from the round's global model x
// (mult, ref, w as for BoundedStep).
func NewStep(x []float64, n int, mult, ref float64, w Watch) *Step {
	if mult <= 0 {
		mult = DefaultMult
	}
	return &Step{x: x, mult: mult, ref: ref, w: w, dist: make([]float64, n),
		rep: StepReport{Sites: make([]SiteResult, n), Culprit: -1, Watch: w}}
}

// Measure is the first pass's look at site j: its vectors' dimensions,
// the norm of the step it asks for and its copy's distance from x.
func (st *Step) Measure(j int, in SiteInput) error {
	if _, err := st.rep.siteStep(j, st.x, in); err != nil {
		return err
	}
	st.dist[j] = distance(in.Z, st.x)
	return nil
}

// Decide sets the round's bound, the floor, the copies' distance bound
// and the divergence watch from the first pass.
func (st *Step) Decide() {
	votes := st.rep.bound(st.mult, st.ref)
	// Rounding noise is never clipped: once the steps are down to a few
	// ulps of x their medians jump about at random.
	st.floor = Floor * norm(st.x)
	st.distBound = distanceBound(st.dist)
	if votes >= MinScreened {
		st.rep.watch(st.w, st.floor*math.Sqrt(float64(votes)), !math.IsInf(st.mult, 1))
	}
	st.sum = make([]float64, len(st.x))
}

// Count is the second pass's judgement of site j (the input Measure saw):
// clipped, set aside or taken back, and its e_j added to the mean.
func (st *Step) Count(j int, in SiteInput) {
	e := st.rep.judge(j, in, askedStep(in), st.floor, st.dist[j] <= st.distBound)
	if e == nil {
		return
	}
	for i, v := range e {
		st.sum[i] += v
	}
	st.counted++
}

// Finish writes the mean of the counted e_j into dst (nil: a new slice;
// x when every site is set aside) and returns it with the report.
func (st *Step) Finish(dst []float64) ([]float64, StepReport, error) {
	rep := st.rep
	for _, r := range rep.Sites {
		if r.SetAside || r.Readmitted {
			// The sites in the mean changed, and so does the fixed
			// point: the honest steps towards the new one may be far
			// longer than the last ones. The next round's bound starts
			// again from its own median.
			rep.Ref = 0
		}
	}
	if dst == nil {
		dst = make([]float64, len(st.x))
	}
	if len(dst) != len(st.x) {
		return nil, rep, fmt.Errorf("%w: dst has %d, want %d", ErrDim, len(dst), len(st.x))
	}
	if st.counted == 0 {
		copy(dst, st.x)
		return dst, rep, nil
	}
	// ServerStep's mean: the sum in site order, times 1/m.
	inv := 1 / float64(st.counted)
	for i, v := range st.sum {
		dst[i] = v * inv
		if math.IsNaN(dst[i]) || math.IsInf(dst[i], 0) {
			return nil, rep, fmt.Errorf("%w in the mean of the sites' z", ErrNonFinite)
		}
	}
	return dst, rep, nil
}

// siteStep checks site j's vectors against the model's dimension and
// returns the step it asks for (its update plus its lag), filling in
// rep.Sites[j] with the step norm and the site's state without its lag.
func (rep *StepReport) siteStep(j int, x []float64, in SiteInput) ([]float64, error) {
	d := len(x)
	if len(in.Z) != d || (in.Delta != nil && len(in.Delta) != d) || (in.State.Lag != nil && len(in.State.Lag) != d) {
		return nil, fmt.Errorf("%w: site %d's vectors and the model's %d", ErrDim, j, d)
	}
	st := in.State
	st.Lag = nil
	step := askedStep(in)
	n := norm(step)
	if math.IsNaN(n) || math.IsInf(n, 0) {
		return nil, fmt.Errorf("%w in site %d's step", ErrNonFinite, j)
	}
	if in.Delta != nil {
		st.Norm, st.Voted = n, true
	}
	rep.Sites[j] = SiteResult{State: st, Step: n}
	return step, nil
}

// askedStep is the step a site asks for this round: its update plus the
// lag it still has to make up (the update alone after a reset, the lag
// alone without an update).
func askedStep(in SiteInput) []float64 {
	switch {
	case in.Delta != nil && in.Reset:
		return in.Delta
	case in.Delta != nil && in.State.Lag != nil:
		step := make([]float64, len(in.Delta))
		for i := range step {
			step[i] = in.Delta[i] + in.State.Lag[i]
		}
		return step
	case in.Delta != nil:
		return in.Delta
	default:
		return in.State.Lag // no update: only a lag to make up
	}
}

// bound sets rep's median step, Ref and Bound from the step norms of the
// sites that sent an update (the votes), when there are at least
// MinScreened of them, and returns the number of votes.
func (rep *StepReport) bound(mult, ref float64) int {
	var votes []float64
	for _, r := range rep.Sites {
		if r.State.Voted {
			votes = append(votes, r.State.Norm)
		}
	}
	rep.Bound, rep.Median = math.Inf(1), math.NaN()
	if len(votes) >= MinScreened {
		//nolint:staticcheck // S1032: sort.Float64s is slices.Sort since Go 1.22; sort.Sort keeps the float64 pdqsort instantiation out of edge-agent
		sort.Sort(sort.Float64Slice(votes))
		n := len(votes)
		rep.Median = votes[n/2]
		if n%2 == 0 {
			rep.Median = (votes[n/2-1] + votes[n/2]) / 2
		}
		rep.Ref = rep.Median
		if ref > 0 && rep.Ref > Growth*ref {
			rep.Ref = Growth * ref
		}
		if !math.IsInf(mult, 1) {
			rep.Bound = mult * rep.Ref
		}
	}
	return len(votes)
}

// distance is a site's copy's distance |r_j - x|.
func distance(z, x []float64) float64 {
	var q float64
	for i, v := range z {
		q += (v - x[i]) * (v - x[i])
	}
	return math.Sqrt(q)
}

// distanceBound is the farthest a set-aside site's copy may be from x to
// be taken back: DistMult times the median distance (+Inf below
// MinScreened sites).
func distanceBound(dist []float64) float64 {
	if len(dist) < MinScreened {
		return math.Inf(1)
	}
	sorted := slices.Clone(dist)
	sort.Sort(sort.Float64Slice(sorted)) //nolint:staticcheck // S1032: as above
	n := len(sorted)
	return DistMult * (sorted[(n-1)/2] + sorted[n/2]) / 2
}

// judge decides site j's part in this step: set aside by the divergence
// watch, judged while set aside, or clipped to its allowance. It updates
// rep.Sites[j] and returns the site's e_j for the mean (nil: left out).
// near says the site's copy is close enough to x to be taken back.
func (rep *StepReport) judge(j int, in SiteInput, step []float64, floor float64, near bool) []float64 {
	r := &rep.Sites[j]
	if j == rep.Culprit {
		// Set aside by the divergence watch: left out from this
		// step on, its e_j frozen (the lag takes the whole step).
		r.State.Aside, r.SetAside, r.State.Clean = true, true, 0
		r.State.Diverged++
		r.State.Lag = slices.Clone(step)
		r.Clipped = true
		return nil
	}
	judged := rep.allowance(in) // the allowance a set-aside site's update is judged by
	allowed := max(judged, floor)
	if in.Delta != nil {
		r.recordApplied(in, allowed)
	}
	if in.State.Aside {
		return r.judgeAside(in, step, allowed, judged, near)
	}
	return r.clip(in, step, allowed)
}

// allowance is how far a site may step this round: the bound, or as far
// as it did unclipped in one of its last OwnRounds updates when that is
// farther (up to MaxRatio median steps).
func (rep *StepReport) allowance(in SiteInput) float64 {
	allowed := rep.Bound
	if !math.IsInf(allowed, 1) && rep.Ref > 0 {
		// A site's steps may be longer than the median's in every
		// round (heterogeneous data): it may always step as far as
		// it did, unclipped, in one of its last OwnRounds updates
		// (up to MaxRatio median steps). Honest steps shrink as the
		// federation converges, or oscillate (Peaceman-Rachford is
		// not averaged); a poisoner's grow, are clipped and earn it
		// nothing.
		if own := slices.Max(append([]float64{0}, in.State.Applied...)); own > 0 {
			allowed = max(allowed, min(own, MaxRatio*rep.Ref))
		}
	}
	return allowed
}

// recordApplied appends to the site's last OwnRounds applied steps the
// step its update earns it: the whole step within its allowance, the
// allowance when only its lag made it longer, none when its own update
// is beyond it.
func (r *SiteResult) recordApplied(in SiteInput, allowed float64) {
	n := r.Step
	if in.State.Aside {
		n = norm(in.Delta) // its own update, not its frozen lag
	}
	switch {
	case n <= allowed:
	case norm(in.Delta) <= allowed:
		n = allowed // clipped for its lag only: it keeps its allowance
	default:
		n = 0 // its own update is beyond it: it earns none
	}
	as := append(slices.Clone(in.State.Applied), n)
	r.State.Applied = as[max(0, len(as)-OwnRounds):]
}

// judgeAside judges a site set aside. Its e_j stays where it is (the lag
// takes the whole step) and the site is judged on its own updates:
// Patience of them in a row within its allowance, and a copy r_j no
// farther from x than DistMult times the median distance (a site that
// parked its copy far away while set aside stays out), take it back with
// e_j = r_j, which it returns (nil: still set aside).
func (r *SiteResult) judgeAside(in SiteInput, step []float64, allowed, judged float64, near bool) []float64 {
	r.Clipped = r.Step > allowed
	r.State.Lag = slices.Clone(step)
	if in.Delta != nil && norm(in.Delta) <= judged {
		// (Not below the floor: steps of rounding noise say
		// nothing about the site.)
		r.State.Clean++
	} else {
		r.State.Clean = 0
	}
	if r.State.Clean >= probation(r.State.Diverged) && near {
		r.State = SiteState{Norm: r.State.Norm, Voted: r.State.Voted, Applied: r.State.Applied, From: r.State.From, Diverged: r.State.Diverged}
		r.Readmitted = true
		return in.Z
	}
	return nil
}

// clip shortens a site's step to its allowance, counting a strike when
// its own update is beyond it and setting it aside after Patience
// strikes, and returns its e_j (nil: set aside).
func (r *SiteResult) clip(in SiteInput, step []float64, allowed float64) []float64 {
	e := in.Z // e_j = r_j: the site counts as received
	if r.Step > allowed {
		// Shorten the step to the allowance: e_j = e_old + step
		// allowed/|step|, and the rest is the new lag r_j - e_j.
		r.Clipped = true
		keep := 1 - allowed/r.Step
		d := len(in.Z)
		r.State.Lag = make([]float64, d)
		e = make([]float64, d)
		for i, v := range step {
			r.State.Lag[i] = v * keep
			e[i] = in.Z[i] - r.State.Lag[i]
		}
		r.State.Clean = 0
		if in.Delta != nil && norm(in.Delta) > allowed {
			// Its own update, not only its lag, is beyond its
			// allowance: a strike.
			r.State.Strikes++
		}
		if r.State.Strikes >= Patience && !r.State.Aside {
			r.State.Aside, r.SetAside = true, true
		}
	} else if r.State.Clean++; r.State.Clean >= Patience {
		// Patience clean rounds in a row forgive the strikes: a
		// site alternating hostile and honest rounds never has them.
		r.State.Strikes = 0
	}
	if r.State.Aside {
		return nil
	}
	return e
}

// probation is the number of updates in a row within its allowance that
// take back a site set aside: Patience, doubled for each time the
// divergence watch set it aside.
func probation(diverged int) int {
	return Patience << min(diverged, 16)
}

// watch advances the divergence watch from w with this step's residual,
// the root of the sum of the squared step norms of the sites in the mean
// that stepped (Peaceman-Rachford's operator is nonexpansive: for honest
// convex sites it never grows but by rounding, so growth below the floor
// is not counted) and, when it has grown in DivergeRounds steps in a row,
// names the culprit: of those sites, the one whose squared step grew most
// since the window opened (the largest share of the residual's growth).
func (rep *StepReport) watch(w Watch, floor float64, culprit bool) {
	var q float64
	for _, r := range rep.Sites {
		if r.State.Voted && !r.State.Aside {
			q += r.State.Norm * r.State.Norm
		}
	}
	res := math.Sqrt(q)
	rep.Watch = Watch{Median: res}
	if w.Median > 0 && res > w.Median && res > floor {
		rep.Watch.Growing = w.Growing + 1
	}
	for j := range rep.Sites {
		// A site out of the mean as the window opens enters it at 0:
		// its whole step when taken back is growth.
		st := &rep.Sites[j].State
		switch {
		case st.Aside:
			st.From = 0
		case st.Voted && rep.Watch.Growing == 0:
			st.From = st.Norm
		}
	}
	if rep.Watch.Growing < DivergeRounds {
		return
	}
	rep.Diverging = true
	if !culprit {
		return // the plain mean: reported only
	}
	var most float64
	for j, r := range rep.Sites {
		st := r.State
		if st.Aside || !st.Voted {
			continue
		}
		// Its share of the growth of the squared residual.
		if g := st.Norm*st.Norm - st.From*st.From; g > most {
			most, rep.Culprit = g, j
		}
	}
	if rep.Culprit >= 0 {
		// The sites in the mean change: a new window.
		rep.Watch.Growing = 0
	}
}

func norm(v []float64) float64 {
	var s float64
	for _, a := range v {
		s += a * a
	}
	return math.Sqrt(s)
}

// Server step specs: the --aggregator values the FedSplit family takes.
const (
	StepRobust = "fedsplit-robust" // BoundedStep, the default; ":mult=M" sets Mult
	StepMean   = "fedsplit-mean"   // the plain mean of every z (no bound)
)

// ParseServerStep parses a FedSplit server-step spec and returns its step
// bound's factor Mult (+Inf for the plain mean). Any other aggregator is
// refused: the FedSplit server step averages states, not updates, and the
// update aggregators (median, trimmed mean, norm bounding, ...) would be
// silently meaningless there.
func ParseServerStep(spec string) (float64, error) {
	name, opt, _ := strings.Cut(spec, ":")
	switch {
	case name == StepMean && opt == "":
		return math.Inf(1), nil
	case name == StepRobust && opt == "":
		return DefaultMult, nil
	case name == StepRobust && strings.HasPrefix(opt, "mult="):
		m, err := strconv.ParseFloat(strings.TrimPrefix(opt, "mult="), 64)
		if err != nil || !(m >= 1) || math.IsInf(m, 0) {
			return 0, fmt.Errorf("fedsplit: %q: mult must be a finite number >= 1", spec)
		}
		return m, nil
	}
	return 0, fmt.Errorf("fedsplit: server step %q: the FedSplit family takes %s[:mult=M] (the default: no site's step is longer than M times the median step) or %s (the plain mean)", spec, StepRobust, StepMean)
}
