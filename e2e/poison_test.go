package e2e

import (
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefl/edgefl/agent"
	"github.com/edgefl/edgefl/model"
)

// TestPoisoningSiteIsBounded is issue 10's item 1 on real processes: five
// sites run FedProx:FedSplit for 40 rounds, one of them the real edge-agent
// built with -tags edgefl_attack and publishing every Z_DELTA multiplied by
// 1000. Before the robust server step the global model's norm reached 1e38
// and the aggregator crashed at every restart. Now the aggregator stays
// alive, shows the attacker in /metrics, and ends within 1 point of the
// accuracy of the same federation without the attack.
func TestPoisoningSiteIsBounded(t *testing.T) {
	e2eTest(t)
	attackBin := filepath.Join(t.TempDir(), "edge-agent-attack")
	build := exec.Command("go", "build", "-tags", "edgefl_attack", "-o", attackBin, "./cmd/edge-agent")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the attacking agent: %v\n%s", err, out)
	}
	honest := poisonRun(t, "honest", "")
	attacked := poisonRun(t, "attacked", attackBin)
	t.Logf("final accuracy: honest %.4f, with a site scaling its deltas x1000 %.4f", honest, attacked)
	if math.Abs(honest-attacked) > 0.01 {
		t.Fatalf("accuracy %.4f under attack, %.4f without: more than 1 point apart", attacked, honest)
	}
}

// poisonRun runs the federation (site-5 from attackBin when not "") and
// returns the final evaluation accuracy.
func poisonRun(t *testing.T, name, attackBin string) float64 {
	const (
		sites  = 5
		rounds = 40
	)
	dir := filepath.Join(t.TempDir(), name)
	if err := mkdir(dir); err != nil {
		t.Fatal(err)
	}
	federation := "poison"
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, siteIDs(sites)...)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"listen", listen}, {"password_file", passwd},
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		// The attacker's updates that would overflow are refused: rounds
		// close with the honest four at their deadline.
		{"quorum_fraction", "0.8"}, {"round_timeout", "1500ms"},
	}))
	var edges []*edge
	for i := range sites {
		id := fmt.Sprintf("site-%d", i+1)
		// IID sites, so that the evaluation set (another sample of the
		// same distribution) measures the federation's model.
		c := agentConf(federation, "tcp://"+listen, id, passwordFile(dir, id), i, sites, 60).set("data", "synthetic-iid")
		if i == sites-1 && attackBin != "" {
			t.Setenv("EDGEFL_ATTACK_SCALE", "1000")
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
	if !agg.p.alive() {
		t.Fatalf("%s: the aggregator died:\n%s", name, agg.p.tail(20))
	}
	if attackBin != "" {
		excluded := m[`edgefl_aggregator_fedsplit_excluded_total{client="site-5"}`]
		outOfRange := m.rejected("out_of_range")
		t.Logf("attacker: left out of %v server steps, %v updates rejected out of range", excluded, outOfRange)
		if excluded+outOfRange == 0 {
			t.Fatalf("the attacker is not visible in /metrics")
		}
		for i := 1; i < sites; i++ {
			if n := m[fmt.Sprintf(`edgefl_aggregator_fedsplit_excluded_total{client="site-%d"}`, i)]; n != 0 {
				t.Errorf("honest site-%d left out of %v steps", i, n)
			}
		}
	}
	stopFederation(t, agg, edges...)
	// The final model's accuracy on the five sites' pooled data (the
	// federation's objective), loaded exactly as the sites load it.
	var pooled model.Data
	for i := range sites {
		cfg := agent.DefaultConfig()
		cfg.Data, cfg.DataClient, cfg.DataClients, cfg.DataSeed, cfg.DataMaxSamples = "synthetic-iid", i, sites, 3, 60
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
