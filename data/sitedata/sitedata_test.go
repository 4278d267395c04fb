package sitedata

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/testkit"
)

func testSchema(t testing.TB, task, extra string) *schema.Schema {
	t.Helper()
	label := `"label": {"column": "y", "classes": [{"name": "no", "values": ["N", "0"]}, {"name": "yes", "values": ["Y", "1"]}]}`
	switch task {
	case schema.TaskMulticlass:
		label = `"label": {"column": "y", "classes": [{"name": "a", "values": ["0"]}, {"name": "b", "values": ["1"]}, {"name": "c", "values": ["2"]}]}`
	case schema.TaskRegression:
		label = `"label": {"column": "y"}`
	}
	s, err := schema.Parse([]byte(`{"task": "` + task + `", "features": [
		{"name": "size", "type": "numeric"}, {"name": "colour", "type": "categorical"}, {"name": "age", "type": "numeric"}],
		` + label + `, "min_site_samples": 5` + extra + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// siteCSV is a random site CSV: columns shuffled per site, an extra
// column, some missing tokens; the label depends on the features.
func siteCSV(rng *rand.Rand, task string, rows int, shift float64) string {
	cols := []string{"size", "colour", "age", "y", "note"}
	rng.Shuffle(len(cols), func(i, j int) { cols[i], cols[j] = cols[j], cols[i] })
	var b strings.Builder
	b.WriteString(strings.Join(cols, ",") + "\n")
	for range rows {
		size := rng.NormFloat64()*3 + 10 + shift
		age := rng.Float64()*60 + 20
		colour := []string{"red", "green", "blue"}[rng.IntN(3)]
		z := (size-10)/3 + (age-50)/20 + map[string]float64{"red": 1, "green": -1, "blue": 0}[colour] + rng.NormFloat64()*0.7
		var y string
		switch task {
		case schema.TaskBinary:
			y = [][]string{{"N", "0"}, {"Y", "1"}}[boolInt(z > 0)][rng.IntN(2)]
		case schema.TaskMulticlass:
			y = fmt.Sprint(min(2, max(0, int(z+1.5))))
		default:
			y = fmt.Sprintf("%.6g", 3*z+1)
		}
		cell := map[string]string{"size": fmt.Sprintf("%.6g", size), "age": fmt.Sprintf("%.4g", age), "colour": colour, "y": y, "note": "x"}
		if rng.IntN(15) == 0 {
			cell["size"] = "NA"
		}
		if rng.IntN(20) == 0 {
			cell["colour"] = "?"
		}
		rec := make([]string, len(cols))
		for i, c := range cols {
			rec[i] = cell[c]
		}
		b.WriteString(strings.Join(rec, ",") + "\n")
	}
	return b.String()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	testkit.WriteFile(t, p, content)
	return p
}

func TestLoadErrors(t *testing.T) {
	s := testSchema(t, schema.TaskBinary, "")
	dir := t.TempDir()
	cases := []struct {
		name, csv, reason string
		line              int
		column, value     string
	}{
		{"missing column", "size,colour,y\n1,a,Y\n", ReasonSchema, 1, "age", ""},
		{"missing label", "size,colour,age\n1,a,3\n", ReasonSchema, 1, "y", ""},
		{"duplicate header", "size,colour,age,age,y\n", ReasonSchema, 1, "age", ""},
		{"bad value", "size,colour,age,y\n1,a,3,Y\n1,a,secret-42,N\n", ReasonBadValue, 3, "age", "secret-42"},
		{"unknown label", "size,colour,age,y\n1,a,3,Maybe-77\n", ReasonUnknownLabel, 2, "y", "Maybe-77"},
		{"short row", "size,colour,age,y\n1,a,3\n", ReasonData, 2, "", ""},
		{"empty", "", ReasonData, 0, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, dir, strings.ReplaceAll(c.name, " ", "_")+".csv", c.csv)
			_, err := Load(s, path)
			var se *SiteError
			if !errors.As(err, &se) {
				t.Fatalf("%v (%T) is not a *SiteError", err, err)
			}
			if se.Reason != c.reason || se.Line != c.line || se.Column != c.column || se.Value != c.value || se.File != path {
				t.Fatalf("%+v, want reason %s line %d column %q value %q", se, c.reason, c.line, c.column, c.value)
			}
			full, pub := se.Error(), se.Public()
			for _, msg := range []string{full, pub} {
				if strings.ContainsAny(msg, "\n\r") || !strings.Contains(msg, path) {
					t.Fatalf("not one line naming the file: %q", msg)
				}
				if c.line > 0 && !strings.Contains(msg, fmt.Sprintf("line %d", c.line)) {
					t.Fatalf("no line: %q", msg)
				}
				if c.column != "" && !strings.Contains(msg, fmt.Sprintf("%q", c.column)) {
					t.Fatalf("no column: %q", msg)
				}
			}
			if c.value != "" && (!strings.Contains(full, c.value) || strings.Contains(pub, c.value)) {
				t.Fatalf("the value must be in Error only:\n%s\n%s", full, pub)
			}
			if !strings.Contains(pub, "expected") {
				t.Fatalf("public message says nothing expected: %q", pub)
			}
		})
	}
	_, err := Load(s, filepath.Join(dir, "nope.csv"))
	var se *SiteError
	if !errors.As(err, &se) || se.Reason != ReasonData || !strings.Contains(se.Public(), "nope.csv") {
		t.Fatalf("absent file: %v", err)
	}
	// A spreadsheet's ";" export: the public message (what the aggregator
	// shows) names the separator, not only the missing column.
	_, err = Load(s, writeFile(t, dir, "semicolons.csv", "size;colour;age;y\n1,5;a;3;Y\n"))
	if !errors.As(err, &se) || se.Reason != ReasonSchema || !strings.Contains(se.Public(), `set "separator": ";" in the schema`) {
		t.Fatalf("semicolons: %v / %q", err, se.Public())
	}
}

func TestTooFewRows(t *testing.T) {
	s := testSchema(t, schema.TaskBinary, `, "holdout": 0`)
	st, err := Load(s, writeFile(t, t.TempDir(), "few.csv", "size,colour,age,y\n1,a,3,Y\n2,b,4,N\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Statistics()
	var se *SiteError
	if !errors.As(err, &se) || se.Reason != ReasonTooFewRows || !strings.Contains(se.Public(), "min_site_samples 5") {
		t.Fatalf("%v", err)
	}
}

// sites reads three random site CSVs (different row counts, shifted
// features, shuffled columns).
func sites(t *testing.T, s *schema.Schema, seed uint64) []*Site {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	dir := t.TempDir()
	var out []*Site
	for k, n := range []int{120, 45, 80} {
		st, err := Load(s, writeFile(t, dir, fmt.Sprintf("site%d.csv", k+1), siteCSV(rng, s.Task, n, float64(k))))
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Table.Extra) != 1 || st.Table.Extra[0] != "note" || (len(st.Holdout) == 0) != (s.Holdout == 0) {
			t.Fatalf("site %d: extra %v holdout %d", k+1, st.Table.Extra, len(st.Holdout))
		}
		out = append(out, st)
	}
	return out
}

func relClose(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b))
}

func pooled(t *testing.T, s *schema.Schema, ss []*Site) *prep.Stats {
	t.Helper()
	var stats []*prep.Stats
	for _, st := range ss {
		x, err := st.Statistics()
		if err != nil {
			t.Fatal(err)
		}
		stats = append(stats, x)
	}
	p, err := prep.Combine(s, stats)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The federation's transform from three sites' statistics equals the one
// fitted on the concatenated training rows; in client mode each site's
// transform is prep.Fit with its own statistics.
func TestPartitionsGiveTheConcatenatedTransform(t *testing.T) {
	for _, mode := range []string{schema.StandardizeFederation, schema.StandardizeClient} {
		t.Run(mode, func(t *testing.T) {
			s := testSchema(t, schema.TaskBinary, `, "standardize": "`+mode+`"`)
			ss := sites(t, s, 1)
			p := pooled(t, s, ss)
			fed, err := Fit(s, p)
			if err != nil {
				t.Fatal(err)
			}
			// The concatenation: every site's rows one after the other.
			var all schema.Table
			var train []int
			for _, st := range ss {
				for _, i := range st.Train {
					train = append(train, all.Rows+i)
				}
				all = concat(all, *st.Table)
			}
			cst, err := prep.Compute(s, &all, train)
			if err != nil {
				t.Fatal(err)
			}
			want, err := Fit(s, cst)
			if err != nil {
				t.Fatal(err)
			}
			if !transformsClose(fed, want) {
				t.Fatalf("federated %+v\nconcatenated %+v", fed.Columns, want.Columns)
			}
			for k, st := range ss {
				own, _ := st.Statistics()
				ref, err := prep.Fit(s, p, map[bool]*prep.Stats{true: own, false: nil}[mode == schema.StandardizeClient])
				if err != nil {
					t.Fatal(err)
				}
				got, err := st.Transform(fed)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, ref) {
					t.Fatalf("site %d: transform %+v, prep.Fit gives %+v", k+1, got.Columns, ref.Columns)
				}
				train, hold, err := st.Data(fed)
				if err != nil {
					t.Fatal(err)
				}
				if train.N != len(st.Train) || hold.N != len(st.Holdout) || train.D != fed.Outputs || !reflect.DeepEqual(train, ref.Apply(st.Table, st.Train)) {
					t.Fatalf("site %d: data %d/%d rows", k+1, train.N, hold.N)
				}
			}
		})
	}
}

func concat(a, b schema.Table) schema.Table {
	if a.Columns == nil {
		a.Columns = make([]schema.Column, len(b.Columns))
	}
	for j, c := range b.Columns {
		a.Columns[j].Num = append(a.Columns[j].Num, c.Num...)
		a.Columns[j].Level = append(a.Columns[j].Level, c.Level...)
		a.Columns[j].Missing = append(a.Columns[j].Missing, c.Missing...)
	}
	a.Labels = append(a.Labels, b.Labels...)
	a.Lines = append(a.Lines, b.Lines...)
	a.Rows += b.Rows
	return a
}

func transformsClose(a, b *prep.Transform) bool {
	if a.Outputs != b.Outputs || len(a.Columns) != len(b.Columns) || a.SchemaDigest != b.SchemaDigest {
		return false
	}
	for j := range a.Columns {
		x, y := a.Columns[j], b.Columns[j]
		if !relClose(x.Mean, y.Mean) || !relClose(x.Scale, y.Scale) || !relClose(x.Impute, y.Impute) ||
			!reflect.DeepEqual(x.Levels, y.Levels) || x.ImputeLevel != y.ImputeLevel {
			return false
		}
	}
	return true
}

func TestDataRefusesAnotherTransform(t *testing.T) {
	s := testSchema(t, schema.TaskBinary, "")
	ss := sites(t, s, 2)
	other := testSchema(t, schema.TaskBinary, `, "holdout": 0.3`)
	tr, err := Fit(other, pooled(t, other, sites(t, other, 2)))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = ss[0].Data(tr)
	var se *SiteError
	if !errors.As(err, &se) || se.Reason != ReasonBadTransform {
		t.Fatalf("%v", err)
	}
	if _, _, err := ss[0].Data(nil); !errors.As(err, &se) || se.Reason != ReasonBadTransform {
		t.Fatalf("nil transform: %v", err)
	}
}

func TestModelSpec(t *testing.T) {
	bin := testSchema(t, schema.TaskBinary, "")
	multi := testSchema(t, schema.TaskMulticlass, "")
	reg := testSchema(t, schema.TaskRegression, "")
	tr := &prep.Transform{Outputs: 6}
	cases := []struct {
		s       *schema.Schema
		kind    string
		hidden  int
		act     string
		want    model.Spec
		wantErr string
	}{
		{bin, "logreg", 0, "", model.Spec{Kind: model.KindBinaryLogReg, Inputs: 6, L2: 0.1}, ""},
		{bin, "", 0, "", model.Spec{Kind: model.KindBinaryLogReg, Inputs: 6, L2: 0.1}, ""},
		{bin, "binary-logreg", 0, "", model.Spec{Kind: model.KindBinaryLogReg, Inputs: 6, L2: 0.1}, ""},
		{bin, "mlp", 8, "tanh", model.Spec{Kind: model.KindMLP, Inputs: 6, Classes: 2, Hidden: 8, Activation: "tanh", L2: 0.1}, ""},
		{multi, "logreg", 0, "", model.Spec{Kind: model.KindLogReg, Inputs: 6, Classes: 3, L2: 0.1}, ""},
		{multi, "mlp", 4, "relu", model.Spec{Kind: model.KindMLP, Inputs: 6, Classes: 3, Hidden: 4, Activation: "relu", L2: 0.1}, ""},
		{reg, "logreg", 0, "", model.Spec{Kind: model.KindLinear, Inputs: 6, L2: 0.1}, ""},
		{reg, "linear", 0, "", model.Spec{Kind: model.KindLinear, Inputs: 6, L2: 0.1}, ""},
		{bin, "linear", 0, "", model.Spec{}, "does not fit a binary task"},
		{multi, "binary-logreg", 0, "", model.Spec{}, "does not fit a multiclass task"},
		{reg, "mlp", 8, "relu", model.Spec{}, "classifier"},
		{bin, "logreg", 8, "", model.Spec{}, "no hidden layer"},
		{bin, "mlp", 0, "relu", model.Spec{}, "hidden must be >= 1"},
		{bin, "svm", 0, "", model.Spec{}, "unknown model"},
	}
	for _, c := range cases {
		got, err := ModelSpec(c.s, tr, c.kind, c.hidden, c.act, 0.1)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s %s: err %v, want %q", c.s.Task, c.kind, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s %s: %+v %v, want %+v", c.s.Task, c.kind, got, err, c.want)
		}
	}
	if _, err := ModelSpec(bin, nil, "logreg", 0, "", 0); err == nil {
		t.Error("no transform accepted")
	}
}

// A site whose held-out rows are a separate file (eval_data): after
// TrainOnEvery every row of its data trains and none is held out, and
// EvalData is every row of the other table under the transform the site
// applies to its training rows (with standardize = client its own
// training statistics, not the pooled ones).
func TestTrainOnEveryAndEvalData(t *testing.T) {
	for _, mode := range []string{schema.StandardizeFederation, schema.StandardizeClient} {
		t.Run(mode, func(t *testing.T) {
			s := testSchema(t, schema.TaskBinary, `, "holdout": 0.3, "standardize": "`+mode+`"`)
			ss := sites(t, s, 3)
			st, other := ss[0], ss[1]
			st.TrainOnEvery()
			if len(st.Train) != st.Table.Rows || len(st.Holdout) != 0 || st.Train[0] != 0 || st.Train[st.Table.Rows-1] != st.Table.Rows-1 {
				t.Fatalf("train %d of %d rows, holdout %d", len(st.Train), st.Table.Rows, len(st.Holdout))
			}
			tr, err := Fit(s, pooled(t, s, ss))
			if err != nil {
				t.Fatal(err)
			}
			got, err := st.EvalData(tr, other.Table)
			if err != nil {
				t.Fatal(err)
			}
			own, err := st.Transform(tr)
			if err != nil {
				t.Fatal(err)
			}
			want := own.Apply(other.Table, nil)
			if got.N != other.Table.Rows || !slices.Equal(got.X, want.X) || !slices.Equal(got.Y, want.Y) {
				t.Fatalf("EvalData: %d rows, want every one of %d under the site's transform", got.N, other.Table.Rows)
			}
			if pooledX := tr.Apply(other.Table, nil).X; (mode == schema.StandardizeClient) == slices.Equal(got.X, pooledX) {
				t.Fatalf("standardize %s: EvalData equal to the pooled transform's: %v", mode, slices.Equal(got.X, pooledX))
			}
			if _, err := st.EvalData(nil, other.Table); err == nil {
				t.Fatal("EvalData without a transform: no error")
			}
		})
	}
}
