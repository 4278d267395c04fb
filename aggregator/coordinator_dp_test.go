package aggregator

import (
	"errors"
	"math"
	"testing"

	"github.com/edgefl/edgefl/dp"
)

func dpCoordConfig(budgetRounds int) Config {
	cfg := baseConfig()
	cfg.K, cfg.Quorum, cfg.MaxReselections, cfg.Rounds = 2, 2, 0, 20
	cfg.DP = &dp.Config{Clip: 1, Noise: 1.5, Delta: 1e-5}
	if budgetRounds > 0 {
		// 4 sites online, 2 per round: q = 0.5.
		cfg.DP.Budget = dp.EpsilonAfter(0.5, cfg.DP.Noise, budgetRounds, cfg.DP.Delta, nil) * 1.0001
	}
	return cfg
}

// dpRound runs one round at base: the selection's two sites report, the
// round closes and is aggregated.
func dpRound(t *testing.T, c *Coordinator, base int) []Decision {
	t.Helper()
	a := only[Announce](t, c.Step(Tick{At: ms(base + 50)}))
	var out []Decision
	for i, id := range a.Selected {
		out = append(out, c.Step(upd(id, a.Round, base+100+i))...)
	}
	cr := only[CloseRound](t, out)
	return c.Step(AggregatedRound{Round: cr.Round, At: ms(base + 200)})
}

// TestCoordinatorDPAccountant: each round is charged once at its sampling
// rate (2 of a pool of 4), the charge survives Snapshot/Restore (the state
// stored with the checkpoint), and with a budget the run finishes after the
// last round that fits, the normal end of a run, with StopDPBudget.
func TestCoordinatorDPAccountant(t *testing.T) {
	cfg := dpCoordConfig(3)
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c", "d")
	for r := 1; r <= 3; r++ {
		out := dpRound(t, c, r*1000)
		eps, rounds, ok := c.Privacy()
		want := dp.EpsilonAfter(0.5, cfg.DP.Noise, r, cfg.DP.Delta, nil)
		if !ok || rounds != uint64(r) || math.Abs(eps-want) > 1e-9*want {
			t.Fatalf("round %d: epsilon %v after %d rounds (%v), want %v", r, eps, rounds, ok, want)
		}
		if eps > cfg.DP.Budget {
			t.Fatalf("round %d: spent %v > budget %v", r, eps, cfg.DP.Budget)
		}
		c = restored(t, cfg, c)
		if got, _, _ := c.Privacy(); got != eps {
			t.Fatalf("round %d: restored accountant says %v, want %v", r, got, eps)
		}
		if r < 3 {
			if len(ofType[Finished](out)) != 0 {
				t.Fatalf("round %d: finished within the budget: %+v", r, out)
			}
			continue
		}
		mustEqual(t, "after the last round within the budget", out, []Decision{Finished{Rounds: 3, At: ms(3200)}})
		mustEqual(t, "stop reason", c.StopReason(), StopDPBudget)
	}
}

// TestCoordinatorDPWaitsForPool: a round whose pool is too small for the
// budget (q = 1 with two sites online) is not drawn; it is once more sites
// come online (q = 0.5).
func TestCoordinatorDPWaitsForPool(t *testing.T) {
	cfg := dpCoordConfig(0)
	cfg.DP.Budget = dp.EpsilonAfter(0.5, cfg.DP.Noise, 1, cfg.DP.Delta, nil) * 1.0001
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b")
	if ds := c.Step(Tick{At: ms(100)}); len(ofType[Announce](ds)) != 0 || !c.NextDeadline().IsZero() {
		t.Fatalf("announced (or armed a timer) with a pool of 2: %+v", ds)
	}
	if ds := bringOnline(c, ms(200), "c"); len(ofType[Announce](ds)) != 0 {
		t.Fatalf("announced with a pool of 3 (q = 2/3): %+v", ds)
	}
	a := only[Announce](t, bringOnline(c, ms(300), "d"))
	if len(a.Selected) != 2 {
		t.Fatalf("selected %v, want 2 of 4", a.Selected)
	}
}

func TestCoordinatorDPConfig(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"re-selection": func(c *Config) { c.MaxReselections = 1 },
		"late updates": func(c *Config) { c.StoreLate = true },
		"schema":       func(c *Config) { c.Statistics = true },
		"clip 0":       func(c *Config) { c.DP.Clip = 0 },
	} {
		cfg := dpCoordConfig(0)
		mutate(&cfg)
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
