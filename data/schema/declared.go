package schema

import (
	"errors"
	"fmt"
	"math"
)

// Declared preprocessing (docs/privacy.md, "Preprocessing under DP"). A
// schema may carry the transform's parameters itself instead of having the
// federation fit them from the sites' statistics: per numeric feature the
// centre and scale it is standardised with, (x - center) / scale, and the
// value a missing cell takes (impute, default the centre); per categorical
// feature its levels, one-hot in byte-wise lexical order as a fitted
// transform has them (a value outside them gives all zeros), and the level
// a missing cell takes (impute_level, default the first level listed).
// Either every feature declares its preprocessing or none does. With it
// the statistics phase is skipped: no site sends statistics, and the
// transform is public, a function of the schema alone (prep.Declared), so
// it is outside anything a privacy guarantee must cover; --dp with a
// schema requires it. standardize must then be federation (client would
// standardise each site with its own statistics).

// Declared reports whether the schema declares its preprocessing (after
// Validate: every feature does).
func (s *Schema) Declared() bool {
	for _, f := range s.Features {
		if f.declares() {
			return true
		}
	}
	return false
}

func (f *Feature) declares() bool {
	return f.Center != nil || f.Scale != nil || f.Impute != nil || f.Levels != nil || f.ImputeLevel != ""
}

// fillDeclared fills in the defaults of declared preprocessing (Parse), so
// that spelling a default out does not change the digest.
func (s *Schema) fillDeclared() {
	for i := range s.Features {
		f := &s.Features[i]
		if f.Type == Numeric && f.Impute == nil && f.Center != nil {
			c := *f.Center
			f.Impute = &c
		}
		if f.Type == Categorical && f.ImputeLevel == "" && len(f.Levels) > 0 {
			f.ImputeLevel = f.Levels[0]
		}
	}
}

func finite(v *float64) bool { return v != nil && !math.IsNaN(*v) && !math.IsInf(*v, 0) }

// validateDeclared checks declared preprocessing: all features or none,
// the fields of the feature's type only, finite numbers, a positive scale,
// distinct levels that are not missing tokens.
func (s *Schema) validateDeclared() error {
	if !s.Declared() {
		return nil
	}
	if s.Standardize != StandardizeFederation {
		return errors.New("a schema that declares its preprocessing takes standardize federation (client standardises each site with its own statistics)")
	}
	for _, f := range s.Features {
		if !f.declares() {
			return fmt.Errorf("feature %q declares no preprocessing, other features do: declare it for every feature (numeric: center and scale; categorical: levels) or for none", f.Name)
		}
		if f.Type == Numeric {
			switch {
			case f.Levels != nil || f.ImputeLevel != "":
				return fmt.Errorf("numeric feature %q declares levels: a numeric feature declares center, scale and impute", f.Name)
			case f.Center == nil || f.Scale == nil:
				return fmt.Errorf("numeric feature %q: declare both center and scale", f.Name)
			case !finite(f.Center) || !finite(f.Scale) || !(*f.Scale > 0) || (f.Impute != nil && !finite(f.Impute)):
				return fmt.Errorf("numeric feature %q: center and impute must be finite and scale a finite number > 0", f.Name)
			}
			continue
		}
		switch {
		case f.Center != nil || f.Scale != nil || f.Impute != nil:
			return fmt.Errorf("categorical feature %q declares center, scale or impute: a categorical feature declares levels and impute_level", f.Name)
		case len(f.Levels) == 0:
			return fmt.Errorf("categorical feature %q: declare its levels (at least one)", f.Name)
		case len(f.Levels) > MaxLevels:
			return fmt.Errorf("categorical feature %q: %d levels, at most %d", f.Name, len(f.Levels), MaxLevels)
		}
		seen := map[string]bool{} // by Level: "1" and "1.0" are one level
		for _, l := range f.Levels {
			switch {
			case len(l) > MaxNameBytes:
				return fmt.Errorf("categorical feature %q: a level is longer than %d bytes", f.Name, MaxNameBytes)
			case seen[Level(l)]:
				return fmt.Errorf("categorical feature %q: level %q is listed twice (numbers are compared as numbers)", f.Name, l)
			case s.missing(&f, l):
				return fmt.Errorf("categorical feature %q: level %q is a missing token", f.Name, l)
			}
			seen[Level(l)] = true
		}
		if f.ImputeLevel != "" && !seen[Level(f.ImputeLevel)] {
			return fmt.Errorf("categorical feature %q: impute_level %q is not one of its levels", f.Name, f.ImputeLevel)
		}
	}
	return nil
}
