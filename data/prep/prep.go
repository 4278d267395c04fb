// Package prep is the federated preprocessing of a schema run, pure and
// deterministic: per-site statistics of the training rows (Compute), their
// combination over sites (Combine), the fitted transform (Fit) and its
// application to a site's rows (Transform.Apply), which yields model.Data.
// The agent, the aggregator and simulate call exactly these functions.
//
// Statistics carry, per numeric feature, the count of present values, the
// missing count, sum, sum of squares, min and max (the statistics a site sends)
// and also the mean and M2 (sum of squared deviations from the mean) of
// the site: Combine pools means and variances with Chan et al.'s pairwise
// formula on (count, mean, M2), which keeps the pooled variance accurate to
// 1e-12 relative where sum-of-squares arithmetic would lose it. Only these
// aggregates leave a site, and only when it has at least min_site_samples
// training rows.
//
// The transform, in output order, feature by feature as the schema lists
// them:
//   - numeric: a missing value becomes the pooled mean; then
//     (x - mean) / std with the population standard deviation (divide by
//     n). A constant feature (std 0) or one never present is centred but
//     not scaled (scale 1), so it becomes 0 everywhere.
//   - categorical: one 0/1 output per level seen in the pooled statistics,
//     levels in byte-wise lexical order; a missing value becomes the most
//     frequent level (ties: the lexically smallest); a level unseen in
//     training gives all zeros. One-hot outputs are not standardised.
//
// With standardize = client (explicit only) a site's numeric mean and
// scale are its own, everything else (levels, imputed level) is the
// federation's so every site has the same inputs.
//
// Statistics and transforms encode as JSON deterministically (fixed field
// order; maps sorted by encoding/json) and have Validate methods bounding
// sizes and requiring finite numbers, since they travel over the network.
package prep

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/model"
)

// Version is the format version of Stats and Transform.
const Version = 1

// MaxLevels bounds a categorical feature's distinct levels.
const MaxLevels = schema.MaxLevels

// TooFewSamplesError is returned by Compute when a site has fewer training
// rows than the schema's min_site_samples: it must not send statistics.
type TooFewSamplesError struct {
	Rows, Min int
}

func (e *TooFewSamplesError) Error() string {
	return fmt.Sprintf("%d training rows, fewer than min_site_samples %d: statistics are not sent", e.Rows, e.Min)
}

// Numeric are the statistics of one numeric feature (or a regression label).
type Numeric struct {
	Count   int64   `json:"count"` // present values
	Missing int64   `json:"missing"`
	Sum     float64 `json:"sum"`
	SumSq   float64 `json:"sum_sq"`
	Mean    float64 `json:"mean"`
	M2      float64 `json:"m2"` // sum of squared deviations from Mean
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
}

// Var is the population variance.
func (n Numeric) Var() float64 {
	if n.Count == 0 {
		return 0
	}
	return n.M2 / float64(n.Count)
}

// Feature are one feature's statistics: Numeric for a numeric feature,
// Levels (level -> count) and Missing for a categorical one.
type Feature struct {
	Name    string           `json:"name"`
	Type    string           `json:"type"`
	Numeric *Numeric         `json:"numeric,omitempty"`
	Levels  map[string]int64 `json:"levels,omitempty"`
	Missing int64            `json:"missing,omitempty"` // categorical only
}

// Stats are a site's (or, after Combine, the federation's) statistics.
type Stats struct {
	Version      int       `json:"version"`
	SchemaDigest string    `json:"schema_digest"`
	Rows         int64     `json:"rows"`
	Features     []Feature `json:"features"`
	ClassCounts  []int64   `json:"class_counts,omitempty"` // classification
	Label        *Numeric  `json:"label,omitempty"`        // regression
}

// Split divides a table's rows into training and held-out rows by the
// schema's hold-out rule (schema.HoldoutRow on the data row index).
func Split(s *schema.Schema, t *schema.Table) (train, holdout []int) {
	for i := range t.Rows {
		if s.HoldoutRow(i) {
			holdout = append(holdout, i)
		} else {
			train = append(train, i)
		}
	}
	return train, holdout
}

func numericOf(vals []float64, missing []bool, rows []int) *Numeric {
	n := &Numeric{Min: 0, Max: 0}
	first := true
	for _, i := range rows {
		if missing != nil && missing[i] {
			n.Missing++
			continue
		}
		v := vals[i]
		n.Count++
		n.Sum += v
		n.SumSq += v * v
		if first || v < n.Min {
			n.Min = v
		}
		if first || v > n.Max {
			n.Max = v
		}
		first = false
	}
	if n.Count > 0 {
		// Within the site: the mean, refined by the mean of the
		// residuals (corrects the rounding of the sum), then M2 around it.
		n.Mean = n.Sum / float64(n.Count)
		corr := 0.0
		for _, i := range rows {
			if missing == nil || !missing[i] {
				corr += vals[i] - n.Mean
			}
		}
		n.Mean += corr / float64(n.Count)
		for _, i := range rows {
			if missing == nil || !missing[i] {
				d := vals[i] - n.Mean
				n.M2 += d * d
			}
		}
		// The refined mean may round just outside [min, max] when all
		// values are equal.
		n.Mean = math.Min(math.Max(n.Mean, n.Min), n.Max)
	}
	return n
}

// Compute the statistics of the rows of t (the site's training rows).
func Compute(s *schema.Schema, t *schema.Table, rows []int) (*Stats, error) {
	if len(rows) < s.MinSiteSamples {
		return nil, &TooFewSamplesError{Rows: len(rows), Min: s.MinSiteSamples}
	}
	st := &Stats{Version: Version, SchemaDigest: s.Digest(), Rows: int64(len(rows)), Features: make([]Feature, len(s.Features))}
	for j, f := range s.Features {
		c := t.Columns[j]
		fs := Feature{Name: f.Name, Type: f.Type}
		if f.Type == schema.Numeric {
			fs.Numeric = numericOf(c.Num, c.Missing, rows)
		} else {
			fs.Levels = map[string]int64{}
			for _, i := range rows {
				if c.Missing[i] {
					fs.Missing++
				} else {
					fs.Levels[c.Level[i]]++
				}
			}
			if len(fs.Levels) > MaxLevels {
				return nil, fmt.Errorf("feature %q has %d distinct levels, at most %d", f.Name, len(fs.Levels), MaxLevels)
			}
		}
		st.Features[j] = fs
	}
	if s.Task == schema.TaskRegression {
		st.Label = numericOf(t.Labels, nil, rows)
	} else {
		st.ClassCounts = make([]int64, s.NumClasses())
		for _, i := range rows {
			st.ClassCounts[int(t.Labels[i])]++
		}
	}
	return st, nil
}

// combineNumeric pools b into a (Chan et al.).
func combineNumeric(a, b *Numeric) {
	if b.Count == 0 {
		a.Missing += b.Missing
		return
	}
	if a.Count == 0 {
		miss := a.Missing
		*a = *b
		a.Missing += miss
		return
	}
	na, nb := float64(a.Count), float64(b.Count)
	n := na + nb
	delta := b.Mean - a.Mean
	a.Mean += delta * nb / n
	a.M2 += b.M2 + delta*delta*na*nb/n
	a.Count += b.Count
	a.Missing += b.Missing
	a.Sum += b.Sum
	a.SumSq += b.SumSq
	a.Min = math.Min(a.Min, b.Min)
	a.Max = math.Max(a.Max, b.Max)
	a.Mean = math.Min(math.Max(a.Mean, a.Min), a.Max)
}

func cloneNumeric(n *Numeric) *Numeric {
	if n == nil {
		return nil
	}
	c := *n
	return &c
}

// Combine pools validated site statistics into the federation's, in the
// order given (pass them in a fixed order, e.g. by site id, so every
// party gets the same bits).
func Combine(s *schema.Schema, sites []*Stats) (*Stats, error) {
	if len(sites) == 0 {
		return nil, errors.New("combine: no site statistics")
	}
	for k, st := range sites {
		if err := st.Validate(s); err != nil {
			return nil, fmt.Errorf("combine: site statistics %d: %w", k+1, err)
		}
	}
	out := &Stats{Version: Version, SchemaDigest: s.Digest(), Features: make([]Feature, len(s.Features))}
	for j := range s.Features {
		f := sites[0].Features[j]
		out.Features[j] = Feature{Name: f.Name, Type: f.Type, Numeric: cloneNumeric(f.Numeric), Missing: f.Missing}
		if f.Levels != nil {
			out.Features[j].Levels = map[string]int64{}
			for l, c := range f.Levels {
				out.Features[j].Levels[l] = c
			}
		}
	}
	out.Rows = sites[0].Rows
	out.ClassCounts = slices.Clone(sites[0].ClassCounts)
	out.Label = cloneNumeric(sites[0].Label)
	for _, st := range sites[1:] {
		out.Rows += st.Rows
		for j := range s.Features {
			a, b := &out.Features[j], st.Features[j]
			if a.Numeric != nil {
				combineNumeric(a.Numeric, b.Numeric)
				continue
			}
			a.Missing += b.Missing
			for l, c := range b.Levels {
				a.Levels[l] += c
			}
			if len(a.Levels) > MaxLevels {
				return nil, fmt.Errorf("combine: feature %q has %d distinct levels over the sites, at most %d", a.Name, len(a.Levels), MaxLevels)
			}
		}
		for k, c := range st.ClassCounts {
			out.ClassCounts[k] += c
		}
		if out.Label != nil {
			combineNumeric(out.Label, st.Label)
		}
	}
	return out, nil
}

func finite(vs ...float64) bool {
	for _, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

func (n *Numeric) validate(rows int64) error {
	if n.Count < 0 || n.Missing < 0 || n.Count+n.Missing != rows {
		return fmt.Errorf("count %d + missing %d is not the %d rows", n.Count, n.Missing, rows)
	}
	if !finite(n.Sum, n.SumSq, n.Mean, n.M2, n.Min, n.Max) {
		return errors.New("a statistic is not finite")
	}
	if n.M2 < 0 || n.SumSq < 0 || (n.Count > 0 && (n.Min > n.Max || n.Mean < n.Min || n.Mean > n.Max)) {
		return errors.New("inconsistent statistics (negative M2 or sum of squares, or the mean outside [min, max])")
	}
	return nil
}

// Validate checks statistics that came from the network against the
// schema: format version, schema digest, one entry per feature with its
// name and type, counts adding up, finite numbers, bounded levels.
func (st *Stats) Validate(s *schema.Schema) error {
	if st.Version != Version {
		return fmt.Errorf("statistics version %d, expected %d", st.Version, Version)
	}
	if st.SchemaDigest != s.Digest() {
		return fmt.Errorf("statistics of schema %.12s, expected %.12s", st.SchemaDigest, s.Digest())
	}
	if st.Rows < 1 {
		return fmt.Errorf("%d rows", st.Rows)
	}
	if len(st.Features) != len(s.Features) {
		return fmt.Errorf("%d features, the schema has %d", len(st.Features), len(s.Features))
	}
	for j, f := range s.Features {
		fs := st.Features[j]
		if fs.Name != f.Name || fs.Type != f.Type {
			return fmt.Errorf("feature %d is %q (%s), the schema says %q (%s)", j+1, fs.Name, fs.Type, f.Name, f.Type)
		}
		if f.Type == schema.Numeric {
			if fs.Numeric == nil || fs.Levels != nil {
				return fmt.Errorf("feature %q: numeric statistics expected", f.Name)
			}
			if err := fs.Numeric.validate(st.Rows); err != nil {
				return fmt.Errorf("feature %q: %w", f.Name, err)
			}
			continue
		}
		if fs.Numeric != nil || len(fs.Levels) > MaxLevels {
			return fmt.Errorf("feature %q: categorical statistics with at most %d levels expected", f.Name, MaxLevels)
		}
		total := fs.Missing
		for l, c := range fs.Levels {
			if c < 1 || len(l) > schema.MaxNameBytes {
				return fmt.Errorf("feature %q: bad level entry", f.Name)
			}
			total += c
		}
		if fs.Missing < 0 || total != st.Rows {
			return fmt.Errorf("feature %q: level counts add up to %d, not the %d rows", f.Name, total, st.Rows)
		}
	}
	if s.Task == schema.TaskRegression {
		if st.Label == nil || st.ClassCounts != nil {
			return errors.New("regression label statistics expected")
		}
		if err := st.Label.validate(st.Rows); err != nil || st.Label.Missing != 0 {
			return fmt.Errorf("label: %v", err)
		}
	} else {
		if st.Label != nil || len(st.ClassCounts) != s.NumClasses() {
			return fmt.Errorf("%d class counts, the schema has %d classes", len(st.ClassCounts), s.NumClasses())
		}
		var total int64
		for _, c := range st.ClassCounts {
			if c < 0 {
				return errors.New("negative class count")
			}
			total += c
		}
		if total != st.Rows {
			return fmt.Errorf("class counts add up to %d, not the %d rows", total, st.Rows)
		}
	}
	return nil
}

// Column is the transform of one feature.
type Column struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Numeric: Impute replaces a missing value, then (x - Mean) / Scale.
	Impute float64 `json:"impute,omitempty"`
	Mean   float64 `json:"mean,omitempty"`
	Scale  float64 `json:"scale,omitempty"`
	// Categorical: one output per level in this order; ImputeLevel
	// replaces a missing value.
	Levels      []string `json:"levels,omitempty"`
	ImputeLevel string   `json:"impute_level,omitempty"`
}

// Transform is the fitted preprocessing every site applies.
type Transform struct {
	Version      int      `json:"version"`
	SchemaDigest string   `json:"schema_digest"`
	Standardize  string   `json:"standardize"`
	Columns      []Column `json:"columns"`
	Outputs      int      `json:"outputs"` // model inputs
}

// Fit the transform from the federation's pooled statistics. own is the
// site's own statistics, used (and required) only when the schema says
// standardize = client; pass nil otherwise.
func Fit(s *schema.Schema, pooled, own *Stats) (*Transform, error) {
	if err := pooled.Validate(s); err != nil {
		return nil, wrapErr("fit: pooled statistics", err)
	}
	client := s.Standardize == schema.StandardizeClient
	if client {
		if own == nil {
			return nil, errors.New("fit: standardize = client needs the site's own statistics")
		}
		if err := own.Validate(s); err != nil {
			return nil, wrapErr("fit: site statistics", err)
		}
	}
	tr := &Transform{Version: Version, SchemaDigest: s.Digest(), Standardize: s.Standardize, Columns: make([]Column, len(s.Features))}
	for j, f := range s.Features {
		fs := pooled.Features[j]
		col := Column{Name: f.Name, Type: f.Type}
		if f.Type == schema.Numeric {
			n := fs.Numeric
			if client {
				n = own.Features[j].Numeric
			}
			col.Impute, col.Mean, col.Scale = n.Mean, n.Mean, 1
			if sd := math.Sqrt(n.Var()); sd > 0 && finite(sd) {
				col.Scale = sd
			}
			// The federation's mean imputes in either mode, so a missing
			// value means the same at every site.
			col.Impute = fs.Numeric.Mean
			tr.Outputs++
		} else {
			col.Levels = make([]string, 0, len(fs.Levels))
			for l := range fs.Levels {
				col.Levels = append(col.Levels, l)
			}
			sort.Strings(col.Levels)
			var best int64 = -1
			for _, l := range col.Levels {
				if fs.Levels[l] > best {
					best, col.ImputeLevel = fs.Levels[l], l
				}
			}
			tr.Outputs += len(col.Levels)
		}
		tr.Columns[j] = col
	}
	return tr, nil
}

// Validate checks a transform that came from the network or a file.
func (tr *Transform) Validate(s *schema.Schema) error {
	if tr.Version != Version {
		return fmt.Errorf("transform version %d, expected %d", tr.Version, Version)
	}
	if tr.SchemaDigest != s.Digest() {
		return fmt.Errorf("transform of schema %.12s, expected %.12s", tr.SchemaDigest, s.Digest())
	}
	if len(tr.Columns) != len(s.Features) {
		return fmt.Errorf("transform has %d columns, the schema %d features", len(tr.Columns), len(s.Features))
	}
	outputs := 0
	for j, f := range s.Features {
		c := tr.Columns[j]
		if c.Name != f.Name || c.Type != f.Type {
			return fmt.Errorf("transform column %d is %q (%s), the schema says %q (%s)", j+1, c.Name, c.Type, f.Name, f.Type)
		}
		if f.Type == schema.Numeric {
			if !finite(c.Impute, c.Mean, c.Scale) || !(c.Scale > 0) || c.Levels != nil {
				return fmt.Errorf("transform column %q: impute, mean and a positive scale must be finite", f.Name)
			}
			outputs++
			continue
		}
		if len(c.Levels) > MaxLevels || !sort.StringsAreSorted(c.Levels) {
			return fmt.Errorf("transform column %q: at most %d levels in lexical order", f.Name, MaxLevels)
		}
		for k, l := range c.Levels {
			if len(l) > schema.MaxNameBytes || (k > 0 && c.Levels[k-1] == l) {
				return fmt.Errorf("transform column %q: bad level", f.Name)
			}
		}
		if len(c.Levels) > 0 && !slices.Contains(c.Levels, c.ImputeLevel) {
			return fmt.Errorf("transform column %q: imputed level %q is not a level", f.Name, c.ImputeLevel)
		}
		outputs += len(c.Levels)
	}
	if outputs != tr.Outputs || outputs == 0 {
		return fmt.Errorf("transform: %d outputs, the columns give %d", tr.Outputs, outputs)
	}
	return nil
}

// Apply the transform to the rows of t (nil: all rows). Y is the class
// index or the regression value; nil when t has no labels.
func (tr *Transform) Apply(t *schema.Table, rows []int) model.Data {
	if rows == nil {
		rows = make([]int, t.Rows)
		for i := range rows {
			rows[i] = i
		}
	}
	d := model.Data{N: len(rows), D: tr.Outputs, X: make([]float64, len(rows)*tr.Outputs)}
	if t.Labels != nil {
		d.Y = make([]float64, len(rows))
	}
	// Each categorical column's output of a level. A table's levels are
	// schema.Level's (numbers as numbers); a transform fitted before
	// they were may hold "1.0": its levels are found by their Level too
	// (two that are one level: the first in the transform's order).
	index := make([]map[string]int, len(tr.Columns))
	for j, c := range tr.Columns {
		if c.Type == schema.Numeric {
			continue
		}
		index[j] = make(map[string]int, len(c.Levels))
		for k, l := range c.Levels {
			if _, dup := index[j][schema.Level(l)]; !dup {
				index[j][schema.Level(l)] = k
			}
		}
		for k, l := range c.Levels {
			index[j][l] = k
		}
	}
	for r, i := range rows {
		x := d.X[r*tr.Outputs : (r+1)*tr.Outputs]
		o := 0
		for j, c := range tr.Columns {
			col := t.Columns[j]
			if c.Type == schema.Numeric {
				v := c.Impute
				if !col.Missing[i] {
					v = col.Num[i]
				}
				x[o] = (v - c.Mean) / c.Scale
				o++
				continue
			}
			l := c.ImputeLevel
			if !col.Missing[i] {
				l = col.Level[i]
			}
			k, ok := index[j][l]
			if !ok {
				k, ok = index[j][schema.Level(l)]
			}
			if ok {
				x[o+k] = 1
			}
			o += len(c.Levels)
		}
		if d.Y != nil {
			d.Y[r] = t.Labels[i]
		}
	}
	return d
}
