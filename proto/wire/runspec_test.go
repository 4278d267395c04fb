package wire

import (
	"errors"
	"testing"
)

// TestRunSpecByDigest: an announcement whose bodies moved to the run spec
// carries only their digests; a receiver resolves them from the bodies it
// received and refuses a body whose digest is not the one named.
func TestRunSpecByDigest(t *testing.T) {
	sc, tr := []byte(`{"label":"y"}`), []byte(`{"outputs":1}`)
	ann := minRound()
	ann.Schema, ann.Transform = sc, tr
	spec := ann.ByDigest()
	if len(ann.Schema) != 0 || len(ann.Transform) != 0 || ann.SchemaDigest != BodyDigest(sc) || ann.TransformDigest != BodyDigest(tr) {
		t.Fatalf("ByDigest left %q %q, digests %q %q", ann.Schema, ann.Transform, ann.SchemaDigest, ann.TransformDigest)
	}
	b, err := Encode(ann)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeRound(b, Limits{}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec *RunSpec
		ok   bool
	}{
		{"none", nil, false},
		{"schema only", &RunSpec{Federation: "f", Schema: sc}, false},
		{"altered transform", &RunSpec{Federation: "f", Schema: sc, Transform: []byte(`{"outputs":2}`)}, false},
		{"the run's", spec, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c BodyCache
			if tt.spec != nil {
				c.Add(tt.spec)
			}
			a, _ := DecodeRound(b, Limits{})
			err := c.Resolve(a)
			if !tt.ok {
				if !errors.Is(err, ErrBodyMissing) || len(a.Schema) != 0 || len(a.Transform) != 0 {
					t.Fatalf("Resolve = %v, schema %q transform %q; want ErrBodyMissing and nothing filled", err, a.Schema, a.Transform)
				}
				return
			}
			if err != nil || string(a.Schema) != string(sc) || string(a.Transform) != string(tr) {
				t.Fatalf("Resolve = %v, schema %q transform %q", err, a.Schema, a.Transform)
			}
			if err := a.Validate(Limits{}); err != nil {
				t.Fatalf("resolved announcement invalid: %v", err)
			}
		})
	}
	// A body sent with a digest that is not its own is refused.
	bad, _ := DecodeRound(b, Limits{})
	bad.Schema = []byte(`{"label":"z"}`)
	if err := bad.Validate(Limits{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("body with another digest: Validate = %v, want ErrInvalid", err)
	}
}

// A run spec's statistics sites come only with a transform, as valid ids,
// each once.
func TestRunSpecStatisticsSites(t *testing.T) {
	base := func() *RunSpec {
		return &RunSpec{Federation: "fed", RunId: "r1", Schema: []byte(`{}`), Transform: []byte(`{}`), StatisticsSites: []string{"site-a", "site-b"}}
	}
	if err := base().Validate(Limits{}); err != nil {
		t.Fatalf("valid spec refused: %v", err)
	}
	for name, mod := range map[string]func(*RunSpec){
		"without a transform": func(s *RunSpec) { s.Transform = nil },
		"listed twice":        func(s *RunSpec) { s.StatisticsSites = []string{"site-a", "site-a"} },
		"not an id":           func(s *RunSpec) { s.StatisticsSites = []string{"site a"} },
	} {
		s := base()
		mod(s)
		if err := s.Validate(Limits{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}
