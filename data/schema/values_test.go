package schema

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestLevel(t *testing.T) {
	for in, want := range map[string]string{
		"1": "1", "1.0": "1", "01": "1", "+1": "1", "1e0": "1", "4.00": "4", "-0": "0", "0.0": "0", "2.50": "2.5",
		"1e21": "1e+21", "male": "male", "": "", "NaN": "NaN", "Inf": "Inf", "1_000": "1000", "0x10": "0x10", " 1": " 1",
	} {
		if got := Level(in); got != want {
			t.Errorf("Level(%q) = %q, want %q", in, got, want)
		}
	}
}

// Categorical values that are the same number are one level, at every
// site ("4.0" at one hospital, "4" at the others); so are label values,
// declared levels and missing tokens.
func TestNumbersComparedAsNumbers(t *testing.T) {
	s, err := Parse([]byte(`{"task":"multiclass","features":[{"name":"cp","type":"categorical"},{"name":"a","type":"numeric"}],
		"label":{"column":"num","classes":[{"name":"none","values":["0"]},{"name":"mild","values":["1"]},{"name":"severe","values":["2","3"]}]},
		"missing":["?","-9"]}`))
	if err != nil {
		t.Fatal(err)
	}
	tab, err := s.ReadCSV(strings.NewReader("cp,a,num\n4.0,1,0\n4,2,1.0\n1.0,-9.0,3.00\n01,3,2\n?,-9,0\nasym,4,1\n"), "f.csv")
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Columns[0].Level; !slices.Equal(got, []string{"4", "4", "1", "1", "", "asym"}) || !tab.Columns[0].Missing[4] {
		t.Fatalf("levels %q missing %v", got, tab.Columns[0].Missing)
	}
	if !slices.Equal(tab.Columns[1].Missing, []bool{false, false, true, false, true, false}) {
		t.Fatalf("a missing %v: -9.0 is the missing token -9", tab.Columns[1].Missing)
	}
	if !slices.Equal(tab.Labels, []float64{0, 1, 2, 2, 0, 1}) {
		t.Fatalf("labels %v", tab.Labels)
	}
	for _, c := range []struct{ json, want string }{
		{`"label":{"column":"y","classes":[{"name":"n","values":["1"]},{"name":"p","values":["1.0"]}]}`, `label value "1.0" is mapped to two classes`},
		{`"label":{"column":"y","classes":[{"name":"n","values":["1","01"]},{"name":"p","values":["2"]}]}`, `label value "01" is listed twice`},
		{`"label":{"column":"y","classes":[{"name":"n","values":["-9.0"]},{"name":"p","values":["2"]}]},"missing":["-9"]`, `label value "-9.0" of class "n" is also a missing token`},
	} {
		_, err := Parse([]byte(`{"task":"binary","features":[{"name":"a","type":"numeric"}],` + c.json + `}`))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.json, err, c.want)
		}
	}
	_, err = Parse([]byte(`{"task":"regression","features":[{"name":"k","type":"categorical","levels":["1","1.0"]}],"label":{"column":"y"}}`))
	if err == nil || !strings.Contains(err.Error(), `level "1.0" is listed twice`) {
		t.Errorf("declared levels 1 and 1.0: %v", err)
	}
}

// A feature's own missing tokens are missing for it only; a valid range
// makes a value outside it an error naming the line and the range, or
// with out_of_range missing a missing value.
func TestFeatureMissingAndRange(t *testing.T) {
	s, err := Parse([]byte(`{"task":"regression","features":[
		{"name":"chol","type":"numeric","missing":["0"]},
		{"name":"bp","type":"numeric","min":40,"max":250,"out_of_range":"missing"},
		{"name":"age","type":"numeric","min":0,"max":120},
		{"name":"k","type":"categorical","missing":["unknown"]}],
		"label":{"column":"y"}}`))
	if err != nil {
		t.Fatal(err)
	}
	tab, err := s.ReadCSV(strings.NewReader("chol,bp,age,k,y\n0,0,50,0,1\n0.0,120,0,unknown,2\n230,300,120,x,3\n"), "f.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]bool{{true, true, false}, {true, false, true}, {false, false, false}, {false, true, false}}
	for j, w := range want {
		if !slices.Equal(tab.Columns[j].Missing, w) {
			t.Errorf("feature %s missing %v, want %v", s.Features[j].Name, tab.Columns[j].Missing, w)
		}
	}
	if tab.Columns[1].Num[2] != 0 || tab.Columns[0].Num[2] != 230 || tab.Columns[3].Level[0] != "0" {
		t.Fatalf("columns %+v", tab.Columns)
	}
	_, err = s.ReadCSV(strings.NewReader("chol,bp,age,k,y\n1,100,50,a,1\n1,100,121,a,1\n"), "f.csv")
	var ce *CSVError
	if !errors.As(err, &ce) || ce.Kind != KindBadValue || ce.Line != 3 || ce.Column != "age" ||
		!strings.Contains(err.Error(), `f.csv: line 3: column "age": "121" is not a number in the schema's valid range [0, 120] or a missing token`) {
		t.Fatalf("out of range: %v", err)
	}
	explicit, err := Parse([]byte(`{"task":"regression","features":[{"name":"age","type":"numeric","min":0,"max":120,"out_of_range":"error"}],"label":{"column":"y"}}`))
	implicit, err2 := Parse([]byte(`{"task":"regression","features":[{"name":"age","type":"numeric","min":0,"max":120}],"label":{"column":"y"}}`))
	if err != nil || err2 != nil || explicit.Digest() != implicit.Digest() {
		t.Fatalf("out_of_range error spelt out changes the digest: %v %v", err, err2)
	}
	for _, c := range []struct{ feat, want string }{
		{`{"name":"k","type":"categorical","min":1}`, `categorical feature "k" has a valid range`},
		{`{"name":"a","type":"numeric","min":5,"max":1}`, `min 5 is above max 1`},
		{`{"name":"a","type":"numeric","out_of_range":"missing"}`, `out_of_range without min or max`},
		{`{"name":"a","type":"numeric","min":1,"out_of_range":"drop"}`, `unknown out_of_range "drop"`},
		{`{"name":"k","type":"categorical","levels":["0","1"],"missing":["0.0"]}`, `level "0" is a missing token`},
	} {
		_, err := Parse([]byte(`{"task":"regression","features":[` + c.feat + `],"label":{"column":"y"}}`))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.feat, err, c.want)
		}
	}
}
