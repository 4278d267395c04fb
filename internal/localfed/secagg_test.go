package localfed

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/edgefl/edgefl/aggregator"
	"github.com/edgefl/edgefl/dataset"
	"github.com/edgefl/edgefl/internal/testkit"
	"github.com/edgefl/edgefl/model"
)

// TestSecAggFederationRuns: K agents and the aggregator with --secagg over
// the embedded broker finish a run; every round's model comes from the
// unmasked sum.
func TestSecAggFederationRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	for _, k := range []int{2, 3, 5} {
		t.Run(string(rune('0'+k)), func(t *testing.T) {
			src, err := dataset.ParseSource("synthetic:1,1")
			if err != nil {
				t.Fatal(err)
			}
			fed, err := dataset.Build(src, dataset.Partition{Kind: dataset.PartNatural}, dataset.BuildOptions{Clients: k, Seed: 1, SyntheticMaxSamples: 40})
			if err != nil {
				t.Fatal(err)
			}
			ids := SiteIDs(k, 0)
			sites := make([]Site, len(ids))
			for i, id := range ids {
				data := fed.Clients[i].Train
				sites[i] = Site{ID: id, Data: &data}
			}
			var logs testkit.SyncBuffer
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("log:\n%s", logs.String())
				}
			})
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rounds := 0
			lf, err := Start(ctx, Config{Dir: t.TempDir(), Sites: sites, Seed: 1, Logger: log,
				Server: aggregator.ServerConfig{K: k, QuorumFraction: 1, RoundTimeout: time.Minute, Settle: 50 * time.Millisecond,
					MaxReselections: -1, Rounds: 2, Seed: 1, Algorithm: aggregator.AlgoFedProx,
					Params:  aggregator.Params{Mu: 1, Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
					Model:   model.Spec{Kind: model.KindLogReg, Inputs: fed.D, Classes: fed.Classes, L2: 0.01},
					SecAgg:  &aggregator.SecAggSettings{Clip: 1, Timeout: 20 * time.Second},
					OnRound: func(rr aggregator.RoundReport) { rounds++ }}})
			if err != nil {
				t.Fatal(err)
			}
			finished := lf.Wait(ctx)
			if err := lf.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
			if !finished || rounds != 2 {
				t.Fatalf("finished %v after %d rounds", finished, rounds)
			}
		})
	}
}
