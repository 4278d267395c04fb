package dp

import (
	"math"
	"testing"
)

// TestPrivatisedStatisticsCost is the arithmetic behind docs/privacy.md,
// "Preprocessing under DP": what a privatised statistics phase (option a)
// would cost the three-hospital breast-cancer federation. Each site would
// send, per numeric feature, its mean and mean square on the feature's
// public range scaled to [0, 1] (30 features: 60 values, L2 norm at most
// sqrt(60), the sensitivity of adding or removing a site); the federation
// would average K sites' vectors plus Gaussian noise, as one unsampled
// step (q = 1) of the accountant. Logged (-v): the noise multiplier a
// useful per-value noise std needs and what that one step alone spends,
// for K = 3 and 100 sites; and, the other way round, the per-value std at
// the training rounds' own z for epsilon 8, 3, 1 over 10 rounds.
func TestPrivatisedStatisticsCost(t *testing.T) {
	sens := math.Sqrt(60)
	for _, std := range []float64{0.05, 0.1} {
		for _, k := range []float64{3, 100} {
			z := std * k / sens
			eps := EpsilonAfter(1, z, 1, 1e-5, nil)
			t.Logf("K = %3.0f sites, per-value std %.2f of the range: z = %.4g, one step alone spends epsilon %.4g", k, std, z, eps)
			if k == 3 && eps < 100 || k == 100 && eps > 10 {
				t.Errorf("K = %v, std %v: epsilon %v", k, std, eps)
			}
		}
	}
	for _, target := range []float64{8, 3, 1} {
		z, err := CalibrateNoise(target, 1e-5, 1, 10, 1e-3, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("epsilon %g over 10 rounds at q = 1: z = %.3g; a statistics step at that z gives K = 3 sites a per-value std of %.3g (values in [0, 1]), "+
			"an evaluation step (per-site accuracy, sensitivity 1) a std of %.3g", target, z, z*sens/3, z/3)
	}
}
