package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/testkit"
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
	// A schema that does not declare its preprocessing (its statistics
	// phase is outside the guarantee).
	schemaPath, csvPath := demoCSV(t, dir)
	schemaConf := func(name, schema string) string {
		p := filepath.Join(dir, name+".config")
		if err := os.WriteFile(p, []byte(fmt.Sprintf("federation = f\nstate_file = %s\nmetrics_addr =\nlisten = 127.0.0.1:0\nallow_anonymous = true\nschema = %s\n",
			filepath.Join(dir, name+".db"), schema)), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	declared := filepath.Join(dir, "declared.json")
	testkit.WriteFile(t, declared, demoDeclaredSchemaJSON)
	sim := []string{"simulate", "--dataset", "synthetic:1,1", "--clients", "10", "--per-round", "2", "--rounds", "2", "--out", dir,
		"--algo", "fedprox", "--dp", "central"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"run distributed", []string{"run", "--config", conf, "--dp", "distributed", "--dp-noise", "1"}, "secure aggregation"},
		// Uniform selection draws exactly K without replacement: q = K/N is
		// not an amplification theorem for it.
		{"run central uniform", []string{"run", "--config", conf, "--dp", "central", "--dp-noise", "1", "--selector", "uniform"}, "Poisson sampling only"},
		{"simulate central uniform", append(slices.Clone(sim), "--dp-noise", "1", "--select", "uniform"), "Poisson sampling only"},
		{"run central with secagg", []string{"run", "--config", conf, "--dp", "central", "--dp-noise", "1", "--secagg", "--algorithm", "fedprox"}, "distributed mode is the one"},
		{"run distributed poisson", []string{"run", "--config", conf, "--dp", "distributed", "--dp-noise", "1", "--secagg", "--algorithm", "fedprox", "--selector", "poisson"}, "selects exactly K sites uniformly"},
		{"run distributed adaptive", []string{"run", "--config", conf, "--dp", "distributed", "--dp-noise", "1", "--secagg", "--algorithm", "fedprox", "--dp-clip-quantile", "0.5"}, "adaptive clipping in the distributed mode"},
		{"simulate distributed poisson", append(sim[:len(sim)-2:len(sim)-2], "--dp", "distributed", "--dp-noise", "1", "--secagg", "--select", "poisson"), "selects exactly K sites uniformly"},
		{"run fixed rounds without dp", []string{"run", "--config", conf, "--dp-fixed-rounds"}, "--dp-fixed-rounds needs --dp central"},
		{"run distributed fixed rounds", []string{"run", "--config", conf, "--dp", "distributed", "--dp-noise", "1", "--secagg", "--algorithm", "fedprox", "--dp-fixed-rounds"}, "fixed-length rounds"},
		{"run distributed coarse share", []string{"run", "--config", conf, "--dp", "distributed", "--dp-noise", "0.5", "--dp-clip", "0.1", "--secagg", "--algorithm", "fedprox", "--secagg-scale-bits", "2"}, "grid steps"},
		{"simulate distributed coarse share", append(sim[:len(sim)-2:len(sim)-2], "--dp", "distributed", "--dp-noise", "0.5", "--dp-clip", "0.1", "--secagg", "--secagg-scale-bits", "2"), "grid steps"},
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
		{"run undeclared schema", []string{"run", "--config", schemaConf("undeclared", schemaPath), "--dp", "central", "--dp-noise", "1"}, "does not declare its preprocessing"},
		{"run patience", []string{"run", "--config", schemaConf("declared", declared), "--dp", "central", "--dp-noise", "1", "--stop-patience", "2"}, "patience rule"},
		{"demo undeclared schema", []string{"demo", "--dp", "central", "--dp-noise", "1", "--schema", schemaPath, "--dataset", "csv:" + csvPath,
			"--site-column", "hospital"}, "must declare its preprocessing"},
		{"simulate undeclared schema", []string{"simulate", "--dp", "central", "--dp-noise", "1", "--schema", schemaPath, "--dataset", "csv:" + csvPath,
			"--site-column", "hospital", "--partition", "natural", "--rounds", "1", "--algo", "fedprox", "--out", dir}, "must declare its preprocessing"},
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

// TestSimulateSchemaDPCalibrates: simulate --schema with every site every
// round (--per-round 0) calibrates --dp-noise from --dp-epsilon at q = 1,
// before the CSV says how many sites there are.
// TestDPFixedRoundsDefault: under --dp central, run and demo close rounds
// at their deadline unless --dp-fixed-rounds=false, which makes every
// round charged at q = 1 (the timing then tells the draw's size); simulate
// has no round timing and charges the amplified figure; the distributed
// mode takes the flag's default silently and refuses it given.
func TestDPFixedRoundsDefault(t *testing.T) {
	for _, tc := range []struct {
		name              string
		live              bool
		args              []string
		fixed, early, bad bool
	}{
		{"run central", true, []string{"--dp", "central"}, true, false, false},
		{"run central, flag", true, []string{"--dp", "central", "--dp-fixed-rounds"}, true, false, false},
		{"run central, opted out", true, []string{"--dp", "central", "--dp-fixed-rounds=false"}, false, true, false},
		{"simulate central", false, []string{"--dp", "central"}, false, false, false},
		{"run distributed", true, []string{"--dp", "distributed"}, false, false, false},
		{"run distributed, flag", true, []string{"--dp", "distributed", "--dp-fixed-rounds"}, false, false, true},
		{"run off, flag", true, []string{"--dp-fixed-rounds"}, false, false, true},
		{"run off, opted out", true, []string{"--dp-fixed-rounds=false"}, false, false, false},
	} {
		var d dpFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		d.register(fs, false, tc.live)
		if err := fs.Parse(append(tc.args, "--dp-noise", "1")); err != nil {
			t.Fatal(err)
		}
		c, err := d.config(0.1, 10, 2)
		switch {
		case tc.bad:
			if err == nil {
				t.Errorf("%s: accepted", tc.name)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case c == nil:
		case c.FixedRounds != tc.fixed || c.EarlyClose != tc.early:
			t.Errorf("%s: fixed rounds %v, early close %v; want %v, %v", tc.name, c.FixedRounds, c.EarlyClose, tc.fixed, tc.early)
		case (c.ChargedRate(0.1) == 1) != (tc.early || c.Distributed):
			t.Errorf("%s: a round at q = 0.1 is charged at %v", tc.name, c.ChargedRate(0.1))
		}
	}
}

func TestSimulateSchemaDPCalibrates(t *testing.T) {
	dir := t.TempDir()
	_, csvPath := demoCSV(t, dir)
	declared := filepath.Join(dir, "declared.json")
	testkit.WriteFile(t, declared, demoDeclaredSchemaJSON)
	out := filepath.Join(dir, "out")
	code, stdout, stderr := runCLI(t, "simulate", "--schema", declared, "--dataset", "csv:"+csvPath, "--site-column", "hospital",
		"--partition", "natural", "--rounds", "2", "--algo", "fedprox", "--optimum-evals", "1", "--dp", "central", "--dp-epsilon", "8", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	raw, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Runs []struct {
			DP struct {
				Epsilon, Noise, SamplingRate float64
			}
		}
	}
	if err := json.Unmarshal(bytes.ReplaceAll(bytes.ReplaceAll(raw, []byte(`"noise_multiplier"`), []byte(`"Noise"`)), []byte(`"sampling_rate"`), []byte(`"SamplingRate"`)), &res); err != nil {
		t.Fatal(err)
	}
	z, _ := dp.CalibrateNoise(8, 1e-5, 1, 2, 1e-3, nil)
	if len(res.Runs) != 1 || res.Runs[0].DP.Noise != z || res.Runs[0].DP.SamplingRate != 1 || !(res.Runs[0].DP.Epsilon <= 8) {
		t.Fatalf("dp %+v, want z %v at q = 1", res.Runs, z)
	}
}
