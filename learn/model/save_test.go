package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestSaveLoadRoundTrip(t *testing.T) {
	rng := newRNG(10)
	for _, s := range gradSpecs {
		s.L2 = 0.25
		m := mustNew(t, s)
		w := randParams(rng, m, 1)
		var buf bytes.Buffer
		if err := Save(&buf, m, w); err != nil {
			t.Fatalf("%s: Save: %v", s.Kind, err)
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(buf.Bytes(), &keys); err != nil {
			t.Fatalf("%s: saved file is not a JSON object: %v", s.Kind, err)
		}
		for _, k := range []string{"kind", "inputs", "l2", "layout", "weights"} {
			if _, ok := keys[k]; !ok {
				t.Errorf("%s: saved file lacks %q: %s", s.Kind, k, buf.Bytes()[:min(buf.Len(), 200)])
			}
		}
		got, params, err := Load(&buf)
		if err != nil {
			t.Fatalf("%s: Load: %v", s.Kind, err)
		}
		if got.Spec() != m.Spec() {
			t.Errorf("%s: loaded spec %+v, want %+v", s.Kind, got.Spec(), m.Spec())
		}
		if !equalBits(params, w) {
			t.Errorf("%s: parameters changed in the round trip", s.Kind)
		}
		d := randData(rng, s, 5)
		if a, b := m.LossGrad(w, d, nil), got.LossGrad(params, d, nil); a != b {
			t.Errorf("%s: loss %v before saving, %v after", s.Kind, a, b)
		}
	}
}

// TestSaveLoadExact checks that values whose decimal forms are awkward
// survive bit for bit.
func TestSaveLoadExact(t *testing.T) {
	m := NewLinear(6, 0)
	w := []float64{0.1, math.Copysign(0, -1), 1e-300, math.SmallestNonzeroFloat64, math.MaxFloat64, -1.0 / 3, math.Nextafter(1, 2)}
	var buf bytes.Buffer
	if err := Save(&buf, m, w); err != nil {
		t.Fatal(err)
	}
	_, got, err := Load(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !equalBits(got, w) {
		t.Errorf("round trip gave %v, want %v", got, w)
	}
}

func TestSaveRejects(t *testing.T) {
	m := NewLogReg(2, 2, 0)
	tests := []struct {
		name    string
		params  []float64
		wantErr string
	}{
		{"short", make([]float64, 5), "has 6 parameters, got 5"},
		{"nan", []float64{0, 0, math.NaN(), 0, 0, 0}, "parameter 2 is NaN"},
		{"inf", []float64{0, 0, 0, 0, 0, math.Inf(-1)}, "parameter 5 is -Inf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := Save(&buf, m, tt.params)
			if !errors.Is(err, ErrSaved) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Save: error %v, want ErrSaved containing %q", err, tt.wantErr)
			}
			if buf.Len() != 0 {
				t.Errorf("Save wrote %d bytes before failing", buf.Len())
			}
		})
	}
}

func TestLoadRejects(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		wantErr string
	}{
		{"empty", "", "EOF"},
		{"not json", "weights: 1, 2", "invalid character"},
		{"truncated", `{"kind":"linear","inputs":1,"weights":[1,`, "unexpected EOF"},
		{"unknown kind", `{"kind":"svm","inputs":1,"l2":0,"layout":"","weights":[1,2]}`, `unknown model kind "svm"`},
		{"bad spec", `{"kind":"logreg","inputs":2,"classes":1,"l2":0,"layout":"","weights":[1,2,3]}`, "classes must be >= 2"},
		{"negative l2", `{"kind":"linear","inputs":1,"l2":-1,"layout":"","weights":[1,2]}`, "l2 must be"},
		{"too short", `{"kind":"linear","inputs":2,"l2":0,"layout":"","weights":[1,2]}`, "has 3 parameters, got 2"},
		{"too long", `{"kind":"linear","inputs":1,"l2":0,"layout":"","weights":[1,2,3]}`, "has 2 parameters, got 3"},
		{"no weights", `{"kind":"linear","inputs":1,"l2":0,"layout":""}`, "no weights"},
		{"null weights", `{"kind":"linear","inputs":1,"l2":0,"layout":"","weights":null}`, "no weights"},
		{"overflowing weight", `{"kind":"linear","inputs":1,"l2":0,"layout":"","weights":[1e999,0]}`, "1e999"},
		{"string weight", `{"kind":"linear","inputs":1,"l2":0,"layout":"","weights":["NaN",0]}`, "cannot unmarshal"},
		{"unknown field", `{"kind":"linear","inputs":1,"l2":0,"layout":"","weights":[1,2],"bias":3}`, `unknown field "bias"`},
		{"trailing data", `{"kind":"linear","inputs":1,"l2":0,"layout":"","weights":[1,2]} {"kind":"linear"}`, "after the model document"},
		{"trailing garbage", `{"kind":"linear","inputs":1,"l2":0,"layout":"","weights":[1,2]}x`, "after the model document"},
		{"array", `[1, 2]`, "cannot unmarshal array"},
		{"huge model", `{"kind":"mlp","inputs":1000000000,"hidden":1000000000,"classes":2,"activation":"relu","l2":0,"layout":"","weights":[]}`, "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, params, err := Load(strings.NewReader(tt.file))
			if !errors.Is(err, ErrSaved) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Load: error %v, want ErrSaved containing %q", err, tt.wantErr)
			}
			if m != nil || params != nil {
				t.Errorf("Load returned a model or parameters with its error")
			}
		})
	}
	// A file that passes is accepted with trailing whitespace (a newline is
	// what Save writes), and its layout text is not compared.
	if _, _, err := Load(strings.NewReader("{\"kind\":\"linear\",\"inputs\":1,\"l2\":0,\"layout\":\"old words\",\"weights\":[1,2]}\n\n")); err != nil {
		t.Errorf("Load of a valid file: %v", err)
	}
}
