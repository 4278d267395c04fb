// Command broker-agg is edgefl's on-prem aggregator. Subcommands:
//
//	broker-agg simulate   many virtual clients in one process (experiments, benchmarks)
//	broker-agg report     tabulate results.json files as markdown
//
// Run `broker-agg help` for the list and `broker-agg CMD -h` for each one's flags.
package main

import (
	"context"
	"io"

	"github.com/edgefl/edgefl/internal/cli"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// errUsage marks an error the flag package already reported.
var errUsage = cli.ErrUsage

func commands() []cli.Command {
	return []cli.Command{
		{Name: "run", Summary: "run the aggregator daemon (embedded MQTT broker by default)", Run: runServe},
		{Name: "demo", Summary: "embedded broker + aggregator + N in-process edge agents over real MQTT", Run: runDemo},
		{Name: "status", Summary: "print the current round and each client's last-seen and participation", Run: runStatus},
		{Name: "export", Summary: "write the model bundle of a stored round of a run with --schema (also while the daemon runs)", Run: runExport},
		{Name: "pki", Summary: "make a site PKI: a CA and per-site certificates for mutual TLS", Run: runPKI},
		{Name: "simulate", Summary: "run many virtual clients in one process and write results.json/csv/png", Run: runSimulate},
		{Name: "report", Summary: "tabulate results.json files (mean ± sd over seeds) as markdown", Run: runReport},
		{Name: "version", Summary: "print the version", Run: func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			return cli.Version(args, stdout, stderr, "broker-agg", version)
		}},
	}
}

func main() { cli.Main("broker-agg", commands()) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "broker-agg", commands(), args, stdout, stderr)
}
