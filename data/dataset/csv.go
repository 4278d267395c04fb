package dataset

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/learn/model"
)

// MaxClassLabel is the largest class label a classification file may use:
// a model allocates parameters per class, so a stray large integer (often a
// regression target or an ID column picked as the label) is refused rather
// than turned into millions of classes.
const MaxClassLabel = 1<<16 - 1

// CSVOptions says how to read a CSV file.
type CSVOptions struct {
	// Label is the label column: a header name, or a 0-based column index
	// when no column has that name. Required.
	Label string
	// Regression reads the label as a real-valued target (Classes = 0);
	// otherwise labels must be class indices, integers >= 0.
	Regression bool
}

// LoadCSV reads a CSV file with a header row: one column is the label
// (CSVOptions.Label), every other column a numeric feature. The Dataset is
// named after the file without its extension.
func LoadCSV(path string, opt CSVOptions) (*Dataset, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, wrapErr("csv", err)
	}
	defer f.Close()
	rows, err := countLines(f)
	if err != nil {
		return nil, wrapErr("csv", err)
	}
	ds, err := readCSV(f, path, opt, rows)
	if err != nil {
		return nil, err
	}
	ds.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	return ds, nil
}

// ReadCSV reads CSV data as LoadCSV does; name is used in the errors
// ("name:line: ...") and as the Dataset name. Every cell must be a finite
// number (surrounding spaces allowed); a classification label must be an
// integer in 0..MaxClassLabel and Classes is the largest label + 1.
func ReadCSV(r io.Reader, name string, opt CSVOptions) (*Dataset, error) {
	return readCSV(r, name, opt, lineCount{})
}

// lineCount is what countLines saw of a file: its size and how many lines
// it has (newlines, plus one for a last line without one).
type lineCount struct{ size, lines int64 }

// countLines reads the file f once to count its lines, and rewinds it.
// Reading a file from the page cache twice costs far less than growing
// the feature matrix row by row: each growth copies everything read so
// far, and a run of garbage collections frees the copies.
func countLines(f *os.File) (lineCount, error) {
	var c lineCount
	buf := make([]byte, 64<<10)
	last := byte('\n')
	for {
		n, err := f.Read(buf)
		if n > 0 {
			c.size += int64(n)
			c.lines += int64(bytes.Count(buf[:n], []byte{'\n'}))
			last = buf[n-1]
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return c, err
		}
	}
	if last != '\n' {
		c.lines++
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return c, err
	}
	return c, nil
}

// capacity is how many rows of d features to allocate up front: the lines
// after the header, an upper bound on the records (a quoted cell may span
// lines), when that many rows fit the file at all (every cell takes at
// least one byte and a separator, so rows·d <= size/2 for a well-formed
// file, and the matrix is addressable); else 0, and the rows grow as they
// are read.
func (c lineCount) capacity(d int) int {
	rows := c.lines - 1
	if rows < 1 || d < 1 || rows > c.size/2/int64(d) || rows*int64(d) > math.MaxInt/8 {
		return 0
	}
	return int(rows)
}

// readCSV is ReadCSV with the line count of the file (zero when unknown).
func readCSV(r io.Reader, name string, opt CSVOptions, lc lineCount) (*Dataset, error) {
	if opt.Label == "" {
		return nil, fmt.Errorf("csv %s: no label column given: expected a column name or 0-based index", name)
	}
	br := bufio.NewReader(r)
	if bom, _ := br.Peek(3); string(bom) == "\ufeff" {
		_, _ = br.Discard(3) // a UTF-8 byte order mark, as spreadsheets write (peeked: cannot fail)
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = -1 // checked below, with a clearer message
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("csv %s: empty file: expected a header row", name)
	}
	if err != nil {
		return nil, csvError(name, err)
	}
	cols := make([]string, len(header))
	for i, h := range header {
		cols[i] = strings.TrimSpace(h)
	}
	label, err := labelColumn(cols, opt.Label)
	if err != nil {
		return nil, fmt.Errorf("csv %s: %w", name, err)
	}
	if len(cols) < 2 {
		return nil, fmt.Errorf("csv %s: the header has only the label column %q: expected at least one feature column", name, cols[label])
	}
	d := len(cols) - 1
	features := make([]string, 0, d)
	for i, c := range cols {
		if i != label {
			features = append(features, c)
		}
	}

	data := model.Data{D: d}
	if rows := lc.capacity(d); rows > 0 {
		data.X, data.Y = make([]float64, 0, rows*d), make([]float64, 0, rows)
	}
	maxLabel := -1
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, csvError(name, err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(cols) {
			return nil, fmt.Errorf("%s:%d: %d fields, expected %d as in the header", name, line, len(rec), len(cols))
		}
		for i, cell := range rec {
			v, err := parseCell(cell)
			if err != nil {
				line, col := cr.FieldPos(i)
				return nil, fmt.Errorf("%s:%d:%d: column %q: %w", name, line, col, cols[i], err)
			}
			if i != label {
				data.X = append(data.X, v)
				continue
			}
			if !opt.Regression {
				if v < 0 || v > MaxClassLabel || v != math.Trunc(v) {
					line, col := cr.FieldPos(i)
					return nil, fmt.Errorf("%s:%d:%d: label column %q: %s is not a class index (an integer in 0..%d); add :regression for a real-valued target", name, line, col, cols[i], strconv.Quote(strings.TrimSpace(cell)), MaxClassLabel)
				}
				maxLabel = max(maxLabel, int(v))
			}
			data.Y = append(data.Y, v)
		}
		data.N++
	}
	if data.N == 0 {
		return nil, fmt.Errorf("csv %s: no data rows after the header", name)
	}
	classes := 0
	if !opt.Regression {
		if maxLabel < 1 {
			return nil, fmt.Errorf("csv %s: every label in column %q is 0: a classifier needs at least 2 classes (add :regression for a real-valued target)", name, cols[label])
		}
		classes = maxLabel + 1
	}
	return &Dataset{Name: name, Data: data, Classes: classes, FeatureNames: features}, nil
}

// csvError names the file, line and column of a CSV syntax error.
func csvError(name string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s:%d:%d: %w", name, pe.Line, pe.Column, pe.Err)
	}
	return fmt.Errorf("csv %s: %w", name, err)
}

// labelColumn resolves the label option: a header name first, else a
// 0-based index.
func labelColumn(cols []string, label string) (int, error) {
	found := -1
	for i, c := range cols {
		if c == label {
			if found >= 0 {
				return 0, fmt.Errorf("label column %q is ambiguous: columns %d and %d both have that name (give the 0-based index)", label, found, i)
			}
			found = i
		}
	}
	if found >= 0 {
		return found, nil
	}
	if i, err := strconv.Atoi(label); err == nil {
		if i < 0 || i >= len(cols) {
			return 0, fmt.Errorf("label column index %d out of range: the header has %d columns (0..%d)", i, len(cols), len(cols)-1)
		}
		return i, nil
	}
	shown := cols
	if len(shown) > 10 {
		shown = shown[:10]
	}
	more := ""
	if len(cols) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(cols)-len(shown))
	}
	return 0, fmt.Errorf("no label column %q: expected one of the header names %q%s or a 0-based index", label, shown, more)
}

// parseCell parses one numeric cell, refusing empty cells, NaN and ±Inf
// (including values too large for a float64).
func parseCell(cell string) (float64, error) {
	s := strings.TrimSpace(cell)
	if s == "" {
		return 0, errors.New("empty cell, expected a number")
	}
	if v, ok := parseDecimal(s); ok {
		return v, nil // finite: at most 19 digits times 10^±22
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%s is not a number", strconv.Quote(s))
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s is not a finite number", strconv.Quote(s))
	}
	return v, nil
}

// csvFromBytes is ReadCSV over a byte slice (for tests and fuzzing).
func csvFromBytes(b []byte, opt CSVOptions) (*Dataset, error) {
	return ReadCSV(bytes.NewReader(b), "input.csv", opt)
}
