package split

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// One authenticated site can publish any z_j it likes; the plain server step
// (the mean of every z_j) lets it move x anywhere, and because z_j is the
// site's persistent state the damage never ends (issue 10, item 1: a site
// scaling its deltas x1000 drove the global model to 1e38). The robust step
// screens the z_j before the mean:
//
//	d_j = ||z_j - x||, x the global model the round announced;
//	z_j is left out of this step when d_j > Mult x median(d).
//
// Why this keeps FedSplit exact for honest sites: at the fixed point every
// z_j = x* - s_j grad f_j(x*) (Pathak & Wainwright, Prop. 1), so the d_j are
// the sites' scaled gradients at the optimum, which differ by the sites'
// heterogeneity, not by orders of magnitude; with Mult well above that
// spread nobody is ever left out, and the step is the plain mean, bit for
// bit (the same summation order). A poisoned z_j far from x is left out of
// every step, so x converges to the fixed point of the honest sites alone
// (the optimum of their pooled objective), and what a site that stays just
// under the bound can do per step is at most Mult x median(d) / m.
//
// The screen needs a majority of honest sites and at least MinScreened of
// them: with fewer z the median is not robust and the plain mean is used.

// DefaultMult is the screening factor of RobustServerStep.
const DefaultMult = 20

// MinScreened is the number of z below which the step is the plain mean.
const MinScreened = 3

// Screen returns the indices of the zs that RobustServerStep leaves out,
// and each z's distance from x.
func Screen(zs [][]float64, x []float64, mult float64) (out []int, dist []float64) {
	dist = make([]float64, len(zs))
	for j, z := range zs {
		var s float64
		for i, v := range z {
			d := v - x[i]
			s += d * d
		}
		dist[j] = math.Sqrt(s)
	}
	if len(zs) < MinScreened {
		return nil, dist
	}
	sorted := slices.Clone(dist)
	slices.Sort(sorted)
	n := len(sorted)
	med := sorted[n/2]
	if n%2 == 0 {
		med = (sorted[n/2-1] + sorted[n/2]) / 2
	}
	if !(med > 0) {
		// Every honest z still equals x (the first round, before any
		// update): only a z that moved at all can be an outlier, and with
		// a zero median that would be every z that moved. Screen nothing.
		return nil, dist
	}
	for j, d := range dist {
		if d > mult*med || math.IsNaN(d) {
			out = append(out, j)
		}
	}
	return out, dist
}

// RobustServerStep is ServerStep over the zs that Screen keeps (see the
// comment above); it returns the indices it left out. mult <= 0 means
// DefaultMult.
func RobustServerStep(dst []float64, zs [][]float64, x []float64, mult float64) ([]float64, []int, error) {
	if mult <= 0 {
		mult = DefaultMult
	}
	for j, z := range zs {
		if len(z) != len(x) {
			return nil, nil, fmt.Errorf("%w: client %d has %d, the model %d", ErrDim, j, len(z), len(x))
		}
	}
	out, _ := Screen(zs, x, mult)
	if len(out) == 0 {
		dst, err := ServerStep(dst, zs)
		return dst, nil, err
	}
	kept := make([][]float64, 0, len(zs)-len(out))
	for j, z := range zs {
		if !slices.Contains(out, j) {
			kept = append(kept, z)
		}
	}
	dst, err := ServerStep(dst, kept)
	return dst, out, err
}

// Server step specs: the --aggregator values the FedSplit family takes.
const (
	StepRobust = "fedsplit-robust" // RobustServerStep, the default; ":mult=M" sets Mult
	StepMean   = "fedsplit-mean"   // the plain mean of every z (no screening)
)

// ParseServerStep parses a FedSplit server-step spec and returns its
// screening factor (+Inf for the plain mean). Any other aggregator is
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
	return 0, fmt.Errorf("fedsplit: server step %q: the FedSplit family takes %s[:mult=M] (the default: z far from the model are left out of the mean) or %s (the plain mean)", spec, StepRobust, StepMean)
}
