package aggregate

import "fmt"

// CheckDP refuses what central differential privacy cannot use
// (docs/privacy.md, "The mechanism per round" and "Sampling rate"): under
// DP the aggregator is the fixed-denominator noisy mean of clipped updates,
// which replaces fedavg's sample weights and mean alike; every other
// aggregator weighs individual updates by their values (robust,
// similarity, clustering) and is refused, as is every selector but
// uniform (loss-based selection reads un-noised losses; window and
// samples break the accountant's sampling rate q = K/N).
func CheckDP(aggSpec, selectSpec string) error {
	switch aggSpec {
	case "", "fedavg", "mean":
	default:
		return fmt.Errorf("aggregator %q cannot be used with differential privacy: it weighs individual updates by their values; use fedavg or mean, which DP replaces by the noisy mean of clipped updates (docs/privacy.md, \"The mechanism per round\")", aggSpec)
	}
	switch selectSpec {
	case "", "uniform":
	default:
		return fmt.Errorf("selector %q cannot be used with differential privacy: the accountant assumes uniform selection (q = K/N); loss-based selection also leaks un-noised losses (docs/privacy.md, \"Sampling rate\")", selectSpec)
	}
	return nil
}
