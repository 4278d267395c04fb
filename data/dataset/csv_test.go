package dataset

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestLoadCSV(t *testing.T) {
	for _, tc := range []struct {
		name     string
		file     string
		opt      CSVOptions
		classes  int
		features []string
		y        []float64
		row1     []float64
	}{
		{"label by name", "clinic.csv", CSVOptions{Label: "diagnosis"}, 3,
			[]string{"age", "weight", "score"}, []float64{1, 0, 2, 1, 0, 2}, []float64{45, 80, 1.5}},
		{"label by index", "clinic.csv", CSVOptions{Label: "2"}, 3,
			[]string{"age", "weight", "score"}, []float64{1, 0, 2, 1, 0, 2}, []float64{45, 80, 1.5}},
		{"regression label", "clinic.csv", CSVOptions{Label: "score", Regression: true}, 0,
			[]string{"age", "weight", "diagnosis"}, []float64{0.25, 1.5, -0.75, 2, 0, 1.25}, []float64{45, 80, 0}},
		{"first column, BOM, quotes and spaces", "regression.csv", CSVOptions{Label: "x1", Regression: true}, 0,
			[]string{"x2", "target"}, []float64{1, 3, 5}, []float64{4, -1e-3}},
		{"index 0 as label", "regression.csv", CSVOptions{Label: "0", Regression: true}, 0,
			[]string{"x2", "target"}, []float64{1, 3, 5}, []float64{4, -1e-3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := LoadCSV("testdata/csv/"+tc.file, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimSuffix(tc.file, ".csv"); ds.Name != want {
				t.Errorf("name %q, want %q", ds.Name, want)
			}
			if ds.Classes != tc.classes || !slices.Equal(ds.FeatureNames, tc.features) || !slices.Equal(ds.Data.Y, tc.y) {
				t.Errorf("got classes %d features %q labels %v; want %d %q %v", ds.Classes, ds.FeatureNames, ds.Data.Y, tc.classes, tc.features, tc.y)
			}
			if ds.Data.N != len(tc.y) || ds.Data.D != len(tc.features) || !slices.Equal(ds.Data.Row(1), tc.row1) {
				t.Errorf("got %d×%d, row 1 %v; want %d×%d, %v", ds.Data.N, ds.Data.D, ds.Data.Row(1), len(tc.y), len(tc.features), tc.row1)
			}
		})
	}
}

func TestLoadCSVErrors(t *testing.T) {
	for _, tc := range []struct {
		file string
		opt  CSVOptions
		want string
	}{
		{"clinic.csv", CSVOptions{}, "no label column given"},
		{"clinic.csv", CSVOptions{Label: "outcome"}, `no label column "outcome": expected one of the header names ["age" "weight" "diagnosis" "score"]`},
		{"clinic.csv", CSVOptions{Label: "4"}, "label column index 4 out of range: the header has 4 columns (0..3)"},
		{"clinic.csv", CSVOptions{Label: "-1"}, "out of range"},
		{"clinic.csv", CSVOptions{Label: "score"}, `testdata/csv/clinic.csv:2:11: label column "score": "0.25" is not a class index`},
		{"ragged.csv", CSVOptions{Label: "y"}, "testdata/csv/ragged.csv:4: 2 fields, expected 3 as in the header"},
		{"nonnumeric.csv", CSVOptions{Label: "y"}, `testdata/csv/nonnumeric.csv:3:3: column "b": "four" is not a number`},
		{"emptycell.csv", CSVOptions{Label: "y"}, `testdata/csv/emptycell.csv:2:3: column "b": empty cell, expected a number`},
		{"empty.csv", CSVOptions{Label: "y"}, "csv testdata/csv/empty.csv: empty file: expected a header row"},
		{"headeronly.csv", CSVOptions{Label: "y"}, "no data rows after the header"},
		{"nan.csv", CSVOptions{Label: "y"}, `testdata/csv/nan.csv:3:3: column "b": "NaN" is not a finite number`},
		{"inf.csv", CSVOptions{Label: "y"}, `testdata/csv/inf.csv:3:3: column "b": "-Inf" is not a finite number`},
		{"overflow.csv", CSVOptions{Label: "y"}, `"1e400" is not a finite number`},
		{"nan.csv", CSVOptions{Label: "b", Regression: true}, `"NaN" is not a finite number`},
		{"fraclabel.csv", CSVOptions{Label: "y"}, `testdata/csv/fraclabel.csv:3:5: label column "y": "1.5" is not a class index (an integer in 0..65535); add :regression`},
		{"neglabel.csv", CSVOptions{Label: "y"}, `"-1" is not a class index`},
		{"oneclass.csv", CSVOptions{Label: "y"}, `every label in column "y" is 0`},
		{"duplabel.csv", CSVOptions{Label: "y"}, `label column "y" is ambiguous: columns 1 and 2`},
		{"labelonly.csv", CSVOptions{Label: "y"}, "only the label column"},
		{"badquote.csv", CSVOptions{Label: "y"}, `testdata/csv/badquote.csv:3:8: extraneous or missing " in quoted-field`},
		{"missing.csv", CSVOptions{Label: "y"}, "testdata/csv/missing.csv"},
	} {
		t.Run(tc.file+"/"+tc.opt.Label, func(t *testing.T) {
			ds, err := LoadCSV("testdata/csv/"+tc.file, tc.opt)
			if err == nil {
				t.Fatalf("got %d samples, want an error containing %q", ds.Data.N, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.want)
			}
			checkOneLine(t, err)
		})
	}
	// A duplicated label name can still be chosen by index.
	ds, err := LoadCSV("testdata/csv/duplabel.csv", CSVOptions{Label: "2"})
	if err != nil || ds.Data.D != 2 {
		t.Errorf("duplabel.csv by index: %v", err)
	}
}

// FuzzCSV feeds arbitrary text to the CSV reader, as a classification file
// labelled "y" and as a regression file labelled by index 0: it must never
// panic, and what it accepts must be finite, well-shaped data.
func FuzzCSV(f *testing.F) {
	for _, name := range []string{"clinic.csv", "regression.csv", "ragged.csv", "nan.csv"} {
		p, err := os.ReadFile("testdata/csv/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		for _, opt := range []CSVOptions{{Label: "y"}, {Label: "0", Regression: true}} {
			ds, err := csvFromBytes(p, opt)
			if err != nil {
				if strings.ContainsAny(err.Error(), "\n") {
					t.Fatalf("multi-line error %q", err)
				}
				continue
			}
			if err := ds.Data.Validate(); err != nil {
				t.Fatal(err)
			}
			if ds.Data.N < 1 || ds.Data.D < 1 || len(ds.FeatureNames) != ds.Data.D {
				t.Fatalf("accepted %d×%d with %d feature names", ds.Data.N, ds.Data.D, len(ds.FeatureNames))
			}
			if err := checkLabels(ds.Data.Y, ds.Classes); err != nil {
				t.Fatal(err)
			}
			if !opt.Regression && (ds.Classes < 2 || ds.Classes > MaxClassLabel+1) {
				t.Fatalf("%d classes", ds.Classes)
			}
			for _, y := range ds.Data.Y {
				if math.IsNaN(y) {
					t.Fatal("NaN label")
				}
			}
		}
	})
}
