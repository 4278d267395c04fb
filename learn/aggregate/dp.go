package aggregate

import "fmt"

// DPSelector is the selector differential privacy uses when none is named:
// Poisson sampling at k/n, the sampling the accountant's amplification is
// proved for (docs/privacy.md, "Sampling rate").
const DPSelector = "poisson"

// CheckDP refuses what central differential privacy cannot use
// (docs/privacy.md, "The mechanism per round" and "Sampling rate"): under
// DP the aggregator is the fixed-denominator noisy mean of clipped updates,
// which replaces fedavg's sample weights and mean alike; every other
// aggregator weighs individual updates by their values (robust,
// similarity, clustering) and is refused, as is every selector but
// poisson (the default) and uniform (loss-based selection reads un-noised
// losses; window and samples break the accountant's sampling rate). An
// empty selectSpec is DPSelector.
//
// In the central mode the selector must be poisson: the accountant's
// amplification by subsampling is a theorem for Poisson sampling (each
// site independently with probability q; Mironov, Talwar & Zhang 2019),
// not for drawing exactly K of N without replacement, which uniform does
// (its add/remove neighbours change N, and no amplified bound at q = K/N
// is proven for that relation here). In the distributed mode (central
// false) the selection is published and charged at q = 1 anyway.
func CheckDP(aggSpec, selectSpec string, central bool) error {
	switch aggSpec {
	case "", "fedavg", "mean":
	default:
		return fmt.Errorf("aggregator %q cannot be used with differential privacy: it weighs each update by its values (hint: use fedavg or mean)", aggSpec)
	}
	if selectSpec == "" {
		return nil
	}
	sel, err := NewSelector(selectSpec)
	if err != nil {
		return err
	}
	switch sel.(type) {
	case Poisson:
	case Uniform:
		if central {
			return fmt.Errorf("selector %q cannot be used with central differential privacy: amplification is proven for Poisson sampling only (hint: use poisson, the default)", selectSpec)
		}
	default:
		return fmt.Errorf("selector %q cannot be used with differential privacy: the accountant assumes poisson or uniform selection (hint: docs/privacy.md, \"Sampling rate\")", selectSpec)
	}
	return nil
}
