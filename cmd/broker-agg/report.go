package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/sim"
)

// runReport prints a markdown table from results.json files (one per seed).
func runReport(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("report", stderr, `usage: broker-agg report [--metric NAME] [--at ROUNDS] [--below X] RESULTS.json...

Tabulates the results.json files of broker-agg simulate as a markdown table:
one row per algorithm, one column per --at round, each cell the mean ± sd of
--metric over the files (one file per seed).

flags:
`)
	metric := fs.String("metric", "accuracy", "metric: accuracy (percent) | loss | gap | relgap | dist | bytes_up")
	atList := fs.String("at", "0", "comma-separated rounds to tabulate (0 = the last round)")
	below := fs.Float64("below", 0, "also report the first round at which the metric falls below this value")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var at []int
	for _, s := range strings.Split(*atList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return fmt.Errorf("--at %q: want comma-separated round numbers >= 0", *atList)
		}
		at = append(at, n)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return cli.ErrUsage
	}
	var files []*sim.Results
	for _, p := range fs.Args() {
		r, err := sim.ReadResults(p)
		if err != nil {
			return err
		}
		files = append(files, r)
	}
	return sim.Report(stdout, files, *metric, at, *below)
}
