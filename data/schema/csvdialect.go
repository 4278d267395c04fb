package schema

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// The sites' CSV dialect. Spreadsheets in much of Europe export ";" as the
// field separator and "," as the decimal mark ("1,5"): the schema says so
// ("separator": ";", "decimal": ","), and every site reads its CSV that
// way. A header that holds another separator than the schema's (the whole
// header read as one column "age;chol;num") is refused with a hint naming
// the separator it holds, and a number written with the other decimal
// mark with a hint naming the mark, instead of "missing column".

// Separators a header is checked for when a column is missing.
var otherSeparators = []rune{';', ',', '\t', '|'}

// comma is the field separator as a rune.
func (s *Schema) comma() rune {
	if s.Separator == "" {
		return ','
	}
	r, _ := utf8.DecodeRuneInString(s.Separator)
	return r
}

// decimalComma reports whether numbers are written with a decimal comma.
func (s *Schema) decimalComma() bool { return s.Decimal == "," }

// fillDialect spells the defaults as absent (Parse), so that writing them
// out does not change the digest.
func (s *Schema) fillDialect() {
	if s.Separator == "," {
		s.Separator = ""
	}
	if s.Decimal == "." {
		s.Decimal = ""
	}
}

func (s *Schema) validateDialect() error {
	if s.Separator != "" {
		r, n := utf8.DecodeRuneInString(s.Separator)
		if n != len(s.Separator) || r == utf8.RuneError || r == '"' || r == '\r' || r == '\n' || r == '.' || (r >= '0' && r <= '9') {
			return fmt.Errorf("separator %q: expected one character such as \",\" (the default), \";\", \"\\t\" or \"|\"", s.Separator)
		}
	}
	switch s.Decimal {
	case "", ".":
	case ",":
		if s.comma() == ',' {
			return fmt.Errorf("decimal \",\" with the separator \",\": a decimal comma needs another separator (\"separator\": \";\")")
		}
	default:
		return fmt.Errorf("decimal %q: expected \".\" (the default) or \",\"", s.Decimal)
	}
	return nil
}

// dotted is cell with a decimal comma written as a point ("1,5" -> "1.5")
// when the schema's decimal mark is a comma and the cell is a number that
// way; any other cell is returned as it is. ambiguous: a decimal comma is
// expected but the cell is a number with a point ("1.234" may be 1234 with
// a thousands separator): not read as a number.
func (s *Schema) dotted(cell string) (out string, ambiguous bool) {
	if !s.decimalComma() {
		return cell, false
	}
	if strings.Count(cell, ",") == 1 && !strings.Contains(cell, ".") {
		if d := strings.Replace(cell, ",", ".", 1); isNumber(d) {
			return d, false
		}
		return cell, false
	}
	return cell, strings.Contains(cell, ".") && isNumber(cell)
}

func isNumber(v string) bool { _, ok := parseFinite(v); return ok }

// decimalHint is the hint for a cell that is not a number as the schema
// reads numbers but is one with the other decimal mark.
func (s *Schema) decimalHint(cell string) string {
	if s.decimalComma() {
		if strings.Contains(cell, ".") && isNumber(cell) {
			return `the schema's decimal mark is "," ("decimal": ","), this cell has a point`
		}
		return ""
	}
	if strings.Count(cell, ",") == 1 && isNumber(strings.Replace(cell, ",", ".", 1)) {
		return `this cell has a decimal comma: set "decimal": "," (and "separator": ";") in the schema`
	}
	return ""
}

// separatorHint is the hint for a header without a column the schema
// names: the separator the header's names hold instead of the schema's.
func (s *Schema) separatorHint(header []string) string {
	for _, r := range otherSeparators {
		if r == s.comma() {
			continue
		}
		for _, h := range header {
			parts := strings.Split(h, string(r))
			if len(parts) < 2 {
				continue
			}
			for _, p := range parts {
				if s.names(strings.TrimSpace(strings.TrimPrefix(p, "\ufeff"))) {
					name := string(r)
					if r == '\t' {
						name = `\t`
					}
					return fmt.Sprintf("the header is separated by %q, the schema reads %q: set \"separator\": %q in the schema", name, string(s.comma()), name)
				}
			}
		}
	}
	return ""
}

// names reports whether col is a column the schema reads.
func (s *Schema) names(col string) bool {
	if col == s.Label.Column {
		return true
	}
	for _, f := range s.Features {
		if f.Name == col {
			return true
		}
	}
	return false
}
