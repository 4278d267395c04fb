package aggregator

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/testkit"

	"github.com/edgefl/edgefl/proto/wire"
)

// The bounded FedSplit step in the daemon: three honest sites whose steps
// shrink and a fourth whose deltas double and flip sign every round (the
// copy of a site scaling its updates by 3 moves so). The fourth is clipped
// from its first long step, set aside once its own updates exceed 25
// median steps three times, and stays set aside across a restart (its
// state is stored with the round's checkpoint). Its rounds and the reason
// are in the status read from the state file, and the honest sites are
// never clipped or left out.
func TestServerFedSplitBoundsAScalingSite(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 4, AlgoFedSplit, 0.5, 1
	cfg.Init, cfg.InitSeed = InitModel, 3
	r := f.start(cfg)
	ids := []string{"site-a", "site-b", "site-c", "site-d"}
	agents := make([]*fakeAgent, len(ids))
	for i, id := range ids {
		agents[i] = f.agent(id, 10)
	}
	delta := func(i int, round uint64) []float64 {
		d := vec(float64(i + 1))
		s := math.Pow(0.5, float64(round)) // honest: shrinking steps
		if ids[i] == "site-d" {
			s = math.Pow(-2, float64(round)) // the poisoner's copy: x(-2) a round
		}
		for k := range d {
			d[k] *= s
		}
		return d
	}
	const rounds = 8
	var global []float64
	for round := uint64(1); round <= rounds; round++ {
		if round == 6 {
			r.stop(t)
			r = f.start(cfg)
		}
		for i, a := range agents {
			a.nextRound(t, round)
			a.send(t, zDelta(t, ids[i], round, round-1, delta(i, round)))
		}
		for _, a := range agents {
			rc := a.receipt(t)
			for rc.Round < round { // a redelivery across the restart
				rc = a.receipt(t)
			}
			wantReceipt(t, rc, round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		}
		rr := r.round(t)
		global = rr.Global
		t.Logf("round %d: %v", round, rr.Metrics)
	}
	for _, v := range global {
		if math.IsNaN(v) || math.Abs(v) > 100 {
			t.Fatalf("the global model ran away: %v", global)
		}
	}
	r.stop(t)
	status := statusOfFile(t, cfg.StatePath)
	for _, c := range status.Clients {
		sc := c.FedSplit
		switch {
		case c.ID == "site-d":
			if sc == nil || !sc.AsideNow || sc.Aside < 2 || sc.Clipped < 4 || len(sc.Rounds) < 4 || sc.Reason == "" {
				t.Fatalf("status of the poisoner: %+v", sc)
			}
			if sc.Rounds[len(sc.Rounds)-1] != rounds {
				t.Errorf("its last round %v, want %d (set aside after the restart too)", sc.Rounds, rounds)
			}
			t.Logf("site-d: %s", fmt.Sprintf("%+v", *sc))
		case sc != nil:
			t.Errorf("honest %s: %+v", c.ID, *sc)
		}
	}
}

// A federation whose steps grow round after round (here the four sites
// doubling their deltas, under fedsplit-mean: nothing bounds them) is
// reported as diverging: a WARN line, the counter and the status's
// fedsplit_diverging_since, from the fifth growing step on; and the run,
// ending while it diverges, does not end as a normal finish: its last line
// is an ERROR saying the final model is not to be trusted.
func TestServerFedSplitDivergenceIsReported(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 4, AlgoFedSplit, 0.5, 1
	cfg.Init, cfg.InitSeed, cfg.Aggregator = InitModel, 3, "fedsplit-mean"
	var logs testkit.SyncBuffer
	cfg.Rounds, cfg.Logger = 7, slog.New(slog.NewTextHandler(&logs, nil))
	r := f.start(cfg)
	ids := []string{"site-a", "site-b", "site-c", "site-d"}
	agents := make([]*fakeAgent, len(ids))
	for i, id := range ids {
		agents[i] = f.agent(id, 10)
	}
	const rounds = 7
	for round := uint64(1); round <= rounds; round++ {
		for i, a := range agents {
			a.nextRound(t, round)
			d := vec(float64(i + 1))
			for k := range d {
				d[k] *= math.Pow(2, float64(round)) / 100
			}
			a.send(t, zDelta(t, ids[i], round, round-1, d))
		}
		for _, a := range agents {
			wantReceipt(t, a.receipt(t), round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		}
		r.round(t)
	}
	select {
	case <-r.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("the run did not finish")
	}
	if out := logs.String(); !strings.Contains(out, `level=ERROR msg="federation finished with the FedSplit iterate diverging`) || strings.Contains(out, `msg="federation finished" `) {
		t.Errorf("the run ended diverging as a normal finish:\n%s", out)
	}
	if n := r.s.diverging.Load(); n != rounds-divergeRounds {
		t.Errorf("diverging steps counted: %d, want %d", n, rounds-divergeRounds)
	}
	r.stop(t)
	status := statusOfFile(t, cfg.StatePath)
	if status.FedSplitDiverging != divergeRounds+1 {
		t.Errorf("status: diverging since round %d, want %d", status.FedSplitDiverging, divergeRounds+1)
	}
}

// The divergence watch in the daemon: four sites whose steps all grow
// (no site beyond the step bound, so nobody strikes), site-d's fastest.
// At the fifth growing step (round 6) the watch names site-d, which is set
// aside; its status reason says why and the honest sites stay in.
func TestServerFedSplitDivergenceSetsTheCulpritAside(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 4, AlgoFedSplit, 0.5, 1
	cfg.Init, cfg.InitSeed = InitModel, 3
	var logs testkit.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := f.start(cfg)
	ids := []string{"site-a", "site-b", "site-c", "site-d"}
	agents := make([]*fakeAgent, len(ids))
	for i, id := range ids {
		agents[i] = f.agent(id, 10)
	}
	const rounds = 7
	for round := uint64(1); round <= rounds; round++ {
		for i, a := range agents {
			a.nextRound(t, round)
			d := vec(float64(i + 1))
			s := math.Pow(1.1, float64(round)) / 100
			if ids[i] == "site-d" {
				s = 1.5 * math.Pow(1.2, float64(round)) / 100
			}
			for k := range d {
				d[k] *= s
			}
			a.send(t, zDelta(t, ids[i], round, round-1, d))
		}
		for _, a := range agents {
			wantReceipt(t, a.receipt(t), round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		}
		r.round(t)
	}
	r.stop(t)
	if !strings.Contains(logs.String(), `the site with the largest share of the growth is set aside" round=6`) || !strings.Contains(logs.String(), "client=site-d") {
		t.Errorf("no WARN line naming site-d in round 6:\n%s", logs.String())
	}
	status := statusOfFile(t, cfg.StatePath)
	for _, c := range status.Clients {
		sc := c.FedSplit
		switch {
		case c.ID == "site-d":
			if sc == nil || !sc.AsideNow || sc.Aside != 2 || !slices.Equal(sc.Rounds, []int{6, 7}) || !strings.Contains(sc.Reason, "the iterate was diverging") {
				t.Fatalf("status of site-d: %+v", sc)
			}
			t.Logf("site-d: %+v", *sc)
		case sc != nil:
			t.Errorf("honest %s: %+v", c.ID, *sc)
		}
	}
}
