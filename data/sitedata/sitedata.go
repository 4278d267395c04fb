// Package sitedata is the one place where a site's data becomes what the
// federation trains and evaluates on: a site's CSV read by the
// federation schema and split into training and held-out rows (Load,
// FromTable), the statistics of its training rows (Statistics), the
// federation's transform fitted from pooled statistics (Fit) and applied
// to the site's rows (Data), held-out rows kept in a separate file
// (TrainOnEvery, EvalData), the model every party trains (ModelSpec), the
// evaluation of a model on held-out rows (Evaluate), and site errors with
// the reason codes the protocol carries (SiteError).
//
// The edge agent, the aggregator and simulate all call these functions,
// so the simulator computes exactly what the daemons compute. The package
// is pure: no goroutines, clocks or globals; it reads a file only in Load.
//
// # Preprocessing modes
//
// With standardize = federation (the default) every party uses the
// transform Fit returns as it is. With standardize = client the
// transform Fit returns is the federation's (levels, imputation, and the
// pooled mean and scale, used by the bundle); Data re-fits it for the
// site: each numeric column's mean and scale become the site's own
// training statistics, exactly what prep.Fit(s, pooled, own) gives.
package sitedata

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io/fs"
	"math"

	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
)

// Site is one site's CSV read by the schema, split into training and
// held-out rows (indices into Table, by the schema's hold-out rule).
type Site struct {
	Schema         *schema.Schema
	Table          *schema.Table
	Train, Holdout []int
	File           string
}

// Load reads the site's CSV at path by the schema and splits it. Errors
// are *SiteError.
func Load(s *schema.Schema, path string) (*Site, error) {
	t, err := s.ReadCSVFile(path)
	if err != nil {
		return nil, Classify(path, err)
	}
	return FromTable(s, t, path), nil
}

// FromTable is Load for a table already read (simulate: one site's rows
// of a multi-site CSV, schema.Table.Subset). The split uses the row index
// within t, as if t were the site's own CSV.
func FromTable(s *schema.Schema, t *schema.Table, file string) *Site {
	train, holdout := prep.Split(s, t)
	return &Site{Schema: s, Table: t, Train: train, Holdout: holdout, File: file}
}

// Statistics are prep.Compute of the training rows. Fewer training rows
// than the schema's min_site_samples is a SiteError too_few_rows: the
// site must not send statistics.
func (st *Site) Statistics() (*prep.Stats, error) {
	stats, err := prep.Compute(st.Schema, st.Table, st.Train)
	if err != nil {
		var few *prep.TooFewSamplesError
		if errors.As(err, &few) {
			return nil, &SiteError{Reason: ReasonTooFewRows, File: st.File, Problem: "too few rows",
				Expected: fmt.Sprintf("at least min_site_samples %d training rows, have %d", few.Min, few.Rows), Err: err}
		}
		return nil, &SiteError{Reason: ReasonData, File: st.File, Problem: err.Error(), Err: err}
	}
	return stats, nil
}

// EnoughRows is the schema's min_site_samples rule without the statistics
// (a schema that declares its preprocessing has no statistics phase): a
// SiteError too_few_rows, as Statistics gives, below it; the site then
// does not train either.
func (st *Site) EnoughRows() error {
	if n, m := len(st.Train), st.Schema.MinSiteSamples; n < m {
		return &SiteError{Reason: ReasonTooFewRows, File: st.File, Problem: "too few rows",
			Expected: fmt.Sprintf("at least min_site_samples %d training rows, have %d", m, n), Err: &prep.TooFewSamplesError{Rows: n, Min: m}}
	}
	return nil
}

// Fit is the federation's transform from the pooled statistics (what the
// aggregator announces): prep.Fit(s, pooled, nil), or with standardize =
// client prep.Fit(s, pooled, pooled), whose numeric means and scales are
// the pooled ones (each site replaces them with its own in Data).
func Fit(s *schema.Schema, pooled *prep.Stats) (*prep.Transform, error) {
	var own *prep.Stats
	if s.Standardize == schema.StandardizeClient {
		own = pooled
	}
	return prep.Fit(s, pooled, own)
}

// Transform is the transform this site applies: tr itself, or with
// standardize = client tr with the site's own numeric means and scales
// (equal to prep.Fit(s, pooled, own) for tr = Fit(s, pooled)). A
// transform that does not fit the schema is a SiteError bad_transform.
func (st *Site) Transform(tr *prep.Transform) (*prep.Transform, error) {
	if tr == nil {
		return nil, &SiteError{Reason: ReasonBadTransform, File: st.File, Problem: "no transform", Expected: "the federation's fitted preprocessing"}
	}
	if err := tr.Validate(st.Schema); err != nil {
		return nil, &SiteError{Reason: ReasonBadTransform, File: st.File, Problem: "transform refused: " + err.Error(), Err: err}
	}
	if tr.Standardize != schema.StandardizeClient {
		return tr, nil
	}
	own, err := st.Statistics()
	if err != nil {
		return nil, err
	}
	out := *tr
	out.Columns = make([]prep.Column, len(tr.Columns))
	copy(out.Columns, tr.Columns)
	for j := range out.Columns {
		c := &out.Columns[j]
		if c.Type != schema.Numeric {
			continue
		}
		// As prep.Fit does with the site's own statistics.
		n := own.Features[j].Numeric
		c.Mean, c.Scale = n.Mean, 1
		if sd := math.Sqrt(n.Var()); sd > 0 && !math.IsInf(sd, 0) {
			c.Scale = sd
		}
	}
	return &out, nil
}

// Data applies the federation's transform tr (as Transform adapts it to
// this site) to the training and the held-out rows.
func (st *Site) Data(tr *prep.Transform) (train, holdout model.Data, err error) {
	tr, err = st.Transform(tr)
	if err != nil {
		return model.Data{}, model.Data{}, err
	}
	return apply(tr, st.Table, st.Train), apply(tr, st.Table, st.Holdout), nil
}

// TrainOnEvery makes every row of the site's table a training row and
// holds none out: a site whose held-out rows come from a separate file
// (eval_data; simulate's --eval-dataset) trains on all of its data.
func (st *Site) TrainOnEvery() {
	st.Train, st.Holdout = make([]int, st.Table.Rows), nil
	for i := range st.Train {
		st.Train[i] = i
	}
}

// EvalData is a separate table of held-out rows (eval_data) under the
// federation's transform tr as this site applies it (Transform, so with
// standardize = client the site's own training statistics): every row of
// eval, none trained on.
func (st *Site) EvalData(tr *prep.Transform, eval *schema.Table) (model.Data, error) {
	own, err := st.Transform(tr)
	if err != nil {
		return model.Data{}, err
	}
	all := make([]int, eval.Rows)
	for i := range all {
		all[i] = i
	}
	return apply(own, eval, all), nil
}

// apply is tr.Apply for exactly rows (Apply reads nil as every row).
func apply(tr *prep.Transform, t *schema.Table, rows []int) model.Data {
	if len(rows) == 0 {
		return model.Data{D: tr.Outputs, X: []float64{}, Y: []float64{}}
	}
	return tr.Apply(t, rows)
}

// Operator model kinds ModelSpec accepts (the model flags of broker-agg).
const (
	KindLogReg = model.KindLogReg // the linear model of the task
	KindMLP    = model.KindMLP
)

// ModelSpec is the model every party trains, from the schema's task, the
// transform's outputs and the operator's model flags. kind logreg (or
// "") is the task's linear model: binary -> binary-logreg, multiclass ->
// logreg with the schema's classes, regression -> linear; binary-logreg
// and linear are accepted for their own task. kind mlp is a
// classification MLP (softmax over the classes, binary included) with
// hidden units and activation. hidden and activation must be unset for
// the linear models.
func ModelSpec(s *schema.Schema, tr *prep.Transform, kind string, hidden int, activation string, l2 float64) (model.Spec, error) {
	if tr == nil || tr.Outputs < 1 {
		return model.Spec{}, errors.New("model: no fitted transform (the model's inputs are its outputs)")
	}
	spec := model.Spec{Inputs: tr.Outputs, L2: l2}
	k := s.NumClasses()
	switch kind {
	case "", model.KindLogReg, model.KindBinaryLogReg, model.KindLinear:
		switch {
		case s.Task == schema.TaskBinary && (kind != model.KindLinear):
			spec.Kind = model.KindBinaryLogReg
		case s.Task == schema.TaskMulticlass && kind != model.KindLinear && kind != model.KindBinaryLogReg:
			spec.Kind, spec.Classes = model.KindLogReg, k
		case s.Task == schema.TaskRegression && kind != model.KindBinaryLogReg:
			spec.Kind = model.KindLinear
		default:
			return model.Spec{}, fmt.Errorf("model %s does not fit a %s task (use logreg: the task's linear model)", kind, s.Task)
		}
	case model.KindMLP:
		if s.Task == schema.TaskRegression {
			return model.Spec{}, errors.New("model mlp is a classifier; a regression task takes logreg (linear least squares)")
		}
		spec.Kind, spec.Classes, spec.Hidden, spec.Activation = model.KindMLP, k, hidden, activation
	default:
		return model.Spec{}, fmt.Errorf("unknown model %q, expected logreg or mlp", kind)
	}
	if spec.Kind != model.KindMLP && (hidden != 0 || activation != "") {
		return model.Spec{}, fmt.Errorf("model %s has no hidden layer: hidden and activation must be unset", spec.Kind)
	}
	if _, err := model.New(spec); err != nil {
		return model.Spec{}, err
	}
	return spec, nil
}

// Evaluate the model spec with parameters x on d (a site's held-out
// rows): evaluate.Classification of the class probabilities or
// evaluate.Regression of the predictions, as bundle's EvaluateCSV does.
func Evaluate(spec model.Spec, x []float64, d model.Data) (evaluate.Report, error) {
	m, err := model.New(spec)
	if err != nil {
		return evaluate.Report{}, err
	}
	if len(x) != m.NumParams() {
		return evaluate.Report{}, fmt.Errorf("evaluate: %d parameters, the %s model has %d", len(x), spec.Kind, m.NumParams())
	}
	if d.D != spec.Inputs {
		return evaluate.Report{}, fmt.Errorf("evaluate: %d features, the model has %d inputs", d.D, spec.Inputs)
	}
	if d.N == 0 {
		return evaluate.Report{}, nil
	}
	out, k, err := model.Outputs(m, x, d)
	if err != nil {
		return evaluate.Report{}, err
	}
	if k == 1 {
		return evaluate.Regression(out, d.Y)
	}
	return evaluate.Classification(out, d.Y, k)
}

// Reason codes of a site error. They equal wire's SiteErr* constants
// (ClientStatus.error_reason); keep the two lists the same.
const (
	ReasonSchema       = "schema_mismatch" // missing column, duplicate header
	ReasonBadValue     = "bad_value"       // a cell that does not parse
	ReasonUnknownLabel = "unknown_label"   // a label value the mapping does not know
	ReasonTooFewRows   = "too_few_rows"    // fewer than min_site_samples training rows
	ReasonBadTransform = "bad_transform"   // the aggregator's transform or schema refused
	ReasonSolveFailed  = "solve_failed"    // the local solve failed
	ReasonDisk         = "disk"            // state file, disk full, model_out not writable
	ReasonData         = "data"            // anything else about the data file
	ReasonSecAgg       = "secagg_refused"  // a secure-aggregation key list this site could not verify
)

// SiteError is why a site cannot take part. Error is the full one-line
// text for the site's own log (it may contain a cell value); Public is the
// same without any data value, for the aggregator (ClientStatus
// error_message).
type SiteError struct {
	Reason   string // Reason* code
	File     string
	Line     int    // CSV line (1 = header), 0 when not about a line
	Column   string // column name, "" when not about a column
	Problem  string // what is wrong, without data values
	Expected string // what was expected
	Value    string // the offending cell (local log only)
	Err      error
}

func (e *SiteError) Unwrap() error { return e.Err }

// Error is the full text: the schema's CSV error as it is (it names file,
// line, column, expected and the value), otherwise Public.
func (e *SiteError) Error() string {
	var ce *schema.CSVError
	if errors.As(e.Err, &ce) {
		return e.Err.Error()
	}
	return e.Public()
}

// MaxPublic bounds Public's length (it travels in a status message).
const MaxPublic = 512

// Public is one line naming file, line, column, the problem and what was
// expected, never a data value.
func (e *SiteError) Public() string {
	msg := e.File
	add := func(s string) {
		if msg != "" {
			msg += ": "
		}
		msg += s
	}
	if e.Line > 0 {
		add(fmt.Sprintf("line %d", e.Line))
	}
	if e.Column != "" {
		add(fmt.Sprintf("column %q", e.Column))
	}
	p := e.Problem
	if e.Expected != "" {
		if p != "" {
			p += ", "
		}
		p += "expected " + e.Expected
	}
	if p == "" {
		p = e.Reason
	}
	add(p)
	return oneLine(msg, MaxPublic)
}

func oneLine(s string, max int) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\n' || c == '\r' {
			b[i] = ' '
		}
	}
	if len(b) > max {
		b = append(b[:max-3], "..."...)
	}
	return string(b)
}

// NewError is a site error of the given reason about file (empty when
// not about a file), e.g. solve_failed or disk. err's text becomes the
// Problem, so it must not carry data values.
func NewError(reason, file string, err error) *SiteError {
	return &SiteError{Reason: reason, File: file, Problem: err.Error(), Err: err}
}

// Classify turns an error reading the site's CSV at file into a
// *SiteError with its reason code (a *SiteError is returned as it is).
func Classify(file string, err error) *SiteError {
	var se *SiteError
	if errors.As(err, &se) {
		return se
	}
	var ce *schema.CSVError
	if errors.As(err, &ce) {
		e := &SiteError{File: ce.File, Line: ce.Line, Column: ce.Column, Expected: ce.Expected, Value: ce.Value, Err: err}
		col := "column"
		if ce.Role == schema.RoleLabel || ce.Role == schema.RoleSite {
			col = ce.Role + " column"
		}
		switch ce.Kind {
		case schema.KindMissingColumn:
			e.Reason, e.Problem = ReasonSchema, "missing "+col
		case schema.KindDuplicateColumn:
			e.Reason, e.Problem = ReasonSchema, "named twice in the header"
		case schema.KindSiteColumn:
			e.Reason, e.Problem = ReasonSchema, "the site column is a schema column"
		case schema.KindBadValue:
			e.Reason, e.Problem = ReasonBadValue, "unparseable value"
			if ce.Role == schema.RoleSite {
				e.Problem = "empty site column"
			}
		case schema.KindUnknownLabel:
			e.Reason, e.Problem = ReasonUnknownLabel, "unknown label value"
			e.Expected = "one of " + ce.Expected
		case schema.KindEmpty:
			e.Reason, e.Problem = ReasonData, "empty file"
		case schema.KindMalformed:
			e.Reason, e.Problem = ReasonData, "malformed CSV"
			for _, known := range []error{csv.ErrFieldCount, csv.ErrBareQuote, csv.ErrQuote} {
				if errors.Is(ce.Err, known) {
					e.Problem = "malformed CSV (" + known.Error() + ")"
				}
			}
		default:
			e.Reason, e.Problem = ReasonData, ce.Kind
		}
		if ce.Hint != "" { // another separator or decimal mark: no data value
			e.Problem += " (" + ce.Hint + ")"
		}
		if e.File == "" {
			e.File = file
		}
		return e
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return &SiteError{Reason: ReasonData, File: file, Problem: "cannot read the file (" + pe.Op + ": " + pe.Err.Error() + ")", Err: err}
	}
	return &SiteError{Reason: ReasonData, File: file, Problem: "cannot read the file", Err: err}
}
