// Command broker-agg is edgefl's on-prem aggregator. Subcommands:
//
//	broker-agg simulate   many virtual clients in one process (experiments, benchmarks)
//	broker-agg report     tabulate results.json files as markdown
//
// Run `broker-agg help` for the list and `broker-agg CMD -h` for each one's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"run", "run the aggregator daemon (embedded MQTT broker by default)", runServe},
		{"demo", "embedded broker + aggregator + N in-process edge agents over real MQTT", runDemo},
		{"status", "print the current round and each client's last-seen and participation", runStatus},
		{"pki", "make a site PKI: a CA and per-site certificates for mutual TLS", runPKI},
		{"simulate", "run many virtual clients in one process and write results.json/csv/png", runSimulate},
		{"report", "tabulate results.json files (mean ± sd over seeds) as markdown", runReport},
		{"version", "print the version", func(_ context.Context, _ []string, stdout, _ io.Writer) error {
			_, err := fmt.Fprintln(stdout, "broker-agg", version)
			return err
		}},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "broker-agg %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "broker-agg: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

// errUsage marks an error already reported by the flag package.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: broker-agg COMMAND [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
}
