package prep

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/schema"
)

// TestDeclared: the transform a schema declares is a function of the
// schema alone, with fitted transforms' conventions (levels in lexical
// order, unseen levels all zeros, missing cells imputed).
func TestDeclared(t *testing.T) {
	s, err := schema.Parse([]byte(`{"task":"binary",
	 "features":[{"name":"age","type":"numeric","center":50,"scale":10,"impute":40},
	             {"name":"ward","type":"categorical","levels":["C","A","B"],"impute_level":"B"}],
	 "label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Declared(s)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Outputs != 4 || !slices.Equal(tr.Columns[1].Levels, []string{"A", "B", "C"}) || tr.SchemaDigest != s.Digest() {
		t.Fatalf("transform %+v", tr)
	}
	tab, err := s.ReadCSV(strings.NewReader("age,ward,y\n60,A,1\nNA,?,0\n30,D,0\n"), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	d := tr.Apply(tab, nil)
	want := []float64{
		1, 1, 0, 0, // (60-50)/10, A
		-1, 0, 1, 0, // impute 40, impute level B
		-2, 0, 0, 0, // an unseen level: all zeros
	}
	if !slices.Equal(d.X, want) {
		t.Fatalf("applied: %v, want %v", d.X, want)
	}
	// Same schema, same transform, whoever computes it.
	again, _ := Declared(s)
	if a, b := again.Columns[0], tr.Columns[0]; a.Mean != b.Mean || a.Scale != b.Scale || a.Impute != b.Impute {
		t.Fatal("Declared is not deterministic")
	}

	plain, err := schema.Parse([]byte(`{"task":"binary","features":[{"name":"age","type":"numeric"}],
	 "label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Declared(plain); err == nil || !strings.Contains(err.Error(), "declares no preprocessing") {
		t.Fatalf("a schema without declarations: %v", err)
	}
}

// FuzzDeclared: a schema from the network (an announcement carries it)
// either fails to parse with a one-line error or, when it declares its
// preprocessing, always gives a valid transform (the schema's validation
// admits nothing prep.Transform.Validate refuses), and its canonical
// encoding parses back to the same digest.
func FuzzDeclared(f *testing.F) {
	f.Add([]byte(`{"task":"binary","features":[{"name":"a","type":"numeric","center":1,"scale":2},{"name":"b","type":"categorical","levels":["x","y"]}],` +
		`"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]}]}}`))
	f.Add([]byte(`{"task":"regression","features":[{"name":"a","type":"numeric","center":-1e308,"scale":1e-308,"impute":0}],"label":{"column":"y"},"missing":[]}`))
	f.Add([]byte(`{"task":"multiclass","features":[{"name":"b","type":"categorical","levels":["",""],"impute_level":""}],"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]},{"name":"q","values":["2"]}]},"missing":["?"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := schema.Parse(b)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error: %q", err)
			}
			return
		}
		again, err := schema.Parse(s.Canonical())
		if err != nil || again.Digest() != s.Digest() {
			t.Fatalf("canonical encoding does not parse back: %v", err)
		}
		if !s.Declared() {
			return
		}
		tr, err := Declared(s)
		if err != nil {
			t.Fatalf("a valid declared schema gives no transform: %v", err)
		}
		if err := tr.Validate(again); err != nil {
			t.Fatalf("the transform does not fit the re-parsed schema: %v", err)
		}
	})
}
