//go:build edgefl_attack

package agent

import (
	"os"
	"strconv"
)

// poison scales an update's delta by $EDGEFL_ATTACK_SCALE before it is
// encoded: a test-only build (-tags edgefl_attack) of a site that poisons
// the federation (docs/aggregators.md, "One poisoning site and FedSplit"). The site's own copy of what the
// aggregator holds follows what it sent, as a real attacker's would.
func poison(delta []float64) {
	s, err := strconv.ParseFloat(os.Getenv("EDGEFL_ATTACK_SCALE"), 64)
	if err != nil || s == 1 {
		return
	}
	for i := range delta {
		delta[i] *= s
	}
}

// claimedSamples replaces the sample count the site reports, in its
// statuses and updates, by $EDGEFL_ATTACK_SAMPLES when set: a site that
// lies about its size from its very first message, to take FedAvg's
// weight (docs/aggregators.md, "What a site can do to the weights").
func claimedSamples(n uint64) uint64 {
	if c, err := strconv.ParseUint(os.Getenv("EDGEFL_ATTACK_SAMPLES"), 10, 64); err == nil && c > 0 {
		return c
	}
	return n
}
