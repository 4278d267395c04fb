package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// ReadResults loads a results.json written by WriteDir.
func ReadResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(r.Runs) == 0 {
		return nil, fmt.Errorf("%s: no runs", path)
	}
	return &r, nil
}

// Metric names accepted by Report.
var reportMetrics = map[string]func(r *Results, row Round) float64{
	"accuracy": func(_ *Results, row Round) float64 { return float64(row.TestAccuracy) },
	"loss":     func(_ *Results, row Round) float64 { return float64(row.TrainLoss) },
	"gap":      func(_ *Results, row Round) float64 { return float64(row.Gap) },
	"relgap":   func(r *Results, row Round) float64 { return float64(row.Gap) / math.Abs(float64(r.Optimum.TrainLoss)) },
	"dist":     func(_ *Results, row Round) float64 { return float64(row.DistToOpt) },
	"bytes_up": func(_ *Results, row Round) float64 { return float64(row.BytesUp) },
}

// Report writes a markdown table: one row per algorithm (in the order of the
// first file), one column per (metric, round), each cell the mean over the
// files (typically one per seed) and, with several files, ± the standard
// deviation. Round 0 in at means the last round. A final column, for relgap,
// gives the first round at which it fell below below (when below > 0).
func Report(w io.Writer, files []*Results, metric string, at []int, below float64) error {
	fn, ok := reportMetrics[metric]
	if !ok {
		names := make([]string, 0, len(reportMetrics))
		for k := range reportMetrics {
			names = append(names, k)
		}
		return fmt.Errorf("--metric %q: want one of %s", metric, strings.Join(names, ", "))
	}
	if len(files) == 0 {
		return fmt.Errorf("no results files")
	}
	head := []string{"algorithm"}
	for _, t := range at {
		if t == 0 {
			head = append(head, metric+" (final)")
		} else {
			head = append(head, fmt.Sprintf("%s @%d", metric, t))
		}
	}
	if below > 0 {
		head = append(head, fmt.Sprintf("first round < %g", below))
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	if metric == "accuracy" || metric == "loss" {
		var vals []float64
		for _, f := range files {
			if metric == "accuracy" {
				vals = append(vals, float64(f.Optimum.TestAccuracy))
			} else {
				vals = append(vals, float64(f.Optimum.TrainLoss))
			}
		}
		cells := []string{"centralised optimum"}
		for range at {
			cells = append(cells, meanSD(vals, metric))
		}
		if below > 0 {
			cells = append(cells, "")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	for _, run := range files[0].Runs {
		cells := []string{run.Algo}
		for _, t := range at {
			var vals []float64
			for _, f := range files {
				if row, ok := roundOf(f, run.Algo, t); ok {
					vals = append(vals, fn(f, row))
				}
			}
			cells = append(cells, meanSD(vals, metric))
		}
		if below > 0 {
			var firsts []string
			for _, f := range files {
				first := "never"
				for _, r := range f.Runs {
					if r.Algo != run.Algo {
						continue
					}
					for _, row := range r.Rounds {
						if fn(f, row) < below {
							first = fmt.Sprint(row.Round)
							break
						}
					}
				}
				firsts = append(firsts, first)
			}
			cells = append(cells, strings.Join(firsts, ", "))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	return nil
}

func roundOf(f *Results, algo string, t int) (Round, bool) {
	for _, r := range f.Runs {
		if r.Algo != algo || len(r.Rounds) == 0 {
			continue
		}
		if t == 0 {
			return r.Rounds[len(r.Rounds)-1], true
		}
		for _, row := range r.Rounds {
			if row.Round == t {
				return row, true
			}
		}
	}
	return Round{}, false
}

func meanSD(v []float64, metric string) string {
	if len(v) == 0 {
		return "-"
	}
	var m float64
	for _, x := range v {
		m += x
	}
	m /= float64(len(v))
	format := func(x float64) string {
		switch metric {
		case "accuracy":
			return fmt.Sprintf("%.2f", 100*x)
		case "relgap", "gap", "dist":
			return fmt.Sprintf("%.2e", x)
		case "bytes_up":
			return fmt.Sprintf("%.0f", x)
		}
		return fmt.Sprintf("%.4f", x)
	}
	if len(v) == 1 {
		return format(m)
	}
	var ss float64
	for _, x := range v {
		ss += (x - m) * (x - m)
	}
	return format(m) + " ± " + format(math.Sqrt(ss/float64(len(v)-1)))
}
