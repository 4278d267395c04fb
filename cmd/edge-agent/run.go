package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/node/agent"
)

// runAgent runs the edge daemon until ctx is canceled (SIGINT/SIGTERM,
// see main), then publishes the offline status and disconnects cleanly.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("edge-agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The command's own flags, printed by the flag package; the options
	// (printOptionFlags) after them.
	own := flag.NewFlagSet("edge-agent run", flag.ContinueOnError)
	own.SetOutput(stderr)
	path := own.String("config", "", "configuration `FILE` of key = value lines (see deploy/edge-agent.example.conf)")
	reset := own.Bool("reset-state", false, "move a damaged state file aside (to FILE.damaged-<unix time>) and start this site over from the aggregator; the site keeps its id")
	fresh := own.Bool("fresh-state", false, "create a missing state file although traces show this site ran here before (its model_out, a copy moved aside, its file system in /etc/fstab not mounted): a deliberate start over with a new identity")
	own.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	flags := addOptionFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: edge-agent run --config FILE [--reset-state] [--fresh-state] [--option value ...]\n\n"+
			"Every option of the file can be given as a flag (underscores become hyphens)\nand then overrides the file. --reset-state is a flag only: a damaged state file is\nmoved aside and the site starts over from the aggregator (it keeps its id).\n"+
			"A missing state file where this site ran before (model_out exists, a copy was moved\naside, or the state file's file system in /etc/fstab is not mounted) is refused:\nmount it or fix state_file; --fresh-state (a flag only) starts over with a new one.\n\n"+
			"When the federation has a schema, data = csv:PATH is read by it (by header name)\nand split into training and held-out rows (or eval_data holds the held-out rows);\nthe site sends statistics of its training rows before round 1 and evaluation\nfigures of its held-out rows when asked. A problem with the data (a missing\ncolumn, a bad cell, too few rows) is logged and sent to the aggregator without\nany data value. When the run ends the final model bundle is verified, kept in the\nstate file and written to model_out (default: final.bundle.json next to the state\nfile); the agent then stays connected quietly until another run starts.\n\nflags:")
		own.PrintDefaults()
		printOptionFlags(fs.Output())
	}
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "edge-agent run: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return cli.ErrUsage
	}
	if *path == "" && len(*flags) == 0 {
		fmt.Fprintln(stderr, "edge-agent run: --config FILE is required (or every setting as a flag)")
		fs.Usage()
		return cli.ErrUsage
	}
	cfg, err := loadConfig(*path, *flags, version)
	if err != nil {
		return err
	}
	lvl, err := agent.ParseLevel(cfg.LogLevel)
	if err != nil {
		return err
	}
	hopts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(stderr, hopts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(stderr, hopts)
	}
	log := slog.New(h)
	cfg.FreshState = *fresh || *reset
	a, err := agent.New(cfg.Config, agent.Deps{Logger: log})
	if err != nil {
		return err
	}
	if *reset {
		aside, err := agent.ResetState(cfg.StateFile, time.Now())
		if err != nil {
			return err
		}
		if aside != "" {
			log.Warn("state file moved aside; this site starts over from the aggregator", "state", cfg.StateFile, "kept_as", aside)
		}
	}
	return a.Run(ctx)
}
