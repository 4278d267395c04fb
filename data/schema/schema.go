// Package schema is the federation schema: the features a
// federation trains on, by CSV column name, each numeric or categorical; the
// label column and its mapping from raw values to classes; the tokens that
// mean missing; the task; and the preprocessing options every site applies
// identically. It also reads a site's CSV by header name (ReadCSV).
//
// # Format
//
// A schema is a JSON object (see deploy/schema.example.json):
//
//	{
//	  "task": "binary",                  // binary, multiclass or regression
//	  "features": [{"name": "age", "type": "numeric"},
//	               {"name": "chol", "type": "numeric",       // optional per feature:
//	                "missing": ["0"],                        // its own missing tokens
//	                "min": 50, "max": 700,                   // a valid range
//	                "out_of_range": "error"},                // error (default) or missing
//	               {"name": "site_kind", "type": "categorical"}],
//	  "label": {"column": "diagnosis",
//	            "classes": [{"name": "benign",    "values": ["B", "0"]},
//	                        {"name": "malignant", "values": ["M", "1"]}]},
//	  "missing": ["", "NA", "N/A", "n/a", "?", "NaN"],  // optional, this default
//	  "min_site_samples": 10,            // optional, default 10
//	  "standardize": "federation",       // optional: federation (default) or client
//	  "holdout": 0.2,                    // optional, default 0.2, in [0, 0.9]
//	  "holdout_seed": 1,                 // optional, default 1
//	  "separator": ";",                  // optional: the CSV's field separator, default ","
//	  "decimal": ","                     // optional: the decimal mark, "." (default) or ","
//	}
//
// A schema may also declare the preprocessing instead of having the
// federation fit it from the sites' statistics (declared.go): every numeric
// feature then carries "center" and "scale" (and optionally "impute"),
// every categorical one its "levels" (and optionally "impute_level"); see
// deploy/schema-dp.example.json. Differential privacy (--dp) requires it.
//
// For binary and multiclass tasks the order of "classes" is the class order:
// class k is the model's output k (binary: classes[1] is the positive class).
// Several raw values may map to one class; a raw value may map to only one.
// predict reports a predicted class k by its name, classes[k].name, and with
// --raw-label also by the first entry of classes[k].values (RawLabel). Regression has no classes: the label column is parsed
// as a number.
//
// Values that read as finite numbers are compared as numbers (Level,
// values.go): categorical cells, label values, declared levels and missing
// tokens; "4.0" and "4" are one level, written "4". A feature's own
// "missing" tokens add to the schema's for it; a value outside a numeric
// feature's "min"/"max" is an error at the site, or with "out_of_range":
// "missing" a missing value. An unknown key is refused with its JSON path
// (fields.go).
//
// The held-out split: a site holds out row i (0-based data row of its CSV)
// when HoldoutRow(i) is true, a pure function of holdout_seed and i, so the
// split does not depend on the site's row count or the process.
//
// # Identity
//
// Canonical returns the schema with defaults filled in, encoded as compact
// JSON with a fixed field order; Digest is the hex SHA-256 of that encoding
// and is part of a run's identity: two schemas that differ only in spelling
// of defaults have the same digest.
package schema

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
)

// Tasks.
const (
	TaskBinary     = "binary"
	TaskMulticlass = "multiclass"
	TaskRegression = "regression"
)

// Feature types.
const (
	Numeric     = "numeric"
	Categorical = "categorical"
)

// Standardisation modes.
const (
	StandardizeFederation = "federation" // pooled statistics of all sites (default)
	StandardizeClient     = "client"     // each site's own statistics (explicit only)
)

// DefaultMissing are the cell values that mean missing unless the schema
// says otherwise.
var DefaultMissing = []string{"", "NA", "N/A", "n/a", "?", "NaN"}

// Limits on a schema, which may arrive over the network.
const (
	MaxFeatures  = 4096
	MaxClasses   = 1024
	MaxNameBytes = 256
	MaxLevels    = 1024 // a categorical feature's levels (prep.MaxLevels)
)

// Feature is one input column. The other fields are its declared
// preprocessing (declared.go; all of them absent: the statistics phase
// fits it): Center, Scale and Impute for a numeric feature, Levels and
// ImputeLevel for a categorical one.
//
// Missing are the feature's own missing tokens, besides the schema's (a
// cholesterol of "0" that means "not measured"). Min and Max are a
// numeric feature's valid range: a value outside it is an error at the
// site, or with OutOfRange "missing" a missing value (values.go).
type Feature struct {
	Name        string   `json:"name"`
	Type        string   `json:"type"`
	Center      *float64 `json:"center,omitempty"`
	Scale       *float64 `json:"scale,omitempty"`
	Impute      *float64 `json:"impute,omitempty"`
	Levels      []string `json:"levels,omitempty"`
	ImputeLevel string   `json:"impute_level,omitempty"`
	Missing     []string `json:"missing,omitempty"`
	Min         *float64 `json:"min,omitempty"`
	Max         *float64 `json:"max,omitempty"`
	OutOfRange  string   `json:"out_of_range,omitempty"`
}

// Class is one label class and the raw values that mean it.
type Class struct {
	Name   string   `json:"name"`
	Values []string `json:"values"`
}

// Label is the label column and, for classification, its class mapping.
type Label struct {
	Column  string  `json:"column"`
	Classes []Class `json:"classes,omitempty"`
}

// Schema is a federation schema. Use Parse or Load, which validate and
// fill in defaults; a Schema built by hand must pass Validate before use.
type Schema struct {
	Task           string    `json:"task"`
	Features       []Feature `json:"features"`
	Label          Label     `json:"label"`
	Missing        []string  `json:"missing"`
	MinSiteSamples int       `json:"min_site_samples"`
	Standardize    string    `json:"standardize"`
	Holdout        float64   `json:"holdout"`
	HoldoutSeed    uint64    `json:"holdout_seed"`
	// Separator and Decimal are the sites' CSV dialect (csvdialect.go):
	// the field separator ("" or ",": a comma) and the decimal mark
	// ("" or ".": a point; ",": a comma, as spreadsheets export it with
	// Separator ";").
	Separator string `json:"separator,omitempty"`
	Decimal   string `json:"decimal,omitempty"`
}

// rawSchema distinguishes absent optional fields from zero values.
type rawSchema struct {
	Task           string    `json:"task"`
	Features       []Feature `json:"features"`
	Label          *Label    `json:"label"`
	Missing        []string  `json:"missing"`
	MinSiteSamples *int      `json:"min_site_samples"`
	Standardize    string    `json:"standardize"`
	Holdout        *float64  `json:"holdout"`
	HoldoutSeed    *uint64   `json:"holdout_seed"`
	Separator      string    `json:"separator"`
	Decimal        string    `json:"decimal"`
}

// Load reads and validates the schema file path. Errors are one line and
// name the file.
func Load(path string) (*Schema, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, wrapErr("schema", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("schema %s: %w", path, err)
	}
	return s, nil
}

// Parse decodes, defaults and validates a schema. Unknown fields are
// refused (a misspelt option must not silently take its default).
func Parse(b []byte) (*Schema, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r rawSchema
	if err := dec.Decode(&r); err != nil {
		if strings.HasPrefix(err.Error(), "json: unknown field") {
			if where := unknownField(b); where != nil {
				return nil, where
			}
		}
		return nil, wrapErr("invalid JSON", err)
	}
	if dec.More() {
		return nil, errors.New("invalid JSON: trailing data after the schema object")
	}
	s := &Schema{
		Task: r.Task, Features: r.Features, Missing: r.Missing,
		MinSiteSamples: 10, Standardize: r.Standardize, Holdout: 0.2, HoldoutSeed: 1,
		Separator: r.Separator, Decimal: r.Decimal,
	}
	if r.Label == nil {
		return nil, errors.New("no label: \"label\": {\"column\": ...} is required")
	}
	s.Label = *r.Label
	if s.Missing == nil {
		s.Missing = slices.Clone(DefaultMissing)
	}
	if r.MinSiteSamples != nil {
		s.MinSiteSamples = *r.MinSiteSamples
	}
	if s.Standardize == "" {
		s.Standardize = StandardizeFederation
	}
	if r.Holdout != nil {
		s.Holdout = *r.Holdout
	}
	if r.HoldoutSeed != nil {
		s.HoldoutSeed = *r.HoldoutSeed
	}
	s.fillDeclared()
	s.fillValues()
	s.fillDialect()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s has an empty name", what)
	}
	if len(name) > MaxNameBytes {
		return fmt.Errorf("%s %.32q... is longer than %d bytes", what, name, MaxNameBytes)
	}
	return nil
}

// Validate checks s; the error is one line saying what is wrong.
func (s *Schema) Validate() error {
	for _, check := range []func() error{s.validateTask, s.validateColumns, s.validateLabel, s.validateMissing, s.validateOptions, s.validateDialect} {
		if err := check(); err != nil {
			return err
		}
	}
	return s.validateDeclared()
}

// validateTask checks the task is one of binary, multiclass, regression.
func (s *Schema) validateTask() error {
	switch s.Task {
	case TaskBinary, TaskMulticlass, TaskRegression:
	case "":
		return errors.New("no task: expected \"task\": binary, multiclass or regression")
	default:
		return fmt.Errorf("unknown task %q, expected binary, multiclass or regression", s.Task)
	}
	return nil
}

// validateColumns checks the label column's name and the features: their
// number, names (distinct, none the label's), types and declared values.
func (s *Schema) validateColumns() error {
	if len(s.Features) == 0 {
		return errors.New("no features")
	}
	if len(s.Features) > MaxFeatures {
		return fmt.Errorf("%d features, at most %d", len(s.Features), MaxFeatures)
	}
	if err := checkName("label column", s.Label.Column); err != nil {
		return wrapErr("no label", err)
	}
	seen := map[string]bool{s.Label.Column: true}
	for i, f := range s.Features {
		if err := checkName(fmt.Sprintf("feature %d", i+1), f.Name); err != nil {
			return err
		}
		if seen[f.Name] {
			if f.Name == s.Label.Column {
				return fmt.Errorf("column %q is both the label and a feature", f.Name)
			}
			return fmt.Errorf("column %q is named twice", f.Name)
		}
		seen[f.Name] = true
		if f.Type != Numeric && f.Type != Categorical {
			return fmt.Errorf("feature %q has unknown type %q, expected numeric or categorical", f.Name, f.Type)
		}
		if err := f.validateValues(); err != nil {
			return err
		}
	}
	return nil
}

// validateLabel checks the label's classes against the task: none for a
// regression; for a classification, their number, distinct names, and
// raw values each mapped to one class.
func (s *Schema) validateLabel() error {
	switch s.Task {
	case TaskRegression:
		if len(s.Label.Classes) != 0 {
			return errors.New("a regression label has no classes")
		}
	default:
		min := 2
		if len(s.Label.Classes) < min {
			return fmt.Errorf("label %q: a %s task needs at least %d classes, got %d", s.Label.Column, s.Task, min, len(s.Label.Classes))
		}
		if s.Task == TaskBinary && len(s.Label.Classes) != 2 {
			return fmt.Errorf("label %q: a binary task has exactly 2 classes, got %d", s.Label.Column, len(s.Label.Classes))
		}
		if len(s.Label.Classes) > MaxClasses {
			return fmt.Errorf("label %q: %d classes, at most %d", s.Label.Column, len(s.Label.Classes), MaxClasses)
		}
		names := map[string]bool{}
		values := map[string]string{} // by Level: "1" and "1.0" are one value
		for k, c := range s.Label.Classes {
			if err := checkName(fmt.Sprintf("label class %d", k+1), c.Name); err != nil {
				return err
			}
			if names[c.Name] {
				return fmt.Errorf("label class %q is named twice", c.Name)
			}
			names[c.Name] = true
			if len(c.Values) == 0 {
				return fmt.Errorf("label class %q has no raw values", c.Name)
			}
			for _, v := range c.Values {
				if prev, ok := values[Level(v)]; ok {
					if prev == c.Name {
						return fmt.Errorf("label value %q is listed twice for class %q (numbers are compared as numbers)", v, c.Name)
					}
					return fmt.Errorf("label value %q is mapped to two classes, %q and %q (numbers are compared as numbers)", v, prev, c.Name)
				}
				values[Level(v)] = c.Name
			}
		}
	}
	return nil
}

// validateMissing checks the missing tokens: short enough, and none a raw
// value of a label class.
func (s *Schema) validateMissing() error {
	for _, m := range s.Missing {
		if len(m) > MaxNameBytes {
			return fmt.Errorf("missing token longer than %d bytes", MaxNameBytes)
		}
	}
	if s.Task != TaskRegression {
		for _, c := range s.Label.Classes {
			for _, v := range c.Values {
				if s.IsMissing(v) {
					return fmt.Errorf("label value %q of class %q is also a missing token", v, c.Name)
				}
			}
		}
	}
	return nil
}

// validateOptions checks the run options: min_site_samples, standardize
// and holdout.
func (s *Schema) validateOptions() error {
	if s.MinSiteSamples < 1 {
		return fmt.Errorf("min_site_samples %d, expected at least 1", s.MinSiteSamples)
	}
	switch s.Standardize {
	case StandardizeFederation, StandardizeClient:
	default:
		return fmt.Errorf("unknown standardize %q, expected federation or client", s.Standardize)
	}
	if !(s.Holdout >= 0 && s.Holdout <= 0.9) {
		return fmt.Errorf("holdout %v, expected a share in [0, 0.9]", s.Holdout)
	}
	return nil
}

// NumClasses is the number of classes (0 for regression).
func (s *Schema) NumClasses() int {
	if s.Task == TaskRegression {
		return 0
	}
	return len(s.Label.Classes)
}

// ClassOf maps a raw label value to its class index. Numbers are
// compared as numbers (Level): "1.0" is the class of "1".
func (s *Schema) ClassOf(raw string) (int, bool) {
	l := Level(raw)
	for k, c := range s.Label.Classes {
		for _, v := range c.Values {
			if v == raw || Level(v) == l {
				return k, true
			}
		}
	}
	return 0, false
}

// RawLabel is the raw value reported for class k: the first value mapped
// to it.
func (s *Schema) RawLabel(k int) string { return s.Label.Classes[k].Values[0] }

// IsMissing reports whether a cell value is one of the schema's missing
// tokens (numbers compared as numbers, Level).
func (s *Schema) IsMissing(v string) bool { return matchesToken(v, s.Missing) }

// Canonical is the schema's canonical encoding: compact JSON, fields in
// the struct's order, defaults filled in.
func (s *Schema) Canonical() []byte {
	b, err := json.Marshal(s)
	if err != nil { // only non-finite floats; Validate bounds Holdout
		panic(fmt.Sprintf("schema: canonical encoding: %v", err))
	}
	return b
}

// Digest is the hex SHA-256 of Canonical.
func (s *Schema) Digest() string {
	h := sha256.Sum256(s.Canonical())
	return hex.EncodeToString(h[:])
}

// HoldoutRow reports whether data row i (0-based, header excluded) of a
// site's CSV is held out for evaluation: a splitmix64 hash of the seed and
// i, compared with the holdout share, so every site and the simulator make
// the same choice for the same row without any shared state.
func (s *Schema) HoldoutRow(i int) bool {
	if s.Holdout <= 0 {
		return false
	}
	z := s.HoldoutSeed + uint64(i)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	u := float64(z>>11) / (1 << 53)
	return u < s.Holdout && !math.IsNaN(u)
}
