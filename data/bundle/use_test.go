package bundle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/testkit"
)

func TestPredictAndEvaluateCSV(t *testing.T) {
	b := testBundle(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "pred.csv")
	// The prediction is the class's name: grade 1 (class high) is not
	// read as "severity 1". --raw-label adds the class's first raw value.
	for _, c := range []struct {
		raw    bool
		header string
		values map[string]string // prediction -> prediction_raw
	}{
		{false, "extra,prediction,p_low,p_high", nil},
		{true, "extra,prediction,prediction_raw,p_low,p_high", map[string]string{"low": "0", "high": "1"}},
	} {
		n, err := b.PredictCSV("../schema/testdata/site.csv", out, PredictOptions{Keep: []string{"extra"}, RawLabel: c.raw})
		if err != nil || n != 3 {
			t.Fatalf("raw %v: %d %v", c.raw, n, err)
		}
		got, _ := os.ReadFile(out)
		lines := strings.Split(strings.TrimSpace(string(got)), "\n")
		if len(lines) != 4 || lines[0] != c.header || !strings.HasPrefix(lines[1], "x,") {
			t.Fatalf("raw %v: predictions:\n%s", c.raw, got)
		}
		for _, l := range lines[1:] {
			f := strings.Split(l, ",")
			if f[1] != "low" && f[1] != "high" {
				t.Fatalf("prediction %q is not a class name", f[1])
			}
			if c.raw && f[2] != c.values[f[1]] {
				t.Fatalf("prediction %s: prediction_raw %q, want %q", f[1], f[2], c.values[f[1]])
			}
			if p := f[len(f)-2:]; len(f) != strings.Count(c.header, ",")+1 || p[0] == "" || p[1] == "" {
				t.Fatalf("row %q does not fit header %q", l, c.header)
			}
		}
	}
	r, err := b.EvaluateCSV("../schema/testdata/site.csv", "")
	if err != nil || r.N != 3 || len(r.Confusion) != 2 {
		t.Fatalf("%v %+v", err, r)
	}
	// A CSV lacking a feature column: the training error, nothing written.
	bad := testkit.WriteFileIn(t, dir, "bad.csv", "kind,grade\na,1\n")
	out2 := filepath.Join(dir, "pred2.csv")
	if _, err := b.PredictCSV(bad, out2, PredictOptions{}); err == nil || !strings.Contains(err.Error(), `missing column "size"`) {
		t.Fatalf("err %v", err)
	}
	if _, err := os.Stat(out2); !os.IsNotExist(err) {
		t.Fatal("output written on error")
	}
	if _, err := b.PredictCSV("../schema/testdata/site.csv", out2, PredictOptions{Keep: []string{"nope"}}); err == nil {
		t.Fatal("unknown --keep column accepted")
	}
}

func TestParseDataArg(t *testing.T) {
	for _, c := range []struct{ in, path, label string }{
		{"csv:a.csv", "a.csv", ""}, {"csv:/x/a.csv:label=y", "/x/a.csv", "y"},
	} {
		p, l, err := ParseDataArg(c.in)
		if err != nil || p != c.path || l != c.label {
			t.Fatalf("%q: %q %q %v", c.in, p, l, err)
		}
	}
	for _, bad := range []string{"a.csv", "csv:", "csv:a.csv:label="} {
		if _, _, err := ParseDataArg(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// BenchmarkPredictCSV measures predict throughput on 100,000 rows
// (reported as rows/s).
func BenchmarkPredictCSV(b *testing.B) {
	t := &testing.T{}
	bu := testBundle(t)
	dir := b.TempDir()
	in := filepath.Join(dir, "in.csv")
	var sb strings.Builder
	sb.WriteString("id,size,kind\n")
	const rows = 100000
	for i := range rows {
		fmt.Fprintf(&sb, "%d,%g,%s\n", i, float64(i%97)/7, []string{"a", "b", "NA"}[i%3])
	}
	testkit.WriteFile(t, in, sb.String())
	out := filepath.Join(dir, "out.csv")
	b.ResetTimer()
	for range b.N {
		if _, err := bu.PredictCSV(in, out, PredictOptions{Keep: []string{"id"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
}
