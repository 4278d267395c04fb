package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/internal/cli"
)

// runEvaluate is `edge-agent evaluate`: the metrics of a bundle's model on
// a labelled CSV, through the bundle's schema and preprocessing.
func runEvaluate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("evaluate", stderr, "usage: edge-agent evaluate --model BUNDLE --data csv:PATH[:label=COL] [--heldout] [--json]\n\n"+
		"Reads PATH by the bundle's schema (label=COL overrides the label column), applies the\n"+
		"bundle's preprocessing and prints n, loss and accuracy, balanced accuracy, confusion\n"+
		"matrix and ROC AUC (binary), or RMSE and R^2 (regression). With --heldout only the rows\n"+
		"the federation held out of PATH (the schema's holdout rule) are evaluated, as the site\n"+
		"did: on the site's own data file this is the site's federated figure in the bundle.\n\nflags:\n")
	modelPath := fs.String("model", "", "model bundle written by broker-agg (required)")
	data := fs.String("data", "", "labelled data: csv:PATH[:label=COL] (required)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	heldout := fs.Bool("heldout", false, "evaluate only the rows of PATH the federation held out (never trained on)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *modelPath == "" || *data == "" || fs.NArg() > 0 {
		return errors.New("evaluate: --model and --data are required, no arguments")
	}
	path, label, err := bundle.ParseDataArg(*data)
	if err != nil {
		return err
	}
	b, err := bundle.Read(*modelPath)
	if err != nil {
		return err
	}
	evalCSV := b.EvaluateCSV
	if *heldout {
		evalCSV = b.EvaluateHeldOutCSV
	}
	r, err := evalCSV(path, label)
	if err != nil {
		return err
	}
	if *asJSON {
		// With its baseline, as the bundle records a site's figure, so
		// that --heldout reproduces the site's report field for field.
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r.WithBaseline())
	}
	if p := b.Privacy; p != nil {
		// The model's guarantee, not this evaluation's: these figures
		// are of the local CSV and stay here.
		fmt.Fprintf(stdout, "model      %s\n", p)
	}
	rows := "every row"
	if *heldout {
		rows = "the held-out rows"
	}
	fmt.Fprintf(stdout, "rows       %s of %s\n", rows, path)
	fmt.Fprintf(stdout, "n          %d\nloss       %.6g\n", r.N, r.Loss)
	if r.Confusion == nil {
		fmt.Fprintf(stdout, "rmse       %.6g\n", r.RMSE)
		if r.R2 != nil {
			fmt.Fprintf(stdout, "r2         %.6g\n", *r.R2)
			if *r.R2 <= 0 {
				fmt.Fprintln(stdout, "baseline   the model does NOT beat predicting these rows' own mean (R^2 <= 0)")
			}
		}
		return nil
	}
	fmt.Fprintf(stdout, "accuracy   %.4f\nbalanced   %.4f\n", r.Accuracy, r.BalancedAccuracy)
	if bl := r.WithBaseline().Baseline; bl != nil {
		// The rule a model must beat to be of any use on these rows.
		verdict := "the model beats it"
		if !bl.Beaten {
			verdict = "the model does NOT beat it"
		}
		fmt.Fprintf(stdout, "baseline   %.4f (always %s, the most frequent class here; %s)\n", bl.Accuracy, b.Schema.Label.Classes[bl.Class].Name, verdict)
	}
	if r.AUC != nil {
		fmt.Fprintf(stdout, "auc        %.4f\n", *r.AUC)
	}
	fmt.Fprintln(stdout, "confusion (rows: true class, columns: predicted)")
	for k, row := range r.Confusion {
		fmt.Fprintf(stdout, "  %-12s %v\n", b.Schema.Label.Classes[k].Name, row)
	}
	return nil
}
