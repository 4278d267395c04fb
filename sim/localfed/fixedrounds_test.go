package localfed

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator"
)

// TestFixedRoundsOverMQTT: with --dp-fixed-rounds (dp.Config.FixedRounds)
// a federation over the real broker, aggregator and agents holds every
// round open after all its invited sites have reported, until the
// aggregator's (fake) clock reaches the round's deadline, and only then
// closes it; so each round lasts the round timeout whatever was drawn.
func TestFixedRoundsOverMQTT(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	const rounds, n = 4, 4
	const timeout = 10 * time.Minute
	fd, sites, log, _ := syntheticSites(t, n, 1)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	selKey := dp.TestSelectionKey(12)
	aggClock := clock.NewFake(t0)
	lf, err := Start(ctx, Config{Federation: "fixed", Dir: t.TempDir(), Sites: sites, Seed: 1,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
		NewClock: func() clock.Clock { return clock.NewFake(t0) }, Logger: log,
		Server: aggregator.ServerConfig{
			K: n, QuorumFraction: 1, RoundTimeout: timeout, Rounds: rounds, Seed: 1,
			Algorithm: aggregator.AlgoFedProx, Selector: "poisson:q=0.5",
			Params:        aggregator.Params{Mu: 1, Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
			Model:         model.Spec{Kind: model.KindLogReg, Inputs: fd.D, Classes: fd.Classes, L2: 0.01},
			PrivacyConfig: aggregator.PrivacyConfig{DP: &dp.Config{Clip: 0.5, Noise: 1, Delta: 1e-5, FixedRounds: true}, DPTestSelectionKey: &selKey},
			Clock:         aggClock, Logger: log.With("party", "aggregator"),
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := lf.Stop(); err != nil {
			t.Error(err)
		}
	}()
	// waitView waits for the aggregator's view to satisfy ok.
	waitView := func(what string, ok func(aggregator.ServerView) bool) aggregator.ServerView {
		t.Helper()
		for {
			v, changed := lf.Server.Watch()
			if ok(v) {
				return v
			}
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("%s: the aggregator stayed at round %d, phase %s, selected %v, received %v", what, v.Round, v.Phase, v.Selected, v.Received)
			}
		}
	}
	sizes := map[int]bool{}
	for r := 1; r <= rounds; r++ {
		v := waitView("round drawn", func(v aggregator.ServerView) bool {
			return int(v.Round) == r && v.Phase == aggregator.PhaseCollecting
		})
		drawnAt := aggClock.Now()
		sizes[len(v.Selected)] = true
		// Every invited site reports; the round is still open.
		v = waitView("every invited site reported", func(v aggregator.ServerView) bool {
			return int(v.Round) != r || v.Phase != aggregator.PhaseCollecting || len(v.Received) == len(v.Selected)
		})
		if int(v.Round) != r || v.Phase != aggregator.PhaseCollecting {
			t.Fatalf("round %d closed before its deadline: round %d, phase %s", r, v.Round, v.Phase)
		}
		if !slices.Equal(v.Received, v.Selected) {
			t.Fatalf("round %d: received %v, selected %v", r, v.Received, v.Selected)
		}
		// Only the deadline closes it: wait for its timer, then reach it.
		deadline := drawnAt.Add(timeout)
		for {
			armed, ats := aggClock.Armed()
			if slices.ContainsFunc(ats, deadline.Equal) {
				break
			}
			select {
			case <-armed:
			case <-ctx.Done():
				t.Fatalf("round %d: no timer at its deadline %v (armed %v)", r, deadline, ats)
			}
		}
		aggClock.Set(deadline)
		waitView("closed at the deadline", func(v aggregator.ServerView) bool { return int(v.Round) > r || v.Phase == aggregator.PhaseFinished })
	}
	if !lf.Wait(ctx) {
		t.Fatal("the federation did not finish")
	}
	// Fixed-length rounds keep the amplified figure: each round charged at
	// its q (0.5), and /status says so.
	if v, _ := lf.Server.Watch(); v.Privacy == nil || !v.Privacy.Amplified || v.Privacy.Rounds != rounds ||
		math.Abs(v.Privacy.Epsilon-dp.EpsilonAfter(0.5, 1, rounds, 1e-5, nil)) > 1e-9*v.Privacy.Epsilon {
		t.Errorf("privacy after %d fixed-length rounds: %+v, want amplified at q = 0.5", rounds, v.Privacy)
	}
	if len(sizes) < 2 {
		t.Logf("every round drew %v sites", sizes)
	}
}
