package aggregator

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/edgefl/edgefl/dp"
)

// The coordinator's part of central differential privacy (Config.DP;
// docs/privacy.md, "The accountant" and "Sampling rate"):
//
//   - a round's selection is drawn once (no re-selection: a second draw
//     would raise the round's sampling rate after its budget check); its
//     sampling rate is q = K_t / N_t, the sites invited over the pool the
//     selection was drawn from;
//   - a round is only drawn when one more round at that q keeps the
//     accountant within the budget (otherwise it waits for a larger pool);
//   - the accountant is charged when the round closes, so the state stored
//     with the round's checkpoint holds the charge, once;
//   - after an aggregation the run finishes (StopReason "dp_budget", the
//     normal end of a run) when not even the whole registry as the pool
//     would keep the next round within the budget.

// StopDPBudget is Coordinator.StopReason when the privacy budget ended the
// run.
const StopDPBudget = "dp_budget"

// DPState is the accountant in State (absent without Config.DP): its RDP
// values, the sampling rate of the open round's selection, and with
// adaptive clipping the clip norm of the open round (0: Config.DP.Clip).
type DPState struct {
	Accountant *dp.Accountant `json:"accountant"`
	Q          float64        `json:"q,omitempty"`
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

// roundQ is the sampling rate of a selection of min(K, n) from a pool of n.
func (c *Coordinator) roundQ(n int) float64 {
	if n <= 0 {
		return 1
	}
	return float64(min(c.cfg.K, n)) / float64(n)
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

func (c *Coordinator) snapshotDP() *DPState {
	if c.cfg.DP == nil {
		return nil
	}
	a := c.dp.acc
	return &DPState{Accountant: &dp.Accountant{Orders: slices.Clone(a.Orders), RDP: slices.Clone(a.RDP), Rounds: a.Rounds}, Q: c.dp.q,
		Rates: slices.Clone(c.dp.rates), Clip: c.dp.clip}
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
	if len(a.Orders) == 0 || len(a.RDP) != len(a.Orders) || !(s.Q >= 0 && s.Q <= 1) || !(s.Clip >= 0) || math.IsInf(s.Clip, 0) {
		return fmt.Errorf("%w: the accountant has %d orders, %d RDP values, q %v, clip %v", ErrBadState, len(a.Orders), len(a.RDP), s.Q, s.Clip)
	}
	if err := checkRates(s.Rates, a.Rounds); err != nil {
		return err
	}
	c.dp = dpState{acc: &dp.Accountant{Orders: slices.Clone(a.Orders), RDP: slices.Clone(a.RDP), Rounds: a.Rounds}, q: s.Q,
		rates: slices.Clone(s.Rates), clip: s.Clip}
	return nil
}
