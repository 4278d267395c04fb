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

// TestSimulateDivergedClientAsTheDaemons: a client whose solve diverges
// does what a site does (package round): it takes no step and sends the
// received model (FedProx family) or its z_j (FedSplit) back, counted as a
// participant, and the run goes on; it does not end the simulation.
func TestSimulateDivergedClientAsTheDaemons(t *testing.T) {
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "simulate", "--algo", "fedprox,fedproxsplit", "--solver", "sgd", "--lr", "1e9",
		"--clients", "4", "--per-round", "4", "--rounds", "3", "--optimum-evals", "50", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	res, err := sim.ReadResults(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Runs {
		for _, row := range r.Rounds[1:] { // round 0 is the initial model
			if row.Participants != 4 || row.TrainLoss != r.Rounds[0].TrainLoss {
				t.Errorf("%s round %d: %d participants, train loss %v; want 4 and the initial model's %v kept",
					r.Algo, row.Round, row.Participants, row.TrainLoss, r.Rounds[0].TrainLoss)
			}
		}
	}
}
