package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/internal/cli"
)

// TestEveryCommandHelp: every subcommand's --help exits 0 and starts with a
// synopsis and a sentence, and no flag shows its type as "value"; run's
// options show their types and the agent's defaults.
func TestEveryCommandHelp(t *testing.T) {
	for _, c := range commands() {
		t.Run(c.Name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), []string{c.Name, "--help"}, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
			}
			help := stdout.String() + stderr.String()
			for _, p := range cli.HelpProblems("edge-agent", c.Name, help) {
				t.Error(p)
			}
			if c.Name == "run" {
				for _, want := range []string{
					"  -keepalive duration\n", "MQTT keepalive (default 30s)",
					"  -max-message-bytes int\n", "(default 33554432)",
					"  -deadline-margin duration\n", "(default 1s)",
					"  -broker URL\n", "  -seed uint\n", "  -lr float\n", "  -state-file FILE\n",
					"  -log-level string\n", `(default "info")`,
					"  -config FILE\n", "  -reset-state\n", "  -fresh-state\n",
				} {
					if !strings.Contains(help, want) {
						t.Errorf("run --help does not show %q", want)
					}
				}
				// Every option of the file is a flag in the help.
				for _, o := range options() {
					if !strings.Contains(help, "  -"+flagName(o.key)+" "+o.val.typ+"\n") {
						t.Errorf("run --help does not list -%s %s", flagName(o.key), o.val.typ)
					}
				}
			}
			if t.Failed() {
				t.Logf("--help:\n%s", help)
			}
		})
	}
}
