package sim

import (
	"bytes"
	"context"
	"github.com/edgefl/edgefl/node/aggstore"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/testkit"
)

// evalSites writes three sites whose held-out rows are a separate file (a
// fixed per-site train/test split, as a published benchmark gives it):
// each site's training CSV and held-out CSV in its own column order
// (train[k], eval[k]), and train.csv and eval.csv with a site column, the
// sites' rows interleaved. A held-out row may carry a level never seen in
// training (purple).
func evalSites(t *testing.T) (dir string, train, eval []string, trainRows, evalRows []int) {
	t.Helper()
	dir = t.TempDir()
	rng := rand.New(rand.NewPCG(7, 7))
	names := []string{"hosp-a", "hosp-b", "hosp-c"}
	orders := [][]string{{"size", "colour", "age", "y"}, {"y", "age", "size", "colour", "extra"}, {"colour", "y", "size", "age"}}
	var allTrain, allEval [][]map[string]string
	for k, n := range []int{60, 30, 45} {
		rows := siteRows(rng, n, float64(k))
		var tr, ev []map[string]string
		for i, r := range rows {
			if i%3 == 2 {
				ev = append(ev, r)
			} else {
				tr = append(tr, r)
			}
		}
		ev[0]["colour"] = "purple"
		for part, rs := range map[string][]map[string]string{"train": tr, "eval": ev} {
			p := filepath.Join(dir, names[k]+"-"+part+".csv")
			testkit.WriteFile(t, p, csvOf(orders[k], rs))
			if part == "train" {
				train = append(train, p)
			} else {
				eval = append(eval, p)
			}
		}
		allTrain, allEval = append(allTrain, tr), append(allEval, ev)
		trainRows, evalRows = append(trainRows, len(tr)), append(evalRows, len(ev))
	}
	interleave := func(per [][]map[string]string) []map[string]string {
		var out []map[string]string
		for i := 0; ; i++ {
			added := false
			for k, rs := range per {
				if i < len(rs) {
					r := maps(rs[i])
					r["site"] = names[k]
					out = append(out, r)
					added = true
				}
			}
			if !added {
				return out
			}
		}
	}
	cols := []string{"age", "site", "y", "colour", "size"}
	testkit.WriteFile(t, filepath.Join(dir, "train.csv"), csvOf(cols, interleave(allTrain)))
	testkit.WriteFile(t, filepath.Join(dir, "eval.csv"), csvOf(cols, interleave(allEval)))
	testkit.WriteFile(t, filepath.Join(dir, "schema.json"), testSchemaJSON)
	return dir, train, eval, trainRows, evalRows
}

// TestSimEvalDatasetMatchesLive: `simulate --schema --eval-dataset`
// computes what the daemons compute for sites whose agents have eval_data:
// every row of a site's data trains (the schema's holdout share of 0.2 is
// not applied) and the site evaluates on its rows of the eval file. Live
// over MQTT, the real aggregator.Server and one real agent.Agent per site
// reading its own training CSV and its own eval_data CSV give bit for bit
// simulate's global model every round, simulate's final evaluation at the
// aggregator (per site and federation) and simulate's final weights in
// the bundle; with standardize = federation and client (the held-out rows
// then take the site's own training statistics).
func TestSimEvalDatasetMatchesLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	for _, mode := range []string{schema.StandardizeFederation, schema.StandardizeClient} {
		t.Run(mode, func(t *testing.T) { testSimEvalDatasetMatchesLive(t, mode) })
	}
}

func testSimEvalDatasetMatchesLive(t *testing.T, mode string) {
	const rounds = 3
	dir, train, eval, trainRows, evalRows := evalSites(t)
	cfg := schemaConfig(t, dir, FedProxSplit)
	cfg.Dataset, cfg.EvalDataset, cfg.Standardize = "csv:"+filepath.Join(dir, "train.csv"), "csv:"+filepath.Join(dir, "eval.csv"), mode
	local := Local{Solver: proxsolver.LBFGS, Mu: 1, Gamma: 1e-6, MaxEpochs: 3, Batch: 10, LR: 0.01, Step: 10, Relax: 1}
	cfg.Algos = []Algo{{Label: FedProxSplit, Family: FedProxSplit, Agg: split.StepRobust, Local: local}}
	cfg.Rounds, cfg.EvalEvery, cfg.Codec, cfg.Downlink, cfg.Workers, cfg.OptimumEvals = rounds, 1, "fp32", "fp32", 2, 300
	simGlobal := map[int][]float64{}
	cfg.trace = func(_ string, round int, _ map[string]*uplink.Frame, x []float64) { simGlobal[round] = slices.Clone(x) }
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, s := range res.Sites {
		if s.TrainRows != trainRows[k] || s.HoldoutRows != evalRows[k] {
			t.Fatalf("site %s: %d training and %d held-out rows, want %d and %d (every row of its data trains, its eval rows are held out)",
				s.ID, s.TrainRows, s.HoldoutRows, trainRows[k], evalRows[k])
		}
	}
	run := res.Runs[0]
	last := run.Rounds[len(run.Rounds)-1].Eval
	for k, s := range res.Sites {
		if n := last.Sites[s.ID].N; n != int64(evalRows[k]) {
			t.Fatalf("site %s evaluated on %d rows, want its %d eval rows", s.ID, n, evalRows[k])
		}
	}

	sc, err := schema.Load(cfg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	sc.Standardize = mode
	srvCfg := aggregator.ServerConfig{
		K: len(train), QuorumFraction: 1, RoundTimeout: 10 * time.Minute, Rounds: rounds, Seed: cfg.Seed,
		Algorithm: FedProxSplit, Params: aggregator.Params{Solver: local.Solver, Gamma: local.Gamma, MaxEpochs: local.MaxEpochs, Mu: local.Mu, Step: local.Step, Relax: local.Relax},
		Model: model.Spec{Kind: model.KindLogReg, L2: cfg.L2}, SchemaConfig: aggregator.SchemaConfig{Schema: sc, EvalEvery: 1},
		Codec: "fp32", Downlink: "fp32", Version: "test",
	}
	want, statePath := liveSchemaRunEval(t, "simeval", res, train, eval, srvCfg, rounds, simGlobal)
	b, err := bundle.Unmarshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bitsEqual(b.Model.Params, run.Final) {
		t.Fatalf("final bundle's weights differ from simulate's (max |diff| %g)", maxDiff(b.Model.Params, run.Final))
	}
	store, err := aggstore.OpenAgg(statePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	st, err := aggregator.ReadStatus(store)
	if err != nil {
		t.Fatal(err)
	}
	if st.Evaluation == nil || st.Evaluation.Round != rounds || !reflect.DeepEqual(st.Evaluation.Federation, last.Federation) ||
		!reflect.DeepEqual(st.Evaluation.Sites, last.Sites) {
		t.Fatalf("the aggregator's evaluation %+v, simulate's %+v", st.Evaluation, last)
	}
}

// --eval-dataset is refused, with a reason, where it cannot say which
// site a held-out row belongs to or names a site that has no training
// rows.
func TestSimEvalDatasetRefusals(t *testing.T) {
	dir, _, _, _, _ := evalSites(t)
	testkit.WriteFile(t, filepath.Join(dir, "stranger.csv"), "age,site,y,colour,size\n40,hosp-z,N,red,10\n")
	testkit.WriteFile(t, filepath.Join(dir, "nosite.csv"), "age,y,colour,size\n40,N,red,10\n")
	testkit.WriteFile(t, filepath.Join(dir, "badcell.csv"), "age,site,y,colour,size\nold,hosp-a,N,red,10\n")
	for _, tc := range []struct {
		name, eval, partition, siteColumn, want string
	}{
		{"no site column", "eval.csv", "iid", "", "--eval-dataset needs --site-column"},
		{"a site with no training rows", "stranger.csv", "natural", "site", `names site "hosp-z"`},
		{"the file lacks the site column", "nosite.csv", "natural", "site", "site"},
		{"a bad cell", "badcell.csv", "natural", "site", "line 2"},
		{"not csv:", "tsv:eval.csv", "natural", "site", "csv:PATH"},
		{"no such file", "missing.csv", "natural", "site", "--eval-dataset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := schemaConfig(t, dir, FedAvg)
			cfg.Dataset, cfg.Partition, cfg.SiteColumn = "csv:"+filepath.Join(dir, "train.csv"), tc.partition, tc.siteColumn
			if tc.partition != "natural" {
				cfg.Clients, cfg.PerRound = 3, 3
			}
			cfg.EvalDataset = "csv:" + filepath.Join(dir, tc.eval)
			if strings.HasPrefix(tc.eval, "tsv:") {
				cfg.EvalDataset = tc.eval
			}
			cfg.Rounds = 1
			_, err := Run(context.Background(), cfg, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}
