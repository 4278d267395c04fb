package schema

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

func gradeSchema(t testing.TB) *Schema {
	s, err := Load("testdata/grades.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestReadCSVByName(t *testing.T) {
	s := gradeSchema(t)
	tab, err := s.ReadCSVFile("testdata/site.csv")
	if err != nil {
		t.Fatal(err)
	}
	if tab.Rows != 3 || len(tab.Extra) != 1 || tab.Extra[0] != "extra" {
		t.Fatalf("rows %d extra %v", tab.Rows, tab.Extra)
	}
	size, kind := tab.Columns[0], tab.Columns[1]
	if size.Num[0] != 1.5 || !size.Missing[1] || size.Num[2] != 2.5 {
		t.Fatalf("size %+v", size)
	}
	if kind.Level[0] != "a" || kind.Level[1] != "b" || !kind.Missing[2] {
		t.Fatalf("kind %+v", kind)
	}
	if tab.Labels[0] != 1 || tab.Labels[1] != 1 || tab.Labels[2] != 1 || !tab.SingleClass() {
		t.Fatalf("labels %v counts %v", tab.Labels, tab.ClassCounts)
	}
	if tab.Lines[2] != 4 {
		t.Fatalf("lines %v", tab.Lines)
	}
}

func TestReadCSVErrors(t *testing.T) {
	s := gradeSchema(t)
	cases := []struct {
		name, csv, want string
		kind            string
		line            int
		column, value   string
	}{
		{"missing column", "grade,kind\n1,a\n", `f.csv: line 1: missing column "size"`, KindMissingColumn, 1, "size", ""},
		{"missing label", "size,kind\n1,a\n", `missing label column "grade"`, KindMissingColumn, 1, "grade", ""},
		{"bad number", "size,kind,grade\n1,a,1\nabc,b,0\n", `f.csv: line 3: column "size": "abc" is not a finite number`, KindBadValue, 3, "size", "abc"},
		{"inf", "size,kind,grade\nInf,a,1\n", `"Inf" is not a finite number`, KindBadValue, 2, "size", "Inf"},
		{"unknown label", "size,kind,grade\n1,a,7\n", `line 2: label column "grade": unknown label value "7"`, KindUnknownLabel, 2, "grade", "7"},
		{"short row", "size,kind,grade\n1,a\n", "line 2: wrong number of fields", KindMalformed, 2, "", ""},
		{"empty", "", "empty file", KindEmpty, 0, "", ""},
		{"dup header", "size,size,kind,grade\n", `column "size" appears twice`, KindDuplicateColumn, 1, "size", ""},
		{"bare quote", "size,kind,grade\n1,a\"b,1\n", "bare \"", KindMalformed, 2, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.ReadCSV(strings.NewReader(c.csv), "f.csv")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("not one line: %q", err)
			}
			var ce *CSVError
			if !errors.As(err, &ce) {
				t.Fatalf("%T is not a *CSVError", err)
			}
			if ce.File != "f.csv" || ce.Kind != c.kind || ce.Line != c.line || ce.Column != c.column || ce.Value != c.value || ce.Expected == "" {
				t.Fatalf("%+v, want kind %q line %d column %q value %q", ce, c.kind, c.line, c.column, c.value)
			}
		})
	}
}

func TestReadFeaturesCSVWithoutLabel(t *testing.T) {
	s := gradeSchema(t)
	tab, err := s.ReadFeaturesCSV(strings.NewReader("kind,size\na,1\n"), "p.csv")
	if err != nil || tab.Rows != 1 || tab.Labels != nil {
		t.Fatalf("%v %+v", err, tab)
	}
}

func FuzzSchemaCSV(f *testing.F) {
	seed, err := os.ReadFile("testdata/site.csv")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte("size,kind,grade\n1,a,1\n\"x\ny\",b,0\n"))
	f.Add([]byte("grade,size,kind\n0,1e308,?\n"))
	s := gradeSchema(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := s.ReadCSV(strings.NewReader(string(b)), "fuzz.csv")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error: %q", err)
			}
			return
		}
		if len(tab.Labels) != tab.Rows || len(tab.Lines) != tab.Rows {
			t.Fatalf("rows %d labels %d lines %d", tab.Rows, len(tab.Labels), len(tab.Lines))
		}
		for _, c := range tab.Columns {
			if len(c.Missing) != tab.Rows || (len(c.Num) != tab.Rows && len(c.Level) != tab.Rows) {
				t.Fatal("column length differs from rows")
			}
		}
	})
}

func TestReadSitesCSVAndSubset(t *testing.T) {
	s := gradeSchema(t)
	csv := "site,size,kind,grade\nA,1,a,0\nB,2,b,1\nA,NA,b,3\n"
	tab, sites, err := s.ReadSitesCSV(strings.NewReader(csv), "all.csv", "site")
	if err != nil || strings.Join(sites, "") != "ABA" || len(tab.Extra) != 0 {
		t.Fatalf("%v %v %v", err, sites, tab.Extra)
	}
	a := tab.Subset([]int{0, 2})
	if a.Rows != 2 || a.Lines[1] != 4 || !a.Columns[0].Missing[1] || a.Columns[1].Level[1] != "b" || a.ClassCounts[0] != 1 || a.ClassCounts[1] != 1 {
		t.Fatalf("subset %+v", a)
	}
	for _, c := range []struct{ col, csv, want string }{
		{"where", csv, `missing site column "where"`},
		{"grade", csv, `is a schema column`},
		{"site", "site,size,kind,grade\n,1,a,0\n", `line 2: site column "site" is empty`},
	} {
		if _, _, err := s.ReadSitesCSV(strings.NewReader(c.csv), "all.csv", c.col); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", c.col, err, c.want)
		}
	}
}

// Subset of every task's table: a regression table's labels are values,
// not class indices, and have no class counts (a regression table once
// indexed ClassCounts by its target value and panicked).
func TestSubsetEveryTask(t *testing.T) {
	const feats = `"features":[{"name":"a","type":"numeric"},{"name":"k","type":"categorical"}]`
	for _, c := range []struct {
		task, label string
		counts      []int // class counts of rows 2 and 0
	}{
		{TaskBinary, `"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1","2"]}]}`, []int{1, 1}},
		{TaskMulticlass, `"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]},{"name":"q","values":["2"]}]}`, []int{1, 0, 1}},
		{TaskRegression, `"label":{"column":"y"}`, nil},
	} {
		t.Run(c.task, func(t *testing.T) {
			s, err := Parse([]byte(`{"task":"` + c.task + `",` + feats + `,` + c.label + `}`))
			if err != nil {
				t.Fatal(err)
			}
			tab, err := s.ReadCSV(strings.NewReader("a,k,y\n1,x,0\n2,y,1\n3,?,2\n"), "f.csv")
			if err != nil {
				t.Fatal(err)
			}
			sub := tab.Subset([]int{2, 0})
			if sub.Rows != 2 || sub.Lines[0] != 4 || sub.Columns[0].Num[1] != 1 || !sub.Columns[1].Missing[0] {
				t.Fatalf("subset %+v", sub)
			}
			if !slices.Equal(sub.ClassCounts, c.counts) || (c.counts == nil) != (tab.ClassCounts == nil) || sub.SingleClass() {
				t.Fatalf("class counts %v (table %v), want %v", sub.ClassCounts, tab.ClassCounts, c.counts)
			}
			if c.task == TaskRegression && !slices.Equal(sub.Labels, []float64{2, 0}) {
				t.Fatalf("labels %v", sub.Labels)
			}
		})
	}
}
