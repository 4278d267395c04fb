package e2e

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/learn/dp"
)

// clinicalSchema with its preprocessing declared: what --dp needs.
var clinicalDeclaredSchema = strings.NewReplacer(
	`{"name": "age", "type": "numeric"}`, `{"name": "age", "type": "numeric", "center": 55, "scale": 15}`,
	`{"name": "bmi", "type": "numeric"}`, `{"name": "bmi", "type": "numeric", "center": 26, "scale": 5}`,
	`{"name": "smoker", "type": "categorical"}`, `{"name": "smoker", "type": "categorical", "levels": ["no", "yes"]}`,
	`{"name": "ward", "type": "categorical"}`, `{"name": "ward", "type": "categorical", "levels": ["A", "B", "C"]}`,
).Replace(clinicalSchema)

// TestModelLifecycleDP is TestModelLifecycle under central differential
// privacy, on real processes: broker-agg run --schema --dp central with a
// schema that declares its preprocessing (no statistics phase: no site
// sends statistics), three edge-agent run processes whose CSVs differ in
// column order and case mix, rounds with evaluation reports that reach the
// aggregator only; at the end every site's model_out is byte for byte the
// aggregator's final bundle, which records the guarantee (the
// accountant's epsilon after the run's rounds at q = 1) and carries no
// evaluation and no site's name or figure; edge-agent evaluate and predict
// use it; broker-agg export of round 2 records round 2's epsilon; status
// shows the operator the epsilon and the sites' evaluation.
func TestModelLifecycleDP(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 6
		clip   = 1.0
		noise  = 0.8
	)
	dir := t.TempDir()
	federation := "ward9dp"
	schemaPath, files := clinicalFederation(t, dir, clinicalDeclaredSchema)

	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, "site-1", "site-2", "site-3")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"listen", listen}, {"password_file", passwd}, {"schema", schemaPath},
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)}, {"eval_every", "2"},
		{"algorithm", "fedprox"}, {"l2", "0.01"}, {"max_epochs", "5"}, {"lr", "0.1"},
		{"dp", "central"}, {"dp_clip", fmt.Sprint(clip)}, {"dp_noise", fmt.Sprint(noise)}, {"dp_delta", "1e-5"},
		// Rounds close when every site has reported (charged at q = 1; the
		// fixed-length default would make each last round_timeout).
		{"dp_fixed_rounds", "false"},
	}).drop("features", "classes", "step"))
	edges := clinicalEdges(t, dir, federation, listen, files, nil)
	agg.waitFinished(180 * time.Second)

	final := filepath.Join(dir, "final.bundle.json")
	waitFor(t, 60*time.Second, "the final bundle at the aggregator", func() (bool, error) {
		_, err := os.Stat(final)
		return err == nil, err
	})
	raw, err := os.ReadFile(final)
	if err != nil {
		t.Fatal(err)
	}
	want, err := bundle.Unmarshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edges {
		p := filepath.Join(dir, e.id+".bundle.json")
		waitFor(t, 60*time.Second, e.id+"'s model_out", func() (bool, error) {
			got, err := os.ReadFile(p)
			return err == nil && bytes.Equal(got, raw), nil
		})
	}
	eps := dp.EpsilonAfter(1, noise, rounds, 1e-5, nil)
	p := want.Privacy
	// EpsilonAfter multiplies where the accountant adds round by round:
	// equal to 1e-12.
	if p == nil || want.Version != 2 || math.Abs(p.Epsilon-eps) > 1e-12*eps || p.Rounds != rounds || p.ClipNorm != clip || p.NoiseMultiplier != noise ||
		len(p.SamplingRates) != 1 || p.SamplingRates[0].Q != 1 || want.Provenance.Round != rounds {
		t.Fatalf("final bundle: version %d, privacy %+v; want epsilon %v after %d rounds at q = 1", want.Version, p, eps, rounds)
	}
	if want.Evaluation != nil || bytes.Contains(raw, []byte("site-")) || bytes.Contains(raw, []byte(`"confusion"`)) {
		t.Fatalf("the final bundle carries an evaluation or names a site:\n%.600s", raw)
	}
	// No site sent statistics: the schema declares the preprocessing.
	if m := agg.mustScrape(); m[`edgefl_aggregator_statistics_sites`] != 0 || m[`edgefl_dp_epsilon`] != p.Epsilon {
		t.Errorf("metrics: statistics sites %v, epsilon %v (want 0 and %v)", m[`edgefl_aggregator_statistics_sites`], m[`edgefl_dp_epsilon`], eps)
	}
	for _, e := range edges {
		done := e.p.waitLine(30*time.Second, e.id+"'s end of the run", func(l logLine) bool { return l.msg() == "federation finished; final model written" })
		if done.num("dp_epsilon") != p.Epsilon {
			t.Errorf("%s logged the end of the run with epsilon %v, the bundle's is %v", e.id, done.num("dp_epsilon"), p.Epsilon)
		}
		if n := len(e.lines(func(l logLine) bool { return strings.Contains(l.msg(), "statistics") && l.str("level") != "DEBUG" })); n != 0 {
			t.Errorf("%s logged %d lines about statistics", e.id, n)
		}
	}

	// The site uses the model: evaluate on its CSV (the model's guarantee
	// shown), predict.
	bun := filepath.Join(dir, "site-3.bundle.json")
	out, err := exec.Command(agentBin, "evaluate", "--model", bun, "--data", "csv:"+files[2]).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "model      central differential privacy (per site)") || !strings.Contains(string(out), "accuracy") {
		t.Fatalf("edge-agent evaluate: %v\n%s", err, out)
	}
	pred := filepath.Join(dir, "pred.csv")
	if out, err := exec.Command(agentBin, "predict", "--model", bun, "--data", "csv:"+files[2], "--out", pred, "--keep", "patient_id").CombinedOutput(); err != nil {
		t.Fatalf("edge-agent predict: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(pred); err != nil || strings.Count(string(b), "\n") != 221 {
		t.Fatalf("predictions: %v\n%.300s", err, b)
	}

	// The operator's view: epsilon and the sites' evaluation.
	if err := agg.p.stop(); err != nil {
		t.Fatal(err)
	}
	st, err := exec.Command(aggBin, "status", "--state", agg.state).CombinedOutput()
	if err != nil {
		t.Fatalf("broker-agg status: %v\n%s", err, st)
	}
	for _, w := range []string{"differential privacy (central): epsilon", "ACCURACY", "site-2", "final bundle: round 6",
		"preprocessing declared by the schema (no statistics phase)", "the operator's only under --dp: no bundle carries it"} {
		if !strings.Contains(string(st), w) {
			t.Errorf("broker-agg status lacks %q:\n%s", w, st)
		}
	}
	exp := filepath.Join(dir, "round2.bundle.json")
	out, err = exec.Command(aggBin, "export", "--state", agg.state, "--round", "2", "--out", exp).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "privacy: central differential privacy") {
		t.Fatalf("broker-agg export: %v\n%s", err, out)
	}
	b2, err := bundle.Read(exp)
	if err != nil || b2.Privacy == nil || b2.Privacy.Rounds != 2 || math.Abs(b2.Privacy.Epsilon-dp.EpsilonAfter(1, noise, 2, 1e-5, nil)) > 1e-12 || b2.Evaluation != nil {
		t.Fatalf("exported bundle of round 2: %v %+v", err, b2)
	}
	noPanics(agg, edges...)
}
