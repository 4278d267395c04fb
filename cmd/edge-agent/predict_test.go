package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/testkit"
)

// writeTestBundle builds a bundle over data/schema/testdata's grades schema.
func writeTestBundle(t *testing.T, dir string) string {
	s, err := schema.Load("../../data/schema/testdata/grades.json")
	if err != nil {
		t.Fatal(err)
	}
	tab, err := s.ReadCSVFile("../../data/schema/testdata/site.csv")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := prep.Compute(s, tab, []int{0, 1, 2})
	tr, _ := prep.Fit(s, st, nil)
	m := model.NewBinaryLogReg(tr.Outputs, 0)
	w := []float64{1, -1, 0.5, 0.1}
	path := filepath.Join(dir, "m.bundle.json")
	err = bundle.Write(path, &bundle.Bundle{Model: model.Saved{Spec: m.Spec(), Layout: m.Layout(), Params: w}, Schema: s, Transform: tr,
		Provenance: bundle.Provenance{Federation: "f", RunID: "r", Round: 1, Algorithm: "fedavg", EdgeflVersion: "test", Time: "2026-11-24T00:00:00Z"}})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func TestEvaluateAndPredictCommands(t *testing.T) {
	dir := t.TempDir()
	b := writeTestBundle(t, dir)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"evaluate", "--model", b, "--data", "csv:../../data/schema/testdata/site.csv", "--json"}, &out, &errb); code != 0 {
		t.Fatalf("evaluate exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), `"n": 3`) {
		t.Fatalf("evaluate output %s", out.String())
	}
	pred := filepath.Join(dir, "p.csv")
	out.Reset()
	if code := run(context.Background(), []string{"predict", "--model", b, "--data", "csv:../../data/schema/testdata/site.csv", "--out", pred, "--keep", "extra", "--raw-label"}, &out, &errb); code != 0 {
		t.Fatalf("predict exit %d: %s", code, errb.String())
	}
	if got, _ := os.ReadFile(pred); !strings.HasPrefix(string(got), "extra,prediction,prediction_raw,p_low,p_high\nx,") ||
		!strings.Contains(string(got), "\nx,high,1,") && !strings.Contains(string(got), "\nx,low,0,") {
		t.Fatalf("predictions %s", got)
	}
	// A tampered bundle: one line naming the file.
	raw, _ := os.ReadFile(b)
	testkit.WriteFile(t, b, strings.Replace(string(raw), `"round":1`, `"round":2`, 1))
	errb.Reset()
	if code := run(context.Background(), []string{"evaluate", "--model", b, "--data", "csv:../../data/schema/testdata/site.csv"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "digest mismatch") {
		t.Fatalf("tampered bundle: exit %d, %s", code, errb.String())
	}
}
