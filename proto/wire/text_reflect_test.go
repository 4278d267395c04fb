package wire

import (
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

// fill sets every field of the struct v to a value that is written:
// strings with quotes and non-ASCII, numbers at their extremes, enums known
// (variant 0) or unknown (1), floats finite, NaN, -0 or infinite, repeated
// fields of two, sub-messages filled in turn.
func fill(v reflect.Value, variant, depth int) {
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("a\"b\\é\n" + v.Type().Field(i).Name)
		case reflect.Uint32:
			f.SetUint(math.MaxUint32 - uint64(variant))
		case reflect.Uint64:
			f.SetUint(1<<40 + uint64(i))
		case reflect.Int64:
			f.SetInt(-5 - int64(i))
		case reflect.Int32:
			f.SetInt([]int64{1, 99}[variant%2])
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Float64:
			f.SetFloat([]float64{-1.5e-300, math.NaN(), math.Copysign(0, -1), math.Inf(-1)}[variant%4])
		case reflect.Pointer:
			if depth < 4 {
				f.Set(reflect.New(f.Type().Elem()))
				fill(f.Elem(), variant, depth+1)
			}
		case reflect.Slice:
			s := reflect.MakeSlice(f.Type(), 2, 2)
			for j := range 2 {
				switch e := s.Index(j); e.Kind() {
				case reflect.String:
					e.SetString("x\"" + string(rune('a'+j)))
				case reflect.Uint8, reflect.Uint32:
					e.SetUint(uint64(j + 200))
				case reflect.Float64:
					e.SetFloat([]float64{math.Inf(1), 0.1}[j])
				}
			}
			f.Set(s)
		}
	}
}

// textForms is the text form of every message, empty and filled in four
// ways, alone and in an envelope, and of nil and empty bodies.
func textForms(t *testing.T) string {
	var b strings.Builder
	for _, mk := range []func() Message{
		func() Message { return &RoundAnnouncement{} }, func() Message { return &ClientStatus{} },
		func() Message { return &ClientUpdate{} }, func() Message { return &Receipt{} },
		func() Message { return &SiteStatistics{} }, func() Message { return &EvalReport{} },
		func() Message { return &SecAggMessage{} }, func() Message { return &RunSpec{} },
	} {
		for variant := range 4 {
			m := mk()
			fmt.Fprintf(&b, "%T %d empty: %s\n", m, variant, m)
			fill(reflect.ValueOf(m).Elem(), variant, 0)
			if n := len(m.String()); n < 40 {
				t.Fatalf("%T filled writes %d bytes: fill sets nothing", m, n)
			}
			fmt.Fprintf(&b, "%T %d filled: %s\n", m, variant, m)
			fmt.Fprintf(&b, "%T %d envelope: %s\n", m, variant, &Envelope{Version: 1, Body: m.wrap()})
		}
	}
	var nilRound *RoundAnnouncement
	var nilWrap *Envelope_Update
	fmt.Fprintf(&b, "nil: %s\nempty body: %s\nnil body: %s\n", nilRound.String(),
		&Envelope{Body: &Envelope_Round{}}, &Envelope{Body: nilWrap})
	return b.String()
}

// The text form of every message (String: one writer walking the fields by
// reflection) is, byte for byte, what the generated per-message writers
// wrote (testdata/text_forms.golden, written by them).
func TestTextForms(t *testing.T) {
	got := textForms(t)
	if os.Getenv("WIRE_UPDATE_TEXT_GOLDEN") != "" {
		if err := os.WriteFile("testdata/text_forms.golden", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/text_forms.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("line %d:\ngot  %s\nwant %s", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("%d lines, want %d", len(gl), len(wl))
	}
}
