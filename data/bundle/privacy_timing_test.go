package bundle

import (
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
)

// TestPrivacyCoversRoundTiming: a bundle states which figure holds: with
// fixed-length rounds the amplified one, with rounds that closed early the
// q = 1 charge its sampling rates record.
func TestPrivacyCoversRoundTiming(t *testing.T) {
	for _, tc := range []struct {
		c    dp.Config
		q    float64
		want string
	}{
		{dp.Config{Clip: 1, Noise: 1, Delta: 1e-5, FixedRounds: true}, 0.1, "amplified by the secret Poisson draw"},
		{dp.Config{Clip: 1, Noise: 1, Delta: 1e-5, EarlyClose: true}, 1, "every round is charged at q = 1"},
	} {
		q := tc.c.ChargedRate(0.1)
		if q != tc.q {
			t.Fatalf("%+v: charged at %v, want %v", tc.c, q, tc.q)
		}
		p, err := NewPrivacy(tc.c, []dp.Rate{{Q: q, Noise: 1, Rounds: 3}}, 3)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(p.Covers, tc.want) || p.SamplingRates[0].Q != tc.q {
			t.Errorf("%+v: covers %q, rates %+v; want %q", tc.c, p.Covers, p.SamplingRates, tc.want)
		}
		if err := p.check(); err != nil {
			t.Error(err)
		}
	}
}
