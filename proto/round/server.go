package round

import (
	"errors"

	"github.com/edgefl/edgefl/learn/split"
)

// SplitStep is the FedSplit family's server step outside sum mode, as the
// aggregator and simulate take it: split.BoundedStep over every known
// site's latest z (in the caller's deterministic order) into dst, from the
// round's global model x, with the step bound factor mult and the bound's
// state (ref, w). A step that would hold a value that is not a finite
// number is never taken: dst is then x, kept is true and the state does not
// move (the report is zero). Any other error leaves dst undefined. It is
// SplitStepFrom over inputs held in memory.
func SplitStep(dst, x []float64, sites []split.SiteInput, mult, ref float64, w split.Watch) (rep split.StepReport, kept bool, err error) {
	return SplitStepFrom(dst, x, len(sites), func(j int) (split.SiteInput, error) { return sites[j], nil }, mult, ref, w)
}

// SplitStepFrom is SplitStep over n sites whose inputs site(j) gives,
// twice each, in order (split.Step's two passes): the aggregator reads a
// site's z_j and updates from its store as needed, one site's vectors in
// memory at a time. site must give the same input both times; its error
// is returned as is.
func SplitStepFrom(dst, x []float64, n int, site func(j int) (split.SiteInput, error), mult, ref float64, w split.Watch) (rep split.StepReport, kept bool, err error) {
	st := split.NewStep(x, n, mult, ref, w)
	for j := range n {
		in, err := site(j)
		if err != nil {
			return rep, false, err
		}
		if err := st.Measure(j, in); err != nil {
			return nonFinite(dst, x, err)
		}
	}
	st.Decide()
	for j := range n {
		in, err := site(j)
		if err != nil {
			return rep, false, err
		}
		st.Count(j, in)
	}
	if _, rep, err = st.Finish(dst); err != nil {
		return nonFinite(dst, x, err)
	}
	return rep, false, nil
}

// nonFinite is SplitStep's answer to the step's error err: x kept for a
// value that is not a finite number, err otherwise.
func nonFinite(dst, x []float64, err error) (split.StepReport, bool, error) {
	if errors.Is(err, split.ErrNonFinite) {
		copy(dst, x)
		return split.StepReport{}, true, nil
	}
	return split.StepReport{}, false, err
}
