package sim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
)

// CSVHeader is the header row of results.csv: one row per algorithm and round.
var CSVHeader = []string{"algo", "round", "train_loss", "test_accuracy", "gap", "dist_to_opt", "participants", "stragglers", "grad_evals", "seconds", "bytes_up"}

// WriteCSV writes the rows of every run.
func (r *Results) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 12, 64) }
	for _, run := range r.Runs {
		for _, row := range run.Rounds {
			rec := []string{run.Algo, strconv.Itoa(row.Round), f(float64(row.TrainLoss)), f(float64(row.TestAccuracy)), f(float64(row.Gap)), f(float64(row.DistToOpt)),
				strconv.Itoa(row.Participants), strconv.Itoa(row.Stragglers), strconv.Itoa(row.GradEvals), f(float64(row.Seconds)), strconv.FormatInt(row.BytesUp, 10)}
			if err := cw.Write(rec); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteJSON writes results.json. NaN values (e.g. no test set) become null.
func (r *Results) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteDir writes results.json, results.csv and results.png into dir.
func (r *Results) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	write := func(name string, fn func(io.Writer) error) error {
		path := filepath.Join(dir, name)
		tmp := path + ".tmp"
		f, err := os.Create(tmp)
		if err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		return os.Rename(tmp, path)
	}
	if err := write("results.json", r.WriteJSON); err != nil {
		return err
	}
	if err := write("results.csv", r.WriteCSV); err != nil {
		return err
	}
	return write("results.png", r.WritePlot)
}

// SaveModel writes DIR/<algo>-model.json.
func SaveModel(dir, algo string, m model.Model, params []float64) error {
	path := filepath.Join(dir, safeName(algo)+"-model.json")
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--save-models: %w", err)
	}
	if err := model.Save(f, m, params); err != nil {
		f.Close()
		return fmt.Errorf("--save-models %s: %w", path, err)
	}
	return f.Close()
}

func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
}

// Float is a float64 that encodes NaN and ±Inf as JSON null (JSON has no
// such numbers; a run without a test set has a NaN accuracy).
type Float float64

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.NaN())
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	*f = Float(v)
	return err
}

// Summary prints the final round of every run next to the centralised
// optimum, as a table.
func Summary(w io.Writer, r *Results, where string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "algorithm\trounds\ttrain loss\tgap F-F*\t||x-x*||\ttest acc\n")
	fmt.Fprintf(tw, "optimum\t-\t%.6g\t0\t0\t%.4f\n", float64(r.Optimum.TrainLoss), float64(r.Optimum.TestAccuracy))
	for _, run := range r.Runs {
		if len(run.Rounds) == 0 {
			continue
		}
		last := run.Rounds[len(run.Rounds)-1]
		fmt.Fprintf(tw, "%s\t%d\t%.6g\t%.3e\t%.3e\t%.4f\n", run.Algo, last.Round, float64(last.TrainLoss), float64(last.Gap), float64(last.DistToOpt), float64(last.TestAccuracy))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Optimum.Eval != nil {
		if err := evalSummary(w, r); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "results: %s\n", where)
	return err
}

// evalSummary prints the federated evaluation of a --schema run on the
// sites' held-out rows: the centralised optimum and every run's last
// evaluation, per site and for the federation.
func evalSummary(w io.Writer, r *Results) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	ids := make([]string, len(r.Sites))
	for i, s := range r.Sites {
		ids[i] = s.ID
	}
	cls := r.Optimum.Eval.Federation.Confusion != nil
	unit := "accuracy / AUC"
	if !cls {
		unit = "RMSE / R^2"
	}
	fmt.Fprintf(tw, "held-out rows (%s)\tround", unit)
	for _, id := range ids {
		fmt.Fprintf(tw, "\t%s", id)
	}
	fmt.Fprintf(tw, "\tfederation\n")
	cell := func(rep evaluate.Report) string {
		a, b := rep.Accuracy, rep.AUC
		if !cls {
			a, b = rep.RMSE, rep.R2
		}
		s := fmt.Sprintf("%.4f / ", a)
		if b == nil {
			return s + "-"
		}
		return s + fmt.Sprintf("%.4f", *b)
	}
	line := func(name, round string, ev *bundle.Evaluation) {
		fmt.Fprintf(tw, "%s\t%s", name, round)
		for _, id := range ids {
			fmt.Fprintf(tw, "\t%s", cell(ev.Sites[id]))
		}
		fmt.Fprintf(tw, "\t%s\n", cell(ev.Federation))
	}
	line("centralised optimum", "-", r.Optimum.Eval)
	for _, run := range r.Runs {
		var last *bundle.Evaluation
		for _, row := range run.Rounds {
			if row.Eval != nil {
				last = row.Eval
			}
		}
		if last != nil {
			line(run.Algo, strconv.Itoa(last.Round), last)
		}
	}
	return tw.Flush()
}
