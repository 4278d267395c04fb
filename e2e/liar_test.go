package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/agent"
)

// liarBound is how far (in accuracy on the sites' pooled data) the final
// model of a federation with a site claiming 2e9 samples from its first
// message may end from the same federation without the lie, under the
// default FedAvg (cap=3: no site counts for more than 3 x the others'
// median count).
const liarBound = 0.02

// TestLyingSiteDoesNotDominate is the lying site's sample-count cap on real processes: four
// sites run FedAvg on heterogeneous data (synthetic(1,1)), one of them the
// real edge-agent built with -tags edgefl_attack claiming 2e9 samples in
// every status and update, its first message included (so the daemon's
// rule "no more than the first count" does not help). With the cap off
// (fedavg:cap=0, what the default was) the liar took the whole weight and
// the final model was its own; with the default it counts for 3 x the
// others' median, the final model ends within liarBound of the honest
// federation's accuracy, and the cap is shown for the liar alone in
// /metrics and /status.
func TestLyingSiteDoesNotDominate(t *testing.T) {
	e2eTest(t)
	attackBin := filepath.Join(t.TempDir(), "edge-agent-attack")
	build := exec.Command("go", "build", "-tags", "edgefl_attack", "-o", attackBin, "./cmd/edge-agent")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the attacking agent: %v\n%s", err, out)
	}
	honest := liarRun(t, "honest", "", "")
	uncapped := liarRun(t, "uncapped", attackBin, "fedavg:cap=0")
	capped := liarRun(t, "default", attackBin, "")
	t.Logf("final accuracy on the pooled data: honest %.4f; a site claiming 2e9 samples: %.4f with the cap off, %.4f with the default cap",
		honest, uncapped, capped)
	if math.Abs(honest-capped) > liarBound {
		t.Errorf("accuracy %.4f with the liar under the default cap, %.4f without the lie: more than %v apart", capped, honest, liarBound)
	}
	// The attack is real: without the cap the liar's model is the
	// federation's (checked so that the bound above means something).
	if math.Abs(honest-uncapped) <= liarBound {
		t.Errorf("with the cap off the liar moved the accuracy by only %.4f: the test's federation does not show the attack", honest-uncapped)
	}
}

// liarRun runs the federation (site-4 from attackBin, claiming 2e9
// samples, when not "") with --aggregator spec ("": the default) and
// returns the final model's accuracy on the four sites' pooled data.
func liarRun(t *testing.T, name, attackBin, spec string) float64 {
	const (
		sites      = 4
		rounds     = 12
		maxSamples = 200
	)
	dir := filepath.Join(t.TempDir(), name)
	if err := mkdir(dir); err != nil {
		t.Fatal(err)
	}
	federation := "liar"
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, siteIDs(sites)...)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	conf := aggDefaults(federation).with(kv{
		{"listen", listen}, {"password_file", passwd},
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"algorithm", "fedavg"}, {"mu", "0"}, {"max_epochs", "20"},
	})
	if spec != "" {
		conf = conf.with(kv{{"aggregator", spec}})
	}
	agg := newAggregator(t, dir, conf)
	var edges []*edge
	for i := range sites {
		id := fmt.Sprintf("site-%d", i+1)
		c := agentConf(federation, "tcp://"+listen, id, passwordFile(dir, id), i, sites, maxSamples)
		if i == sites-1 && attackBin != "" {
			t.Setenv("EDGEFL_ATTACK_SAMPLES", "2000000000")
			e := &edge{t: t, dir: dir, id: id, conf: filepath.Join(dir, id+".conf"), state: filepath.Join(dir, id+".db")}
			writeConf(t, e.conf, c.set("state_file", e.state))
			e.p = startProc(t, dir, id, nil, attackBin, "run", "--config", e.conf)
			e.runs = append(e.runs, e.p)
			edges = append(edges, e)
			continue
		}
		edges = append(edges, newEdge(t, dir, id, c))
	}
	m := agg.waitFinished(180 * time.Second)
	// The cap's action, per site: the liar's every round under the
	// default, nobody's otherwise.
	const metric = `edgefl_aggregator_sample_count_median_capped_total{client="%s"}`
	var st struct {
		Clients []struct {
			ID            string `json:"id"`
			SamplesCapped uint64 `json:"samples_capped"`
		} `json:"clients"`
	}
	code, body, err := httpGet(agg.metrics, "/status")
	if err != nil || code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("%s: /status: %d %v", name, code, err)
	}
	shown := map[string]uint64{}
	for _, c := range st.Clients {
		shown[c.ID] = c.SamplesCapped
	}
	for i := range sites {
		id := fmt.Sprintf("site-%d", i+1)
		want := 0.0
		if i == sites-1 && attackBin != "" && spec == "" {
			want = rounds
		}
		if got := m[fmt.Sprintf(metric, id)]; got != want {
			t.Errorf("%s: %s = %v, want %v", name, fmt.Sprintf(metric, id), got, want)
		}
		if got := shown[id]; float64(got) != want {
			t.Errorf("%s: /status shows %d capped updates for %s, want %v", name, got, id, want)
		}
	}
	stopFederation(t, agg, edges...)
	var pooled model.Data
	for i := range sites {
		cfg := agent.DefaultConfig()
		cfg.Data, cfg.DataClient, cfg.DataClients, cfg.DataSeed, cfg.DataMaxSamples = "synthetic:1,1", i, sites, 3, maxSamples
		d, err := agent.LoadData(cfg)
		if err != nil {
			t.Fatal(err)
		}
		pooled = model.Data{N: pooled.N + d.N, D: d.D, X: append(pooled.X, d.X...), Y: append(pooled.Y, d.Y...)}
	}
	mdl, err := model.New(model.Spec{Kind: model.KindLogReg, Inputs: features, Classes: classes, L2: 0.001})
	if err != nil {
		t.Fatal(err)
	}
	return mdl.Score(readAggState(t, agg.state).final, pooled)
}
