package aggregator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// A binary task over a numeric and a categorical feature (one-hot: the
// model's inputs are only known after the statistics phase).
const fedSchemaJSON = `{"task": "binary",
 "features": [{"name": "x1", "type": "numeric"}, {"name": "color", "type": "categorical"}],
 "label": {"column": "y", "classes": [{"name": "no", "values": ["0", "n"]}, {"name": "yes", "values": ["1", "y"]}]},
 "min_site_samples": 5}`

func fedSchema(t *testing.T) *schema.Schema {
	t.Helper()
	sc, err := schema.Parse([]byte(fedSchemaJSON))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// siteCSV makes a site's CSV of n rows (columns in a site-specific order,
// an extra column, a missing cell) and reads it with the schema.
func siteCSV(t *testing.T, sc *schema.Schema, id string, n int, seed uint64) *sitedata.Site {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 9))
	colors := []string{"red", "green", "blue"}
	var b strings.Builder
	order := seed % 2
	if order == 0 {
		b.WriteString("x1,color,y,note\n")
	} else {
		b.WriteString("note,y,color,x1\n")
	}
	for i := range n {
		x := rng.NormFloat64() + float64(seed)
		c := colors[rng.IntN(3)]
		y := "0"
		if x+0.5*rng.NormFloat64() > float64(seed) {
			y = "1"
		}
		xs := fmt.Sprintf("%.3f", x)
		if i == 3 {
			xs = "NA"
		}
		if order == 0 {
			fmt.Fprintf(&b, "%s,%s,%s,r%d\n", xs, c, y, i)
		} else {
			fmt.Fprintf(&b, "r%d,%s,%s,%s\n", i, y, c, xs)
		}
	}
	tab, err := sc.ReadCSV(strings.NewReader(b.String()), id+".csv")
	if err != nil {
		t.Fatal(err)
	}
	return sitedata.FromTable(sc, tab, id+".csv")
}

func (f *fixture) fedConfig(t *testing.T) ServerConfig {
	cfg := f.config()
	cfg.Schema = fedSchema(t)
	cfg.Model = model.Spec{Kind: model.KindLogReg, L2: 0.01}
	cfg.EvalEvery = 1
	cfg.Version = "test"
	return cfg
}

// fedSite is a fake agent with data.
type fedSite struct {
	*fakeAgent
	site *sitedata.Site
}

func (f *fixture) fedSite(t *testing.T, id string, seed uint64) *fedSite {
	return &fedSite{fakeAgent: f.agent(id, 30), site: siteCSV(t, fedSchema(t), id, 30, seed)}
}

func (a *fedSite) sendStats(t *testing.T, runID string) {
	t.Helper()
	st, err := a.site.Statistics()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(st)
	a.send2(t, &wire.SiteStatistics{ClientId: a.id, RunId: runID, SchemaDigest: a.site.Schema.Digest(), Stats: b, SentAtUnixMs: 1})
}

func (a *fedSite) send2(t *testing.T, m wire.Message) {
	t.Helper()
	b, err := wire.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	a.sendRaw(t, b)
}

// evaluate evaluates the announcement's global model on the site's
// held-out rows with the announcement's transform, as an agent does.
func (a *fedSite) evaluate(t *testing.T, ann *wire.RoundAnnouncement) evaluate.Report {
	t.Helper()
	var tr prep.Transform
	if err := json.Unmarshal(ann.Transform, &tr); err != nil {
		t.Fatal(err)
	}
	_, hold, err := a.site.Data(&tr)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := sitedata.ModelSpec(a.site.Schema, &tr, model.KindLogReg, 0, "", 0.01)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := sitedata.Evaluate(spec, decodeGlobal(t, ann), hold)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func (a *fedSite) sendEval(t *testing.T, ann *wire.RoundAnnouncement) evaluate.Report {
	t.Helper()
	rep := a.evaluate(t, ann)
	b, _ := json.Marshal(rep)
	a.send2(t, &wire.EvalReport{ClientId: a.id, RunId: ann.RunId, Round: uint64(ann.EvalRound), Report: b, SentAtUnixMs: 1})
	return rep
}

// nextPhase returns the next announcement of phase (and round, for
// PHASE_TRAIN and PHASE_FINISHED), skipping others.
func (a *fakeAgent) nextPhase(t *testing.T, phase wire.Phase, round uint64, withBundle bool) *wire.RoundAnnouncement {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		select {
		case r := <-a.rounds:
			if r.Phase == phase && r.Round == round && (len(r.Bundle) > 0) == withBundle {
				return r
			}
		case <-deadline:
			t.Fatalf("%s: no %v announcement of round %d (bundle %v)", a.id, phase, round, withBundle)
		}
	}
}

func wantSubject(t *testing.T, r *wire.Receipt, subject wire.ReceiptSubject, round uint64, accepted bool, code wire.ReceiptCode) {
	t.Helper()
	if r.Subject != subject || r.Round != round || r.Accepted != accepted || r.Code != code {
		t.Fatalf("receipt %v, want %v round %d accepted %v code %v", r, subject, round, accepted, code)
	}
}

// The whole schema-run path over the embedded broker: the statistics phase
// (receipted, a copy is a duplicate), the fit (model inputs from the
// one-hot levels), rounds whose announcements carry the schema and the
// transform and ask for evaluations, evaluation reports stored and
// receipted, the latest bundle, the end announced, the final reports, the
// final bundle (file, announcement, store), status and metrics; a restart
// after the end re-publishes the same final announcement.
func TestFedProtocolEndToEnd(t *testing.T) {
	f := newFixture(t)
	cfg := f.fedConfig(t)
	cfg.Rounds = 2
	evalSite := siteCSV(t, cfg.Schema, "holdout", 20, 5)
	cfg.EvalTable = evalSite.Table // --eval-data, read by the schema
	r := f.start(cfg)
	sites := []*fedSite{f.fedSite(t, "site-a", 1), f.fedSite(t, "site-b", 2), f.fedSite(t, "site-c", 3)}

	ann := sites[0].nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false)
	if !bytes.Equal(ann.Schema, cfg.Schema.Canonical()) || ann.RunId == "" || len(ann.Transform) != 0 || ann.Global != nil {
		t.Fatalf("statistics announcement %v", ann)
	}
	run := ann.RunId
	for i, s := range sites {
		s.sendStats(t, run)
		wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		if i == 0 { // a copy
			s.sendStats(t, run)
			wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
		}
	}
	// Statistics of another run, and an evaluation before any is asked.
	sites[1].sendStats(t, "another-run")
	wantSubject(t, sites[1].receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND)

	a1 := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, 1, false)
	var tr prep.Transform
	if err := json.Unmarshal(a1.Transform, &tr); err != nil || tr.Outputs != 4 { // x1 + 3 colours
		t.Fatalf("transform %s: %v", a1.Transform, err)
	}
	if a1.Model.Kind != model.KindBinaryLogReg || a1.Model.Inputs != 4 || a1.Global.Dimension != 5 || a1.Evaluate || a1.RunId != run ||
		!bytes.Equal(a1.Schema, ann.Schema) {
		t.Fatalf("round 1 announcement %v", a1)
	}
	dim := int(a1.Global.Dimension)
	var last RoundReport
	step := func(round uint64, base float64) []float64 {
		for i, s := range sites {
			v := make([]float64, dim)
			for j := range v {
				v[j] = base + float64(i+j)/4
			}
			s.send(t, update(t, s.id, round, v, 24))
			wantReceipt(t, s.receipt(t), round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		}
		last = r.round(t)
		return last.Global
	}
	x1 := step(1, 0.5)
	// --eval-data is judged with the federation's preprocessing.
	m, _ := model.New(model.Spec{Kind: model.KindBinaryLogReg, Inputs: 4, L2: 0.01})
	d := tr.Apply(evalSite.Table, nil)
	if want := m.LossGrad(x1, d, nil); last.EvalLoss != want || !(last.EvalScore >= 0) {
		t.Fatalf("--eval-data loss %v, want %v (score %v)", last.EvalLoss, want, last.EvalScore)
	}
	a2 := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, 2, false)
	if !a2.Evaluate || a2.EvalRound != 1 {
		t.Fatalf("round 2 announcement: evaluate %v eval_round %d", a2.Evaluate, a2.EvalRound)
	}
	var reps []evaluate.Report
	for i, s := range sites {
		reps = append(reps, s.sendEval(t, a2))
		wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		if i == 2 { // a copy after the last
			s.sendEval(t, a2)
			wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
		}
	}
	want, _ := evaluate.Combine(reps)
	v := waitView(t, r.s, "federated evaluation of round 1", func(v ServerView) bool { return v.Evaluation != nil && v.Evaluation.Round == 1 })
	if v.Evaluation.Federation.N != want.N || v.Evaluation.Federation.Loss != want.Loss || len(v.Evaluation.Sites) != 3 {
		t.Fatalf("federated evaluation %+v, want %+v", v.Evaluation.Federation, want)
	}
	latest, err := bundle.Read(filepath.Join(f.dir, LatestBundle))
	if err != nil || latest.Provenance.Round != 1 || latest.Evaluation == nil || latest.Evaluation.Federation.N != want.N ||
		latest.Provenance.RunID != run || latest.Model.Inputs != 4 {
		t.Fatalf("latest bundle %+v: %v", latest, err)
	}
	// An evaluation of a round nobody asked for.
	bad := *a2
	bad.EvalRound = 2
	sites[0].sendEval(t, &bad)
	wantSubject(t, sites[0].receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 2, false, wire.ReceiptCode_RECEIPT_CODE_FUTURE_ROUND)

	x := step(2, 1)
	fin := sites[0].nextPhase(t, wire.Phase_PHASE_FINISHED, 2, false)
	if !fin.Evaluate || fin.EvalRound != 2 || fin.Global == nil || len(fin.Transform) == 0 {
		t.Fatalf("finishing announcement %v", fin)
	}
	if err := closeTo(decodeGlobal(t, fin), x, 1e-6); err != nil {
		t.Fatalf("final model in the announcement: %v", err)
	}
	reps = reps[:0]
	for _, s := range sites {
		reps = append(reps, s.sendEval(t, fin))
		wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 2, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	}
	select {
	case <-r.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("not finished")
	}
	done := sites[1].nextPhase(t, wire.Phase_PHASE_FINISHED, 2, true)
	// The schema and transform went out once each on the run topic (the
	// statistics phase's spec, then the fitted one); every announcement
	// named them by digest only.
	for _, s := range sites {
		s.mu.Lock()
		inline, specs := s.inline, slices.Clone(s.specs)
		s.mu.Unlock()
		if inline != 0 || len(specs) != 2 || len(specs[0].Transform) != 0 || !bytes.Equal(specs[1].Schema, cfg.Schema.Canonical()) ||
			!bytes.Equal(specs[1].Transform, a1.Transform) || specs[1].RunId != run ||
			len(specs[0].StatisticsSites) != 0 || !slices.Equal(specs[1].StatisticsSites, []string{"site-a", "site-b", "site-c"}) {
			t.Fatalf("%s: %d announcements with bodies, run specs %v", s.id, inline, specs)
		}
	}
	fb, err := bundle.Unmarshal(done.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	want, _ = evaluate.Combine(reps)
	if fb.Provenance.Round != 2 || fb.Evaluation == nil || fb.Evaluation.Round != 2 || fb.Evaluation.Federation.N != want.N ||
		len(fb.Evaluation.Sites) != 3 || !slices.Equal(fb.Model.Params, x) || fb.Provenance.EdgeflVersion != "test" {
		t.Fatalf("final bundle %+v", fb)
	}
	onDisk, err := os.ReadFile(filepath.Join(f.dir, FinalBundle))
	if err != nil || !bytes.Equal(onDisk, done.Bundle) {
		t.Fatalf("final.bundle.json: %v (equal %v)", err, bytes.Equal(onDisk, done.Bundle))
	}
	st, err := ReadStatus(r.s.store)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != coordinator.PhaseFinished || st.Schema != cfg.Schema.Digest() || len(st.StatisticsSites) != 3 || st.Evaluation == nil ||
		st.Evaluation.Round != 2 || st.StopReason != coordinator.StopRounds || st.FinalBundle == nil || st.FinalBundle.Digest != fb.Digest ||
		st.Model == nil || st.Model.Inputs != 4 {
		t.Fatalf("status %+v", st)
	}
	// The figures that do not mislead: next to each accuracy the
	// balanced accuracy and the majority-class baseline of the same rows,
	// in the console's data (/status) and the bundle; a model that does
	// not beat its baseline is marked.
	live, err := r.s.LiveStatus(-1, -1)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(live)
	var doc struct {
		Evaluation struct {
			Federation struct {
				BalancedAccuracy *float64           `json:"balanced_accuracy"`
				Baseline         *evaluate.Baseline `json:"baseline"`
			} `json:"federation"`
			Sites map[string]struct {
				Accuracy float64            `json:"accuracy"`
				Baseline *evaluate.Baseline `json:"baseline"`
			} `json:"sites"`
		} `json:"evaluation"`
		Clients []struct {
			ID       string `json:"id"`
			LastEval *struct {
				Score            *float64 `json:"score"`
				BalancedAccuracy *float64 `json:"balanced_accuracy"`
				Baseline         *float64 `json:"baseline"`
				BelowBaseline    bool     `json:"below_baseline"`
			} `json:"last_eval"`
		} `json:"clients"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	majority := func(r evaluate.Report) float64 {
		best, n := int64(0), int64(0)
		for _, row := range r.Confusion {
			var s int64
			for _, c := range row {
				s += c
			}
			best, n = max(best, s), n+s
		}
		return float64(best) / float64(n)
	}
	fedDoc := doc.Evaluation.Federation
	if fedDoc.BalancedAccuracy == nil || fedDoc.Baseline == nil || fedDoc.Baseline.Rule != evaluate.BaselineMajority ||
		fedDoc.Baseline.Accuracy != majority(want) || fedDoc.Baseline.Beaten != (want.Accuracy > majority(want)) {
		t.Fatalf("the federation's figures in /status: %s", raw)
	}
	for i, s := range sites {
		got, rep := doc.Evaluation.Sites[s.id], reps[i]
		if got.Baseline == nil || got.Baseline.Accuracy != majority(rep) || got.Baseline.Beaten != (rep.Accuracy > majority(rep)) {
			t.Fatalf("%s's baseline in /status %+v, its report %+v", s.id, got.Baseline, rep)
		}
	}
	for _, c := range doc.Clients {
		e := c.LastEval
		if e == nil || e.Score == nil || e.BalancedAccuracy == nil || e.Baseline == nil {
			t.Fatalf("%s's last evaluation in the console's data lacks figures: %s", c.ID, raw)
		}
		if e.BelowBaseline != (*e.Score <= *e.Baseline) {
			t.Fatalf("%s: accuracy %v, baseline %v, below_baseline %v", c.ID, *e.Score, *e.Baseline, e.BelowBaseline)
		}
	}
	if b := fb.Evaluation.Federation.Baseline; b == nil || b.Accuracy != majority(want) {
		t.Fatalf("the bundle's federation baseline %+v", b)
	}
	for id, rep := range fb.Evaluation.Sites {
		if rep.Baseline == nil {
			t.Fatalf("the bundle's %s has no baseline", id)
		}
	}
	met := metricsText(t, r.s)
	for _, line := range []string{
		`edgefl_aggregator_eval_baseline_accuracy`, `edgefl_aggregator_site_eval_baseline_accuracy{site="site-a"}`,
		`edgefl_aggregator_site_eval_below_baseline{site="site-c"}`, `edgefl_aggregator_site_eval_balanced_accuracy{site="site-b"}`,
		`edgefl_aggregator_eval_round 2`, `edgefl_aggregator_eval_sites 3`, `edgefl_aggregator_statistics_sites 3`,
		`edgefl_aggregator_statistics_total{result="duplicate"} 1`, `edgefl_aggregator_evaluations_total{result="stored"} 6`,
		`edgefl_aggregator_site_eval_accuracy{site="site-b"}`, `edgefl_aggregator_eval_auc`, `edgefl_aggregator_eval_data_loss`, `edgefl_aggregator_phase{phase="finished"} 1`,
	} {
		if !strings.Contains(met, line) {
			t.Errorf("metrics lack %q", line)
		}
	}

	// A restart after the end: the same final announcement, bundle and all.
	r.stop(t)
	r2 := f.start(cfg)
	select {
	case <-r2.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("restarted server not finished")
	}
	again := sites[2].nextPhase(t, wire.Phase_PHASE_FINISHED, 2, true)
	if !bytes.Equal(again.Bundle, done.Bundle) {
		t.Fatal("the bundle changed across a restart")
	}
	if v := waitView(t, r2.s, "evaluation after restart", func(v ServerView) bool { return v.Evaluation != nil }); v.Evaluation.Round != 2 {
		t.Fatalf("evaluation after restart %+v", v.Evaluation)
	}
}

func metricsText(t *testing.T, s *Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// trainRound has every site send an update of round and waits for the
// aggregation; it returns the new global model.
func trainRound(t *testing.T, r *running, sites []*fedSite, ann *wire.RoundAnnouncement, base float64) []float64 {
	t.Helper()
	dim := int(ann.Global.Dimension)
	for i, s := range sites {
		v := make([]float64, dim)
		for j := range v {
			v[j] = base + float64(i+j)/4
		}
		s.send(t, update(t, s.id, ann.Round, v, 24))
		wantReceipt(t, s.receipt(t), ann.Round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	}
	return r.round(t).Global
}

// The statistics phase closes at its deadline with a quorum; a restart
// during it keeps the statistics stored (a copy is a duplicate) and the
// deadline; an update before round 1 is for a future round. A restart
// after the fit announces the same transform and initial model.
func TestFedStatisticsDeadlineAndRestarts(t *testing.T) {
	f := newFixture(t)
	cfg := f.fedConfig(t)
	cfg.QuorumFraction = 2.0 / 3
	r := f.start(cfg)
	a, b := f.fedSite(t, "site-a", 1), f.fedSite(t, "site-b", 2)
	ann := a.nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false)
	if ann.DeadlineUnixMs != start0.Add(time.Minute).UnixMilli() {
		t.Fatalf("deadline %d", ann.DeadlineUnixMs)
	}
	a.sendStats(t, ann.RunId)
	wantSubject(t, a.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	wantReceipt(t, a.receipt(t), 1, false, wire.ReceiptCode_RECEIPT_CODE_FUTURE_ROUND)

	r.stop(t)
	r = f.start(cfg)
	again := b.nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false)
	if again.RunId != ann.RunId || again.DeadlineUnixMs != ann.DeadlineUnixMs {
		t.Fatalf("statistics announcement after a restart %v", again)
	}
	a.sendStats(t, ann.RunId)
	// The server acknowledges a message to the broker after answering it,
	// so a stop right after the FUTURE_ROUND receipt can leave the update
	// unacknowledged: the broker then redelivers it to the new server,
	// which answers it again (at-least-once, as designed).
	rc := a.receipt(t)
	if rc.Subject == wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE && rc.Code == wire.ReceiptCode_RECEIPT_CODE_FUTURE_ROUND {
		rc = a.receipt(t)
	}
	wantSubject(t, rc, wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	b.sendStats(t, ann.RunId)
	wantSubject(t, b.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	waitView(t, r.s, "two statistics sites", func(v ServerView) bool { return len(v.StatsSites) == 2 && v.Phase == coordinator.PhaseStatistics })

	f.clock.Advance(time.Minute) // the deadline, with a quorum of 2
	a1 := a.nextPhase(t, wire.Phase_PHASE_TRAIN, 1, false)
	if len(a1.Selected) != 2 || len(a1.Transform) == 0 {
		t.Fatalf("round 1 %v", a1)
	}
	// A third site's statistics come too late.
	c := f.fedSite(t, "site-c", 3)
	c.sendStats(t, ann.RunId)
	wantSubject(t, c.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND)

	r.stop(t)
	r = f.start(cfg)
	a1again := b.nextPhase(t, wire.Phase_PHASE_TRAIN, 1, false)
	if !bytes.Equal(a1again.Transform, a1.Transform) || !bytes.Equal(a1again.Global.Payload, a1.Global.Payload) ||
		a1again.Global.Dimension != a1.Global.Dimension || !slices.Equal(a1again.Selected, a1.Selected) {
		t.Fatalf("round 1 after a restart differs:\n%v\n%v", a1again, a1)
	}
	st, err := ReadStatus(r.s.store)
	if err != nil || !slices.Equal(st.StatisticsSites, []string{"site-a", "site-b"}) || st.Model == nil || st.Model.Inputs != 4 {
		t.Fatalf("status %+v %v", st, err)
	}
}

// A kill during the finishing phase: the restarted aggregator announces
// the end again and keeps waiting for the final reports it lacks; at the
// deadline it finishes with those it has. Export makes the bundle of any
// stored round, and refuses a round that is not stored in one line.
func TestFedFinishingRestartTimeoutAndExport(t *testing.T) {
	f := newFixture(t)
	cfg := f.fedConfig(t)
	cfg.Rounds, cfg.EvalEvery = 1, 0
	r := f.start(cfg)
	sites := []*fedSite{f.fedSite(t, "site-a", 1), f.fedSite(t, "site-b", 2), f.fedSite(t, "site-c", 3)}
	ann := sites[0].nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false)
	for _, s := range sites {
		s.sendStats(t, ann.RunId)
		s.receipt(t)
	}
	a1 := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, 1, false)
	x := trainRound(t, r, sites, a1, 0.25)
	fin := sites[0].nextPhase(t, wire.Phase_PHASE_FINISHED, 1, false)
	if fin.DeadlineUnixMs != f.clock.Now().Add(time.Minute).UnixMilli() {
		t.Fatalf("finishing deadline %d", fin.DeadlineUnixMs)
	}
	sites[0].sendEval(t, fin)
	wantSubject(t, sites[0].receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)

	r.stop(t)
	r = f.start(cfg)
	again := sites[1].nextPhase(t, wire.Phase_PHASE_FINISHED, 1, false)
	if again.DeadlineUnixMs != fin.DeadlineUnixMs || !again.Evaluate {
		t.Fatalf("finishing announcement after a restart %v", again)
	}
	select {
	case <-r.s.Finished():
		t.Fatal("finished before the final reports or the deadline")
	default:
	}
	sites[1].sendEval(t, again)
	wantSubject(t, sites[1].receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	waitView(t, r.s, "second final report", func(v ServerView) bool { return v.EvalsStored["stored"] == 1 })
	f.clock.Advance(time.Minute)
	select {
	case <-r.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("not finished at the deadline")
	}
	done := sites[2].nextPhase(t, wire.Phase_PHASE_FINISHED, 1, true)
	fb, err := bundle.Unmarshal(done.Bundle)
	if err != nil || fb.Evaluation == nil || len(fb.Evaluation.Sites) != 2 || !slices.Equal(fb.Model.Params, x) {
		t.Fatalf("final bundle %+v: %v", fb, err)
	}
	// A late final report is still stored and receipted; the status keeps
	// the final bundle's evaluation (an earlier round's late report
	// completes that round: TestFedLateEvaluationOfAnEarlierRound).
	sites[2].sendEval(t, done)
	wantSubject(t, sites[2].receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	if v, _ := r.s.Watch(); v.Evaluation == nil || len(v.Evaluation.Sites) != 2 {
		t.Fatalf("the status's evaluation after a late final report %+v, want the final bundle's two sites", v.Evaluation)
	}

	// Export: round 0 (the initial model, no evaluation), round 1 (the
	// final model with the three reports now stored), the default (the
	// stored final bundle), a round that is not stored.
	raw, n, err := ExportBundle(r.s.store, 0, f.clock.Now(), "test")
	if b0, uerr := bundle.Unmarshal(raw); err != nil || uerr != nil || n != 0 || b0.Evaluation != nil || !slices.Equal(b0.Model.Params, make([]float64, 5)) {
		t.Fatalf("export of round 0: %v %v", err, uerr)
	}
	raw, _, err = ExportBundle(r.s.store, 1, f.clock.Now(), "test")
	if b1, uerr := bundle.Unmarshal(raw); err != nil || uerr != nil || b1.Evaluation == nil || len(b1.Evaluation.Sites) != 3 || !slices.Equal(b1.Model.Params, x) {
		t.Fatalf("export of round 1: %v %v", err, uerr)
	}
	if raw, _, err = ExportBundle(r.s.store, -1, f.clock.Now(), "test"); err != nil || !bytes.Equal(raw, done.Bundle) {
		t.Fatalf("default export is not the final bundle: %v", err)
	}
	_, _, err = ExportBundle(r.s.store, 7, f.clock.Now(), "test")
	if !errors.Is(err, ErrNotStored) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "round 7 is not stored") {
		t.Fatalf("export of round 7: %v", err)
	}
	for q, code := range map[string]int{"?round=1": 200, "?round=7": 404, "?round=x": 400, "": 200} {
		rec := httptest.NewRecorder()
		r.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/bundle"+q, nil))
		if rec.Code != code {
			t.Errorf("GET /bundle%s: %d %s", q, rec.Code, rec.Body)
		}
	}
}

// The stopping rules end a run before --rounds: the delta rule on the
// model's change, the patience rule on the federated evaluation loss.
func TestFedStoppingRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    func(*ServerConfig)
		rounds uint64 // when the run ends
		reason string
	}{
		{"delta", func(c *ServerConfig) { c.StopDelta = 10 }, 2, coordinator.StopDelta},                         // round 1 starts from zeros: no change measured
		{"patience", func(c *ServerConfig) { c.StopPatience, c.StopTol = 1, 1e9 }, 3, coordinator.StopPatience}, // eval 1 is the best, eval 2 does not beat it by 1e9
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			cfg := f.fedConfig(t)
			cfg.Rounds = 10
			tc.set(&cfg)
			r := f.start(cfg)
			sites := []*fedSite{f.fedSite(t, "site-a", 1), f.fedSite(t, "site-b", 2), f.fedSite(t, "site-c", 3)}
			ann := sites[0].nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false)
			for _, s := range sites {
				s.sendStats(t, ann.RunId)
				s.receipt(t)
			}
			for round := uint64(1); round <= tc.rounds; round++ {
				a := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, round, false)
				if a.Evaluate {
					for _, s := range sites {
						s.sendEval(t, a)
						s.receipt(t)
					}
				}
				trainRound(t, r, sites, a, float64(round))
			}
			fin := sites[0].nextPhase(t, wire.Phase_PHASE_FINISHED, tc.rounds, false)
			if fin.EvalRound != uint32(tc.rounds) {
				t.Fatalf("finishing %v", fin)
			}
			v := waitView(t, r.s, "stop reason", func(v ServerView) bool { return v.StopReason != "" })
			if v.StopReason != tc.reason || v.Phase != coordinator.PhaseFinishing {
				t.Fatalf("stopped by %q in %s", v.StopReason, v.Phase)
			}
		})
	}
}

// A site's error status is shown in status, counted per site and reason
// when it changes, and cleared by a status without one.
func TestFedSiteErrors(t *testing.T) {
	f := newFixture(t)
	r := f.start(f.config()) // site errors need no schema
	a := f.agent("site-a", 0)
	topic, _ := a.topics.Status("site-a")
	conn := uint64(0)
	send := func(reason, msg string) {
		// Numbered as new connections: the ingest workers may hand
		// statuses to the loop in any order, the newest wins.
		conn++
		b, _ := wire.Encode(&wire.ClientStatus{ClientId: "site-a", Online: true, SampleCount: 10, ErrorReason: reason, ErrorMessage: msg, Connection: conn})
		a.pub(t, topic, true, b)
	}
	const m1 = `site-a.csv: line 1: no column "age" (expected by the schema)`
	send(wire.SiteErrSchema, m1)
	waitView(t, r.s, "one error", func(v ServerView) bool { return v.SiteErrors["site-a/schema_mismatch"] == 1 })
	send(wire.SiteErrSchema, m1) // the same error again: not a change
	send(wire.SiteErrBadValue, "site-a.csv: line 7, column \"age\": expected a number")
	waitView(t, r.s, "changed error", func(v ServerView) bool { return v.SiteErrors["site-a/bad_value"] == 1 })
	if v, _ := r.s.Watch(); v.SiteErrors["site-a/schema_mismatch"] != 1 {
		t.Fatalf("site errors %v", v.SiteErrors)
	}
	st, err := ReadStatus(r.s.store)
	if err != nil || len(st.Clients) != 1 || st.Clients[0].Error == nil || st.Clients[0].Error.Reason != wire.SiteErrBadValue {
		t.Fatalf("status %+v %v", st, err)
	}
	if met := metricsText(t, r.s); !strings.Contains(met, `edgefl_aggregator_site_errors_total{site="site-a",reason="bad_value"} 1`) {
		t.Fatalf("metrics:\n%s", met)
	}
	send("", "") // no error
	waitView(t, r.s, "the error cleared", func(ServerView) bool {
		st, err := ReadStatus(r.s.store)
		return err == nil && st.Clients[0].Error == nil
	})
}

// The schema's digest is part of the run's identity: a state file is
// resumed only with the same schema, and the refusal names both digests.
func TestFedSchemaIdentity(t *testing.T) {
	f := newFixture(t)
	cfg := f.fedConfig(t)
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	other, err := schema.Parse([]byte(strings.Replace(fedSchemaJSON, `"min_site_samples": 5`, `"min_site_samples": 6`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []*schema.Schema{other, nil} {
		c := cfg
		c.Schema = sc
		if sc == nil {
			c.Model = testModel
		}
		_, err := NewServer(c)
		want := "(none)"
		if sc != nil {
			want = sc.Digest()
		}
		if err == nil || !strings.Contains(err.Error(), cfg.Schema.Digest()) || !strings.Contains(err.Error(), want) {
			t.Fatalf("resuming with schema %v: %v", sc != nil, err)
		}
	}
	c := cfg // the same schema resumes
	if s, err = NewServer(c); err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// TestFedLateEvaluationOfAnEarlierRound: a site's evaluation report of
// round r-1 travels separately from its round-r update (the ingest workers
// may store the update first), so with rounds drawn back to back it can
// arrive once the run has moved on: here site-a's report of round 2 comes
// after round 3 closed, while the final evaluation is awaited or once the
// run has finished. It is stored under its own round, and round 2's
// evaluation is complete with it in the history the console and the demo
// read (it had the other two sites' reports only).
func TestFedLateEvaluationOfAnEarlierRound(t *testing.T) {
	for _, afterFinish := range []bool{false, true} {
		t.Run(fmt.Sprintf("after_finish=%v", afterFinish), func(t *testing.T) {
			f := newFixture(t)
			cfg := f.fedConfig(t)
			cfg.Rounds = 3
			r := f.start(cfg)
			sites := []*fedSite{f.fedSite(t, "site-a", 1), f.fedSite(t, "site-b", 2), f.fedSite(t, "site-c", 3)}
			run := sites[0].nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false).RunId
			for _, s := range sites {
				s.sendStats(t, run)
				wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
			}
			late := lateEvalRounds(t, r, sites)
			sendLate := func() {
				sites[0].sendEval(t, late)
				wantSubject(t, sites[0].receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 2, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
			}
			fin := sites[0].nextPhase(t, wire.Phase_PHASE_FINISHED, 3, false)
			if !afterFinish {
				sendLate()
			}
			for _, s := range sites {
				s.sendEval(t, fin)
				wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 3, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
			}
			select {
			case <-r.s.Finished():
			case <-time.After(waitLong):
				t.Fatal("not finished")
			}
			if afterFinish {
				sendLate()
			}
			live, err := r.s.LiveStatus(-1, -1)
			if err != nil {
				t.Fatal(err)
			}
			got := map[int]int{}
			for _, e := range live.Live.Evaluations {
				got[e.Round] = len(e.Sites)
			}
			for round := 1; round <= 3; round++ {
				if got[round] != len(sites) {
					t.Errorf("the history's evaluation of round %d has %d sites, want %d (history %v)", round, got[round], len(sites), got)
				}
			}
			if v, _ := r.s.Watch(); v.Evaluation == nil || v.Evaluation.Round != 3 || len(v.Evaluation.Sites) != len(sites) {
				t.Errorf("the status's evaluation %+v, want the final round's", v.Evaluation)
			}
		})
	}
}

// lateEvalRounds runs rounds 1-3 of sites with every evaluation asked for
// sent before the site's update, except site-a's of round 2, whose
// announcement it returns.
func lateEvalRounds(t *testing.T, r *running, sites []*fedSite) (late *wire.RoundAnnouncement) {
	t.Helper()
	for round := uint64(1); round <= 3; round++ {
		ann := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, round, false)
		for i, s := range sites {
			switch {
			case !ann.Evaluate:
			case round == 3 && i == 0:
				late = ann
			default:
				s.sendEval(t, ann)
				wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, round-1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
			}
			v := make([]float64, ann.Global.Dimension)
			for j := range v {
				v[j] = float64(round) + float64(i+j)/4
			}
			s.send(t, update(t, s.id, round, v, 24))
			wantReceipt(t, s.receipt(t), round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		}
		r.round(t)
	}
	return late
}
