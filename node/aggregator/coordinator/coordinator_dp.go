package coordinator

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
)

// The coordinator's part of central differential privacy (Config.DP;
// docs/privacy.md, "The accountant" and "Sampling rate"):
//
//   - a round's selection is drawn once (no re-selection: a second draw
//     would raise the round's sampling rate after its budget check); its
//     sampling rate q_t is aggregate.SamplingRate over the pool N_t it was
//     drawn from (poisson: its q, or K/N_t; uniform: K_t / N_t), and its
//     fixed denominator m_t aggregate.DPDenominator, both fixed by the
//     draw before anyone answers;
//   - a round is only drawn when one more round at that q keeps the
//     accountant within the budget (otherwise it waits for a larger pool);
//   - the accountant is charged when the round closes, so the state stored
//     with the round's checkpoint holds the charge, once; so is each
//     contributor's count of rounds, from which the unamplified per-site
//     epsilon is reported (docs/privacy.md, "Sampling rate", option (b):
//     the unsampled Gaussian, q = 1, over the rounds a site's update was in
//     the aggregate, the maximum over sites; the figure that holds against
//     whoever learns the selection, the aggregator included);
//   - after an aggregation the run finishes (StopReason "dp_budget", the
//     normal end of a run) when not even the whole registry as the pool
//     would keep the next round within the budget.

// StopDPBudget is Coordinator.StopReason when the privacy budget ended the
// run.
const StopDPBudget = "dp_budget"

// DPState is the accountant in State (absent without Config.DP): its RDP
// values, the sampling rate and fixed denominator of the open round's
// selection, how many aggregated rounds each site contributed to, the
// charging history, and with adaptive clipping the clip norm of the open
// round (0: Config.DP.Clip).
type DPState struct {
	Accountant *dp.Accountant    `json:"accountant"`
	Q          float64           `json:"q,omitempty"`
	M          int               `json:"denominator,omitempty"`
	SiteRounds map[string]uint64 `json:"site_rounds,omitempty"`
	// Rates is the charging history (bundles record the epsilon of their
	// round from it: server_dpschema.go).
	Rates []dp.Rate `json:"rates,omitempty"`
	Clip  float64   `json:"clip,omitempty"`
}

type dpState struct {
	acc   *dp.Accountant
	q     float64
	rates []dp.Rate
	clip  float64
	m     int
	sites map[string]uint64
	// unsampled is the accountant of the most charged site: max(sites)
	// steps of (1, z). z is the run's, so a site's unamplified accountant
	// is its count of rounds alone, and the maximum over sites is the
	// site with the most; stepping it reuses the RDP vector of (1, z).
	// Not state: rebuilt from sites by restoreDP.
	unsampled *dp.Accountant
}

// ClipEstimated: adaptive clipping (Config.DP.Adaptive) estimated the clip
// norm of the round after Round from its noised clip bits. The shell steps
// it while Round closes, before it stores the state with the next round's
// checkpoint, so the clip norm moves with the checkpoint, once. Ignored
// otherwise.
type ClipEstimated struct {
	Round int
	Clip  float64
	At    time.Time
}

func (e ClipEstimated) eventTime() time.Time { return e.At }

// clipEstimated applies a ClipEstimated; ok is false for other events.
func (c *Coordinator) clipEstimated(ev Event) (ok bool) {
	e, ok := ev.(ClipEstimated)
	if !ok {
		return false
	}
	if c.cfg.DP == nil || c.cfg.DP.Adaptive == nil || c.phase != PhaseClosing || e.Round != c.round ||
		!(e.Clip > 0) || math.IsInf(e.Clip, 0) {
		c.counters.Ignored++
		return true
	}
	c.dp.clip = e.Clip
	return true
}

// DPClip is the clip norm of the open round (0 without DP).
func (c *Coordinator) DPClip() float64 {
	switch {
	case c.cfg.DP == nil:
		return 0
	case c.dp.clip > 0:
		return c.dp.clip
	}
	return c.cfg.DP.Clip
}

func (c Config) validateDP() error {
	d := c.DP
	if _, ok := c.Selector.(aggregate.Sampler); ok && d == nil {
		return fmt.Errorf("%w: selector %s draws rounds of random size, even of one site: it needs differential privacy (--dp) (hint: use uniform)", ErrConfig, c.Selector.Name())
	}
	if d == nil {
		return nil
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	switch {
	case c.MaxReselections != 0:
		return fmt.Errorf("%w: differential privacy needs MaxReselections = 0 (a re-selection raises a round's sampling rate after its budget check)", ErrConfig)
	case c.StoreLate:
		return fmt.Errorf("%w: differential privacy refuses late updates (a site would contribute outside its sampled round)", ErrConfig)
	}
	return c.validateFedDP()
}

// roundQ is the sampling rate of a selection from a pool of n.
func (c *Coordinator) roundQ(n int) float64 {
	return c.cfg.DP.ChargedRate(aggregate.SamplingRate(c.sel, c.cfg.K, n))
}

// dpDrawn fixes the sampling rate and the denominator of the round just
// drawn from a pool of n.
func (c *Coordinator) dpDrawn(n int) {
	if c.cfg.DP == nil {
		return
	}
	c.dp.q = c.roundQ(n)
	c.dp.m = aggregate.DPDenominator(c.sel, c.cfg.K, n)
}

// dpFits says whether a round drawn from a pool of n sites keeps the
// accountant within the budget (always without DP or a budget).
func (c *Coordinator) dpFits(n int) bool {
	if c.cfg.DP == nil || c.cfg.DP.Budget == 0 {
		return true
	}
	ok, _, err := c.cfg.DP.Within(c.dp.acc, c.roundQ(n))
	return err == nil && ok
}

// dpCharge charges the closing round.
func (c *Coordinator) dpCharge() {
	if c.cfg.DP == nil {
		return
	}
	// Step fails only on a q outside [0, 1] or an invalid z, which
	// roundQ and Config.validate rule out.
	_ = c.dp.acc.Step(c.dp.q, c.cfg.DP.Noise)
	c.dp.rates = dp.AppendRate(c.dp.rates, c.dp.q, c.cfg.DP.Noise)
	if c.dp.sites == nil {
		c.dp.sites = map[string]uint64{}
	}
	for id := range c.received {
		c.dp.sites[id]++
	}
	c.syncUnsampled()
}

// syncUnsampled steps the most charged site's accountant up to its count.
func (c *Coordinator) syncUnsampled() {
	if c.dp.unsampled == nil {
		c.dp.unsampled = dp.NewAccountant(nil)
	}
	var most uint64
	for _, n := range c.dp.sites {
		most = max(most, n)
	}
	for c.dp.unsampled.Rounds < most {
		_ = c.dp.unsampled.Step(1, c.cfg.DP.Noise) // valid z: see dpCharge
	}
}

// dpExhausted says whether no pool the registry can offer keeps the next
// round within the budget.
func (c *Coordinator) dpExhausted() bool {
	n := 0
	for _, cl := range c.clients {
		if !cl.failing {
			n++
		}
	}
	return n > 0 && !c.dpFits(n)
}

// Privacy is the epsilon spent so far at the configured delta and the
// rounds charged; ok is false without DP.
func (c *Coordinator) Privacy() (eps float64, rounds uint64, ok bool) {
	if c.cfg.DP == nil {
		return 0, 0, false
	}
	eps, _ = c.dp.acc.Epsilon(c.cfg.DP.Delta)
	return eps, c.dp.acc.Rounds, true
}

// SitePrivacy is the unamplified per-site epsilon at the configured delta
// (the unsampled Gaussian over the rounds each site contributed to, the
// maximum over sites) and that site's count of rounds; ok is false
// without DP.
func (c *Coordinator) SitePrivacy() (eps float64, rounds uint64, ok bool) {
	if c.cfg.DP == nil {
		return 0, 0, false
	}
	if c.dp.unsampled == nil || c.dp.unsampled.Rounds == 0 {
		return 0, 0, true
	}
	eps, _ = c.dp.unsampled.Epsilon(c.cfg.DP.Delta)
	return eps, c.dp.unsampled.Rounds, true
}

func (c *Coordinator) SnapshotDP() *DPState {
	if c.cfg.DP == nil {
		return nil
	}
	a := c.dp.acc
	s := &DPState{Accountant: &dp.Accountant{Orders: slices.Clone(a.Orders), RDP: slices.Clone(a.RDP), Rounds: a.Rounds}, Q: c.dp.q, M: c.dp.m,
		Rates: slices.Clone(c.dp.rates), Clip: c.dp.clip}
	if len(c.dp.sites) > 0 {
		s.SiteRounds = maps.Clone(c.dp.sites)
	}
	return s
}

func (c *Coordinator) restoreDP(s *DPState) error {
	if c.cfg.DP == nil {
		return nil
	}
	if s == nil || s.Accountant == nil {
		if c.counters.RoundsClosed > 0 {
			return fmt.Errorf("%w: a run with differential privacy has no accountant in its state", ErrBadState)
		}
		c.dp = dpState{acc: dp.NewAccountant(nil)}
		return nil
	}
	a := s.Accountant
	if len(a.Orders) == 0 || len(a.RDP) != len(a.Orders) || !(s.Q >= 0 && s.Q <= 1) || s.M < 0 || !(s.Clip >= 0) || math.IsInf(s.Clip, 0) {
		return fmt.Errorf("%w: the accountant has %d orders, %d RDP values, q %v, denominator %d, clip %v", ErrBadState, len(a.Orders), len(a.RDP), s.Q, s.M, s.Clip)
	}
	if err := checkRates(s.Rates, a.Rounds); err != nil {
		return err
	}
	for id, n := range s.SiteRounds {
		if id == "" || n > a.Rounds {
			return fmt.Errorf("%w: site %q contributed to %d of %d charged rounds", ErrBadState, id, n, a.Rounds)
		}
	}
	c.dp = dpState{acc: &dp.Accountant{Orders: slices.Clone(a.Orders), RDP: slices.Clone(a.RDP), Rounds: a.Rounds}, q: s.Q, m: s.M,
		sites: maps.Clone(s.SiteRounds), rates: slices.Clone(s.Rates), clip: s.Clip}
	c.syncUnsampled()
	return nil
}
