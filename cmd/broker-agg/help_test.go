package main

import (
	"strings"
	"testing"

	"github.com/edgefl/edgefl/internal/cli"
)

// TestEveryCommandHelp: every subcommand's --help (pki passwd's too)
// exits 0 and starts with a synopsis and a sentence, and no flag shows its
// type as "value".
func TestEveryCommandHelp(t *testing.T) {
	var cmds [][]string
	for _, c := range commands() {
		cmds = append(cmds, []string{c.Name})
		for _, s := range c.Sub {
			cmds = append(cmds, []string{c.Name, s.Name})
		}
	}
	for _, c := range cmds {
		name := strings.Join(c, " ")
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append(c, "--help")...)
			if code != 0 {
				t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
			}
			help := stdout + stderr
			for _, p := range cli.HelpProblems("broker-agg", name, help) {
				t.Error(p)
			}
			if t.Failed() {
				t.Logf("--help:\n%s", help)
			}
		})
	}
}
