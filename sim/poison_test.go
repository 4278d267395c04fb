package sim

import (
	"context"
	"fmt"
	"math"
	"testing"
)

// poisonConfig: four sites of identically distributed synthetic data, FedSplit
// with a near-exact local solve, the first site faulty with the given scale
// (0: none), scaling the delta it sends as the attacking agent does.
func poisonConfig(t *testing.T, scale float64, every int) Config {
	t.Helper()
	c := DefaultConfig()
	c.Dataset, c.Partition = "synthetic-iid", "iid"
	c.Clients, c.PerRound, c.Rounds = 4, 4, 60
	c.L2 = 0.05
	c.Local.MaxEpochs, c.Local.Gamma = 5, 1e-8
	c = withAlgos(t, c, "fedsplit")
	if scale != 0 {
		c.Faulty, c.FaultyScale, c.FaultyEvery = 1, scale, every
	}
	return c
}

// One site of four scaling its FedSplit updates (as the attacking agent
// does), through the simulate path: every scale of the acceptance test,
// and a site alternating hostile (odd) and honest (even) rounds
// (--faulty-every 2).
// The final model's pooled training loss is within 2 % of the honest
// federation's on the same data and seed (a set-aside attacker's data is
// lost: the honest three's optimum is 0.5 % above), its test accuracy
// within 1 point; the honest federation sets nobody aside.
func TestSimPoisonedFedSplit(t *testing.T) {
	final := func(scale float64, every int) (Round, int, int) {
		res, err := Run(context.Background(), poisonConfig(t, scale, every), nil)
		if err != nil {
			t.Fatal(err)
		}
		rows := res.Runs[0].Rounds
		clipped, aside := 0, 0
		for _, r := range rows {
			clipped += int(r.Metrics["clipped"])
			aside += int(r.Metrics["excluded"])
		}
		return rows[len(rows)-1], clipped, aside
	}
	h, hc, hx := final(0, 0)
	t.Logf("honest federation: %d clips, %d set-aside rounds of %d", hc, hx, h.Round)
	if hx > h.Round/20 {
		t.Errorf("honest federation: sites set aside in %d rounds", hx)
	}
	for _, at := range []struct {
		scale float64
		every int
	}{{0.5, 0}, {-1, 0}, {1.5, 0}, {3, 0}, {10, 0}, {1000, 0}, {1000, 2}, {3, 2}, {-1, 2}} {
		name := fmt.Sprintf("x%v", at.scale)
		if at.every == 2 {
			name += " odd rounds"
		}
		a, c, x := final(at.scale, at.every)
		rel := math.Abs(float64(a.TrainLoss)-float64(h.TrainLoss)) / float64(h.TrainLoss)
		t.Logf("%s: pooled train loss %.5f (honest %.5f, %+.2f %%), test accuracy %.4f (honest %.4f); clips %d, set-aside rounds %d",
			name, float64(a.TrainLoss), float64(h.TrainLoss), 100*rel, float64(a.TestAccuracy), float64(h.TestAccuracy), c, x)
		if !(rel <= 0.02) || float64(a.TestAccuracy) < float64(h.TestAccuracy)-0.01 {
			t.Errorf("%s: the final model is not within 2 %% of the honest federation's", name)
		}
	}
}
