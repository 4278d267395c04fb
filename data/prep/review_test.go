package prep

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/testkit/heartdisease"
)

// heartStats are the four hospitals' statistics of their training rows
// under the heart-disease schema with extra on chol.
func heartStats(t *testing.T, extra string) (*schema.Schema, []*Stats) {
	t.Helper()
	s, err := schema.Parse([]byte(heartdisease.Schema(extra)))
	if err != nil {
		t.Fatal(err)
	}
	paths, err := heartdisease.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var stats []*Stats
	for _, p := range paths {
		tab, err := s.ReadCSVFile(p)
		if err != nil {
			t.Fatal(err)
		}
		train, _ := Split(s, tab)
		st, err := Compute(s, tab, train)
		if err != nil {
			t.Fatal(err)
		}
		stats = append(stats, st)
	}
	return s, stats
}

// TestReviewHeartDisease: the four real hospitals through the statistics
// phase. Cleveland exports its codes as "4.0", the others as "4": compared
// as numbers, chest-pain type has its 4 levels (it had 8, and the model 31
// inputs instead of 18), and no level is seen at one site only. The
// review names the features whose per-site ranges disagree (training rows):
// cholesterol (every value 0 at Switzerland and 49 at VA: "not measured")
// and resting blood pressure (a 0 at VA); with "missing": ["0"] on
// cholesterol its finding goes (Switzerland then has no cholesterol).
func TestReviewHeartDisease(t *testing.T) {
	s, stats := heartStats(t, "")
	pooled, err := Combine(s, stats)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Fit(s, pooled, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 5 numeric inputs, sex 2, cp 4, fbs 2, restecg 3, exang 2 (Cleveland's
	// "1.0" split every code: 31).
	if cp := tr.Columns[2]; !slices.Equal(cp.Levels, []string{"1", "2", "3", "4"}) || tr.Outputs != 18 {
		t.Fatalf("cp levels %q, %d inputs; want 1..4 and 18", cp.Levels, tr.Outputs)
	}
	r, err := ReviewStats(s, heartdisease.Sites, stats)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(r.Lines(), "\n")
	var ranges []string
	for _, f := range r.Ranges {
		ranges = append(ranges, f.Feature)
	}
	if len(r.Levels) != 0 || !slices.Equal(ranges, []string{"trestbps", "chol"}) {
		t.Fatalf("review:\n%s", lines)
	}
	for _, want := range []string{
		`feature "chol": per-site ranges disagree (site switzerland's mean lies outside site cleveland's range): cleveland [131, 564], hungarian [100, 603], switzerland [0, 0], va [0, 458]`,
		`feature "trestbps": per-site ranges disagree (site va's minimum lies 7.7 standard deviations of site hungarian below its mean): cleveland [94, 200], hungarian [92, 200], switzerland [80, 200], va [0, 190]`,
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("review lacks %q:\n%s", want, lines)
		}
	}
	t.Logf("review of the four hospitals:\n%s", lines)

	s, stats = heartStats(t, `"missing": ["0"]`)
	r, err = ReviewStats(s, heartdisease.Sites, stats)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Ranges {
		if f.Feature == "chol" {
			t.Fatalf("with missing 0 on chol: %s", strings.Join(r.Lines(), "\n"))
		}
	}
	if n := stats[2].Features[4].Numeric; n.Count != 0 || n.Missing != stats[2].Rows {
		t.Fatalf("switzerland's chol with missing 0: %+v", n)
	}
}

// The review without the comparison of numbers as numbers: levels "4.0"
// at one site and "4" at another are levels seen at one site only, each
// site's listed (at most MaxReviewLevels, the rest counted); a feature at
// one site only, or ranges within RangeSD, are no finding.
func TestReviewLevels(t *testing.T) {
	s, err := schema.Parse([]byte(`{"task":"regression","features":[{"name":"k","type":"categorical"},{"name":"x","type":"numeric"}],"label":{"column":"y"},"min_site_samples":1}`))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(levels map[string]int64, n int64, mean, m2, lo, hi float64) *Stats {
		var total int64
		for _, c := range levels {
			total += c
		}
		return &Stats{Version: Version, SchemaDigest: s.Digest(), Rows: total, Features: []Feature{
			{Name: "k", Type: schema.Categorical, Levels: levels},
			{Name: "x", Type: schema.Numeric, Numeric: &Numeric{Count: n, Missing: total - n, Sum: mean * float64(n), SumSq: m2 + mean*mean*float64(n), Mean: mean, M2: m2, Min: lo, Max: hi}}},
			Label: &Numeric{Count: total, Sum: 0, Mean: 0}}
	}
	many := map[string]int64{}
	for i := range 11 {
		many[string(rune('a'+i))] = 1
	}
	a := mk(map[string]int64{"1": 5, "4": 5}, 10, 5, 90, 0, 10)
	b := mk(many, 11, 6, 99, 1, 11)
	r, err := ReviewStats(s, []string{"b-site", "a-site"}, []*Stats{b, a})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Sites, []string{"a-site", "b-site"}) || len(r.Levels) != 2 || len(r.Ranges) != 0 {
		t.Fatalf("%+v\n%s", r, strings.Join(r.Lines(), "\n"))
	}
	if l := r.Levels[1]; l.Site != "b-site" || len(l.Levels) != MaxReviewLevels || l.More != 3 ||
		!strings.Contains(r.Lines()[1], `feature "k": levels seen only at site b-site: "a", "b", "c", "d", "e", "f", "g", "h" and 3 more`) {
		t.Fatalf("%+v %q", l, r.Lines())
	}
	if r.Lines()[0] != `feature "k": levels seen only at site a-site: "1", "4"` {
		t.Fatalf("%q", r.Lines()[0])
	}
	one, err := ReviewStats(s, []string{"a"}, []*Stats{a})
	if err != nil || !one.Empty() {
		t.Fatalf("one site: %v %+v", err, one)
	}
}
