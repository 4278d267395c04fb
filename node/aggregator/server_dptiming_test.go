package aggregator

import (
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
)

// TestDPRoundTimingCharge: a central-DP run whose rounds close early (no
// FixedRounds) tells observers the draw's size through when rounds end, so
// the server charges it at q = 1 (dp.Config.EarlyClose) and says so in
// /status and /metrics; with fixed-length rounds the amplified figure
// holds; the distributed mode is charged at q = 1 as before.
func TestDPRoundTimingCharge(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dp        dp.Config
		amplified bool
	}{
		{"early close", dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}, false},
		{"fixed rounds", dp.Config{Clip: 1, Noise: 1, Delta: 1e-5, FixedRounds: true}, true},
		{"distributed", dp.Config{Clip: 1, Noise: 1, Delta: 1e-5, Distributed: true}, false},
	} {
		cfg := ServerConfig{PrivacyConfig: PrivacyConfig{DP: &tc.dp}}
		cfg.defaults()
		c := cfg.DP
		if q := c.ChargedRate(0.1); (q == 0.1) != tc.amplified || (q == 1) == tc.amplified {
			t.Errorf("%s: a round drawn at q = 0.1 is charged at %v", tc.name, q)
		}
		if tc.dp.EarlyClose {
			t.Errorf("%s: defaults changed the caller's configuration", tc.name)
		}
		// A round log written before the early-close charge (the same
		// setting, charged amplified) is refused on resume, not continued
		// under another charge: resumeDiffs compares dpText.
		if old := tc.dp; !tc.amplified && !old.Distributed && dpText(c) == dpText(&old) {
			t.Errorf("%s: a run stored as %s resumes as %s", tc.name, dpText(&old), dpText(c))
		}
		p := newPrivacyStatus(c, &coordinator.DPState{Accountant: dp.NewAccountant(nil)}, 0, 0)
		if p.Amplified != tc.amplified {
			t.Errorf("%s: /status says amplified %v", tc.name, p.Amplified)
		}
		var got float64 = -1
		for _, f := range privacyFamilies(p) {
			if f.Name == "edgefl_dp_amplified" {
				got = f.Samples[0].Value
			}
		}
		if want := map[bool]float64{true: 1, false: 0}[tc.amplified]; got != want {
			t.Errorf("%s: edgefl_dp_amplified = %v, want %v", tc.name, got, want)
		}
	}
}
