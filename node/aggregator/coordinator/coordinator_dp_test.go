package coordinator

import (
	"errors"
	"math"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
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
	a := drawn(t, c, ms(base+50))
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
			if len(OfType[Finished](out)) != 0 {
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
	if ds := c.Step(Tick{At: ms(100)}); len(OfType[Announce](ds)) != 0 || !c.NextDeadline().IsZero() {
		t.Fatalf("announced (or armed a timer) with a pool of 2: %+v", ds)
	}
	if ds := bringOnline(c, ms(200), "c"); len(OfType[Announce](ds)) != 0 {
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

// TestCoordinatorClipEstimated: adaptive clipping's next clip norm is taken
// only while its round closes (and only with adaptive clipping), becomes
// DPClip for the next round and survives Snapshot/Restore.
func TestCoordinatorClipEstimated(t *testing.T) {
	cfg := dpCoordConfig(0)
	cfg.DP.Adaptive = &dp.Adaptive{Quantile: 0.5, LR: 0.2, BitNoise: 1}
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c", "d")
	if c.DPClip() != cfg.DP.Clip {
		t.Fatalf("first clip %v, want %v", c.DPClip(), cfg.DP.Clip)
	}
	a := only[Announce](t, c.Step(Tick{At: ms(50)}))
	c.Step(ClipEstimated{Round: a.Round, Clip: 0.5, At: ms(60)}) // the round is collecting: ignored
	if c.DPClip() != cfg.DP.Clip {
		t.Fatal("a clip estimate outside the round's close was taken")
	}
	var out []Decision
	for i, id := range a.Selected {
		out = append(out, c.Step(upd(id, a.Round, 100+i))...)
	}
	cr := only[CloseRound](t, out)
	for _, bad := range []ClipEstimated{{Round: cr.Round + 1, Clip: 0.5}, {Round: cr.Round, Clip: math.Inf(1)}, {Round: cr.Round, Clip: 0}} {
		c.Step(bad)
	}
	if c.DPClip() != cfg.DP.Clip {
		t.Fatal("a bad clip estimate was taken")
	}
	c.Step(ClipEstimated{Round: cr.Round, Clip: 0.7, At: ms(150)})
	c = restored(t, cfg, c)
	c.Step(AggregatedRound{Round: cr.Round, At: ms(200)})
	if c.DPClip() != 0.7 {
		t.Fatalf("clip after the round %v, want 0.7", c.DPClip())
	}
	fixed := dpCoordConfig(0)
	f := mustNew(t, fixed)
	f.Step(ClipEstimated{Round: 0, Clip: 0.7})
	if f.DPClip() != fixed.DP.Clip {
		t.Fatal("a fixed clip norm moved")
	}
}

// TestCoordinatorDPDistributedChargesFullRate: in the distributed mode the
// accountant claims no amplification by subsampling (the aggregator, and
// under --secagg every site, knows the selection): a round drawn at 2 of a
// pool of 4 is charged at q = 1 (dp.Config.ChargedRate), and the per-site
// figure is beside it.
func TestCoordinatorDPDistributedChargesFullRate(t *testing.T) {
	cfg := dpCoordConfig(0)
	cfg.DP.Distributed = true
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c", "d")
	dpRound(t, c, 1000)
	eps, rounds, ok := c.Privacy()
	want := dp.EpsilonAfter(1, cfg.DP.Noise, 1, cfg.DP.Delta, nil)
	if !ok || rounds != 1 || math.Abs(eps-want) > 1e-9*want {
		t.Fatalf("epsilon %v after %d rounds (%v), want %v (q = 1)", eps, rounds, ok, want)
	}
	if site, n, _ := c.SitePrivacy(); n != 1 || math.Abs(site-want) > 1e-9*want {
		t.Fatalf("per-site epsilon %v over %d rounds, want %v over 1", site, n, want)
	}
}
