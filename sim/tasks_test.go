package sim

import (
	"context"
	"fmt"
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
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/testkit"
)

// The schema tasks (schema.TaskBinary, TaskMulticlass, TaskRegression),
// each with its label mapping, over testSites' features.
var taskSchemas = map[string]string{
	schema.TaskBinary: testSchemaJSON,
	schema.TaskMulticlass: `{"task": "multiclass",
 "features": [{"name": "size", "type": "numeric"}, {"name": "colour", "type": "categorical"}, {"name": "age", "type": "numeric"}],
 "label": {"column": "y", "classes": [{"name": "low", "values": ["L", "0"]}, {"name": "mid", "values": ["M"]}, {"name": "high", "values": ["H", "2"]}]},
 "min_site_samples": 5}`,
	schema.TaskRegression: `{"task": "regression",
 "features": [{"name": "size", "type": "numeric"}, {"name": "colour", "type": "categorical"}, {"name": "age", "type": "numeric"}],
 "label": {"column": "y"}, "min_site_samples": 5}`,
}

var tasks = []string{schema.TaskBinary, schema.TaskMulticlass, schema.TaskRegression}

// taskSites is testSites with the label of task: the same three sites and
// combined CSV, y recomputed from the features (binary: N/Y; multiclass:
// L/M/H; regression: a number).
func taskSites(t *testing.T, task string) (dir string, perSite []string) {
	t.Helper()
	dir = t.TempDir()
	rng := rand.New(rand.NewPCG(5, 6))
	names := []string{"hosp-a", "hosp-b", "hosp-c"}
	orders := [][]string{{"size", "colour", "age", "y"}, {"y", "age", "size", "colour", "extra"}, {"colour", "y", "size", "age"}}
	var comb []map[string]string
	for k, n := range []int{90, 40, 70} {
		rows := siteRows(rng, n, float64(k))
		for _, r := range rows {
			var size, age float64
			_, _ = fmt.Sscan(r["size"], &size) // "NA" leaves 0: the test's rows mean it
			_, _ = fmt.Sscan(r["age"], &age)
			z := (size-10)/3 + (age-50)/20 + map[string]float64{"red": 1, "green": -1}[r["colour"]] + rng.NormFloat64()*0.5
			switch task {
			case schema.TaskMulticlass:
				r["y"] = "M"
				if z < -0.7 {
					r["y"] = "L"
				} else if z > 0.7 {
					r["y"] = "H"
				}
			case schema.TaskRegression:
				r["y"] = fmt.Sprintf("%.5g", 3*z+20)
			}
			rc := maps(r)
			rc["site"] = names[k]
			comb = append(comb, rc)
		}
		p := filepath.Join(dir, names[k]+".csv")
		testkit.WriteFile(t, p, csvOf(orders[k], rows))
		perSite = append(perSite, p)
	}
	// The combined file interleaves the sites' rows, each site's in its
	// own file's order (its held-out rows are the same rows).
	order := make([]string, len(comb))
	for i, r := range comb {
		order[i] = r["site"]
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	bySite := map[string][]map[string]string{}
	for _, r := range comb {
		bySite[r["site"]] = append(bySite[r["site"]], r)
	}
	var ordered []map[string]string
	for _, s := range order {
		ordered = append(ordered, bySite[s][0])
		bySite[s] = bySite[s][1:]
	}
	testkit.WriteFile(t, filepath.Join(dir, "all.csv"), csvOf([]string{"age", "site", "y", "colour", "size"}, ordered))
	testkit.WriteFile(t, filepath.Join(dir, "schema.json"), taskSchemas[task])
	return dir, perSite
}

func maps(r map[string]string) map[string]string {
	c := make(map[string]string, len(r)+1)
	for k, v := range r {
		c[k] = v
	}
	return c
}

// TestSchemaRunEveryTask: simulate --schema runs every task with every
// partition that fits it: natural (a site column) and iid for all three,
// dirichlet and classes for the classification tasks; a regression run
// refuses the class partitions with one line. Each run trains (the final
// model moves), evaluates every site's held-out rows with the task's
// figures (accuracy for classes, RMSE for regression) and writes a bundle.
// A regression schema once panicked in Table.Subset with every partition.
func TestSchemaRunEveryTask(t *testing.T) {
	for _, task := range tasks {
		dir, _ := taskSites(t, task)
		for _, part := range []string{"natural", "iid", "dirichlet:0.5", "classes:2"} {
			t.Run(task+"/"+part, func(t *testing.T) {
				cfg := schemaConfig(t, dir, "fedavg,fedproxsplit")
				cfg.Rounds, cfg.EvalEvery = 3, 3
				if part != "natural" {
					cfg.Partition, cfg.SiteColumn, cfg.Clients, cfg.PerRound = part, "", 3, 3
				}
				res, err := Run(context.Background(), cfg, nil)
				if task == schema.TaskRegression && strings.HasPrefix(part, "d") || task == schema.TaskRegression && strings.HasPrefix(part, "c") {
					if err == nil || !strings.Contains(err.Error(), "--partition") || !strings.Contains(err.Error(), "iid") || strings.Contains(err.Error(), "\n") {
						t.Fatalf("a regression run with --partition %s: %v, want one line naming --partition and iid", part, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Sites) != 3 {
					t.Fatalf("sites %+v", res.Sites)
				}
				rows := 0
				for _, s := range res.Sites {
					rows += s.TrainRows + s.HoldoutRows
					if (len(s.ClassCounts) > 0) != (task != schema.TaskRegression) {
						t.Fatalf("site %s class counts %v for a %s task", s.ID, s.ClassCounts, task)
					}
				}
				if rows != 200 {
					t.Fatalf("%d rows over the sites, want 200", rows)
				}
				for _, run := range res.Runs {
					if len(run.Final) == 0 || maxDiff(run.Final, make([]float64, len(run.Final))) == 0 {
						t.Fatalf("%s: final model %v", run.Algo, run.Final)
					}
					ev := run.Rounds[len(run.Rounds)-1].Eval
					if ev == nil || len(ev.Sites) != 3 || ev.Federation.N == 0 {
						t.Fatalf("%s: evaluation %+v", run.Algo, ev)
					}
					if classes := ev.Federation.Confusion != nil; classes != (task != schema.TaskRegression) || (!classes && !(ev.Federation.RMSE > 0)) {
						t.Fatalf("%s: a %s task evaluated as %+v", run.Algo, task, ev.Federation)
					}
					b, err := res.Bundle(run, "test", time.Unix(0, 0))
					if err != nil {
						t.Fatal(err)
					}
					if _, err := b.Marshal(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// TestSimSchemaMatchesLiveEveryTask: for every task, `simulate --schema`
// with its statistics phase computes what the daemons compute: the three
// sites of taskSites, FedProx with an L-BFGS solve, fp32; live
// over MQTT the real aggregator.Server and one real agent.Agent per site
// reading its own CSV by the schema (statistics, the fitted transform,
// rounds, evaluation) give bit for bit simulate's global model every
// round, simulate's final evaluation at the aggregator, and the final
// bundle at every site, for FedProx and for FedProx:FedSplit, whose
// per-site step weighs a site by the sample counts the aggregator knows
// when it draws round 1: the statistics' training rows (StatisticsArrived),
// not the statuses, which may arrive after that draw.
func TestSimSchemaMatchesLiveEveryTask(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	for _, task := range tasks {
		for _, algo := range []string{FedProx, FedProxSplit} {
			t.Run(task+"/"+algo, func(t *testing.T) { testSimSchemaMatchesLive(t, task, algo) })
		}
	}
}

func testSimSchemaMatchesLive(t *testing.T, task, algo string) {
	const rounds = 3
	dir, perSite := taskSites(t, task)
	cfg := schemaConfig(t, dir, algo)
	local := Local{Solver: proxsolver.LBFGS, Mu: 1, Gamma: 1e-6, MaxEpochs: 3, Batch: 10, LR: 0.01, Step: 1, Relax: 1}
	agg := "mean"
	if algo == FedProxSplit {
		agg, local.Step = split.StepRobust, 10
	}
	cfg.Algos = []Algo{{Label: algo, Family: algo, Agg: agg, Local: local}}
	cfg.Rounds, cfg.EvalEvery, cfg.Codec, cfg.Downlink, cfg.Workers, cfg.OptimumEvals = rounds, 1, "fp32", "fp32", 2, 300
	simGlobal := map[int][]float64{}
	cfg.trace = func(_ string, round int, _ map[string]*uplink.Frame, x []float64) { simGlobal[round] = slices.Clone(x) }
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run := res.Runs[0]

	sc, err := schema.Load(cfg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	srvCfg := aggregator.ServerConfig{
		K: len(perSite), QuorumFraction: 1, RoundTimeout: 10 * time.Minute, Rounds: rounds, Seed: cfg.Seed,
		Algorithm: algo, Params: aggregator.Params{Solver: local.Solver, Gamma: local.Gamma, MaxEpochs: local.MaxEpochs, Mu: local.Mu, Step: local.Step, Relax: local.Relax},
		Model: model.Spec{Kind: model.KindLogReg, L2: cfg.L2}, SchemaConfig: aggregator.SchemaConfig{Schema: sc, EvalEvery: 1},
		Codec: "fp32", Downlink: "fp32", Version: "test",
	}
	want, statePath := liveSchemaRun(t, "simtask", res, perSite, srvCfg, rounds, simGlobal)
	b, err := bundle.Unmarshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bitsEqual(b.Model.Params, run.Final) || b.Evaluation == nil || b.Schema.Task != task {
		t.Fatalf("final bundle: weights equal simulate's %v, evaluation %+v, task %s", bitsEqual(b.Model.Params, run.Final), b.Evaluation, b.Schema.Task)
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
	last := run.Rounds[len(run.Rounds)-1].Eval
	if st.Evaluation == nil || st.Evaluation.Round != rounds || !reflect.DeepEqual(st.Evaluation.Federation, last.Federation) ||
		!reflect.DeepEqual(st.Evaluation.Sites, last.Sites) {
		t.Fatalf("the aggregator's evaluation %+v, simulate's %+v", st.Evaluation, last)
	}
}
