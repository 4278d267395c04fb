package schema

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

const dialectSchema = `{"task":"regression","features":[{"name":"chol","type":"numeric"},{"name":"cp","type":"categorical"}],"label":{"column":"y"}%s}`

func dialect(t *testing.T, extra string) *Schema {
	t.Helper()
	s, err := Parse([]byte(strings.Replace(dialectSchema, "%s", extra, 1)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A spreadsheet export with ";" separators and decimal commas reads with
// "separator": ";" and "decimal": ","; without them, the refusal says which
// separator the header holds (it named a missing column), and a number
// with the other decimal mark says so.
func TestCSVDialect(t *testing.T) {
	const export = "chol;cp;y\n233,5;4,0;1,25\n250;\"a,b\";-2\n?;4;3\n"
	s := dialect(t, `,"separator":";","decimal":","`)
	tab, err := s.ReadCSV(strings.NewReader(export), "eu.csv")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tab.Columns[0].Num, []float64{233.5, 250, 0}) || !tab.Columns[0].Missing[2] ||
		!slices.Equal(tab.Columns[1].Level, []string{"4", "a,b", "4"}) || !slices.Equal(tab.Labels, []float64{1.25, -2, 3}) {
		t.Fatalf("read %+v labels %v", tab.Columns, tab.Labels)
	}
	for _, c := range []struct {
		name, extra, csv, want string
		kind                   string
	}{
		{"semicolons, schema default", "", export, `eu.csv: line 1: missing column "chol" (numeric feature of the schema) (the header is separated by ";", the schema reads ",": set "separator": ";" in the schema)`, KindMissingColumn},
		{"tabs", "", "chol\tcp\ty\n1\ta\t2\n", `(the header is separated by "\\t", the schema reads ","`, KindMissingColumn},
		{"commas, schema semicolons", `,"separator":";"`, "chol,cp,y\n1,a,2\n", `(the header is separated by ",", the schema reads ";"`, KindMissingColumn},
		{"decimal comma, schema point", `,"separator":";"`, "chol;cp;y\n1,5;a;2\n", `line 2: column "chol": "1,5" is not a finite number or a missing token (this cell has a decimal comma: set "decimal": ","`, KindBadValue},
		{"point, schema decimal comma", `,"separator":";","decimal":","`, "chol;cp;y\n1.234;a;2\n", `"1.234" is not a finite number or a missing token (the schema's decimal mark is ","`, KindBadValue},
		{"label point, schema decimal comma", `,"separator":";","decimal":","`, "chol;cp;y\n1;a;2.5\n", `label column "y": "2.5" is not a finite number (the schema's decimal mark is ","`, KindBadValue},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := dialect(t, c.extra).ReadCSV(strings.NewReader(c.csv), "eu.csv")
			var ce *CSVError
			if !errors.As(err, &ce) || ce.Kind != c.kind || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%v\nwant %q", err, c.want)
			}
		})
	}
	for _, c := range []struct{ extra, want string }{
		{`,"decimal":","`, `decimal "," with the separator ","`},
		{`,"separator":";;"`, `separator ";;": expected one character`},
		{`,"separator":"\""`, `expected one character`},
		{`,"decimal":"·"`, `decimal "·": expected "." (the default) or ","`},
	} {
		if _, err := Parse([]byte(strings.Replace(dialectSchema, "%s", c.extra, 1))); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.extra, err, c.want)
		}
	}
	if a, b := dialect(t, `,"separator":",","decimal":"."`), dialect(t, ""); a.Digest() != b.Digest() {
		t.Error("the default separator and decimal mark spelt out change the digest")
	}
}
