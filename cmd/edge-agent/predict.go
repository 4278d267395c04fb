package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/internal/cli"
)

// runPredict is `edge-agent predict`: one output row per input row.
func runPredict(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("predict", stderr, "usage: edge-agent predict --model BUNDLE --data csv:PATH --out FILE [--keep COL,...] [--raw-label]\n\n"+
		"Writes FILE (atomically) with one row per row of PATH: the --keep columns, \"prediction\"\n"+
		"(the predicted class's name from the schema, or the value for regression), with --raw-label\n"+
		"\"prediction_raw\" (the first raw label value of that class), and p_<class> per class.\n"+
		"PATH is read by the bundle's schema (the label column may be absent).\n\nflags:\n")
	modelPath := fs.String("model", "", "model bundle written by broker-agg (required)")
	data := fs.String("data", "", "input rows: csv:PATH (required)")
	out := fs.String("out", "", "output CSV (required)")
	keep := fs.String("keep", "", "comma-separated input columns copied to the output")
	rawLabel := fs.Bool("raw-label", false, "add a prediction_raw column: the predicted class's first raw label value")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *modelPath == "" || *data == "" || *out == "" || fs.NArg() > 0 {
		return errors.New("predict: --model, --data and --out are required, no arguments")
	}
	path, label, err := bundle.ParseDataArg(*data)
	if err != nil {
		return err
	}
	if label != "" {
		return errors.New("predict: --data takes csv:PATH (no label=)")
	}
	var cols []string
	if *keep != "" {
		cols = strings.Split(*keep, ",")
	}
	b, err := bundle.Read(*modelPath)
	if err != nil {
		return err
	}
	n, err := b.PredictCSV(path, *out, bundle.PredictOptions{Keep: cols, RawLabel: *rawLabel})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %d predictions to %s\n", n, *out)
	return nil
}
