package schema

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Values that mean the same at every site (the statistics phase would
// otherwise split a feature: one hospital exporting chest-pain type as
// "4.0", the others as "4", gave 8 levels for 4).
//
//   - A categorical cell, a label value, a declared level and a missing
//     token that read as a finite number are compared as that number
//     (Level): "1", "1.0", "01", "+1" and "1e0" are one level, written
//     "1" in the statistics and the fitted transform; "-0" is "0". Any
//     other text is compared as it is (after trimming spaces, as every
//     cell is).
//   - A feature's own missing tokens ("missing": ["0"]) are missing for
//     that feature only, besides the schema's.
//   - A numeric feature's valid range ("min", "max", either or both): a
//     value outside it is an error at the site (a bad value, the row's
//     line named), or with "out_of_range": "missing" a missing value.

// Out-of-range actions (Feature.OutOfRange).
const (
	OutOfRangeError   = "error"   // the default
	OutOfRangeMissing = "missing" // the value is missing
)

// MaxFeatureMissing bounds a feature's own missing tokens.
const MaxFeatureMissing = 64

// Level is the canonical form of a categorical value: a value that reads
// as a finite number is that number in Go's shortest round-trip form
// (strconv 'g'), so values that are the same number are one level; any
// other text is itself.
func Level(v string) string {
	if x, ok := parseFinite(v); ok {
		if x == 0 {
			x = 0 // -0
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return v
}

// matchesToken reports whether v is one of tokens, numbers compared as
// numbers.
func matchesToken(v string, tokens []string) bool {
	var l string
	leveled := false
	for _, t := range tokens {
		if t == v {
			return true
		}
		if !leveled {
			l, leveled = Level(v), true
		}
		if Level(t) == l {
			return true
		}
	}
	return false
}

// missing reports whether cell is missing for feature f: one of the
// schema's tokens or the feature's own.
func (s *Schema) missing(f *Feature, cell string) bool {
	return s.IsMissing(cell) || (len(f.Missing) > 0 && matchesToken(cell, f.Missing))
}

// inRange reports whether v lies in f's valid range.
func (f *Feature) inRange(v float64) bool {
	return (f.Min == nil || v >= *f.Min) && (f.Max == nil || v <= *f.Max)
}

// rangeText is f's valid range for messages.
func (f *Feature) rangeText() string {
	lo, hi := "-inf", "+inf"
	if f.Min != nil {
		lo = strconv.FormatFloat(*f.Min, 'g', -1, 64)
	}
	if f.Max != nil {
		hi = strconv.FormatFloat(*f.Max, 'g', -1, 64)
	}
	return "[" + lo + ", " + hi + "]"
}

// fillValues spells the default out-of-range action as absent (Parse), so
// that writing "error" does not change the digest.
func (s *Schema) fillValues() {
	for i := range s.Features {
		if s.Features[i].OutOfRange == OutOfRangeError {
			s.Features[i].OutOfRange = ""
		}
	}
}

// validateValues checks f's own missing tokens and valid range.
func (f *Feature) validateValues() error {
	if len(f.Missing) > MaxFeatureMissing {
		return fmt.Errorf("feature %q: %d missing tokens, at most %d", f.Name, len(f.Missing), MaxFeatureMissing)
	}
	for _, m := range f.Missing {
		if len(m) > MaxNameBytes {
			return fmt.Errorf("feature %q: a missing token is longer than %d bytes", f.Name, MaxNameBytes)
		}
	}
	if f.Type != Numeric {
		if f.Min != nil || f.Max != nil || f.OutOfRange != "" {
			return fmt.Errorf("categorical feature %q has a valid range (min, max, out_of_range): only a numeric feature has one", f.Name)
		}
		return nil
	}
	for _, b := range []*float64{f.Min, f.Max} {
		if b != nil && (math.IsNaN(*b) || math.IsInf(*b, 0)) {
			return fmt.Errorf("numeric feature %q: min and max must be finite", f.Name)
		}
	}
	if f.Min != nil && f.Max != nil && *f.Min > *f.Max {
		return fmt.Errorf("numeric feature %q: min %v is above max %v", f.Name, *f.Min, *f.Max)
	}
	switch f.OutOfRange {
	case "", OutOfRangeError, OutOfRangeMissing:
	default:
		return fmt.Errorf("numeric feature %q: unknown out_of_range %q, expected error (the default) or missing", f.Name, f.OutOfRange)
	}
	if f.OutOfRange != "" && f.Min == nil && f.Max == nil {
		return errors.New("numeric feature " + strconv.Quote(f.Name) + ": out_of_range without min or max")
	}
	return nil
}
