package sim

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/testkit"
)

const testSchemaJSON = `{"task": "binary",
 "features": [{"name": "size", "type": "numeric"}, {"name": "colour", "type": "categorical"}, {"name": "age", "type": "numeric"}],
 "label": {"column": "y", "classes": [{"name": "no", "values": ["N", "0"]}, {"name": "yes", "values": ["Y", "1"]}]},
 "min_site_samples": 5}`

// siteRows makes n random rows of a site (map column -> cell); shift
// moves the site's features (a skewed site).
func siteRows(rng *rand.Rand, n int, shift float64) []map[string]string {
	var rows []map[string]string
	for range n {
		size := rng.NormFloat64()*3 + 10 + shift
		age := rng.Float64()*60 + 20 - 5*shift
		colour := []string{"red", "green", "blue"}[rng.IntN(3)]
		z := (size-10)/3 + (age-50)/20 + map[string]float64{"red": 1, "green": -1, "blue": 0}[colour] + rng.NormFloat64()*0.8
		y := "N"
		if z > 0 {
			y = "Y"
		}
		r := map[string]string{"size": fmt.Sprintf("%.6g", size), "age": fmt.Sprintf("%.4g", age), "colour": colour, "y": y}
		if rng.IntN(12) == 0 {
			r["size"] = "NA"
		}
		if rng.IntN(15) == 0 {
			r["colour"] = "?"
		}
		rows = append(rows, r)
	}
	return rows
}

func csvOf(cols []string, rows []map[string]string) string {
	var b strings.Builder
	b.WriteString(strings.Join(cols, ",") + "\n")
	for _, r := range rows {
		rec := make([]string, len(cols))
		for i, c := range cols {
			rec[i] = r[c]
		}
		b.WriteString(strings.Join(rec, ",") + "\n")
	}
	return b.String()
}

// testSites writes a schema, three site CSVs (each its own column order)
// and the combined CSV with a site column, rows interleaved (each site's
// rows in its own order).
func testSites(t *testing.T) (dir string, perSite []string) {
	t.Helper()
	dir = t.TempDir()
	rng := rand.New(rand.NewPCG(5, 5))
	names := []string{"hosp-a", "hosp-b", "hosp-c"}
	orders := [][]string{{"size", "colour", "age", "y"}, {"y", "age", "size", "colour", "extra"}, {"colour", "y", "size", "age"}}
	var all [][]map[string]string
	for k, n := range []int{90, 40, 70} {
		rows := siteRows(rng, n, float64(k))
		all = append(all, rows)
		p := filepath.Join(dir, names[k]+".csv")
		testkit.WriteFile(t, p, csvOf(orders[k], rows))
		perSite = append(perSite, p)
	}
	var comb []map[string]string
	next := make([]int, 3)
	for len(comb) < 200 {
		k := rng.IntN(3)
		if next[k] == len(all[k]) {
			continue
		}
		r := all[k][next[k]]
		r["site"] = names[k]
		comb = append(comb, r)
		next[k]++
	}
	testkit.WriteFile(t, filepath.Join(dir, "all.csv"), csvOf([]string{"age", "site", "y", "colour", "size"}, comb))
	testkit.WriteFile(t, filepath.Join(dir, "schema.json"), testSchemaJSON)
	return dir, perSite
}

func schemaConfig(t *testing.T, dir, algos string) Config {
	t.Helper()
	c := DefaultConfig()
	c.Schema, c.Dataset, c.Partition, c.SiteColumn = filepath.Join(dir, "schema.json"), "csv:"+filepath.Join(dir, "all.csv"), "natural", "site"
	c.Clients, c.PerRound, c.Rounds, c.EvalEvery = 0, 0, 7, 3
	c.L2 = 0.01
	return withAlgos(t, c, algos)
}

// A --schema run computes what the daemons compute: the sites read from
// their own CSVs (sitedata.Load) give the same transform, and the run's
// per-site evaluations equal sitedata.Evaluate on their held-out rows.
func TestSchemaRunIsTheDaemonsPipeline(t *testing.T) {
	for _, mode := range []string{"", "client"} {
		t.Run("standardize="+mode, func(t *testing.T) {
			dir, perSite := testSites(t)
			cfg := schemaConfig(t, dir, "fedsplit,fedavg")
			cfg.Standardize = mode
			var progress bytes.Buffer
			res, err := Run(context.Background(), cfg, &progress)
			if err != nil {
				t.Fatal(err)
			}
			if res.Config.Clients != 3 || res.Config.PerRound != 3 || len(res.Sites) != 3 || res.Sites[0].ID != "hosp-a" || res.Sites[2].ID != "hosp-c" {
				t.Fatalf("config %+v sites %+v", res.Config, res.Sites)
			}
			if !strings.Contains(progress.String(), "hosp-b") {
				t.Fatalf("progress: %s", progress.String())
			}
			// The daemons: each site loads its own CSV.
			s, err := schema.Load(cfg.Schema)
			if err != nil {
				t.Fatal(err)
			}
			if mode != "" {
				s.Standardize = mode
			}
			var stats []*prep.Stats
			var sites []*sitedata.Site
			for k, p := range perSite {
				st, err := sitedata.Load(s, p)
				if err != nil {
					t.Fatal(err)
				}
				x, err := st.Statistics()
				if err != nil {
					t.Fatal(err)
				}
				if res.Sites[k].TrainRows != len(st.Train) || res.Sites[k].HoldoutRows != len(st.Holdout) || res.Sites[k].StatsBytes < 100 {
					t.Fatalf("site %d: %+v, loaded %d/%d", k, res.Sites[k], len(st.Train), len(st.Holdout))
				}
				sites, stats = append(sites, st), append(stats, x)
			}
			pooled, err := prep.Combine(s, stats)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := sitedata.Fit(s, pooled)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tr, res.sites.transform) {
				t.Fatalf("transform differs:\n%+v\n%+v", tr, res.sites.transform)
			}
			spec, err := sitedata.ModelSpec(s, tr, "logreg", 0, "", cfg.L2)
			if err != nil || spec != res.Model.Spec() || spec.Kind != "binary-logreg" {
				t.Fatalf("spec %+v %v, run %+v", spec, err, res.Model.Spec())
			}
			for _, run := range res.Runs {
				for _, row := range run.Rounds {
					want := row.Round > 0 && (row.Round%cfg.EvalEvery == 0 || row.Round == cfg.Rounds)
					if (row.Eval != nil) != want {
						t.Fatalf("%s round %d: eval %v", run.Algo, row.Round, row.Eval != nil)
					}
				}
				last := run.Rounds[len(run.Rounds)-1].Eval
				var reports []evaluate.Report
				for k, st := range sites {
					_, hold, err := st.Data(tr)
					if err != nil {
						t.Fatal(err)
					}
					r, err := sitedata.Evaluate(spec, run.Final, hold)
					if err != nil {
						t.Fatal(err)
					}
					// The aggregator adds the baseline to what a site reports.
					if !reflect.DeepEqual(r.WithBaseline(), last.Sites[res.Sites[k].ID]) {
						t.Fatalf("%s site %d: run %+v, daemons %+v", run.Algo, k, last.Sites[res.Sites[k].ID], r)
					}
					reports = append(reports, r)
				}
				fedRep, _ := evaluate.Combine(reports)
				if !reflect.DeepEqual(fedRep.WithBaseline(), last.Federation) || last.Round != cfg.Rounds || last.Federation.AUC == nil {
					t.Fatalf("federation %+v, want %+v", last.Federation, fedRep)
				}
				// The bundle carries the final evaluation and evaluates
				// like the federation (federated preprocessing).
				b, err := res.Bundle(run, "test", time.Unix(0, 0))
				if err != nil {
					t.Fatal(err)
				}
				raw, err := b.Marshal()
				if err != nil {
					t.Fatal(err)
				}
				if b, err = bundle.Unmarshal(raw); err != nil || b.Evaluation.Round != cfg.Rounds || b.Provenance.Algorithm != run.Family || b.Provenance.Params["l2"] != "0.01" {
					t.Fatalf("bundle %v %+v", err, b.Provenance)
				}
			}
			if res.Optimum.Eval == nil || res.Optimum.Eval.Federation.N != int64(res.Data.TestSamples) {
				t.Fatalf("optimum eval %+v", res.Optimum.Eval)
			}
			var out bytes.Buffer
			if err := Summary(&out, res, "x"); err != nil || !strings.Contains(out.String(), "centralised optimum") || !strings.Contains(out.String(), "hosp-c") {
				t.Fatalf("summary: %v\n%s", err, out.String())
			}
		})
	}
}

func TestSchemaRunIIDPartition(t *testing.T) {
	dir, _ := testSites(t)
	cfg := schemaConfig(t, dir, "fedavg")
	cfg.Partition, cfg.SiteColumn, cfg.Clients, cfg.PerRound, cfg.Rounds = "iid", "", 4, 2, 2
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, s := range res.Sites {
		n := s.TrainRows + s.HoldoutRows
		if n < 50 || n > 50 {
			t.Fatalf("iid site sizes %+v", res.Sites)
		}
		total += n
	}
	if total != 200 || res.Sites[0].ID != "client0" {
		t.Fatalf("sites %+v", res.Sites)
	}
	again, err := Run(context.Background(), cfg, nil)
	if err != nil || !reflect.DeepEqual(again.Sites, res.Sites) || !reflect.DeepEqual(again.Runs[0].Final, res.Runs[0].Final) {
		t.Fatal("an iid --schema run is not deterministic")
	}
}

func TestSchemaRunBadInput(t *testing.T) {
	dir, _ := testSites(t)
	bad := testkit.WriteFileIn(t, dir, "bad.csv", "site,size,colour,age,y\na,1,red,30,Y\nb,2,red,forty,N\n")
	miss := testkit.WriteFileIn(t, dir, "miss.csv", "site,size,age,y\na,1,30,Y\n")
	few := testkit.WriteFileIn(t, dir, "few.csv", "site,size,colour,age,y\na,1,red,30,Y\na,2,red,40,N\nb,1,red,30,Y\n")
	label := testkit.WriteFileIn(t, dir, "label.csv", "site,size,colour,age,y\na,1,red,30,maybe\n")
	cases := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"bad cell", func(c *Config) { c.Dataset = "csv:" + bad }, []string{"bad.csv", "line 3", `column "age"`, "finite number"}},
		{"missing column", func(c *Config) { c.Dataset = "csv:" + miss }, []string{"miss.csv", "line 1", `"colour"`}},
		{"unknown label", func(c *Config) { c.Dataset = "csv:" + label }, []string{"label.csv", "line 2", `"y"`, "unknown label"}},
		{"too few rows", func(c *Config) { c.Dataset = "csv:" + few }, []string{"few.csv (site a)", "min_site_samples 5"}},
		{"natural without site column", func(c *Config) { c.SiteColumn = "" }, []string{"--site-column"}},
		{"site column with iid", func(c *Config) { c.Partition, c.Clients = "iid", 3 }, []string{"--site-column"}},
		{"no site column in the file", func(c *Config) { c.SiteColumn = "hospital" }, []string{"all.csv", `"hospital"`}},
		{"other label", func(c *Config) { c.Dataset += ":label=z" }, []string{"--dataset", `"y"`}},
		{"not csv", func(c *Config) { c.Dataset = "synthetic:1,1" }, []string{"--dataset", "csv:PATH"}},
		{"standardize none", func(c *Config) { c.Standardize = "none" }, []string{"--standardize"}},
		{"wrong clients", func(c *Config) { c.Clients = 5 }, []string{"--clients 5", "3 sites"}},
		{"linear model for a binary task", func(c *Config) { c.Model = "linear" }, []string{"--model"}},
		{"no schema file", func(c *Config) { c.Schema = filepath.Join(dir, "nope.json") }, []string{"--schema", "nope.json"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := schemaConfig(t, dir, "fedavg")
			c.edit(&cfg)
			_, err := Run(context.Background(), cfg, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%v: want %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("not one line: %q", err)
			}
		})
	}
}

// Without --schema nothing of the schema path shows in results.json.
func TestNoSchemaResultsUnchanged(t *testing.T) {
	cfg := smallConfig(t, "fedavg")
	cfg.Rounds = 2
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := res.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"eval"`, `"sites"`, `"schema`, `"site_column"`} {
		if strings.Contains(b.String(), key) {
			t.Fatalf("results.json of a run without --schema has %s", key)
		}
	}
	if _, err := res.Bundle(res.Runs[0], "test", time.Now()); err == nil {
		t.Fatal("a bundle without a schema")
	}
}

func TestBundlePath(t *testing.T) {
	for _, c := range []struct {
		file, label string
		runs        int
		want        string
	}{
		{"out/final.bundle.json", "fedavg", 1, "out/final.bundle.json"},
		{"out/final.bundle.json", "fedavg", 2, "out/final-fedavg.bundle.json"},
		{"b", "fedsplit:step=5", 2, "b-fedsplit_step_5"},
	} {
		if got := BundlePath(c.file, c.label, c.runs); got != c.want {
			t.Errorf("%q %q %d: %q, want %q", c.file, c.label, c.runs, got, c.want)
		}
	}
}

// BuildSchemaFederation is Run's federation without the algorithms: the
// same sites and reference, and each site's rows of the CSV, written as the
// site's own CSV, are the site's data (sitedata.Load gives the same
// training and held-out rows, so the same reference figures).
func TestBuildSchemaFederation(t *testing.T) {
	dir, _ := testSites(t)
	for _, part := range []string{"natural", "iid"} {
		t.Run(part, func(t *testing.T) {
			cfg := schemaConfig(t, dir, "fedavg")
			if part == "iid" {
				cfg.Partition, cfg.SiteColumn, cfg.Clients, cfg.PerRound = "iid", "", 3, 3
			}
			res, err := Run(context.Background(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			fed, err := BuildSchemaFederation(context.Background(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(fed.Sites, res.Sites) || fed.Spec != res.Model.Spec() {
				t.Fatalf("sites %+v spec %+v, Run's %+v %+v", fed.Sites, fed.Spec, res.Sites, res.Model.Spec())
			}
			ref, want := fed.Reference, res.Optimum
			ref.Seconds, want.Seconds = 0, 0
			if !reflect.DeepEqual(ref, want) || ref.Eval == nil {
				t.Fatalf("reference %+v, Run's optimum %+v", ref, want)
			}
			// Each site's rows as a CSV of its own.
			raw, err := os.ReadFile(filepath.Join(dir, "all.csv"))
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
			s, err := schema.Load(cfg.Schema)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[int]bool{}
			var reports []evaluate.Report
			for k, rows := range fed.Rows {
				if !slices.IsSorted(rows) {
					t.Fatalf("site %d: rows not in file order: %v", k, rows)
				}
				body := []string{lines[0]}
				for _, i := range rows {
					if seen[i] {
						t.Fatalf("row %d in two sites", i)
					}
					seen[i] = true
					body = append(body, lines[i+1])
				}
				p := filepath.Join(t.TempDir(), "site.csv")
				testkit.WriteFile(t, p, strings.Join(body, "\n")+"\n")
				st, err := sitedata.Load(s, p)
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Train) != fed.Sites[k].TrainRows || len(st.Holdout) != fed.Sites[k].HoldoutRows {
					t.Fatalf("site %d: %d/%d rows loaded, %+v", k, len(st.Train), len(st.Holdout), fed.Sites[k])
				}
				reports = append(reports, fed.Reference.Eval.Sites[fed.Sites[k].ID])
			}
			if len(seen) != len(lines)-1 {
				t.Fatalf("%d of %d rows in a site", len(seen), len(lines)-1)
			}
			if c, _ := evaluate.Combine(reports); !reflect.DeepEqual(c.WithBaseline(), fed.Reference.Eval.Federation) { // the baseline: of the pooled rows
				t.Fatalf("federation %+v, sites combine to %+v", fed.Reference.Eval.Federation, c)
			}
		})
	}
	cfg := DefaultConfig()
	if _, err := BuildSchemaFederation(context.Background(), cfg, nil); err == nil {
		t.Fatal("no schema: no error")
	}
}

// FedSplit, the exact reference, always solves with L-BFGS: results.json
// and the bundle record that solver, whatever solver= or the default
// (sgd) said, and no SGD knobs; FedAvg records its SGD with them.
func TestSolverRecordedIsTheOneUsed(t *testing.T) {
	dir, _ := testSites(t)
	cfg := schemaConfig(t, dir, "fedsplit:solver=sgd,fedsplit,fedavg")
	cfg.Rounds, cfg.EvalEvery = 2, 1
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range res.Runs {
		want := proxsolver.LBFGS
		if run.Family == FedAvg {
			want = proxsolver.SGD
		}
		if run.Local.Solver != want {
			t.Errorf("%s: results record solver %q, want %q", run.Algo, run.Local.Solver, want)
		}
		b, err := res.Bundle(run, "test", time.Unix(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		p := b.Provenance.Params
		if _, lr := p["lr"]; p["solver"] != want || lr != (want == proxsolver.SGD) {
			t.Errorf("%s: the bundle's params %v, want solver %q", run.Algo, p, want)
		}
	}
}
