package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/testkit"
)

// writeSite writes a site's CSV of n rows (columns y, a, b, c, color and
// an extra one) and a configuration file whose data line is data (with
// %s for the CSV's path); it returns the configuration's path.
func writeSite(t *testing.T, n int, data string) (conf, csv string) {
	t.Helper()
	dir := t.TempDir()
	csv = filepath.Join(dir, "site.csv")
	var b strings.Builder
	b.WriteString("note,y,a,b,c,color\n")
	rng := rand.New(rand.NewPCG(1, 2))
	colors := []string{"red", "green", "blue"}
	for i := range n {
		a, bb, c := rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64()
		y := 0
		if a+bb > 0 {
			y = 1
		}
		fmt.Fprintf(&b, "row%d,%d,%.4f,%.4f,%.4f,%s\n", i, y, a, bb, c, colors[i%3])
	}
	testkit.WriteFile(t, csv, b.String())
	conf = filepath.Join(dir, "edge-agent.conf")
	text := fmt.Sprintf("site_id = site-a\nfederation = f\nbroker = tcp://127.0.0.1:1\npassword_file = %s\ndata = %s\nstate_file = %s\n",
		filepath.Join(dir, "no-such-password"), fmt.Sprintf(data, csv), filepath.Join(dir, "state", "edge.db"))
	testkit.WriteFile(t, conf, text)
	return conf, csv
}

const benchSchemaJSON = `{"task": "binary",
 "features": [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"}, {"name": "color", "type": "categorical"}],
 "label": {"column": "y", "classes": [{"name": "no", "values": ["0"]}, {"name": "yes", "values": ["1"]}]},
 "min_site_samples": 5}`

func benchJSON(t *testing.T, args ...string) benchResult {
	t.Helper()
	code, stdout, stderr := runCmd(t, append([]string{"bench", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("bench %v: exit %d\n%s", args, code, stderr)
	}
	var r benchResult
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	return r
}

// bench --config benchmarks the site's own data (read by its data line;
// the password file is not read, nothing connects) with the model shape it
// implies, and caps the suggested budget.
func TestBenchConfigSiteData(t *testing.T) {
	conf, csv := writeSite(t, 300, "csv:%s:label=y")
	// The columns besides y: note is not a number, so keep the numbers.
	raw, _ := os.ReadFile(csv)
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Split(line, ",")
		b.WriteString(strings.Join(f[1:5], ",") + "\n")
	}
	testkit.WriteFile(t, csv, b.String())

	r := benchJSON(t, "--config", conf, "--epochs", "2")
	if r.Samples != 300 || r.Model.Kind != model.KindLogReg || r.Model.Inputs != 3 || r.Model.Classes != 2 || r.Params != 8 {
		t.Errorf("samples %d, model %+v (%d parameters); want 300 samples, logreg 3 x 2 (8)", r.Samples, r.Model, r.Params)
	}
	if !strings.Contains(r.Data, csv) || !strings.Contains(r.ShapeFrom, "3 features and 2 label classes") {
		t.Errorf("data %q, shape from %q", r.Data, r.ShapeFrom)
	}
	// 300 samples of 3 features: far more than the cap fits a 60 s round.
	if r.MaxSuggested != maxSuggestedEpochs || r.FitEpochs <= maxSuggestedEpochs || r.BudgetEpochs != maxSuggestedEpochs {
		t.Errorf("fit %d, suggested %d (cap %d); want the cap", r.FitEpochs, r.BudgetEpochs, r.MaxSuggested)
	}
	r = benchJSON(t, "--config", conf, "--epochs", "2", "--model", "mlp", "--hidden", "4")
	if r.Model.Kind != model.KindMLP || r.Params != 3*4+4+4*2+2 {
		t.Errorf("mlp: %+v, %d parameters", r.Model, r.Params)
	}
	r = benchJSON(t, "--config", conf, "--epochs", "2", "--model", "binary-logreg")
	if r.Model.Kind != model.KindBinaryLogReg || r.Params != 4 {
		t.Errorf("binary-logreg: %+v, %d parameters", r.Model, r.Params)
	}

	code, stdout, stderr := runCmd(t, "bench", "--config", conf, "--epochs", "2")
	if code != 0 {
		t.Fatalf("text: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"300 samples of this site's data", "read locally (nothing is sent)",
		fmt.Sprintf("max_epochs = %d (capped at %d", maxSuggestedEpochs, maxSuggestedEpochs), "--max-epochs"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, stdout)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", conf, "--features", "10"}, "--features: with --config the site's data decides"},
		{[]string{"--config", conf, "--schema", conf}, "--schema: the site's data"},
		{[]string{"--schema", conf}, "--schema needs --config"},
		{[]string{"--config", filepath.Join(t.TempDir(), "nope.conf")}, "--config"},
		{[]string{"--config", conf, "--model", "cnn"}, "--model \"cnn\""},
	} {
		code, _, stderr := runCmd(t, append([]string{"bench"}, tc.args...)...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("bench %v: exit %d, %q; want an error naming %q", tc.args, code, stderr, tc.want)
		}
	}
}

// Data read by the federation's schema: the shape comes from --schema (a
// preprocessing fitted on this site's statistics), or from the final bundle
// of the site's last run; without either bench says what it needs.
func TestBenchConfigSchemaData(t *testing.T) {
	conf, csv := writeSite(t, 60, "csv:%s")
	code, _, stderr := runCmd(t, "bench", "--config", conf)
	if code == 0 || !strings.Contains(stderr, "--schema FILE") {
		t.Fatalf("schema data without a schema: exit %d, %q", code, stderr)
	}
	sf := filepath.Join(t.TempDir(), "schema.json")
	testkit.WriteFile(t, sf, benchSchemaJSON)
	sc, err := schema.Load(sf)
	if err != nil {
		t.Fatal(err)
	}
	site, err := sitedata.Load(sc, csv)
	if err != nil {
		t.Fatal(err)
	}
	r := benchJSON(t, "--config", conf, "--schema", sf, "--epochs", "2")
	// a, b and one-hot color (3 levels): 5 inputs; binary: binary-logreg.
	if r.Model.Kind != model.KindBinaryLogReg || r.Model.Inputs != 5 || r.Samples != len(site.Train) || r.Samples >= 60 {
		t.Errorf("model %+v on %d samples; want binary-logreg with 5 inputs on the %d training rows", r.Model, r.Samples, len(site.Train))
	}
	if !strings.Contains(r.ShapeFrom, "fitted on this site's own statistics") || !strings.Contains(r.ShapeFrom, "assumed") {
		t.Errorf("shape from %q: does not say what it assumes", r.ShapeFrom)
	}

	// The final bundle of an earlier run, at model_out's default place:
	// its transform knows a fourth color another site has.
	stats, err := site.Statistics()
	if err != nil {
		t.Fatal(err)
	}
	stats.Features[2].Levels["violet"] = 3
	stats.Features[2].Levels["red"] -= 3
	tr, err := sitedata.Fit(sc, stats)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := sitedata.ModelSpec(sc, tr, model.KindMLP, 3, model.ActivationReLU, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := model.New(spec)
	out := filepath.Join(filepath.Dir(csv), "state", "final.bundle.json")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := bundle.Write(out, &bundle.Bundle{Model: model.Saved{Spec: spec, Layout: m.Layout(), Params: make([]float64, m.NumParams())},
		Schema: sc, Transform: tr, Provenance: bundle.Provenance{Federation: "f", RunID: "R", Round: 3, Algorithm: "fedprox", EdgeflVersion: "test", Time: "2026-01-01T00:00:00Z"}}); err != nil {
		t.Fatal(err)
	}
	r = benchJSON(t, "--config", conf, "--epochs", "2")
	if r.Model != spec || r.Model.Inputs != 6 || !strings.Contains(r.ShapeFrom, out) {
		t.Errorf("from the bundle: model %+v, shape from %q; want %+v from %s", r.Model, r.ShapeFrom, spec, out)
	}
}
