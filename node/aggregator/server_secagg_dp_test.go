package aggregator

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// TestSecAggDPColluders: under distributed DP the announced noise_shares is
// t - c (the secagg threshold less the collusion bound), so that a sum of
// t inputs less the c colluders' own shares still carries std z*C: with 3
// hospitals (t = 2) and c = 1 each share is the whole z*C (with t shares, a
// surviving hospital that removes its own share from a sum of two sees the
// other's update under 0.707 z*C). t - c < 1 is refused at start with the
// reason.
func TestSecAggDPColluders(t *testing.T) {
	for _, tc := range []struct {
		name       string
		k, t, c    int
		wantShares uint32
		refuse     string
	}{
		{"3 sites, t 2, one colluder", 3, 0, 1, 1, ""},
		{"3 sites, t 2, no colluder", 3, 0, 0, 2, ""},
		{"3 sites, t 3, one colluder", 3, 3, 1, 2, ""},
		{"3 sites, t 2, two colluders", 3, 0, 2, 0, "2 colluders needs a secagg threshold >= 3"},
		{"3 sites, t 3, three colluders", 3, 3, 3, 0, "threshold >= 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			cfg := f.config()
			cfg.K, cfg.Algorithm, cfg.Aggregator = tc.k, AlgoFedAvg, "fedavg"
			cfg.BrokerURL, cfg.Username, cfg.Password = "", "", ""
			cfg.Dial = f.brk.Dial
			cfg.SecAgg = &SecAggConfig{Clip: 1, Threshold: tc.t}
			cfg.DP = &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5, Distributed: true, Colluders: tc.c}
			if tc.refuse != "" {
				err := cfg.Validate()
				if !errors.Is(err, coordinator.ErrConfig) || !strings.Contains(err.Error(), tc.refuse) {
					t.Fatalf("Validate = %v, want a refusal naming %q", err, tc.refuse)
				}
				return
			}
			f.start(cfg)
			a := f.agent("site-a", 10)
			f.agent("site-b", 10)
			f.agent("site-c", 10)
			ann := a.nextRound(t, 1)
			d := ann.GetDp()
			if d == nil || d.Mode != wire.DPMode_DP_MODE_DISTRIBUTED || d.NoiseShares != tc.wantShares {
				t.Fatalf("announced dp %v, want %d noise shares", d, tc.wantShares)
			}
			// The noise left in a sum of t inputs after c sites remove
			// their own shares: (t - c) shares of variance (zC)^2/k.
			th := int(ann.Secagg.Threshold)
			left := float64(th-tc.c) * dp.SiteStd(1, 1, int(d.NoiseShares)) * dp.SiteStd(1, 1, int(d.NoiseShares))
			if left < 1-1e-12 {
				t.Fatalf("a sum of %d inputs less %d colluders' shares has noise variance %.3f (zC)^2, want >= 1", th, tc.c, left)
			}
		})
	}
}
