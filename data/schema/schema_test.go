package schema

import (
	"bytes"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/testkit"
)

const base = `"task":"binary","features":[{"name":"a","type":"numeric"},{"name":"b","type":"categorical"}],` +
	`"label":{"column":"y","classes":[{"name":"neg","values":["B"]},{"name":"pos","values":["M"]}]}`

func TestParseErrors(t *testing.T) {
	cases := []struct{ name, json, want string }{
		{"column twice", `{"task":"binary","features":[{"name":"a","type":"numeric"},{"name":"a","type":"numeric"}],"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]}]}}`, `column "a" is named twice`},
		{"label as feature", `{"task":"binary","features":[{"name":"y","type":"numeric"}],"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]}]}}`, `both the label and a feature`},
		{"no label", `{"task":"binary","features":[{"name":"a","type":"numeric"}]}`, "no label"},
		{"empty label column", `{"task":"regression","features":[{"name":"a","type":"numeric"}],"label":{"column":""}}`, "no label"},
		{"label two classes", `{"task":"binary","features":[{"name":"a","type":"numeric"}],"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["0"]}]}}`, `label value "0" is mapped to two classes`},
		{"unknown type", `{"task":"binary","features":[{"name":"a","type":"text"}],"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]}]}}`, `unknown type "text"`},
		{"unknown task", `{"task":"ranking","features":[{"name":"a","type":"numeric"}],"label":{"column":"y"}}`, `unknown task "ranking"`},
		{"binary three classes", `{"task":"binary","features":[{"name":"a","type":"numeric"}],"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1"]},{"name":"q","values":["2"]}]}}`, "exactly 2 classes"},
		{"regression classes", `{"task":"regression","features":[{"name":"a","type":"numeric"}],"label":{"column":"y","classes":[{"name":"n","values":["0"]}]}}`, "no classes"},
		{"unknown field", `{` + base + `,"holdot":0.3}`, `unknown field "holdot"`},
		{"bad holdout", `{` + base + `,"holdout":1.5}`, "holdout 1.5"},
		{"bad standardize", `{` + base + `,"standardize":"global"}`, `unknown standardize "global"`},
		{"min samples", `{` + base + `,"min_site_samples":0}`, "min_site_samples 0"},
		{"label missing token", `{"task":"binary","features":[{"name":"a","type":"numeric"}],"label":{"column":"y","classes":[{"name":"n","values":["NA"]},{"name":"p","values":["1"]}]}}`, "also a missing token"},
		{"trailing", `{` + base + `} {}`, "trailing data"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.json))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse: %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
}

func TestDefaultsAndDigest(t *testing.T) {
	s, err := Parse([]byte(`{` + base + `}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.MinSiteSamples != 10 || s.Standardize != StandardizeFederation || s.Holdout != 0.2 || len(s.Missing) != len(DefaultMissing) {
		t.Fatalf("defaults not filled: %+v", s)
	}
	explicit, err := Parse([]byte(`{` + base + `,"min_site_samples":10,"standardize":"federation","holdout":0.2,"holdout_seed":1,"missing":["","NA","N/A","n/a","?","NaN"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Digest() != explicit.Digest() {
		t.Fatal("explicit defaults change the digest")
	}
	other, _ := Parse([]byte(`{` + base + `,"holdout":0.3}`))
	if other.Digest() == s.Digest() {
		t.Fatal("a different holdout has the same digest")
	}
	again, err := Parse(s.Canonical())
	if err != nil || !bytes.Equal(again.Canonical(), s.Canonical()) {
		t.Fatalf("canonical does not round-trip: %v", err)
	}
}

func TestExampleSchema(t *testing.T) {
	s, err := Load("../../deploy/schema.example.json")
	if err != nil {
		t.Fatal(err)
	}
	if s.Task != TaskBinary || len(s.Features) != 30 {
		t.Fatalf("example: task %s, %d features", s.Task, len(s.Features))
	}
}

func TestLoadErrorNamesFile(t *testing.T) {
	dir := t.TempDir()
	p := dir + "/bad.json"
	testkit.WriteFile(t, p, `{"task":"binary"}`)
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("Load: %v", err)
	}
}

func TestHoldoutShare(t *testing.T) {
	s, _ := Parse([]byte(`{` + base + `,"holdout":0.25,"holdout_seed":7}`))
	n, held := 100000, 0
	for i := range n {
		if s.HoldoutRow(i) {
			held++
		}
	}
	if share := float64(held) / float64(n); share < 0.24 || share > 0.26 {
		t.Fatalf("held out share %v, want about 0.25", share)
	}
	s.Holdout = 0
	if s.HoldoutRow(3) {
		t.Fatal("holdout 0 holds out rows")
	}
}

// TestUnknownFieldPath: a key the schema does not know is refused with its
// JSON path, the key, a hint where the mistake is a common one (or the
// nearest known key), and what the object takes; encoding/json alone said
// only `unknown field "name"`.
func TestUnknownFieldPath(t *testing.T) {
	const feats = `"features":[{"name":"a","type":"numeric"},{"name":"b","type":"categorical"}]`
	const label = `"label":{"column":"y","classes":[{"name":"neg","values":["B"]},{"name":"pos","values":["M"]}]}`
	for _, c := range []struct{ name, json, want string }{
		{"label name", `{"task":"regression",` + feats + `,"label":{"name":"y"}}`,
			`label: unknown field "name"; the label column is "column" (label takes column, classes)`},
		{"feature column", `{"task":"binary","features":[{"name":"a","type":"numeric"},{"column":"b","type":"numeric"}],` + label + `}`,
			`features[1]: unknown field "column"; a feature's column is "name" (a feature takes name, type,`},
		{"feature misspelt", `{"task":"binary","features":[{"nme":"a","type":"numeric"}],` + label + `}`,
			`features[0]: unknown field "nme"; did you mean "name"? (a feature takes name, type,`},
		{"class value", `{"task":"binary",` + feats + `,"label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","value":["1"]}]}}`,
			`label.classes[1]: unknown field "value"; a class's raw values are "values": [...] (a class takes name, values)`},
		{"top level", `{"task":"binary",` + feats + `,` + label + `,"holdot":0.3}`,
			`unknown field "holdot"; did you mean "holdout"? (the schema takes task, features, label,`},
		{"top level far", `{"task":"binary",` + feats + `,` + label + `,"colour":1}`,
			`unknown field "colour" (the schema takes task,`},
		{"after nested values", `{"task":"binary","features":[{"name":"a","type":"categorical","levels":["x","y"]},{"name":"b","type":"numeric","center":1,"scale":2,"Impute":0,"zzz":{"q":[1]}}],` + label + `}`,
			`features[1]: unknown field "zzz" (a feature takes`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.json))
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Parse: %v\nwant %q", err, c.want)
			}
		})
	}
}
