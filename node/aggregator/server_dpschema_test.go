package aggregator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// fedSchemaJSON with its preprocessing declared (what --dp needs).
const declaredSchemaJSON = `{"task": "binary",
 "features": [{"name": "x1", "type": "numeric", "center": 2, "scale": 1.5},
              {"name": "color", "type": "categorical", "levels": ["red", "green", "blue"]}],
 "label": {"column": "y", "classes": [{"name": "no", "values": ["0", "n"]}, {"name": "yes", "values": ["1", "y"]}]},
 "min_site_samples": 5}`

func (f *fixture) dpFedConfig(t *testing.T) ServerConfig {
	t.Helper()
	cfg := f.fedConfig(t)
	sc, err := schema.Parse([]byte(declaredSchemaJSON))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Schema = sc
	cfg.DP = &dp.Config{Clip: 0.5, Noise: 1.3, Delta: 1e-5}
	key := dp.TestKey(11)
	cfg.DPTestKey = &key
	return cfg
}

// deltaUpdate is a site's update w - x under DP (the aggregator re-clips it).
func deltaUpdate(t *testing.T, id string, round uint64, delta []float64) *wire.ClientUpdate {
	u := update(t, id, round, delta, 24)
	u.Kind = wire.UpdateKind_UPDATE_KIND_DELTA
	u.Report.AnchorLoss = 0
	return u
}

func dpTrainRound(t *testing.T, r *running, sites []*fedSite, ann *wire.RoundAnnouncement) []float64 {
	t.Helper()
	for i, s := range sites {
		v := make([]float64, ann.Global.Dimension)
		for j := range v {
			v[j] = float64(i+j)/8 - 0.25
		}
		s.send(t, deltaUpdate(t, s.id, ann.Round, v))
		wantReceipt(t, s.receipt(t), ann.Round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	}
	return r.round(t).Global
}

// TestFedDPDeclaredSchema is central differential privacy with a federation schema over
// the embedded broker: the schema declares its preprocessing, so round 1
// is announced at once with that transform (no statistics phase; a site's
// statistics are refused as stale); the sites' evaluation reports reach
// the aggregator, whose operator sees them (status), but no bundle carries
// them: the latest, the final and the exported bundles hold no evaluation
// and no per-site value, and record the privacy guarantee at their round,
// the accountant's epsilon after that many rounds; across a restart.
func TestFedDPDeclaredSchema(t *testing.T) {
	f := newFixture(t)
	cfg := f.dpFedConfig(t)
	cfg.Rounds = 2
	r := f.start(cfg)
	var sites []*fedSite
	for i, id := range []string{"site-a", "site-b", "site-c"} {
		sites = append(sites, &fedSite{fakeAgent: f.agent(id, 30), site: siteCSV(t, cfg.Schema, id, 30, uint64(i+1))})
	}

	a1 := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, 1, false)
	want, err := prep.Declared(cfg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	wantTr, _ := json.Marshal(want)
	if !bytes.Equal(a1.Transform, wantTr) || a1.Dp == nil || a1.Dp.ClipNorm != 0.5 || a1.Global.Dimension != 5 || a1.Evaluate {
		t.Fatalf("round 1 announcement: transform %s (want %s), dp %v", a1.Transform, wantTr, a1.Dp)
	}
	sites[0].sendStats(t, a1.RunId)
	wantSubject(t, sites[0].receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND)

	x1 := dpTrainRound(t, r, sites, a1)
	// A restart: the declared fit, the noise key and the accountant come
	// back from the state file.
	r.stop(t)
	r = f.start(cfg)
	a2 := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, 2, false)
	if !bytes.Equal(a2.Transform, a1.Transform) || !slices.Equal(decodeGlobal(t, a2), x1) {
		t.Fatal("the restarted aggregator announces another transform or model")
	}
	if !a2.Evaluate || a2.EvalRound != 1 || a2.Dp.EpsilonSpent != dp.EpsilonAfter(1, 1.3, 1, 1e-5, nil) {
		t.Fatalf("round 2 announcement: evaluate %v round %d, dp %v", a2.Evaluate, a2.EvalRound, a2.Dp)
	}
	var reps []evaluate.Report
	for _, s := range sites {
		reps = append(reps, s.sendEval(t, a2))
		wantSubject(t, s.answer(t, wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	}
	// The operator (trusted in central mode) sees the sites' figures.
	v := waitView(t, r.s, "the evaluation of round 1", func(v ServerView) bool { return v.Evaluation != nil && v.Evaluation.Round == 1 })
	if len(v.Evaluation.Sites) != 3 {
		t.Fatalf("operator's evaluation %+v", v.Evaluation)
	}
	// The view is updated before the latest bundle is written: poll for it.
	var latest *bundle.Bundle
	for deadline := time.Now().Add(waitLong); ; {
		if latest, err = bundle.Read(f.dir + "/" + LatestBundle); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	wantPrivacy(t, "latest bundle", latest, 1, slices.Clone(x1))

	x2 := dpTrainRound(t, r, sites, a2)
	fin := sites[0].nextPhase(t, wire.Phase_PHASE_FINISHED, 2, false)
	for _, s := range sites {
		reps = append(reps, s.sendEval(t, fin))
		s.receipt(t)
	}
	select {
	case <-r.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("not finished")
	}
	done := sites[1].nextPhase(t, wire.Phase_PHASE_FINISHED, 2, true)
	fb, err := bundle.Unmarshal(done.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	wantPrivacy(t, "final bundle", fb, 2, x2)
	if eps, _, _ := r.s.coord.Privacy(); fb.Privacy.Epsilon != eps {
		t.Fatalf("final bundle's epsilon %v, the accountant's %v", fb.Privacy.Epsilon, eps)
	}
	noSiteValues(t, "final bundle", done.Bundle, sites, reps)

	// Export: round 1 has round 1's guarantee, the default is the final bundle.
	raw, _, err := ExportBundle(r.s.store, 1, f.clock.Now(), "test")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := bundle.Unmarshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	wantPrivacy(t, "export of round 1", b1, 1, x1)
	if b1.Privacy.Epsilon != latest.Privacy.Epsilon {
		t.Fatalf("export of round 1: epsilon %v, the latest bundle of round 1 said %v", b1.Privacy.Epsilon, latest.Privacy.Epsilon)
	}
	noSiteValues(t, "export of round 1", raw, sites, reps)
	if raw, _, err = ExportBundle(r.s.store, -1, f.clock.Now(), "test"); err != nil || !bytes.Equal(raw, done.Bundle) {
		t.Fatalf("default export is not the final bundle: %v", err)
	}
	// The console shows the operator the epsilon spent.
	rec := httptest.NewRecorder()
	r.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if want := fmt.Sprintf("central: epsilon %.4g at delta 1e-05 after 2 rounds", fb.Privacy.Epsilon); rec.Code != 200 || !strings.Contains(rec.Body.String(), want) {
		t.Errorf("console: %d, lacks %q", rec.Code, want)
	}
	st, err := ReadStatus(r.s.store)
	if err != nil || st.Privacy == nil || st.Privacy.Epsilon != fb.Privacy.Epsilon || st.Evaluation == nil || len(st.StatisticsSites) != 0 {
		t.Fatalf("status %+v: %v", st, err)
	}
}

func wantPrivacy(t *testing.T, what string, b *bundle.Bundle, rounds int, x []float64) {
	t.Helper()
	p := b.Privacy
	if p == nil || b.Version != 2 || b.Evaluation != nil {
		t.Fatalf("%s: version %d, privacy %+v, evaluation %+v", what, b.Version, p, b.Evaluation)
	}
	eps := dp.EpsilonAfter(1, 1.3, rounds, 1e-5, nil)
	if p.Rounds != rounds || p.Epsilon != eps || p.ClipNorm != 0.5 || p.NoiseMultiplier != 1.3 || p.Delta != 1e-5 ||
		!slices.Equal(p.SamplingRates, []dp.Rate{{Q: 1, Noise: 1.3, Rounds: uint64(rounds)}}) || b.Provenance.Round != rounds {
		t.Fatalf("%s: privacy %+v, want %d rounds at q = 1, epsilon %v", what, p, rounds, eps)
	}
	if !slices.Equal(b.Model.Params, x) {
		t.Fatalf("%s: weights %v, want %v", what, b.Model.Params, x)
	}
}

// noSiteValues: a --dp bundle names no site and carries none of the
// figures of any site's evaluation report.
func noSiteValues(t *testing.T, what string, raw []byte, sites []*fedSite, reps []evaluate.Report) {
	t.Helper()
	for _, s := range sites {
		if bytes.Contains(raw, []byte(s.id)) {
			t.Errorf("%s names %s", what, s.id)
		}
	}
	for _, r := range reps {
		for _, v := range []float64{r.Loss, r.BalancedAccuracy, r.Accuracy} {
			// Short figures (0.5, 0.75) also spell parameters: look for
			// the distinctive ones.
			if s := strconv.FormatFloat(v, 'g', -1, 64); len(s) >= 8 && bytes.Contains(raw, []byte(s)) {
				t.Errorf("%s holds a site's evaluation figure %s", what, s)
			}
		}
	}
	if bytes.Contains(raw, []byte(`"evaluation"`)) || bytes.Contains(raw, []byte(`"confusion"`)) {
		t.Errorf("%s holds an evaluation", what)
	}
}

// Refusals of --dp with a schema: a schema that does not declare its
// preprocessing (its statistics phase is outside the guarantee), and the
// patience rule (the run's length would follow the sites' losses).
func TestFedDPRefusals(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		name string
		edit func(*ServerConfig)
		want string
	}{
		{"undeclared schema", func(c *ServerConfig) { c.Schema = fedSchema(t) }, "does not declare its preprocessing"},
		{"patience", func(c *ServerConfig) { c.StopPatience = 2 }, "patience rule"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := f.dpFedConfig(t)
			c.edit(&cfg)
			_, err := NewServer(cfg)
			if !errors.Is(err, coordinator.ErrConfig) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("NewServer: %v, want %q", err, c.want)
			}
		})
	}
	// --stop-delta watches the released models only: allowed.
	cfg := f.dpFedConfig(t)
	cfg.StopDelta = 1e-3
	if err := cfg.Validate(); err != nil {
		t.Fatalf("--stop-delta under DP: %v", err)
	}
}
