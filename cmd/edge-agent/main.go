// Command edge-agent is edgefl's gateway daemon: it trains on local data that
// never leaves the site and exchanges only model updates over MQTT.
//
//	edge-agent run --config FILE   the daemon
//	edge-agent bench               on-device benchmark: how much local work fits a round
//	edge-agent evaluate            metrics of a model bundle on a labelled CSV
//	edge-agent predict             predictions of a model bundle for a CSV
//	edge-agent version             print the version
package main

import (
	"context"
	"io"

	"github.com/edgefl/edgefl/internal/cli"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

func commands() []cli.Command {
	return []cli.Command{
		{Name: "run", Summary: "run the edge daemon (see run --help)", Run: runAgent},
		{Name: "bench", Summary: "benchmark a local FedProx solve on this device and suggest a work budget", Run: runBench},
		{Name: "evaluate", Summary: "evaluate a model bundle on a labelled CSV (see evaluate --help)", Run: runEvaluate},
		{Name: "predict", Summary: "write a model bundle's predictions for a CSV (see predict --help)", Run: runPredict},
		cli.VersionCommand("edge-agent", version),
	}
}

func main() { cli.Main("edge-agent", commands()) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "edge-agent", commands(), args, stdout, stderr)
}
