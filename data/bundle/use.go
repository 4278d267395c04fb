package bundle

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
)

// ParseDataArg parses a --data value: csv:PATH[:label=COL].
func ParseDataArg(s string) (path, label string, err error) {
	rest, ok := strings.CutPrefix(s, "csv:")
	if !ok || rest == "" {
		return "", "", fmt.Errorf("--data %q: expected csv:PATH[:label=COL]", s)
	}
	if i := strings.LastIndex(rest, ":label="); i >= 0 {
		rest, label = rest[:i], rest[i+len(":label="):]
		if label == "" || rest == "" {
			return "", "", fmt.Errorf("--data %q: expected csv:PATH[:label=COL]", s)
		}
	}
	return rest, label, nil
}

// Outputs applies the bundle's preprocessing and model to a table read
// with its schema: class probabilities (width k = classes) or values (k = 1).
func (b *Bundle) Outputs(t *schema.Table) (out []float64, k int, err error) {
	m, w, err := model.Load(bytes.NewReader(mustJSON(b.Model)))
	if err != nil {
		return nil, 0, err
	}
	return model.Outputs(m, w, b.Transform.Apply(t, nil))
}

// EvaluateCSV reads path through the bundle's schema (label column label
// when not empty) and evaluates the model on every row.
func (b *Bundle) EvaluateCSV(path, label string) (evaluate.Report, error) {
	s := *b.Schema
	if label != "" {
		s.Label.Column = label
	}
	t, err := s.ReadCSVFile(path)
	if err != nil {
		return evaluate.Report{}, err
	}
	out, k, err := b.Outputs(t)
	if err != nil {
		return evaluate.Report{}, err
	}
	if k == 1 {
		return evaluate.Regression(out, t.Labels)
	}
	return evaluate.Classification(out, t.Labels, k)
}

// EvaluateHeldOutCSV is EvaluateCSV on exactly the rows of path that the
// federation held out (the schema's hold-out rule: sitedata.Load's split),
// through the transform the site applied (standardize = client: the
// site's own numeric statistics of its training rows), as the agent
// evaluates: run on the site's own data CSV, it reproduces the report the
// site sent for the bundle's round (Evaluation.Sites), to the last digit.
// A site with eval_data had that file as its held-out rows: evaluate it
// with EvaluateCSV instead.
func (b *Bundle) EvaluateHeldOutCSV(path, label string) (evaluate.Report, error) {
	s := *b.Schema
	if label != "" {
		s.Label.Column = label
	}
	t, err := s.ReadCSVFile(path)
	if err != nil {
		return evaluate.Report{}, err
	}
	st := sitedata.FromTable(&s, t, path)
	if len(st.Holdout) == 0 {
		return evaluate.Report{}, fmt.Errorf("%s: none of its %d rows is held out by the schema (holdout %g)", path, t.Rows, s.Holdout)
	}
	_, holdout, err := st.Data(b.Transform)
	if err != nil {
		return evaluate.Report{}, err
	}
	return sitedata.Evaluate(b.Model.Spec, b.Model.Params, holdout)
}

// PredictOptions are PredictCSV's choices of output columns.
type PredictOptions struct {
	// Keep are input columns copied to the output, first.
	Keep []string
	// RawLabel adds "prediction_raw" after "prediction" (classification):
	// the first raw label value the schema maps to the predicted class.
	RawLabel bool
}

// PredictCSV writes one row per row of in to out (atomically): the kept
// columns, "prediction" (the predicted class's name from the schema, or
// the value for regression), with opt.RawLabel "prediction_raw" (the
// class's first raw label value: a class is named so that a raw code such
// as 1 is not read as a severity) and, for classification, "p_<class>"
// per class.
func (b *Bundle) PredictCSV(in, out string, opt PredictOptions) (rows int, err error) {
	keep := opt.Keep
	raw, err := os.ReadFile(in)
	if err != nil {
		return 0, err
	}
	t, err := b.Schema.ReadFeaturesCSV(bytes.NewReader(raw), in)
	if err != nil {
		return 0, err
	}
	var kept [][]string
	if len(keep) > 0 {
		cr := csv.NewReader(bytes.NewReader(raw))
		all, err := cr.ReadAll()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", in, err)
		}
		pos := map[string]int{}
		for i, h := range all[0] {
			pos[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
		}
		for _, c := range keep {
			i, ok := pos[c]
			if !ok {
				return 0, fmt.Errorf("%s: line 1: --keep column %q is not in the header", in, c)
			}
			col := make([]string, 0, t.Rows)
			for _, rec := range all[1:] {
				col = append(col, rec[i])
			}
			kept = append(kept, col)
		}
	}
	probs, k, err := b.Outputs(t)
	if err != nil {
		return 0, err
	}
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	header := append([]string{}, keep...)
	header = append(header, "prediction")
	withRaw := opt.RawLabel && k > 1
	if withRaw {
		header = append(header, "prediction_raw")
	}
	probCol := len(header) // the first p_<class> column
	if k > 1 {
		for _, c := range b.Schema.Label.Classes {
			header = append(header, "p_"+c.Name)
		}
	}
	w.Write(header)
	rec := make([]string, len(header))
	for i := range t.Rows {
		for j := range kept {
			rec[j] = kept[j][i]
		}
		row := probs[i*k : (i+1)*k]
		if k == 1 {
			rec[len(keep)] = strconv.FormatFloat(row[0], 'g', -1, 64)
		} else {
			best := 0
			for c := range row {
				if row[c] > row[best] {
					best = c
				}
				rec[probCol+c] = strconv.FormatFloat(row[c], 'g', -1, 64)
			}
			rec[len(keep)] = b.Schema.Label.Classes[best].Name
			if withRaw {
				rec[len(keep)+1] = b.Schema.RawLabel(best)
			}
		}
		w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return 0, err
	}
	return t.Rows, WriteFileAtomic(out, buf.Bytes())
}
