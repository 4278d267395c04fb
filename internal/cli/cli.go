// Package cli owns the subcommand dispatch shared by edgefl's binaries:
// `NAME COMMAND [flags]`, a usage listing, signal-cancelled context and the
// exit codes (0 ok or help, 1 failure, 2 usage error). Standard library only,
// so edge-agent stays lean.
package cli

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

// ErrUsage marks an error the flag package has already reported: exit 2
// without another message.
var ErrUsage = errors.New("usage")

// Command is one subcommand. Sub are its own subcommands (`NAME COMMAND
// SUB [flags]`, as `broker-agg pki passwd`): an argument naming one of them
// runs it instead of Run; its errors read "NAME COMMAND: error" as Run's.
type Command struct {
	Name, Summary string
	Run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	Sub           []Command
}

// dispatch picks c's subcommand named by args[0], if any, else c itself.
func (c Command) dispatch(args []string) (func(ctx context.Context, args []string, stdout, stderr io.Writer) error, []string) {
	if len(args) > 0 {
		for _, s := range c.Sub {
			if s.Name == args[0] {
				return s.Run, args[1:]
			}
		}
	}
	return c.Run, args
}

// Main runs the binary: its context is cancelled by SIGINT or SIGTERM, and
// the process exits with Run's code.
func Main(name string, cmds []Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, name, cmds, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run dispatches args to the named command and returns the exit code: 0 on
// success or help, 2 on a usage error or an unknown command, 1 on any other
// error, which is printed as "NAME COMMAND: error".
func Run(ctx context.Context, name string, cmds []Command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr, name, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range cmds {
		if c.Name != args[0] {
			continue
		}
		run, rest := c.dispatch(args[1:])
		err := run(ctx, rest, stdout, stderr)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, ErrUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "%s %s: %v\n", name, c.Name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n", name, args[0])
	usage(stderr, name, cmds)
	return 2
}

func usage(w io.Writer, name string, cmds []Command) {
	width := 0
	for _, c := range cmds {
		width = max(width, len(c.Name))
	}
	fmt.Fprintf(w, "usage: %s COMMAND [flags]\n\ncommands:\n", name)
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-*s %s\n", width+2, c.Name, c.Summary)
	}
}

// Parse parses args into fs (whose ErrorHandling is flag.ContinueOnError):
// flag.ErrHelp is returned as is, any other error, which the flag package
// has reported with the usage, as ErrUsage.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return ErrUsage
	}
	return nil
}

// VersionCommand is the `version` command of binary name: it prints "name
// version" (stamped at build time with -ldflags "-X main.version=...").
func VersionCommand(name, version string) Command {
	return Command{Name: "version", Summary: "print the version", Run: func(_ context.Context, args []string, stdout, stderr io.Writer) error {
		return printVersion(args, stdout, stderr, name, version)
	}}
}

func printVersion(args []string, stdout, stderr io.Writer, name, version string) error {
	fs := NewFlagSet(name+" version", stderr, fmt.Sprintf("usage: %s version\n\nPrints the version this binary was built as (go build -ldflags \"-X main.version=...\";\n\"dev\" when built without it).\n", name))
	if err := Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return ErrUsage
	}
	_, err := fmt.Fprintln(stdout, name, version)
	return err
}

// NewFlagSet is the flag set of a subcommand: errors and help go to stderr,
// and the help is usage (as is: its own trailing newline) followed by the
// flags' defaults. Parse it with Parse or ParseFlags.
func NewFlagSet(name string, stderr io.Writer, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}
