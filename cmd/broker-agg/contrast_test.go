package main

import (
	"strings"
	"testing"
)

// TestContrastCommands: moon and fedsiam-da in simulate, demo and run:
// refused with the reason where they do not compose (a model without a
// representation layer, DP, secure aggregation, tau elsewhere than MOON),
// and a demo of each over an MLP runs to its final figures (fedsiam-da's
// global model carries its prediction head, which the final evaluation
// leaves out).
func TestContrastCommands(t *testing.T) {
	refusals := []struct {
		name string
		args []string
		want string
	}{
		{"simulate moon over logreg", []string{"simulate", "--rounds", "1", "--out", t.TempDir(), "--algo", "moon"}, "representation layer"},
		{"simulate fedsiam-da under dp", []string{"simulate", "--rounds", "1", "--out", t.TempDir(), "--model", "mlp", "--algo", "fedsiam-da", "--dp", "central", "--dp-noise", "1"}, "--dp"},
		{"simulate moon tau 0", []string{"simulate", "--rounds", "1", "--out", t.TempDir(), "--model", "mlp", "--algo", "moon:tau=-1"}, "tau"},
		{"demo fedsiam-da over logreg", []string{"demo", "--rounds", "1", "--metrics-addr", "", "--algorithm", "fedsiam-da"}, "representation layer"},
		{"demo moon under secagg", []string{"demo", "--rounds", "1", "--metrics-addr", "", "--algorithm", "moon", "--model", "mlp", "--secagg"}, "secure aggregation"},
		{"demo tau with fedprox", []string{"demo", "--rounds", "1", "--metrics-addr", "", "--algorithm", "fedprox", "--tau", "0.5"}, "tau"},
		{"run moon over logreg", []string{"run", "--algorithm", "moon", "--features", "4", "--classes", "3", "--state-file", t.TempDir() + "/s.db", "--listen", "127.0.0.1:0", "--password-file", "/nonexistent"}, "representation layer"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, tc.args...)
			if code == 0 || !strings.Contains(lastLine(errOut), tc.want) {
				t.Fatalf("exit %d, last stderr line %q: want a refusal naming %q", code, lastLine(errOut), tc.want)
			}
		})
	}
	for _, algo := range []string{"moon", "fedsiam-da"} {
		t.Run("demo "+algo, func(t *testing.T) {
			code, out, errOut := runCLI(t, "demo", "--algorithm", algo, "--model", "mlp", "--hidden", "6", "--clients", "3",
				"--rounds", "2", "--solver", "sgd", "--max-epochs", "1", "--mu", "0.5", "--metrics-addr", "")
			if code != 0 || !strings.Contains(out, "done: 2 rounds") {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
		})
	}
}
