package main

import (
	"path/filepath"
	"testing"

	"github.com/edgefl/edgefl/sim"
)

// TestSimulateFedSplitIsExact: simulate's fedsplit is the exact reference
// its help promises: without --gamma its prox is solved to
// round.SimulateSplitGamma, so on a strongly convex problem it reaches
// the centralised optimum; --gamma (or gamma=) still sets it, and the
// budgeted families keep --gamma's default.
func TestSimulateFedSplitIsExact(t *testing.T) {
	base := []string{"simulate", "--clients", "5", "--per-round", "5", "--rounds", "60", "--l2", "0.1", "--step", "3"}
	cases := []struct {
		name    string
		args    []string
		gamma   map[string]float64 // by algorithm label
		maxDist float64            // ||x - x*|| after the last round
	}{
		{"default: exact", []string{"--algo", "fedsplit,fedproxsplit"}, map[string]float64{"fedsplit": 1e-9, "fedproxsplit": 1e-3}, 1e-6},
		{"--gamma given", []string{"--algo", "fedsplit", "--gamma", "1e-3"}, map[string]float64{"fedsplit": 1e-3}, 1},
		{"gamma= given", []string{"--algo", "fedsplit:gamma=1e-2"}, map[string]float64{"fedsplit:gamma=1e-2": 1e-2}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			args := append(append(append([]string(nil), base...), c.args...), "--out", out)
			if code, stdout, stderr := runCLI(t, args...); code != 0 {
				t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
			}
			res, err := sim.ReadResults(filepath.Join(out, "results.json"))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res.Runs {
				if want, ok := c.gamma[r.Algo]; !ok || r.Local.Gamma != want {
					t.Errorf("%s: gamma %v, want %v", r.Algo, r.Local.Gamma, want)
				}
				if r.Family != sim.FedSplit {
					continue
				}
				last := r.Rounds[len(r.Rounds)-1]
				if d := float64(last.DistToOpt); !(d <= c.maxDist) {
					t.Errorf("%s: ||x - x*|| = %.3g after %d rounds, want <= %g", r.Algo, d, last.Round, c.maxDist)
				}
			}
		})
	}
}
