package schema

import (
	"encoding/csv"
	"errors"
	"fmt"
)

// Kinds of CSVError.
const (
	KindEmpty           = "empty"            // no header row
	KindMalformed       = "malformed"        // not valid CSV (bare quote, wrong number of fields)
	KindDuplicateColumn = "duplicate column" // a header names a column twice
	KindMissingColumn   = "missing column"   // a schema (or site) column is not in the header
	KindSiteColumn      = "site column"      // the site column is a schema column (a usage error)
	KindBadValue        = "bad value"        // a cell that does not parse (Expected says what would)
	KindUnknownLabel    = "unknown label"    // a label value the schema's mapping does not know
)

// Roles of the column a CSVError names.
const (
	RoleFeature = "feature"
	RoleLabel   = "label"
	RoleSite    = "site"
)

// CSVError is every error ReadCSV, ReadSitesCSV and ReadFeaturesCSV return
// about the content of a CSV (errors opening a file are the os package's),
// so callers classify it by Kind without matching text. Error is one line
// naming the file, line and column and what was expected; it may contain
// the offending cell (Value, clipped to 40 bytes), which must not leave the
// site: build messages for others from the other fields.
type CSVError struct {
	File     string
	Line     int    // CSV line, 1 = header; 0 when not about one line
	Column   string // the column's header name, "" when not about one column
	Role     string // RoleFeature, RoleLabel or RoleSite when Column is set
	Kind     string // Kind*
	Expected string // what the cell or header should have held
	Value    string // the offending cell (clipped), KindBadValue and KindUnknownLabel
	Err      error  // the csv package's error, KindMalformed
	// Hint is what probably went wrong, when it can be told (another
	// field separator or decimal mark than the schema's): no data value.
	Hint string
}

func (e *CSVError) Unwrap() error { return e.Err }

func (e *CSVError) Error() string {
	if e.Hint != "" {
		return e.message() + " (" + e.Hint + ")"
	}
	return e.message()
}

func (e *CSVError) message() string {
	col := fmt.Sprintf("column %q", e.Column)
	if e.Role == RoleLabel || e.Role == RoleSite {
		col = e.Role + " " + col
	}
	switch e.Kind {
	case KindEmpty:
		return fmt.Sprintf("%s: empty file, expected %s", e.File, e.Expected)
	case KindMalformed:
		var pe *csv.ParseError
		if e.Line == 0 || errors.As(e.Err, &pe) {
			return fmt.Sprintf("%s: %v", e.File, e.Err)
		}
		return fmt.Sprintf("%s: line %d: %v", e.File, e.Line, e.Err)
	case KindDuplicateColumn:
		return fmt.Sprintf("%s: line %d: column %q appears twice in the header", e.File, e.Line, e.Column)
	case KindMissingColumn:
		if e.Role == RoleFeature {
			return fmt.Sprintf("%s: line %d: missing column %q (%s)", e.File, e.Line, e.Column, e.Expected)
		}
		return fmt.Sprintf("%s: line %d: missing %s", e.File, e.Line, col)
	case KindSiteColumn:
		return fmt.Sprintf("%s: site column %q is a schema column", e.File, e.Column)
	case KindBadValue:
		if e.Role == RoleSite && e.Value == "" {
			return fmt.Sprintf("%s: line %d: %s is empty", e.File, e.Line, col)
		}
		return fmt.Sprintf("%s: line %d: %s: %q is not %s", e.File, e.Line, col, e.Value, e.Expected)
	case KindUnknownLabel:
		return fmt.Sprintf("%s: line %d: %s: unknown label value %q, the schema maps %s", e.File, e.Line, col, e.Value, e.Expected)
	}
	return fmt.Sprintf("%s: line %d: %s: %s", e.File, e.Line, col, e.Kind)
}
