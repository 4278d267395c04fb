package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/testkit"
	"github.com/edgefl/edgefl/testkit/fedbroker"
)

// TestFederationWithSchemaEndToEnd runs the whole path of a schema run in one
// process over the embedded broker (with its ACL): the real aggregator
// (aggregator.Server with a schema) and three real agents reading their
// CSVs (columns in their own order, one with a separate eval_data file):
// the statistics phase, three training rounds with an evaluation every
// round, the final evaluation and the final bundle, which every site
// stores and writes to its model_out, byte for byte the aggregator's.
// Each site's figures in the bundle are what sitedata.Evaluate gives for
// the bundle's model on that site's held-out rows.
func TestFederationWithSchemaEndToEnd(t *testing.T) {
	s, err := schema.Parse([]byte(fedSchemaJSON))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"site-a", "site-b", "site-c"}
	brk := fedbroker.Start(t, testFed, testkit.Logger(t), nil, ids...)

	aggDir := t.TempDir()
	const rounds = 3
	cfg := aggregator.ServerConfig{
		Federation: testFed, BrokerURL: brk.URL(), Username: fedbroker.Aggregator, Password: fedbroker.AggregatorPassword,
		K: len(ids), QuorumFraction: 1, RoundTimeout: time.Minute, Rounds: rounds, Seed: 7,
		Algorithm: AlgoFedProx, Model: model.Spec{Kind: model.KindLogReg, L2: 0.01},
		Params:    aggregator.Params{Solver: proxsolver.LBFGS, Mu: 0.01, Gamma: 1e-6, MaxEpochs: 50},
		StatePath: filepath.Join(aggDir, "state.db"), FinalModel: filepath.Join(aggDir, "final.bundle.json"),
		SchemaConfig: aggregator.SchemaConfig{Schema: s, EvalEvery: 1}, Version: "test",
		Clock: clock.NewFake(t0), Logger: testkit.Logger(t),
	}
	srv, err := aggregator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("aggregator: %v", err)
			}
		case <-time.After(guard):
			t.Error("aggregator did not stop")
		}
	})

	var sites []*schemaSite
	for i, id := range ids {
		sites = append(sites, startSchemaSite(t, brk.URL(), i, id))
	}
	select {
	case <-srv.Finished():
	case err := <-done:
		t.Fatalf("aggregator stopped: %v", err)
	case <-time.After(2 * guard):
		t.Fatal("the federation did not finish")
	}
	final, err := os.ReadFile(cfg.FinalModel)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Unmarshal(final)
	if err != nil {
		t.Fatal(err)
	}
	if b.Provenance.Round != rounds || b.Evaluation == nil || b.Evaluation.Round != rounds || len(b.Evaluation.Sites) != len(ids) {
		t.Fatalf("final bundle: provenance %+v, evaluation %+v", b.Provenance, b.Evaluation)
	}
	spec := b.Model.Spec
	for _, st := range sites {
		st.ra.wait(t, st.id+" finished", isKind(EventFinished))
		got, err := os.ReadFile(st.out)
		if err != nil || !bytes.Equal(got, final) {
			t.Fatalf("%s: model_out is not the aggregator's final bundle: %v", st.id, err)
		}
		stats := st.ra.Stats()
		if stats.RoundsSolved != rounds || stats.RoundErrors != 0 || stats.BadAnnouncements != 0 || stats.BadMessages != 0 ||
			stats.StatisticsSent == 0 || stats.EvaluationsSent < rounds {
			t.Errorf("%s: stats %+v", st.id, stats)
		}
		// The site's figures in the bundle are its own evaluation of the
		// final model on its held-out rows.
		holdout := heldOutRows(t, s, st.csv, st.eval, b.Transform)
		want, err := sitedata.Evaluate(spec, b.Model.Params, holdout)
		if err != nil {
			t.Fatal(err)
		}
		gotRep, _ := json.Marshal(b.Evaluation.Sites[st.id])
		if wantRep, _ := json.Marshal(want.WithBaseline()); !bytes.Equal(gotRep, wantRep) || want.N == 0 { // the aggregator adds the baseline
			t.Errorf("%s: the bundle says %s, the site's held-out rows give %s", st.id, gotRep, wantRep)
		}
	}
	if acc := b.Evaluation.Federation.Accuracy; acc < 0.7 {
		t.Errorf("federated accuracy %.3f on held-out rows: the model did not learn", acc)
	}
	t.Logf("final bundle: %d bytes, federated held-out accuracy %.3f, loss %.4f", len(final), b.Evaluation.Federation.Accuracy, b.Evaluation.Federation.Loss)
}

// heldOutRows are a site's held-out rows under the final transform tr:
// those of its csv, or its whole eval file when it has one (the site then
// trains on every row of csv).
func heldOutRows(t *testing.T, s *schema.Schema, csv, eval string, tr *prep.Transform) model.Data {
	t.Helper()
	ls, err := sitedata.Load(s, csv)
	if err != nil {
		t.Fatal(err)
	}
	if eval != "" {
		ls.Train, ls.Holdout = nil, nil
		for i := range ls.Table.Rows {
			ls.Train = append(ls.Train, i)
		}
	}
	_, holdout, err := ls.Data(tr)
	if err != nil {
		t.Fatal(err)
	}
	if eval != "" {
		ev, err := sitedata.Load(s, eval)
		if err != nil {
			t.Fatal(err)
		}
		own, err := ls.Transform(tr)
		if err != nil {
			t.Fatal(err)
		}
		holdout = own.Apply(ev.Table, nil)
	}
	return holdout
}

// schemaSite is a site of TestFederationWithSchemaEndToEnd.
type schemaSite struct {
	id, csv, eval, out string
	ra                 *runningAgent
}

// startSchemaSite writes site i's CSV (the third site also has a separate
// held-out file) and starts its agent.
func startSchemaSite(t *testing.T, broker string, i int, id string) *schemaSite {
	t.Helper()
	dir := t.TempDir()
	st := &schemaSite{id: id, csv: filepath.Join(dir, id+".csv"), out: filepath.Join(dir, "model", "final.json")}
	if err := os.WriteFile(st.csv, []byte(siteCSV(60+30*i, uint64(100+i))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Dir(st.out), 0o755); err != nil {
		t.Fatal(err)
	}
	if i == 2 {
		st.eval = filepath.Join(dir, "heldout.csv")
		if err := os.WriteFile(st.eval, []byte(siteCSV(30, 900)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st.ra = startFedAgentID(t, id, broker, filepath.Join(dir, "edge.db"), st.csv, func(c *Config) {
		c.Username, c.Password, c.ModelOut, c.EvalData = id, fedbroker.Password(id), st.out, st.eval
	})
	return st
}
