package prep

import (
	"errors"
	"slices"

	"github.com/edgefl/edgefl/data/schema"
)

// Declared is the transform a schema declares (schema.Schema.Declared;
// docs/privacy.md, "Preprocessing under DP"): a function of the schema
// alone, so every party computes the same one without any statistics.
// Numeric column: Impute, Mean and Scale are the declared impute, center
// and scale. Categorical column: the declared levels in byte-wise lexical
// order (as Fit orders them) and the declared impute level.
func Declared(s *schema.Schema) (*Transform, error) {
	if !s.Declared() {
		return nil, errors.New("the schema declares no preprocessing (center and scale of every numeric feature, levels of every categorical one)")
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	tr := &Transform{Version: Version, SchemaDigest: s.Digest(), Standardize: s.Standardize, Columns: make([]Column, len(s.Features))}
	for j, f := range s.Features {
		col := Column{Name: f.Name, Type: f.Type}
		if f.Type == schema.Numeric {
			col.Mean, col.Scale, col.Impute = *f.Center, *f.Scale, *f.Center
			if f.Impute != nil {
				col.Impute = *f.Impute
			}
			tr.Outputs++
		} else {
			// Levels as the sites' cells read (schema.Level: "1.0" is
			// level "1"); schema.Validate refused two that are one.
			col.Levels = make([]string, len(f.Levels))
			for k, l := range f.Levels {
				col.Levels[k] = schema.Level(l)
			}
			slices.Sort(col.Levels)
			col.ImputeLevel = f.ImputeLevel
			if col.ImputeLevel == "" {
				col.ImputeLevel = f.Levels[0]
			}
			col.ImputeLevel = schema.Level(col.ImputeLevel)
			tr.Outputs += len(col.Levels)
		}
		tr.Columns[j] = col
	}
	if err := tr.Validate(s); err != nil {
		return nil, wrapErr("declared preprocessing", err)
	}
	return tr, nil
}
