package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

const (
	fedRun = "run-0001"
	// fedSecret is a cell value of an extra column: it must never reach
	// the aggregator.
	fedSecret = "patient-secret-771"
)

// fedSchemaJSON: binary task, features in another order than the CSV's
// columns, labels M/B.
const fedSchemaJSON = `{"task": "binary",
  "features": [{"name": "size", "type": "numeric"}, {"name": "colour", "type": "categorical"}, {"name": "age", "type": "numeric"}],
  "label": {"column": "dx", "classes": [{"name": "benign", "values": ["B"]}, {"name": "malignant", "values": ["M"]}]},
  "min_site_samples": 10}`

// siteCSV is a learnable site CSV of n rows, deterministic in seed, with
// the schema's columns in another order, an id column and a free-text
// column the schema does not use, and some missing cells.
func siteCSV(n int, seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 11))
	var b strings.Builder
	b.WriteString("id,age,dx,note,colour,size\n")
	colours := []string{"red", "green", "blue"}
	for i := range n {
		size := 50 + 10*rng.NormFloat64()
		age := 20 + 60*rng.Float64()
		c := rng.IntN(3)
		dx := "B"
		if size+0.1*age+3*float64(c)+4*rng.NormFloat64() > 58 {
			dx = "M"
		}
		col := colours[c]
		if i%11 == 3 {
			col = "NA"
		}
		ageS := fmt.Sprintf("%.1f", age)
		if i%13 == 5 {
			ageS = "?"
		}
		fmt.Fprintf(&b, "%d,%s,%s,%s,%s,%.2f\n", 1000+i, ageS, dx, fedSecret, col, size)
	}
	return b.String()
}

// fedFixture is a site's CSV, the schema, and what the aggregator would
// announce for a one-site federation: the transform fitted from this
// site's statistics, the model spec and a global model.
type fedFixture struct {
	dir     string
	csv     string
	s       *schema.Schema
	site    *sitedata.Site
	stats   *prep.Stats
	tr      *prep.Transform
	trRaw   []byte
	spec    model.Spec
	train   model.Data
	holdout model.Data
}

func newFedFixture(t testing.TB, rows int) *fedFixture {
	t.Helper()
	return newFedFixtureOf(t, rows, fedSchemaJSON)
}

// newFedFixtureOf is newFedFixture with another schema for the same CSV.
func newFedFixtureOf(t testing.TB, rows int, schemaJSON string) *fedFixture {
	t.Helper()
	f := &fedFixture{dir: t.TempDir()}
	f.csv = filepath.Join(f.dir, "site.csv")
	if err := os.WriteFile(f.csv, []byte(siteCSV(rows, 5)), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.s, err = schema.Parse([]byte(schemaJSON)); err != nil {
		t.Fatal(err)
	}
	if f.site, err = sitedata.Load(f.s, f.csv); err != nil {
		t.Fatal(err)
	}
	if f.stats, err = f.site.Statistics(); err != nil {
		t.Fatal(err)
	}
	if f.tr, err = sitedata.Fit(f.s, f.stats); err != nil {
		t.Fatal(err)
	}
	if f.trRaw, err = json.Marshal(f.tr); err != nil {
		t.Fatal(err)
	}
	if f.spec, err = sitedata.ModelSpec(f.s, f.tr, model.KindLogReg, 0, "", 1e-3); err != nil {
		t.Fatal(err)
	}
	if f.train, f.holdout, err = f.site.Data(f.tr); err != nil {
		t.Fatal(err)
	}
	if f.holdout.N == 0 || f.train.N < 20 {
		t.Fatalf("fixture: %d training and %d held-out rows", f.train.N, f.holdout.N)
	}
	return f
}

func (f *fedFixture) dim(t testing.TB) int {
	m, err := model.New(f.spec)
	if err != nil {
		t.Fatal(err)
	}
	return m.NumParams()
}

// global is a model of the fixture's spec, as fp32 carries it.
func (f *fedFixture) global(t testing.TB, round uint64) []float64 {
	x := make([]float64, f.dim(t))
	for i := range x {
		x[i] = 0.05 * float64((int(round)+i)%7-3)
	}
	return f32(x)
}

func (f *fedFixture) statsAnn(run string) *wire.RoundAnnouncement {
	return &wire.RoundAnnouncement{Federation: testFed, Phase: wire.Phase_PHASE_STATISTICS, RunId: run, Schema: f.s.Canonical()}
}

func (f *fedFixture) trainAnn(t testing.TB, run string, round uint64, x []float64) *wire.RoundAnnouncement {
	t.Helper()
	return &wire.RoundAnnouncement{
		Federation: testFed, Round: round, Algorithm: AlgoFedProx, RunId: run,
		Params:      &wire.Params{Mu: 0.1, Solver: proxsolver.LBFGS, Gamma: 1e-4},
		Model:       &wire.ModelSpec{Kind: f.spec.Kind, Inputs: uint32(f.spec.Inputs), Classes: uint32(f.spec.Classes), L2: f.spec.L2},
		Budget:      &wire.WorkBudget{MaxEpochs: 30},
		Global:      &wire.Vector{Codec: "fp32", Dimension: uint32(len(x)), Payload: frame(t, "", x)},
		UplinkCodec: "fp32", Schema: f.s.Canonical(), Transform: f.trRaw,
	}
}

func (f *fedFixture) finishedAnn(t testing.TB, run string, rounds uint64, x []float64, b []byte) *wire.RoundAnnouncement {
	t.Helper()
	ann := f.trainAnn(t, run, rounds, x)
	ann.Phase, ann.Evaluate, ann.EvalRound, ann.Bundle, ann.UplinkCodec = wire.Phase_PHASE_FINISHED, true, uint32(rounds), b, ""
	return ann
}

// bundleOf is the final bundle the aggregator would send with model x.
func (f *fedFixture) bundleOf(t testing.TB, run string, rounds int, x []float64) []byte {
	t.Helper()
	m, err := model.New(f.spec)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := sitedata.Evaluate(f.spec, x, f.holdout)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle.Bundle{Model: model.Saved{Spec: m.Spec(), Layout: m.Layout(), Params: x}, Schema: f.s, Transform: f.tr,
		Evaluation: &bundle.Evaluation{Round: rounds, Federation: rep, Sites: map[string]evaluate.Report{testSite: rep}},
		Provenance: bundle.Provenance{Federation: testFed, RunID: run, Round: rounds, Algorithm: AlgoFedProx, EdgeflVersion: "test", Time: "2026-03-01T12:00:00Z"}}
	raw, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// newFedHandler is a handler over a fresh store whose data are f's CSV,
// read by the announced schema only.
func newFedHandler(t testing.TB, f *fedFixture) *RoundHandler {
	t.Helper()
	h, _ := newHandler(t)
	h.Data = model.Data{}
	h.DataFile, h.ModelOut = f.csv, filepath.Join(t.TempDir(), "final.bundle.json")
	return h
}

func decodeStatistics(t testing.TB, o Outgoing) *wire.SiteStatistics {
	t.Helper()
	if o.Subject != wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS || o.Round != 0 {
		t.Fatalf("outgoing %v round %d, want statistics", o.Subject, o.Round)
	}
	st, err := wire.DecodeStatistics(o.Msg, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func decodeEval(t testing.TB, o Outgoing) *wire.EvalReport {
	t.Helper()
	if o.Subject != wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION {
		t.Fatalf("outgoing %v, want an evaluation", o.Subject)
	}
	ev, err := wire.DecodeEvaluation(o.Msg, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if ev.Round != o.Round {
		t.Fatalf("evaluation of round %d sent as round %d", ev.Round, o.Round)
	}
	return ev
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The statistics phase: the SiteStatistics of the training rows as
// sitedata computes them, named by run and schema digest; once receipted
// it is neither computed nor sent again.
func TestFederatedStatistics(t *testing.T) {
	f := newFedFixture(t, 80)
	h := newFedHandler(t, f)
	var emitted []Outgoing
	h.Emit = func(o Outgoing) { emitted = append(emitted, o) }
	res, err := h.Handle(context.Background(), f.statsAnn(fedRun))
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != ActionStatistics || len(res.Out) != 1 || len(emitted) != 1 || !res.Healthy || res.SampleCount != f.train.N {
		t.Fatalf("result %+v (%d emitted)", res, len(emitted))
	}
	st := decodeStatistics(t, res.Out[0])
	if st.ClientId != testSite || st.RunId != fedRun || st.SchemaDigest != f.s.Digest() || string(st.Stats) != mustJSON(t, f.stats) || st.SentAtUnixMs != t0.UnixMilli() {
		t.Fatalf("statistics %+v, want the site's %s", st, mustJSON(t, f.stats))
	}
	if strings.Contains(string(res.Out[0].Msg), fedSecret) {
		t.Fatal("the statistics carry a cell of a column the schema does not use")
	}
	if run, err := h.Store.RunID(); err != nil || run != fedRun {
		t.Fatalf("run id %q, %v", run, err)
	}

	h.Receipted = func(s wire.ReceiptSubject, run string, round uint64) bool {
		return s == wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS && run == fedRun && round == 0
	}
	res, err = h.Handle(context.Background(), f.statsAnn(fedRun))
	if err != nil || res.Action != ActionDone || len(res.Out) != 0 || len(emitted) != 1 {
		t.Fatalf("after the receipt: %+v, %v", res, err)
	}
	// Another run's statistics phase is not receipted yet.
	if res, err = h.Handle(context.Background(), f.statsAnn("run-0002")); err != nil || res.Action != ActionStatistics {
		t.Fatalf("statistics of a new run: %+v, %v", res, err)
	}
}

// Every way a site's data or the aggregator's preprocessing can stop a
// site is a SiteError with its reason, a public message naming what is
// wrong without any cell value, and nothing sent or written.
func TestFederatedSiteErrors(t *testing.T) {
	good := siteCSV(40, 9)
	lines := strings.Split(strings.TrimSuffix(good, "\n"), "\n")
	replaceCell := func(line int, col int, v string) string {
		out := append([]string(nil), lines...)
		cells := strings.Split(out[line-1], ",")
		cells[col] = v
		out[line-1] = strings.Join(cells, ",")
		return strings.Join(out, "\n") + "\n"
	}
	tests := []struct {
		name     string
		csv      string // "" = no file
		train    bool   // a training round (else the statistics phase)
		mod      func(*wire.RoundAnnouncement)
		reason   string
		public   []string // the public message names these
		notThere string   // a cell value that must stay local
	}{
		{name: "missing column", csv: strings.Replace(good, "id,age,", "id,years,", 1), reason: wire.SiteErrSchema, public: []string{"line 1", `"age"`, "missing"}},
		{name: "duplicate column", csv: strings.Replace(good, "id,age,dx,note", "id,age,dx,size", 1), reason: wire.SiteErrSchema, public: []string{`"size"`}},
		{name: "bad value", csv: replaceCell(7, 5, "5kg-x"), reason: wire.SiteErrBadValue, public: []string{"line 7", `"size"`}, notThere: "5kg-x"},
		{name: "unknown label", csv: replaceCell(4, 2, "maybe-malignant"), reason: wire.SiteErrUnknownLabel, public: []string{"line 4", `"dx"`}, notThere: "maybe-malignant"},
		{name: "too few rows", csv: strings.Join(lines[:8], "\n") + "\n", reason: wire.SiteErrTooFewRows, public: []string{"min_site_samples"}},
		{name: "no file", reason: wire.SiteErrData, public: []string{"site.csv"}},
		{name: "empty file", csv: "EMPTY", reason: wire.SiteErrData, public: []string{"empty"}},
		{name: "transform of another schema", csv: good, train: true, mod: func(a *wire.RoundAnnouncement) {
			a.Transform = []byte(strings.Replace(string(a.Transform), `"schema_digest":"`, `"schema_digest":"0`, 1))
		}, reason: wire.SiteErrBadTransform, public: []string{"transform refused"}},
		{name: "transform not JSON", csv: good, train: true, mod: func(a *wire.RoundAnnouncement) { a.Transform = []byte("{not json") },
			reason: wire.SiteErrBadTransform},
		{name: "schema not a schema", csv: good, train: true, mod: func(a *wire.RoundAnnouncement) { a.Schema = []byte(`{"task": "binary"}`) },
			reason: wire.SiteErrBadTransform, public: []string{"schema refused"}},
	}
	f := newFedFixture(t, 60)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFedHandler(t, f)
			h.DataFile = filepath.Join(t.TempDir(), "site.csv")
			if tt.csv != "" {
				if err := os.WriteFile(h.DataFile, []byte(strings.TrimPrefix(tt.csv, "EMPTY")), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var emitted int
			h.Emit = func(Outgoing) { emitted++ }
			ann := f.statsAnn(fedRun)
			if tt.train {
				ann = f.trainAnn(t, fedRun, 1, f.global(t, 1))
				ann.Evaluate = true
			}
			if tt.mod != nil {
				tt.mod(ann)
			}
			before := snapshot(t, h.Store)
			res, err := h.Handle(context.Background(), ann)
			var se *sitedata.SiteError
			if !errors.As(err, &se) {
				t.Fatalf("Handle = %+v, %v; want a site error", res, err)
			}
			pub := se.Public()
			if se.Reason != tt.reason || strings.ContainsAny(pub, "\n\r") || len(pub) > wire.MaxErrorMessageLen {
				t.Fatalf("site error %q: %q, want reason %s on one line", se.Reason, pub, tt.reason)
			}
			for _, w := range tt.public {
				if !strings.Contains(pub, w) {
					t.Errorf("public message %q does not name %q", pub, w)
				}
			}
			if strings.Contains(pub, fedSecret) || (tt.notThere != "" && strings.Contains(pub, tt.notThere)) {
				t.Errorf("public message %q carries a data value", pub)
			}
			if tt.notThere != "" && !strings.Contains(se.Error(), tt.notThere) {
				t.Errorf("the local log's text %q does not show the offending value", se.Error())
			}
			if emitted != 0 || len(res.Out) != 0 {
				t.Fatalf("%d messages emitted on a site error", emitted)
			}
			if !snapshot(t, h.Store).equal(before) {
				t.Fatal("a site error changed the round state")
			}
			st := &wire.ClientStatus{ClientId: testSite, ErrorReason: se.Reason, ErrorMessage: pub}
			if err := st.Validate(wire.Limits{}); err != nil {
				t.Fatalf("the status carrying it is invalid: %v", err)
			}
		})
	}
}

// A training round with a schema trains on sitedata's Data(transform) and,
// asked to evaluate, sends every site's EvalReport of the announced global
// model on its held-out rows (named by eval_round), selected or not.
func TestFederatedTrainAndEvaluate(t *testing.T) {
	f := newFedFixture(t, 120)
	for _, selected := range []bool{true, false} {
		t.Run(fmt.Sprintf("selected=%v", selected), func(t *testing.T) {
			h := newFedHandler(t, f)
			x := f.global(t, 4)
			ann := f.trainAnn(t, fedRun, 4, x)
			ann.Evaluate, ann.EvalRound = true, 3
			if !selected {
				ann.Selected = []string{"site-b"}
			}
			res, err := h.Handle(context.Background(), ann)
			if err != nil {
				t.Fatal(err)
			}
			want := ActionNotSelected
			if selected {
				want = ActionSolved
			}
			if res.Action != want || len(res.Out) != 1 || !res.Healthy || res.SampleCount != f.train.N {
				t.Fatalf("result %+v", res)
			}
			ev := decodeEval(t, res.Out[0])
			wantRep, err := sitedata.Evaluate(f.spec, x, f.holdout)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Round != 3 || ev.RunId != fedRun || ev.ClientId != testSite || string(ev.Report) != mustJSON(t, wantRep) || wantRep.N != int64(f.holdout.N) {
				t.Fatalf("evaluation %+v, want round 3 and %s", ev, mustJSON(t, wantRep))
			}
			if !selected {
				return
			}
			u := res.Update
			if u.SampleCount != uint64(f.train.N) || u.Round != 4 {
				t.Fatalf("update %v, want %d samples", u, f.train.N)
			}
			// The solve ran on the transformed training rows: the loss at the
			// anchor is the model's loss there.
			m, _ := model.New(f.spec)
			if l := m.LossGrad(x, f.train, nil); u.Report.AnchorLoss != l {
				t.Fatalf("anchor loss %v, want %v on the transformed training rows", u.Report.AnchorLoss, l)
			}
		})
	}
}

// edge-agent evaluate --heldout on the site's own CSV reproduces, to the
// last digit, the evaluation report the site sent for the final model (the
// bundle's per-site figure), under either standardisation; evaluating
// every row mixes the training rows in and gives another figure.
func TestEvaluateHeldOutIsTheSiteReport(t *testing.T) {
	for _, std := range []string{"federation", "client"} {
		t.Run(std, func(t *testing.T) {
			f := newFedFixtureOf(t, 150, strings.Replace(fedSchemaJSON, `"min_site_samples"`, `"standardize": "`+std+`", "min_site_samples"`, 1))
			h := newFedHandler(t, f)
			x := f.global(t, 5)
			raw := f.bundleOf(t, fedRun, 5, x)
			ann := f.finishedAnn(t, fedRun, 5, x, nil) // the final evaluation, before the bundle
			res, err := h.Handle(context.Background(), ann)
			if err != nil || len(res.Out) != 1 {
				t.Fatalf("final evaluation: %+v %v", res, err)
			}
			sent := string(decodeEval(t, res.Out[0]).Report)
			b, err := bundle.Unmarshal(raw)
			if err != nil {
				t.Fatal(err)
			}
			got, err := b.EvaluateHeldOutCSV(f.csv, "")
			if err != nil {
				t.Fatal(err)
			}
			if mustJSON(t, got) != sent || got.N != int64(len(f.site.Holdout)) {
				t.Fatalf("evaluate --heldout %s\nthe site sent   %s", mustJSON(t, got), sent)
			}
			all, err := b.EvaluateCSV(f.csv, "")
			if err != nil {
				t.Fatal(err)
			}
			if all.N != int64(f.site.Table.Rows) || mustJSON(t, all) == sent {
				t.Fatalf("evaluate on every row: %s", mustJSON(t, all))
			}
		})
	}
}

// eval_data: every row of data trains, the eval file's rows are held out.
func TestFederatedEvalData(t *testing.T) {
	f := newFedFixture(t, 60)
	h := newFedHandler(t, f)
	h.EvalFile = filepath.Join(t.TempDir(), "heldout.csv")
	if err := os.WriteFile(h.EvalFile, []byte(siteCSV(25, 77)), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := h.Handle(context.Background(), f.statsAnn(fedRun))
	if err != nil {
		t.Fatal(err)
	}
	if res.SampleCount != 60 {
		t.Fatalf("%d training rows, want all 60 rows of data", res.SampleCount)
	}
	all := &sitedata.Site{Schema: f.s, Table: f.site.Table, Train: make([]int, 60), File: f.csv}
	for i := range all.Train {
		all.Train[i] = i
	}
	wantStats, err := all.Statistics()
	if err != nil {
		t.Fatal(err)
	}
	if st := decodeStatistics(t, res.Out[0]); string(st.Stats) != mustJSON(t, wantStats) {
		t.Fatal("statistics are not those of every row of data")
	}
	x := f.global(t, 2)
	ann := f.trainAnn(t, fedRun, 2, x)
	ann.Evaluate, ann.EvalRound, ann.Selected = true, 1, []string{"site-b"}
	res, err = h.Handle(context.Background(), ann)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := sitedata.Load(f.s, h.EvalFile)
	if err != nil {
		t.Fatal(err)
	}
	wantRep, err := sitedata.Evaluate(f.spec, x, f.tr.Apply(ev.Table, nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeEval(t, res.Out[0]); string(got.Report) != mustJSON(t, wantRep) || wantRep.N != 25 {
		t.Fatalf("evaluation %s, want %s on the 25 rows of eval_data", got.Report, mustJSON(t, wantRep))
	}
}

// The end of a run: the final evaluation when asked, then the bundle,
// verified, stored and written atomically to ModelOut; a re-delivery
// restores the file if needed; a tampered bundle or one of another schema
// is refused (bad_transform) and nothing is written.
func TestFederatedFinish(t *testing.T) {
	f := newFedFixture(t, 80)
	x := f.global(t, 5)
	good := f.bundleOf(t, fedRun, 5, x)

	t.Run("final evaluation, bundle, re-delivery", func(t *testing.T) { testFinishBundle(t, f, x, good) })

	other, err := schema.Parse([]byte(strings.Replace(fedSchemaJSON, `"min_site_samples": 10`, `"min_site_samples": 12`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(good, []byte(`"algorithm":"fedprox"`), []byte(`"algorithm":"fedavg"`), 1)
	if bytes.Equal(tampered, good) {
		t.Fatal("the test did not tamper with the bundle")
	}
	for _, tt := range []struct {
		name string
		raw  []byte
		mod  func(*wire.RoundAnnouncement)
		want string
	}{
		{"digest mismatch", tampered, nil, "digest mismatch"},
		{"not a bundle", []byte(`{"format": "zip"}`), nil, "bundle"},
		{"another schema", good, func(a *wire.RoundAnnouncement) { a.Schema = other.Canonical() }, "schema"},
		{"another run", f.bundleOf(t, "run-other", 5, x), nil, "run-other"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFedHandler(t, f)
			ann := f.finishedAnn(t, fedRun, 5, x, tt.raw)
			if tt.mod != nil {
				tt.mod(ann)
			}
			_, err := h.Handle(context.Background(), ann)
			var se *sitedata.SiteError
			if !errors.As(err, &se) || se.Reason != wire.SiteErrBadTransform || !strings.Contains(se.Public(), tt.want) {
				t.Fatalf("Handle = %v, want bad_transform naming %q", err, tt.want)
			}
			if _, err := os.Stat(h.ModelOut); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("model_out written for a refused bundle: %v", err)
			}
			if _, err := h.Store.Final(); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("a refused bundle was stored: %v", err)
			}
		})
	}

	t.Run("model_out not writable", func(t *testing.T) {
		h := newFedHandler(t, f)
		h.ModelOut = filepath.Join(t.TempDir(), "no-such-dir", "final.json")
		_, err := h.Handle(context.Background(), f.finishedAnn(t, fedRun, 5, x, good))
		var se *sitedata.SiteError
		if !errors.As(err, &se) || se.Reason != wire.SiteErrDisk || !strings.Contains(se.Public(), "no-such-dir") {
			t.Fatalf("Handle = %v, want a disk site error naming the path", err)
		}
	})

	t.Run("without a schema", func(t *testing.T) {
		h, _ := newHandler(t)
		ann := announce(t, 7, AlgoFedProx, f32(testGlobal(7)))
		ann.Phase, ann.RunId = wire.Phase_PHASE_FINISHED, fedRun
		before := snapshot(t, h.Store)
		res, err := h.Handle(context.Background(), ann)
		if err != nil || res.Action != ActionFinished || res.Final != nil || len(res.Out) != 0 {
			t.Fatalf("Handle = %+v, %v", res, err)
		}
		if !snapshot(t, h.Store).equal(before) {
			t.Fatal("the end of a run without a schema changed the round state")
		}
	})
}

// testFinishBundle: the final evaluation while the bundle is awaited, then
// the bundle stored and written, then re-delivered (a deleted file comes
// back).
func testFinishBundle(t *testing.T, f *fedFixture, x []float64, good []byte) {
	h := newFedHandler(t, f)
	if err := h.Store.Commit(edgestore.Commit{Round: 5, Msg: []byte("unreceipted")}); err != nil {
		t.Fatal(err)
	}
	res, err := h.Handle(context.Background(), f.finishedAnn(t, fedRun, 5, x, nil))
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != ActionFinishing || len(res.Out) != 1 || decodeEval(t, res.Out[0]).Round != 5 {
		t.Fatalf("finishing: %+v", res)
	}
	if _, err := os.Stat(h.ModelOut); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("model_out exists before the bundle: %v", err)
	}
	res, err = h.Handle(context.Background(), f.finishedAnn(t, fedRun, 5, x, good))
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != ActionFinished || res.Final == nil || len(res.Out) != 0 || !res.Healthy {
		t.Fatalf("finished: %+v", res)
	}
	b, err := bundle.Read(h.ModelOut)
	if err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(h.ModelOut); !bytes.Equal(raw, good) || res.Final.Digest != b.Digest {
		t.Fatal("model_out is not the announced bundle")
	}
	fin, err := h.Store.Final()
	if err != nil || fin.RunID != fedRun || fin.Round != 5 || fin.Digest != b.Digest || !bytes.Equal(fin.Bundle, good) {
		t.Fatalf("stored final %+v, %v", fin, err)
	}
	if out, _ := h.Store.Outbox(); len(out) != 0 {
		t.Fatalf("the finished run's outbox still holds %d updates", len(out))
	}
	// Re-delivered: nothing new; a deleted file comes back.
	if res, err := h.Handle(context.Background(), f.finishedAnn(t, fedRun, 5, x, good)); err != nil || res.Action != ActionDone {
		t.Fatalf("re-delivery: %+v, %v", res, err)
	}
	if err := os.Remove(h.ModelOut); err != nil {
		t.Fatal(err)
	}
	if res, err := h.Handle(context.Background(), f.finishedAnn(t, fedRun, 5, x, good)); err != nil || res.Action != ActionDone {
		t.Fatalf("re-delivery: %+v, %v", res, err)
	}
	if raw, err := os.ReadFile(h.ModelOut); err != nil || !bytes.Equal(raw, good) {
		t.Fatalf("model_out not restored: %v", err)
	}
}

// A site whose data only a schema reads (csv:PATH without label=) refuses
// a federation without one with a site error, not a crash.
func TestFederatedLegacyRoundWithoutData(t *testing.T) {
	f := newFedFixture(t, 40)
	h := newFedHandler(t, f)
	_, err := h.Handle(context.Background(), announce(t, 1, AlgoFedProx, f32(testGlobal(1))))
	var se *sitedata.SiteError
	if !errors.As(err, &se) || se.Reason != wire.SiteErrData || !strings.Contains(se.Public(), "label=") {
		t.Fatalf("Handle = %v, want a data site error asking for label=", err)
	}
}

// A state file that fails under a round is a site error "disk" naming the
// file, with or without a schema (a damaged file still stops the agent:
// ErrCorrupt is not turned into a site error).
func TestRoundDiskErrorIsSiteError(t *testing.T) {
	h, _ := newHandler(t)
	if err := h.Store.Close(); err != nil {
		t.Fatal(err)
	}
	ann := announce(t, 1, AlgoFedProx, f32(testGlobal(1)))
	ann.RunId = fedRun
	_, err := h.Handle(context.Background(), ann)
	var se *sitedata.SiteError
	if !errors.As(err, &se) || se.Reason != wire.SiteErrDisk || !strings.Contains(se.Public(), "state file: agent: round 1: storage: start run") {
		t.Fatalf("Handle on a closed state file = %v, want a disk site error", err)
	}
	if got := h.diskErr(fmt.Errorf("x: %w", storage.ErrCorrupt)); !errors.Is(got, storage.ErrCorrupt) || errors.As(got, &se) {
		t.Fatalf("diskErr(ErrCorrupt) = %v, want it unchanged", got)
	}
}
