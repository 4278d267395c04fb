package schema

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// Column is one feature's raw values, row by row. For a numeric feature
// Num holds the parsed values; for a categorical one Level holds the cell
// text. Missing[i] marks a missing token in row i (then Num[i] is 0 and
// Level[i] is "").
type Column struct {
	Num     []float64
	Level   []string
	Missing []bool
}

// Table is a site's CSV read through a schema, before preprocessing.
type Table struct {
	Rows    int
	Columns []Column  // Columns[j] is Schema.Features[j]
	Labels  []float64 // class index, or the value for regression
	Lines   []int     // CSV line of each row (1 = header)
	// Extra are the header's columns the schema does not use, for the
	// caller to log once at INFO.
	Extra []string
	// ClassCounts[k] is the number of rows of class k (classification).
	ClassCounts []int
}

// SingleClass reports a classification table whose rows are all of one
// class (allowed, but worth reporting).
func (t *Table) SingleClass() bool {
	present := 0
	for _, c := range t.ClassCounts {
		if c > 0 {
			present++
		}
	}
	return len(t.ClassCounts) > 0 && present == 1
}

// ReadCSVFile reads path with ReadCSV; errors name the file.
func (s *Schema) ReadCSVFile(path string) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := s.ReadCSV(f, path)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// ReadCSV reads a CSV with a header row by column name: any column order,
// extra columns ignored (listed in Table.Extra). name is used in errors,
// which are one line naming the file, line, column and what was expected.
func (s *Schema) ReadCSV(r io.Reader, name string) (*Table, error) {
	t, _, err := s.read(r, name, true, "")
	return t, err
}

// ReadSitesCSV is ReadCSV for a single multi-site CSV (simulate
// --partition natural): siteColumn names each row's site, returned per row.
// Split it with Table.Subset.
func (s *Schema) ReadSitesCSV(r io.Reader, name, siteColumn string) (*Table, []string, error) {
	return s.read(r, name, true, siteColumn)
}

// Subset is the table of the given rows, in that order (a site's rows of a
// multi-site table). Lines keep the source CSV's line numbers.
func (t *Table) Subset(rows []int) *Table {
	out := &Table{Rows: len(rows), Columns: make([]Column, len(t.Columns)), Extra: t.Extra}
	// A regression table has no classes: its labels are values, not
	// indices into ClassCounts.
	if len(t.ClassCounts) > 0 {
		out.ClassCounts = make([]int, len(t.ClassCounts))
	}
	for j, c := range t.Columns {
		o := &out.Columns[j]
		for _, i := range rows {
			o.Missing = append(o.Missing, c.Missing[i])
			if c.Num != nil {
				o.Num = append(o.Num, c.Num[i])
			}
			if c.Level != nil {
				o.Level = append(o.Level, c.Level[i])
			}
		}
	}
	for _, i := range rows {
		out.Lines = append(out.Lines, t.Lines[i])
		if t.Labels != nil {
			out.Labels = append(out.Labels, t.Labels[i])
			if out.ClassCounts != nil {
				out.ClassCounts[int(t.Labels[i])]++
			}
		}
	}
	return out
}

// ReadFeaturesCSV is ReadCSV for files that may lack the label column
// (predict): a present label column is ignored.
func (s *Schema) ReadFeaturesCSV(r io.Reader, name string) (*Table, error) {
	t, _, err := s.read(r, name, false, "")
	return t, err
}

func (s *Schema) read(r io.Reader, name string, withLabel bool, siteColumn string) (*Table, []string, error) {
	cr := csv.NewReader(r)
	cr.Comma = s.comma()
	cr.FieldsPerRecord = 0 // every row as wide as the header
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err == io.EOF {
		return nil, nil, &CSVError{File: name, Kind: KindEmpty, Expected: "a header row naming the columns"}
	}
	if err != nil {
		return nil, nil, malformed(name, err)
	}
	l, err := s.layout(name, header, withLabel, siteColumn)
	if err != nil {
		return nil, nil, err
	}
	t := &Table{Columns: make([]Column, len(s.Features)), Extra: l.extra}
	if withLabel && s.NumClasses() > 0 {
		t.ClassCounts = make([]int, s.NumClasses())
	}
	var sites []string
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, rowError(name, err)
		}
		line, _ := cr.FieldPos(0)
		if err := s.appendFeatures(t, rec, l.features, name, line); err != nil {
			return nil, nil, err
		}
		if l.label >= 0 {
			if err := s.appendLabel(t, strings.TrimSpace(rec[l.label]), name, line); err != nil {
				return nil, nil, err
			}
		}
		if l.site >= 0 {
			site := strings.TrimSpace(rec[l.site])
			if site == "" {
				return nil, nil, &CSVError{File: name, Line: line, Column: siteColumn, Role: RoleSite, Kind: KindBadValue, Expected: "a site name"}
			}
			sites = append(sites, strings.Clone(site))
		}
		t.Lines = append(t.Lines, line)
		t.Rows++
	}
	return t, sites, nil
}

// csvLayout is where a CSV's header puts what the schema reads.
type csvLayout struct {
	features []int    // features[j]: the column of Schema.Features[j]
	label    int      // the label's column, or -1 (not read)
	site     int      // the site column, or -1 (none asked for)
	extra    []string // the header's columns nothing reads, in order
}

// layout maps the header's column names (trimmed, without a byte-order
// mark) to the schema's features, the label (when withLabel) and the site
// column (when not ""), each by name.
func (s *Schema) layout(name string, header []string, withLabel bool, siteColumn string) (csvLayout, error) {
	l := csvLayout{features: make([]int, len(s.Features)), label: -1, site: -1}
	names := make([]string, len(header))
	pos := map[string]int{}
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if _, dup := pos[h]; dup {
			return l, &CSVError{File: name, Line: 1, Column: h, Kind: KindDuplicateColumn, Expected: "each column once"}
		}
		pos[h] = i
		names[i] = h
	}
	used := map[string]bool{}
	for j, f := range s.Features {
		i, ok := pos[f.Name]
		if !ok {
			return l, &CSVError{File: name, Line: 1, Column: f.Name, Role: RoleFeature, Kind: KindMissingColumn, Expected: f.Type + " feature of the schema", Hint: s.separatorHint(header)}
		}
		l.features[j] = i
		used[f.Name] = true
	}
	if siteColumn != "" {
		i, ok := pos[siteColumn]
		if !ok {
			return l, &CSVError{File: name, Line: 1, Column: siteColumn, Role: RoleSite, Kind: KindMissingColumn, Expected: "the site column", Hint: s.separatorHint(header)}
		}
		if used[siteColumn] || siteColumn == s.Label.Column {
			return l, &CSVError{File: name, Column: siteColumn, Role: RoleSite, Kind: KindSiteColumn, Expected: "a column the schema does not use"}
		}
		l.site = i
		used[siteColumn] = true
	}
	if i, ok := pos[s.Label.Column]; ok {
		used[s.Label.Column] = true
		if withLabel {
			l.label = i
		}
	} else if withLabel {
		return l, &CSVError{File: name, Line: 1, Column: s.Label.Column, Role: RoleLabel, Kind: KindMissingColumn, Expected: "the label column", Hint: s.separatorHint(header)}
	}
	for _, h := range names {
		if !used[h] {
			l.extra = append(l.extra, h)
		}
	}
	return l, nil
}

// rowError is the error for a data row the csv reader refused.
func rowError(name string, err error) error {
	// FieldPos is only valid after a successful Read.
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		exp := "valid CSV quoting"
		if errors.Is(pe.Err, csv.ErrFieldCount) {
			exp = "a row as wide as the header"
		}
		return &CSVError{File: name, Line: pe.Line, Kind: KindMalformed, Expected: exp, Err: pe.Err}
	}
	return malformed(name, err)
}

// appendFeatures appends one row's feature cells (rec[cols[j]] for feature
// j) to t's columns: a number, a level, or a missing token.
func (s *Schema) appendFeatures(t *Table, rec []string, cols []int, name string, line int) error {
	for j := range s.Features {
		f := &s.Features[j]
		raw := strings.TrimSpace(rec[cols[j]])
		c := &t.Columns[j]
		miss := s.missing(f, raw)
		cell, ambiguous := s.dotted(raw) // "1,5" with a decimal comma
		if f.Type == Numeric {
			v := 0.0
			if !miss {
				var ok bool
				if v, ok = parseFinite(cell); !ok || ambiguous {
					return &CSVError{File: name, Line: line, Column: f.Name, Role: RoleFeature, Kind: KindBadValue, Expected: "a finite number or a missing token",
						Value: clip(raw), Hint: s.decimalHint(raw)}
				}
				if !f.inRange(v) {
					if f.OutOfRange != OutOfRangeMissing {
						return &CSVError{File: name, Line: line, Column: f.Name, Role: RoleFeature, Kind: KindBadValue,
							Expected: "a number in the schema's valid range " + f.rangeText() + " or a missing token", Value: clip(cell)}
					}
					miss, v = true, 0
				}
			}
			c.Num = append(c.Num, v)
		} else {
			if miss {
				cell = ""
			}
			// Numbers are compared as numbers: "4.0" is level "4".
			c.Level = append(c.Level, strings.Clone(Level(cell)))
		}
		c.Missing = append(c.Missing, miss)
	}
	return nil
}

// appendLabel appends one row's label (a value for regression, a class
// index otherwise) to t.
func (s *Schema) appendLabel(t *Table, raw, name string, line int) error {
	cell, ambiguous := s.dotted(raw)
	if s.Task == TaskRegression {
		v, ok := parseFinite(cell)
		if !ok || ambiguous {
			return &CSVError{File: name, Line: line, Column: s.Label.Column, Role: RoleLabel, Kind: KindBadValue, Expected: "a finite number", Value: clip(raw), Hint: s.decimalHint(raw)}
		}
		t.Labels = append(t.Labels, v)
		return nil
	}
	k, ok := s.ClassOf(raw)
	if !ok {
		k, ok = s.ClassOf(cell)
	}
	if !ok {
		return &CSVError{File: name, Line: line, Column: s.Label.Column, Role: RoleLabel, Kind: KindUnknownLabel, Expected: s.knownLabels(), Value: clip(raw)}
	}
	t.Labels = append(t.Labels, float64(k))
	t.ClassCounts[k]++
	return nil
}

// parseFinite parses a cell as a finite float64.
func parseFinite(cell string) (float64, bool) {
	v, err := strconv.ParseFloat(cell, 64)
	return v, err == nil && !math.IsInf(v, 0) && !math.IsNaN(v)
}

// malformed wraps an error of the csv reader (a *csv.ParseError, whose
// text names the line, or an I/O error).
func malformed(name string, err error) *CSVError {
	e := &CSVError{File: name, Kind: KindMalformed, Expected: "a valid CSV file", Err: err}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		e.Line = pe.Line
	}
	return e
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

func (s *Schema) knownLabels() string {
	var b strings.Builder
	n := 0
	for _, c := range s.Label.Classes {
		for _, v := range c.Values {
			if n == 8 {
				b.WriteString(", ...")
				return b.String()
			}
			if n > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%q", v)
			n++
		}
	}
	return b.String()
}
