// Command broker-agg is edgefl's on-prem aggregator. Subcommands, one file
// each (each parses its flags and --config file, builds what it runs, runs
// it with the signal-cancelled context and returns; internal/cli dispatches
// and turns the result into the exit code):
//
//	broker-agg run        the aggregator daemon, its MQTT broker embedded by default (run.go)
//	broker-agg demo       embedded broker + aggregator + N edge agents in one process (demo.go;
//	                      demo --schema: demo_schema.go; the wiring is sim/localfed's)
//	broker-agg status     the current round and each client, from the state file or a daemon (status.go)
//	broker-agg export     the model bundle of a stored round (export.go)
//	broker-agg pki        a site PKI: a CA and per-site certificates for mutual TLS (pki.go)
//	broker-agg pki passwd add a site to a Mosquitto-format password file (pki.go)
//	broker-agg simulate   many virtual clients in one process (experiments, benchmarks) (simulate.go)
//	broker-agg report     tabulate results.json files as markdown (report.go)
//	broker-agg version    print the version (main.go)
//
// The key = value --config files are read by internal/cli (flags.go).
// Run `broker-agg help` for the list and `broker-agg CMD -h` for each one's flags.
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
		{Name: "run", Summary: "run the aggregator daemon (embedded MQTT broker by default)", Run: runServe},
		{Name: "demo", Summary: "embedded broker + aggregator + N in-process edge agents over real MQTT", Run: runDemo},
		{Name: "status", Summary: "print the current round and each client's last-seen and participation", Run: runStatus},
		{Name: "export", Summary: "write the model bundle of a stored round of a run with --schema (also while the daemon runs)", Run: runExport},
		{Name: "pki", Summary: "make a site PKI: a CA and per-site certificates for mutual TLS", Run: runPKI,
			Sub: []cli.Command{{Name: "passwd", Summary: "add a site to a Mosquitto-format password file", Run: runPasswd}}},
		{Name: "simulate", Summary: "run many virtual clients in one process and write results.json/csv/png", Run: runSimulate},
		{Name: "report", Summary: "tabulate results.json files (mean ± sd over seeds) as markdown", Run: runReport},
		cli.VersionCommand("broker-agg", version),
	}
}

func main() { cli.Main("broker-agg", commands()) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "broker-agg", commands(), args, stdout, stderr)
}
