//go:build edgefl_attack

package agent

import (
	"os"
	"strconv"
)

// poison scales an update's delta by $EDGEFL_ATTACK_SCALE before it is
// encoded: a test-only build (-tags edgefl_attack) of a site that poisons
// the federation (issue 10, item 1). The site's own copy of what the
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
