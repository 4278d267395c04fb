package coordinator

import (
	"errors"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
)

// With a declared transform the statistics phase closes at the first event
// (FitTransform of no sites, nothing announced); statistics are stale; an
// evaluation waits for the sites that have had an update accepted, and so
// does the end of the run.
func TestDeclaredTransformSkipsStatistics(t *testing.T) {
	cfg := fedConfig()
	cfg.DeclaredTransform, cfg.Rounds, cfg.EvalEvery = true, 2, 1
	c := mustNew(t, cfg)
	runScript(t, c, []script{
		{ClientOnline{ID: "a", Samples: 10, At: ms(0)}, []Decision{FitTransform{Sites: nil, At: ms(0)}}},
		{stats("a", 1), []Decision{RejectStatistics{Client: "a", Reason: StaleRound}}},
	})
	mustEqual(t, "resume while fitting", restored(t, cfg, c).Resume(), []Decision{FitTransform{At: ms(0)}})
	bringOnline(c, ms(1), "b", "c", "d")
	c.Step(TransformFitted{At: ms(2)})
	a := only[Announce](t, c.Step(Tick{At: ms(52)}))
	if a.Round != 1 || len(a.Selected) != 3 {
		t.Fatalf("round 1: %+v", a)
	}
	sent := a.Selected // the three sites with an update from now on
	out := playRoundOf(t, c, sent, 1000)
	if len(OfType[Finish](out)) != 0 {
		t.Fatalf("finished after round 1: %+v", out)
	}
	// Eval round 1 (asked for by round 2's announcement) completes once
	// the three contributors reported; the fourth site, which sent no
	// update, is not waited for.
	a2 := drawn(t, c, ms(1100))
	for i, id := range sent {
		out := c.Step(evalAt(id, 1, 1200+i))
		if complete := len(OfType[EvalComplete](out)) == 1; complete != (i == 2) {
			t.Fatalf("report %d of %s: %+v", i+1, id, out)
		}
	}
	out = playRoundOf(t, c, a2.Selected, 2000)
	only[Finish](t, out)
	var fin []Decision
	for _, id := range c.evalSites() {
		fin = c.Step(evalAt(id, 2, 2100))
	}
	only[Finished](t, fin)
	if len(c.evalSites()) < 3 || len(c.StatisticsSites()) != 0 {
		t.Fatalf("evaluation sites %v, statistics sites %v", c.evalSites(), c.StatisticsSites())
	}
}

// playRoundOf closes the current round with the updates of ids and steps
// its aggregation.
func playRoundOf(t *testing.T, c *Coordinator, ids []string, at int) []Decision {
	t.Helper()
	var cr []Decision
	for _, id := range ids {
		cr = append(cr, c.Step(upd(id, c.Round(), at))...)
	}
	only[CloseRound](t, cr)
	return c.Step(AggregatedRound{Round: c.Round(), At: ms(at + 1)})
}

// The charging history grows with every charge, survives a restore, and a
// damaged one is refused.
func TestDPChargingHistory(t *testing.T) {
	cfg := dpCoordConfig(0)
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c", "d")
	for r := 1; r <= 3; r++ {
		dpRound(t, c, r*1000)
	}
	c = restored(t, cfg, c)
	st := c.SnapshotDP()
	if !slices.Equal(st.Rates, []dp.Rate{{Q: 0.5, Noise: cfg.DP.Noise, Rounds: 3}}) {
		t.Fatalf("history %+v", st.Rates)
	}
	rep, err := dp.Replay(st.Rates, 3, nil)
	if err != nil || !slices.Equal(rep.RDP, st.Accountant.RDP) {
		t.Fatalf("the replayed accountant differs from the coordinator's: %v", err)
	}
	snap := c.Snapshot()
	snap.DP.Rates[0].Rounds = 2
	if err := mustNew(t, cfg).Restore(snap); !errors.Is(err, ErrBadState) {
		t.Fatalf("a history of 2 rounds for an accountant of 3: %v", err)
	}
}

func TestDPSchemaConfigValidation(t *testing.T) {
	cfg := fedConfig()
	cfg.MaxReselections = 0
	cfg.DP = &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}
	if _, err := New(cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("DP with a statistics phase: %v", err)
	}
	cfg.DeclaredTransform = true
	if _, err := New(cfg); err != nil {
		t.Fatalf("DP with a declared transform: %v", err)
	}
	cfg.StopPatience = 1
	if _, err := New(cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("DP with the patience rule: %v", err)
	}
	plain := baseConfig()
	plain.DeclaredTransform = true
	if _, err := New(plain); !errors.Is(err, ErrConfig) {
		t.Fatalf("DeclaredTransform without Statistics: %v", err)
	}
}
