package sim

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/sim/localfed"
	"github.com/edgefl/edgefl/testkit"
)

// testSchemaJSON with its preprocessing declared (what --dp needs).
var declaredSchemaJSON = strings.NewReplacer(
	`{"name": "size", "type": "numeric"}`, `{"name": "size", "type": "numeric", "center": 11, "scale": 4}`,
	`{"name": "colour", "type": "categorical"}`, `{"name": "colour", "type": "categorical", "levels": ["red", "green", "blue"]}`,
	`{"name": "age", "type": "numeric"}`, `{"name": "age", "type": "numeric", "center": 45, "scale": 20}`,
).Replace(testSchemaJSON)

// TestSimSchemaDPMatchesLive: `simulate --schema --dp` computes what the
// daemons compute. The three sites of testSites, a schema that declares
// its preprocessing, FedProx with an L-BFGS solve under central DP with
// simulate's noise key (--dp-noise-seed) given to the aggregator, fp32 on
// the wire: simulate, and live over MQTT the real aggregator.Server and
// one real agent.Agent per site reading its own CSV by the schema (no
// statistics phase), give bit for bit the same global model every round;
// the sites' evaluation reports at the aggregator are simulate's
// evaluations; the final bundle (every site's model_out, byte for byte the
// aggregator's) has simulate's weights, no evaluation, and the same
// privacy guarantee as simulate's bundle.
func TestSimSchemaDPMatchesLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	const rounds = 3
	dir, perSite := testSites(t)
	testkit.WriteFile(t, filepath.Join(dir, "schema.json"), declaredSchemaJSON)
	cfg := schemaConfig(t, dir, "fedprox")
	local := Local{Solver: proxsolver.LBFGS, Mu: 1, Gamma: 1e-6, MaxEpochs: 3, Batch: 10, LR: 0.01, Step: 1, Relax: 1}
	cfg.Algos = []Algo{{Label: FedProx, Family: FedProx, Agg: "mean", Local: local}}
	cfg.Rounds, cfg.EvalEvery, cfg.Codec, cfg.Downlink, cfg.Workers, cfg.OptimumEvals = rounds, 1, "fp32", "fp32", 2, 300
	// EarlyClose: the daemons' rounds close when every site has reported
	// (a fake clock), so both charge q = 1 and the bundles say so.
	cfg.DP, cfg.DPNoiseSeed = &dp.Config{Clip: 0.3, Noise: 1.5, Delta: 1e-5, EarlyClose: true}, 7
	key := dp.TestKey(cfg.DPNoiseSeed)

	simGlobal := map[int][]float64{}
	cfg.trace = func(_ string, round int, _ map[string]*uplink.Frame, x []float64) { simGlobal[round] = slices.Clone(x) }
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run := res.Runs[0]
	for _, s := range res.Sites {
		if s.StatsBytes != 0 {
			t.Errorf("site %s: %d bytes of statistics with a declared schema", s.ID, s.StatsBytes)
		}
	}
	simBundle, err := res.Bundle(run, "test", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := simBundle.Marshal(); err != nil {
		t.Fatal(err)
	}

	sc, err := schema.Load(cfg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	srvCfg := aggregator.ServerConfig{
		K: len(perSite), QuorumFraction: 1, RoundTimeout: 10 * time.Minute, Rounds: rounds, Seed: cfg.Seed,
		Algorithm: FedProx, Params: aggregator.Params{Solver: local.Solver, Gamma: local.Gamma, MaxEpochs: local.MaxEpochs, Mu: local.Mu},
		Model: model.Spec{Kind: model.KindLogReg, L2: cfg.L2}, SchemaConfig: aggregator.SchemaConfig{Schema: sc, EvalEvery: 1},
		Codec: "fp32", Downlink: "fp32", PrivacyConfig: aggregator.PrivacyConfig{DP: cfg.DP, DPTestKey: &key}, Version: "test",
	}
	want, statePath := liveSchemaRun(t, "simlive", res, perSite, srvCfg, rounds, simGlobal)
	b, err := bundle.Unmarshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bitsEqual(b.Model.Params, run.Final) || b.Evaluation != nil || b.Privacy == nil {
		t.Fatalf("final bundle: weights equal simulate's %v, evaluation %+v, privacy %+v", bitsEqual(b.Model.Params, run.Final), b.Evaluation, b.Privacy)
	}
	if !reflect.DeepEqual(b.Privacy, simBundle.Privacy) || b.Privacy.Epsilon != float64(run.DP.Epsilon) || b.Privacy.Rounds != rounds {
		t.Fatalf("privacy: live %+v, simulate %+v (epsilon %v)", b.Privacy, simBundle.Privacy, run.DP.Epsilon)
	}
	t.Logf("%d rounds bit for bit; final bundle %d bytes, %s", rounds, len(want), b.Privacy)
	// The operator's view of the final evaluation is simulate's.
	store, err := aggstore.OpenAgg(statePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	st, err := aggregator.ReadStatus(store)
	if err != nil {
		t.Fatal(err)
	}
	last := run.Rounds[len(run.Rounds)-1].Eval
	if st.Evaluation == nil || st.Evaluation.Round != rounds || !reflect.DeepEqual(st.Evaluation.Federation, last.Federation) ||
		!reflect.DeepEqual(st.Evaluation.Sites, last.Sites) || len(st.StatisticsSites) != 0 {
		t.Fatalf("the aggregator's evaluation %+v, simulate's %+v", st.Evaluation, last)
	}
}

// liveSchemaRun runs the live federation of a `simulate --schema` run: the
// real aggregator (srv; its Clock, Logger and OnRound are set here) and one
// real agent per site CSV of perSite, over MQTT to the end. It checks that
// every site wrote the aggregator's final bundle to its model_out and that
// every round's global model is simulate's (simGlobal) bit for bit, and
// returns the final bundle and the aggregator's state file.
func liveSchemaRun(t *testing.T, federation string, res *Results, perSite []string, srv aggregator.ServerConfig, rounds int, simGlobal map[int][]float64) (final []byte, statePath string) {
	t.Helper()
	return liveSchemaRunEval(t, federation, res, perSite, nil, srv, rounds, simGlobal)
}

// liveSchemaRunEval is liveSchemaRun with each site's eval_data
// (evalPerSite[i] for perSite[i]; nil: none).
func liveSchemaRunEval(t *testing.T, federation string, res *Results, perSite, evalPerSite []string, srv aggregator.ServerConfig, rounds int, simGlobal map[int][]float64) (final []byte, statePath string) {
	t.Helper()
	log, _ := testkit.FailureLog(t, "the live federation")
	live := t.TempDir()
	sites := make([]localfed.Site, len(perSite))
	for i, p := range perSite {
		sites[i] = localfed.Site{ID: res.Sites[i].ID, Source: "csv:" + p, ModelOut: filepath.Join(live, res.Sites[i].ID+".bundle.json")}
		if evalPerSite != nil {
			sites[i].EvalSource = evalPerSite[i]
		}
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	liveGlobal := map[int][]float64{}
	srv.Clock, srv.Logger = clock.NewFake(t0), log.With("party", "aggregator")
	srv.OnRound = func(rr aggregator.RoundReport) {
		mu.Lock()
		defer mu.Unlock()
		liveGlobal[rr.Round] = slices.Clone(rr.Global)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lf, err := localfed.Start(ctx, localfed.Config{Federation: federation, Dir: live, Sites: sites, Seed: 1,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
		NewClock: func() clock.Clock { return clock.NewFake(t0) }, Logger: log, Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	finished := lf.Wait(ctx)
	path := filepath.Join(live, aggregator.FinalBundle)
	for deadline := time.Now().Add(30 * time.Second); finished; time.Sleep(20 * time.Millisecond) {
		// Every site writes the bundle of the end announcement: poll.
		final, _ = os.ReadFile(path)
		n := 0
		for _, s := range sites {
			if got, err := os.ReadFile(s.ModelOut); err == nil && len(final) > 0 && bytes.Equal(got, final) {
				n++
			}
		}
		if n == len(sites) || time.Now().After(deadline) {
			if n != len(sites) {
				t.Errorf("%d of %d sites wrote the aggregator's final bundle to their model_out", n, len(sites))
			}
			break
		}
	}
	if err := lf.Stop(); err != nil {
		t.Error(err)
	}
	if !finished {
		t.Fatal("the live federation did not finish")
	}
	for r := 1; r <= rounds; r++ {
		mu.Lock()
		got := liveGlobal[r]
		mu.Unlock()
		if !bitsEqual(got, simGlobal[r]) {
			t.Errorf("round %d: the live global model differs from simulate's (max |diff| %g)", r, maxDiff(got, simGlobal[r]))
		}
	}
	if maxDiff(simGlobal[rounds], simGlobal[1]) == 0 {
		t.Error("the global model did not move: the comparison proves nothing")
	}
	return final, lf.StatePath
}
