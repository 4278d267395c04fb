package sim

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/sim/localfed"
	"github.com/edgefl/edgefl/testkit"
	"github.com/edgefl/edgefl/testkit/heartdisease"
)

// TestStatsReviewHeartDisease: the four real heart-disease hospitals
// through the statistics phase, as exported (Cleveland writes its codes
// "4.0", the others "4"; Switzerland's cholesterol is 0 throughout, VA's
// often). In simulate and at the daemons over MQTT, chest-pain type has
// its 4 levels (not 8), and the statistics review names cholesterol and
// VA's blood pressure of 0: simulate prints it; the aggregator logs it
// at WARN and shows it in its status, and with StatsReview (--stats-review)
// stops before round 1 (no round announced, the daemon up). Restarted
// without it on the same state files, the run goes on to its end.
func TestStatsReviewHeartDisease(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	dir := t.TempDir()
	paths, err := heartdisease.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	schemaPath := testkit.WriteFileIn(t, dir, "schema.json", heartdisease.Schema(""))
	// simulate: the four files as one CSV with a site column.
	var all strings.Builder
	all.WriteString("site," + heartdisease.Header + "\n")
	for k, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n")[1:] {
			all.WriteString(heartdisease.Sites[k] + "," + l + "\n")
		}
	}
	cfg := DefaultConfig()
	cfg.Schema, cfg.Dataset, cfg.Partition, cfg.SiteColumn = schemaPath, "csv:"+testkit.WriteFileIn(t, dir, "all.csv", all.String()), "natural", "site"
	cfg.Clients, cfg.PerRound, cfg.Rounds, cfg.EvalEvery, cfg.L2 = 0, 0, 1, 1, 0.01
	cfg = withAlgos(t, cfg, "fedavg")
	var progress bytes.Buffer
	res, err := Run(context.Background(), cfg, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if cp := res.sites.transform.Columns[2]; !slices.Equal(cp.Levels, []string{"1", "2", "3", "4"}) {
		t.Fatalf("simulate: cp levels %q", cp.Levels)
	}
	for _, want := range []string{"statistics review: feature \"chol\": per-site ranges disagree", "statistics review: feature \"trestbps\""} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("simulate's progress lacks %q:\n%s", want, progress.String())
		}
	}
	if strings.Contains(progress.String(), "levels seen only") {
		t.Errorf("simulate: a level seen at one site only:\n%s", progress.String())
	}

	// The daemons.
	sc, err := schema.Load(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testkit.FailureLog(t, "the live federation")
	live := t.TempDir()
	sites := make([]localfed.Site, len(paths))
	for i, p := range paths {
		sites[i] = localfed.Site{ID: heartdisease.Sites[i], Source: "csv:" + p, ModelOut: filepath.Join(live, heartdisease.Sites[i]+".bundle.json")}
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	fc := clock.NewFake(t0)
	srvCfg := aggregator.ServerConfig{
		K: len(sites), QuorumFraction: 1, RoundTimeout: 10 * time.Minute, Rounds: 2, Seed: 1,
		Algorithm: FedProx, Params: aggregator.Params{Solver: proxsolver.LBFGS, Gamma: 1e-6, MaxEpochs: 3, Mu: 1},
		Model: model.Spec{Kind: model.KindLogReg, L2: 0.01}, SchemaConfig: aggregator.SchemaConfig{Schema: sc, EvalEvery: 1, StatsReview: true},
		Codec: "fp32", Downlink: "fp32", Version: "test", Clock: fc, Logger: log.With("party", "aggregator"),
	}
	start := func(c aggregator.ServerConfig) *localfed.Federation {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		t.Cleanup(cancel)
		lf, err := localfed.Start(ctx, localfed.Config{Federation: "heart", Dir: live, Sites: sites, Seed: 1,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
			NewClock: func() clock.Clock { return clock.NewFake(t0) }, Logger: log, Server: c})
		if err != nil {
			t.Fatal(err)
		}
		return lf
	}
	lf := start(srvCfg)
	var st aggregator.Status
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fc.Advance(time.Second) // status reads the state file at most every 500 ms
		if st, err = lf.Server.LiveStatus(0, 0); err == nil && st.StatisticsReview != nil && st.StatisticsReview.Stopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statistics review stopped the run: %v %+v (phase %s schema %q model %+v)", err, st.StatisticsReview, st.Phase, st.Schema, st.Model)
		}
	}
	r := st.StatisticsReview
	var ranges []string
	for _, f := range r.Ranges {
		ranges = append(ranges, f.Feature)
	}
	if st.Phase != aggregator.PhaseFitting || len(r.Levels) != 0 || !slices.Equal(ranges, []string{"trestbps", "chol"}) ||
		!slices.Equal(r.Sites, heartdisease.Sites) || st.Model == nil || st.Model.Inputs != 18 {
		t.Fatalf("status: phase %s model %+v review %+v", st.Phase, st.Model, r)
	}
	if v, _ := lf.Server.Watch(); v.LastRound != 0 || len(v.Selected) != 0 {
		t.Fatalf("a round went on after the review stopped the run: %+v", v)
	}
	for _, want := range []string{`level=WARN msg="statistics review: feature \"chol\": per-site ranges disagree`,
		`the run stops before round 1 (--stats-review)`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the aggregator's log lacks %q", want)
		}
	}
	if err := lf.Stop(); err != nil {
		t.Fatal(err)
	}
	// From the state file: the same findings, no "stopped" (the daemon's).
	store, err := aggstore.OpenAgg(lf.StatePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := aggregator.ReadStatus(store)
	store.Close()
	if err != nil || fromFile.StatisticsReview == nil || !slices.Equal(fromFile.StatisticsReview.Findings, r.Findings) || fromFile.StatisticsReview.Stopped {
		t.Fatalf("status from the file: %v %+v", err, fromFile.StatisticsReview)
	}

	// Restarted without --stats-review: the run goes on.
	srvCfg.StatsReview, srvCfg.Clock = false, clock.NewFake(t0)
	lf = start(srvCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if !lf.Wait(ctx) {
		t.Fatal("the run did not finish after the restart without --stats-review")
	}
	if err := lf.Stop(); err != nil {
		t.Error(err)
	}
}
