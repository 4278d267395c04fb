package sitedata_test

// An external test: bundle imports sitedata (EvaluateHeldOut), so a test
// that uses both lives outside package sitedata (export_test.go lends it
// the package's test helpers).

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
)

// The federation path (Site.Data + Evaluate) and the bundle path
// (EvaluateCSV) compute the same figures on the same rows.
func TestEvaluateAgreesWithBundle(t *testing.T) {
	for _, c := range []struct{ task, kind string }{
		{schema.TaskBinary, "logreg"}, {schema.TaskBinary, "mlp"}, {schema.TaskMulticlass, "logreg"}, {schema.TaskRegression, "logreg"},
	} {
		t.Run(c.task+"/"+c.kind, func(t *testing.T) {
			s := sitedata.SchemaForTest(t, c.task, `, "holdout": 0`)
			ss := sitedata.SitesForTest(t, s, 4)
			tr, err := sitedata.Fit(s, sitedata.PooledForTest(t, s, ss))
			if err != nil {
				t.Fatal(err)
			}
			hidden, act := 0, ""
			if c.kind == "mlp" {
				hidden, act = 5, "tanh"
			}
			spec, err := sitedata.ModelSpec(s, tr, c.kind, hidden, act, 0.01)
			if err != nil {
				t.Fatal(err)
			}
			m, _ := model.New(spec)
			rng := rand.New(rand.NewPCG(9, 9))
			x := m.InitParams(rng)
			for i := range x {
				x[i] += rng.NormFloat64() * 0.5
			}
			b := &bundle.Bundle{Model: model.Saved{Spec: spec, Layout: m.Layout(), Params: x}, Schema: s, Transform: tr,
				Provenance: bundle.Provenance{Algorithm: "test"}}
			raw, err := b.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			b, err = bundle.Unmarshal(raw)
			if err != nil {
				t.Fatal(err)
			}
			var reports []evaluate.Report
			for _, st := range ss {
				d, hold, err := st.Data(tr) // holdout 0: every row is a training row
				if err != nil || hold.N != 0 {
					t.Fatal(err, hold.N)
				}
				got, err := sitedata.Evaluate(spec, x, d)
				if err != nil {
					t.Fatal(err)
				}
				want, err := b.EvaluateCSV(st.File, "")
				if err != nil {
					t.Fatal(err)
				}
				if empty, err := sitedata.Evaluate(spec, x, hold); err != nil || empty.N != 0 {
					t.Fatalf("no held-out rows: %+v %v", empty, err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("federation path %+v\nbundle path %+v", got, want)
				}
				if c.task != schema.TaskRegression && (got.N != int64(d.N) || got.Accuracy <= 0) {
					t.Fatalf("report %+v", got)
				}
				reports = append(reports, got)
			}
			if _, err := evaluate.Combine(reports); err != nil {
				t.Fatal(err)
			}
			if _, err := sitedata.Evaluate(spec, x[1:], model.Data{D: spec.Inputs}); err == nil {
				t.Fatal("short parameter vector accepted")
			}
		})
	}
}
