package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDPRefusals: what --dp cannot cover stops run, demo and simulate
// before anything starts, with an error that says why (exit 1).
func TestDPRefusals(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "config")
	if err := os.WriteFile(conf, []byte(baseRunConf(dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	run := []string{"run", "--config", conf, "--dp", "central"}
	sim := []string{"simulate", "--dataset", "synthetic:1,1", "--clients", "10", "--per-round", "2", "--rounds", "2", "--out", dir,
		"--algo", "fedprox", "--dp", "central"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"run distributed", []string{"run", "--config", conf, "--dp", "distributed", "--dp-noise", "1"}, "secure aggregation"},
		{"run unknown mode", []string{"run", "--config", conf, "--dp", "local", "--dp-noise", "1"}, "unknown mode"},
		{"run without noise", run, "--dp-noise"},
		{"run fedsplit robust step", append(run, "--dp-noise", "1", "--algorithm", "fedsplit", "--aggregator", "fedsplit-robust:mult=3"), "needs each site's z_j"},
		{"run median", append(run, "--dp-noise", "1", "--aggregator", "median"), "aggregator \"median\""},
		{"run loss selection", append(run, "--dp-noise", "1", "--selector", "loss"), "selector \"loss\""},
		{"run anchor gradients", append(run, "--dp-noise", "1", "--anchor-sketch", "0"), "anchor gradient"},
		{"run bad delta", append(run, "--dp-noise", "1", "--dp-delta", "2"), "delta"},
		{"run rollback", append(run, "--dp-noise", "1", "--rollback", "1"), "--rollback with --dp"},
		{"simulate fedsplit robust step", append(sim[:len(sim)-4:len(sim)-4], "--algo", "fedproxsplit:mult=3", "--dp", "central", "--dp-noise", "1"), "needs each site's z_j"},
		{"simulate budget below one round", append(sim, "--dp-noise", "1", "--dp-epsilon", "0.01"), "even one round"},
		{"simulate adaptive clip bit noise too small", append(sim, "--dp-noise", "1", "--dp-clip-quantile", "0.5", "--dp-clip-bit-noise", "0.1"), "clip-bit noise"},
		{"run adaptive quantile out of range", append(run, "--dp-noise", "1", "--dp-clip-quantile", "1.5"), "quantile"},
		{"simulate budget too small to calibrate", append(sim, "--dp-epsilon", "1e-9"), "too small"},
		{"demo schema", []string{"demo", "--dp", "central", "--dp-noise", "1", "--schema", "x.json"}, "--schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tt.args...)
			if code != 1 || !strings.Contains(lastLine(stderr), tt.want) {
				t.Fatalf("exit %d, %q; want 1 and an error containing %q", code, lastLine(stderr), tt.want)
			}
		})
	}
}
