package schema

import (
	"strings"
	"testing"
)

const declaredBase = `"task":"binary","label":{"column":"y","classes":[{"name":"neg","values":["B"]},{"name":"pos","values":["M"]}]}`

func TestDeclaredPreprocessing(t *testing.T) {
	s, err := Parse([]byte(`{` + declaredBase + `,"features":[{"name":"a","type":"numeric","center":2,"scale":0.5},` +
		`{"name":"b","type":"categorical","levels":["z","x"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Declared() {
		t.Fatal("Declared() = false")
	}
	// Defaults filled in: impute = center, impute_level = the first level.
	if f := s.Features[0]; f.Impute == nil || *f.Impute != 2 || s.Features[1].ImputeLevel != "z" {
		t.Fatalf("defaults not filled: %+v %+v", s.Features[0], s.Features[1])
	}
	explicit, err := Parse([]byte(`{` + declaredBase + `,"features":[{"name":"a","type":"numeric","center":2,"scale":0.5,"impute":2},` +
		`{"name":"b","type":"categorical","levels":["z","x"],"impute_level":"z"}]}`))
	if err != nil || explicit.Digest() != s.Digest() {
		t.Fatalf("spelt-out defaults change the digest: %v", err)
	}
	plain, err := Parse([]byte(`{` + base + `}`))
	if err != nil || plain.Declared() {
		t.Fatalf("a schema without declarations: %v, declared %v", err, plain.Declared())
	}
	// A schema without declarations keeps its digest: the new fields are
	// omitted from its canonical encoding.
	if c := string(plain.Canonical()); strings.Contains(c, "center") || strings.Contains(c, "levels") || strings.Contains(c, "impute") {
		t.Fatalf("canonical encoding of a plain schema mentions declared fields: %s", c)
	}
}

func TestDeclaredPreprocessingErrors(t *testing.T) {
	num := func(extra string) string { return `{"name":"a","type":"numeric"` + extra + `}` }
	cat := func(extra string) string { return `{"name":"b","type":"categorical"` + extra + `}` }
	schema := func(fs ...string) string {
		return `{` + declaredBase + `,"features":[` + strings.Join(fs, ",") + `]}`
	}
	cases := []struct{ name, json, want string }{
		{"only some", schema(num(`,"center":1,"scale":1`), cat(``)), `feature "b" declares no preprocessing`},
		{"no scale", schema(num(`,"center":1`)), "declare both center and scale"},
		{"zero scale", schema(num(`,"center":1,"scale":0`)), "scale a finite number > 0"},
		{"negative scale", schema(num(`,"center":1,"scale":-2`)), "scale a finite number > 0"},
		{"levels on numeric", schema(num(`,"center":1,"scale":1,"levels":["x"]`)), "declares levels"},
		{"center on categorical", schema(cat(`,"levels":["x"],"center":1`)), "declares center"},
		{"no levels", schema(cat(`,"impute_level":"x"`)), "declare its levels"},
		{"level twice", schema(cat(`,"levels":["x","x"]`)), `level "x" is listed twice`},
		{"missing token level", schema(cat(`,"levels":["x","NA"]`)), `level "NA" is a missing token`},
		{"impute not a level", schema(cat(`,"levels":["x"],"impute_level":"y"`)), `impute_level "y" is not one of its levels`},
		{"client standardize", `{` + declaredBase + `,"standardize":"client","features":[` + num(`,"center":1,"scale":1`) + `]}`, "standardize federation"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.json))
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Parse: %v, want one line with %q", err, c.want)
			}
		})
	}
}

// TestDeclaredExampleSchema: deploy/schema-dp.example.json is
// deploy/schema.example.json with every feature's preprocessing declared.
func TestDeclaredExampleSchema(t *testing.T) {
	plain, err := Load("../../deploy/schema.example.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load("../../deploy/schema-dp.example.json")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Declared() || plain.Declared() {
		t.Fatalf("declared: example %v, dp example %v", plain.Declared(), s.Declared())
	}
	if len(s.Features) != len(plain.Features) || s.Label.Column != plain.Label.Column {
		t.Fatalf("the dp example is not the example with declarations")
	}
	for i, f := range s.Features {
		if f.Name != plain.Features[i].Name || f.Type != plain.Features[i].Type || f.Scale == nil || !(*f.Scale > 0) {
			t.Errorf("feature %d: %+v, the example's %+v", i, f, plain.Features[i])
		}
	}
}
