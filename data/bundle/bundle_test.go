package bundle

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/testkit"
)

func testBundle(t *testing.T) *Bundle {
	s, err := schema.Load("../schema/testdata/grades.json")
	if err != nil {
		t.Fatal(err)
	}
	tab, err := s.ReadCSVFile("../schema/testdata/site.csv")
	if err != nil {
		t.Fatal(err)
	}
	st, err := prep.Compute(s, tab, []int{0, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := prep.Fit(s, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := model.NewBinaryLogReg(tr.Outputs, 0.01)
	rng := rand.New(rand.NewPCG(1, 2))
	w := make([]float64, m.NumParams())
	for i := range w {
		w[i] = rng.NormFloat64() * math.Pi
	}
	rep, _ := evaluate.Classification([]float64{0.3, 0.7, 0.9, 0.1}, []float64{1, 0}, 2)
	return &Bundle{
		Model: model.Saved{Spec: m.Spec(), Layout: m.Layout(), Params: w}, Schema: s, Transform: tr,
		Evaluation: &Evaluation{Round: 7, Federation: rep, Sites: map[string]evaluate.Report{"site-b": rep, "site-a": rep}},
		Provenance: Provenance{Federation: "ward7", RunID: "r1", Round: 7, Algorithm: "fedproxsplit",
			Params: map[string]string{"l2": "0.01"}, EdgeflVersion: "test", Time: "2026-11-24T00:00:00Z"},
	}
}

func TestRoundTrip(t *testing.T) {
	b := testBundle(t)
	path := filepath.Join(t.TempDir(), "final.bundle.json")
	if err := Write(path, b); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range b.Model.Params {
		if got.Model.Params[i] != v {
			t.Fatalf("weight %d: %v != %v", i, got.Model.Params[i], v)
		}
	}
	if got.Digest != b.Digest || got.Schema.Digest() != b.Schema.Digest() || got.Evaluation.Round != 7 {
		t.Fatal("content differs after a round trip")
	}
	again, _ := got.Marshal()
	first, _ := os.ReadFile(path)
	if string(again) != string(first) {
		t.Fatal("re-encoding a read bundle changes its bytes")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func TestReadRefuses(t *testing.T) {
	raw, err := testBundle(t).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, edit, want string }{
		{"tampered weight", `"round":7`, "digest mismatch"},
		{"version", `"version":1`, "bundle version 4, this edgefl reads versions 1 to 3"},
		{"unknown field", `"digest":`, "unknown field"},
	}
	repl := map[string]string{
		"tampered weight": `"round":8`,
		"version":         `"version":4`,
		"unknown field":   `"extra":1,"digest":`,
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := strings.Replace(string(raw), c.edit, repl[c.name], 1)
			if bad == string(raw) {
				t.Fatalf("edit %q not applied", c.edit)
			}
			path := filepath.Join(t.TempDir(), "b.json")
			testkit.WriteFile(t, path, bad)
			_, err := Read(path)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err %v, want one line naming %s and %q", err, path, c.want)
			}
		})
	}
}

func TestMarshalRefusesInconsistent(t *testing.T) {
	b := testBundle(t)
	b.Model.Inputs++
	b.Model.Params = append(b.Model.Params, 0)
	if _, err := b.Marshal(); err == nil || !strings.Contains(err.Error(), "inputs") {
		t.Fatalf("err %v", err)
	}
	b = testBundle(t)
	b.Model.Params[0] = math.NaN()
	if _, err := b.Marshal(); err == nil {
		t.Fatal("NaN weight accepted")
	}
	path := filepath.Join(t.TempDir(), "x.json")
	if err := Write(path, b); err == nil {
		t.Fatal("write of a bad bundle succeeded")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("a bad bundle left a file")
	}
}

// Version 3 is written only for a bundle with a baseline, missing sites or
// statistics sites; one of them in an older version's bundle is refused.
func TestVersionFigures(t *testing.T) {
	b := testBundle(t)
	if _, err := b.Marshal(); err != nil || b.Version != VersionPlain {
		t.Fatalf("a plain bundle: version %d, %v", b.Version, err)
	}
	b = testBundle(t)
	b.Provenance.StatisticsSites = []string{"site-a", "site-b"}
	raw, err := b.Marshal()
	if err != nil || b.Version != VersionFigures {
		t.Fatalf("with statistics sites: version %d, %v", b.Version, err)
	}
	got, err := Unmarshal(raw)
	if err != nil || !slices.Equal(got.Provenance.StatisticsSites, []string{"site-a", "site-b"}) {
		t.Fatalf("round trip: %v", err)
	}
	got.Version = VersionPlain
	if err := got.Check(); err == nil || !strings.Contains(err.Error(), "version 3 adds them") {
		t.Fatalf("version 1 with statistics sites: %v", err)
	}
}
