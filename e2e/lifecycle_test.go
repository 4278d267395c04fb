package e2e

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/learn/evaluate"
)

// clinicalSchema is the schema of clinicalSite's CSVs: two numeric and two
// categorical features (one with missing tokens), a label with raw values
// that several spellings map to.
const clinicalSchema = `{
  "task": "binary",
  "features": [
    {"name": "age", "type": "numeric"},
    {"name": "bmi", "type": "numeric"},
    {"name": "smoker", "type": "categorical"},
    {"name": "ward", "type": "categorical"}
  ],
  "label": {"column": "outcome", "classes": [
    {"name": "healthy", "values": ["neg", "0"]},
    {"name": "sick", "values": ["pos", "1"]}
  ]},
  "holdout": 0.25,
  "holdout_seed": 5
}`

// clinicalSite writes a site's CSV: rows from one logistic ground truth, a
// site-specific case mix (shift moves the age distribution, so each site
// standardised on its own would mean something else by the same weight),
// missing cells, and the columns in the given order (extra columns too).
func clinicalSite(t *testing.T, path string, seed uint64, rows int, shift float64, columns []string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := csv.NewWriter(f)
	if err := w.Write(columns); err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		age := 50 + 12*rng.NormFloat64() + shift
		bmi := 26 + 4*rng.NormFloat64()
		smoker := []string{"yes", "no"}[rng.IntN(2)]
		ward := []string{"A", "B", "C"}[rng.IntN(3)]
		z := 0.09*(age-55) + 0.25*(bmi-26)
		if smoker == "yes" {
			z += 1.2
		}
		if ward == "C" {
			z -= 0.8
		}
		label := "neg"
		if rng.Float64() < 1/(1+math.Exp(-z)) {
			label = "pos"
		}
		cell := map[string]string{
			"age": strconv.FormatFloat(age, 'f', 1, 64), "bmi": strconv.FormatFloat(bmi, 'f', 2, 64),
			"smoker": smoker, "ward": ward, "outcome": label, "patient_id": fmt.Sprintf("p%d-%d", seed, i),
		}
		if i%17 == 3 {
			cell["bmi"] = "NA"
		}
		if i%23 == 5 {
			cell["smoker"] = "?"
		}
		rec := make([]string, len(columns))
		for j, c := range columns {
			rec[j] = cell[c]
		}
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// clinicalFederation writes schema to dir/schema.json and the three
// hospitals' CSVs (different sizes, shifted outcomes, the third with its
// columns reordered and an extra one) to dir/site-N.csv.
func clinicalFederation(t *testing.T, dir, schema string) (schemaPath string, files []string) {
	t.Helper()
	schemaPath = filepath.Join(dir, "schema.json")
	if err := os.WriteFile(schemaPath, []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	std := []string{"age", "bmi", "smoker", "ward", "outcome"}
	files = []string{filepath.Join(dir, "site-1.csv"), filepath.Join(dir, "site-2.csv"), filepath.Join(dir, "site-3.csv")}
	clinicalSite(t, files[0], 1, 240, -10, std)
	clinicalSite(t, files[1], 2, 200, 0, std)
	clinicalSite(t, files[2], 3, 220, 12, []string{"outcome", "patient_id", "ward", "bmi", "smoker", "age"})
	return schemaPath, files
}

// clinicalEdges starts an edge agent on each of files, site-1..site-N,
// writing its model to dir/site-N.bundle.json, with extra settings.
func clinicalEdges(t *testing.T, dir, federation, listen string, files []string, extra kv) []*edge {
	t.Helper()
	var edges []*edge
	for i, f := range files {
		id := fmt.Sprintf("site-%d", i+1)
		c := agentConf(federation, "tcp://"+listen, id, passwordFile(dir, id), i, len(files), 0).
			drop("data_client", "data_clients", "data_seed", "data_max_samples").
			with(kv{{"data", "csv:" + f}, {"model_out", filepath.Join(dir, id+".bundle.json")}}).with(extra)
		edges = append(edges, newEdge(t, dir, id, c))
	}
	return edges
}

// TestModelLifecycle is a schema run's whole path on real processes: a
// federation schema given to broker-agg run, three sites whose CSVs differ
// in column order, extra columns and case mix, the statistics phase, rounds
// with federated evaluation, the end announced with the final bundle, which
// every site writes to its model_out; then edge-agent evaluate and predict
// with it, broker-agg export of a stored round, and a fourth site whose CSV
// lacks a schema column, whose error the operator sees at the aggregator.
func TestModelLifecycle(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 6
	)
	dir := t.TempDir()
	federation := "ward9"
	schemaPath, files := clinicalFederation(t, dir, clinicalSchema)
	broken := filepath.Join(dir, "site-4.csv")
	clinicalSite(t, broken, 4, 100, 0, []string{"age", "smoker", "ward", "outcome"}) // no bmi

	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, "site-1", "site-2", "site-3", "site-4")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"listen", listen}, {"password_file", passwd}, {"schema", schemaPath},
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)}, {"eval_every", "2"},
		{"l2", "0.01"}, {"max_epochs", "5"}, {"lr", "0.1"},
	}).drop("features", "classes"))
	edges := clinicalEdges(t, dir, federation, listen, files, kv{{"log_level", "debug"}})
	bad := newEdge(t, dir, "site-4", agentConf(federation, "tcp://"+listen, "site-4", passwordFile(dir, "site-4"), 0, 1, 0).
		drop("data_client", "data_clients", "data_seed", "data_max_samples").
		with(kv{{"data", "csv:" + broken}, {"model_out", filepath.Join(dir, "site-4.bundle.json")}}))

	// The broken site's error reaches the operator: /metrics and status.
	agg.waitMetrics(60*time.Second, "site-4's error", func(m metrics) bool {
		return m[`edgefl_aggregator_site_errors_total{site="site-4",reason="schema_mismatch"}`] >= 1
	})
	agg.waitFinished(180 * time.Second)

	// Every site holds the final bundle, the aggregator's own.
	final := filepath.Join(dir, "final.bundle.json")
	waitFor(t, 60*time.Second, "the final bundle at the aggregator", func() (bool, error) {
		_, err := os.Stat(final)
		return err == nil, err
	})
	want, err := bundle.Read(final)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edges {
		p := filepath.Join(dir, e.id+".bundle.json")
		waitFor(t, 60*time.Second, e.id+"'s model_out", func() (bool, error) {
			_, err := os.Stat(p)
			return err == nil, err
		})
		got, err := bundle.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		if got.Digest != want.Digest {
			t.Errorf("%s wrote bundle %s, the aggregator's is %s", e.id, got.Digest, want.Digest)
		}
	}
	ev := want.Evaluation
	if ev == nil || len(ev.Sites) != sites || ev.Round != rounds {
		t.Fatalf("final bundle's evaluation %+v: want round %d with %d sites", ev, rounds, sites)
	}
	if acc := ev.Federation.Accuracy; acc < 0.7 {
		t.Errorf("federated held-out accuracy %v, want >= 0.7", acc)
	}
	if want.Transform == nil || want.Schema == nil || want.Provenance.RunID == "" {
		t.Errorf("bundle lacks its transform, schema or provenance: %+v", want.Provenance)
	}

	// The site uses the model: evaluate on its CSV, predict with pass-through.
	out, err := exec.Command(agentBin, "evaluate", "--model", filepath.Join(dir, "site-3.bundle.json"), "--data", "csv:"+files[2], "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("edge-agent evaluate: %v\n%s", err, out)
	}
	var rep struct {
		N        int     `json:"n"`
		Accuracy float64 `json:"accuracy"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || rep.N != 220 || rep.Accuracy < 0.6 {
		t.Fatalf("edge-agent evaluate --json: %v: %s", err, out)
	}
	// --heldout: exactly the rows the federation held out, so the site
	// reproduces its own federated figure, the report it sent for the
	// final round (the bundle's per-site evaluation), digit for digit.
	out, err = exec.Command(agentBin, "evaluate", "--heldout", "--model", filepath.Join(dir, "site-3.bundle.json"), "--data", "csv:"+files[2], "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("edge-agent evaluate --heldout: %v\n%s", err, out)
	}
	var held, sent evaluate.Report
	if err := json.Unmarshal(out, &held); err != nil {
		t.Fatalf("edge-agent evaluate --heldout --json: %v: %s", err, out)
	}
	sent = ev.Sites["site-3"]
	hj, _ := json.Marshal(held)
	sj, _ := json.Marshal(sent)
	if h, s := string(hj), string(sj); h != s || held.N == 0 || held.N >= int64(rep.N) {
		t.Fatalf("evaluate --heldout on site-3's CSV:\n%s\nsite-3's federated figure:\n%s", h, s)
	}
	pred := filepath.Join(dir, "pred.csv")
	if out, err := exec.Command(agentBin, "predict", "--model", filepath.Join(dir, "site-3.bundle.json"), "--data", "csv:"+files[2],
		"--out", pred, "--keep", "patient_id").CombinedOutput(); err != nil {
		t.Fatalf("edge-agent predict: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(pred); err != nil || strings.Count(string(b), "\n") != 221 || !strings.HasPrefix(string(b), "patient_id,prediction,") {
		t.Fatalf("predictions: %v\n%.300s", err, b)
	}

	// export of a stored round: from the running daemon (which holds the
	// file), then from the file; and of a round that is not stored.
	export := func(round, out string, extra ...string) ([]byte, error) {
		return exec.Command(aggBin, append([]string{"export", "--state", agg.state, "--round", round, "--out", out}, extra...)...).CombinedOutput()
	}
	live := filepath.Join(dir, "round2-live.bundle.json")
	if out, err := export("2", live, "--addr", agg.metrics); err != nil {
		t.Fatalf("broker-agg export from the running daemon: %v\n%s", err, out)
	}
	if err := agg.p.stop(); err != nil {
		t.Fatal(err)
	}
	// The aggregator (and its embedded broker) is gone: a finished site
	// keeps reconnecting, quietly (DEBUG), until a new run starts.
	for _, e := range edges {
		e.p.waitLine(30*time.Second, e.id+" noticing the broker is gone", func(l logLine) bool {
			return l.str("level") == "DEBUG" && (l.msg() == "connection lost; reconnecting" || l.msg() == "broker unreachable")
		})
		done := false
		for _, l := range e.lines(func(logLine) bool { return true }) {
			if l.msg() == "federation finished; final model written" {
				done = true
			} else if done && (l.str("level") == "WARN" || l.str("level") == "ERROR") {
				t.Errorf("%s logged %s %q after the run finished", e.id, l.str("level"), l.msg())
			}
		}
	}
	exp := filepath.Join(dir, "round2.bundle.json")
	if out, err := export("2", exp); err != nil {
		t.Fatalf("broker-agg export: %v\n%s", err, out)
	}
	for _, p := range []string{live, exp} {
		if b, err := bundle.Read(p); err != nil || b.Provenance.Round != 2 || b.Evaluation == nil || len(b.Evaluation.Sites) != sites {
			t.Fatalf("exported bundle %s: %v %+v", p, err, b)
		}
	}
	out, err = export("99", filepath.Join(dir, "r99.json"))
	if err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || !strings.Contains(string(out), "99") {
		t.Fatalf("export of a round not stored: err %v, output %q: want a one-line error naming the round", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "r99.json")); err == nil {
		t.Fatal("a failed export left a file")
	}

	// broker-agg status shows the federated evaluation and the site error.
	st, err := exec.Command(aggBin, "status", "--state", agg.state).CombinedOutput()
	if err != nil {
		t.Fatalf("broker-agg status: %v\n%s", err, st)
	}
	for _, want := range []string{"site-4: schema_mismatch", "ACCURACY", "final bundle: round 6"} {
		if !strings.Contains(string(st), want) {
			t.Errorf("broker-agg status lacks %q:\n%s", want, st)
		}
	}
	t.Logf("broker-agg status:\n%s", st)

	noPanics(agg, append(edges, bad)...)
}
