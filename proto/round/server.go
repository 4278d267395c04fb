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
// move (the report is zero). Any other error leaves dst undefined.
func SplitStep(dst, x []float64, sites []split.SiteInput, mult, ref float64, w split.Watch) (rep split.StepReport, kept bool, err error) {
	_, rep, err = split.BoundedStep(dst, x, sites, mult, ref, w)
	if errors.Is(err, split.ErrNonFinite) {
		copy(dst, x)
		return split.StepReport{}, true, nil
	}
	return rep, false, err
}
