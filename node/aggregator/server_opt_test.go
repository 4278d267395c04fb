package aggregator

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/proto/wire"
)

// The server optimiser's state (its step count and moments) is kept with
// each checkpoint: an aggregator stopped before round 3 and started again
// on its state file computes round 3 exactly as one that ran through, for
// every optimiser; and round 3 does depend on the state (a fresh one
// steps elsewhere), so the comparison shows something.
func TestServerRestartKeepsServerOptState(t *testing.T) {
	sends := map[uint64][2][]float64{1: {vec(1), vec(3)}, 2: {vec(2), vec(-1)}, 3: {vec(5), vec(2)}}
	for _, p := range []serveropt.Params{
		serveropt.Defaults(serveropt.AvgM),
		{Kind: serveropt.Adagrad, LR: 0.1, Beta1: 0.9, Tau: 1e-3},
		{Kind: serveropt.Adam, LR: 0.1, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3},
		{Kind: serveropt.Yogi, LR: 0.1, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3},
	} {
		t.Run(string(p.Kind), func(t *testing.T) {
			run := func(restart bool) (x2, final []float64) {
				f := newFixture(t)
				cfg := f.config()
				cfg.K, cfg.Rounds, cfg.Algorithm, cfg.ServerOpt = 2, 3, AlgoFedProx, p
				r := f.start(cfg)
				a, b := f.agent("site-a", 10), f.agent("site-b", 10)
				for round := uint64(1); round <= 3; round++ {
					if restart && round == 3 {
						r.stop(t)
						r = f.start(cfg)
					}
					a.nextRound(t, round)
					b.nextRound(t, round)
					a.send(t, update(t, "site-a", round, sends[round][0], 10))
					b.send(t, update(t, "site-b", round, sends[round][1], 10))
					for _, ag := range []*fakeAgent{a, b} {
						rc := ag.receipt(t)
						for rc.Round < round { // a redelivery across the restart
							rc = ag.receipt(t)
						}
						wantReceipt(t, rc, round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
					}
					rr := r.round(t)
					if round == 2 {
						x2 = rr.Global
					}
					final = rr.Global
				}
				st, err := r.s.LiveStatus(0, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(st.ServerOpt, string(p.Kind)+":") {
					t.Errorf("status names server optimiser %q, want %s", st.ServerOpt, p)
				}
				return x2, final
			}
			x2, straight := run(false)
			_, restarted := run(true)
			if !slices.Equal(straight, restarted) {
				t.Fatalf("round 3 after a restart\n%v\nwithout one\n%v", restarted, straight)
			}
			// Round 3's update with a fresh state: another model.
			mean := make([]float64, len(x2))
			for i := range mean {
				mean[i] = (sends[3][0][i] + sends[3][1][i]) / 2
			}
			var fresh serveropt.State
			out := make([]float64, len(x2))
			if err := serveropt.Step(p, &fresh, x2, mean, out); err != nil {
				t.Fatal(err)
			}
			if slices.Equal(f32s(out), straight) {
				t.Fatal("round 3 does not depend on the optimiser's state: the test shows nothing")
			}
		})
	}
}

// An optimiser is refused where the server step is not a mean of deltas
// (the FedSplit family, under secure aggregation too) and with parameters
// out of range, naming the reason; FedProx under secure aggregation takes
// it.
func TestServerOptRefused(t *testing.T) {
	f := newFixture(t)
	adam := serveropt.Defaults(serveropt.Adam)
	for _, tc := range []struct {
		name string
		mod  func(*ServerConfig)
		want string
	}{
		{"fedsplit", func(c *ServerConfig) { c.Algorithm, c.Params.Step = AlgoFedSplit, 1 }, "not a mean of deltas"},
		{"fedproxsplit", func(c *ServerConfig) { c.Algorithm, c.Params.Step = AlgoFedProxSplit, 1 }, "not a mean of deltas"},
		// Under --secagg FedProx:FedSplit runs in sum mode: still
		// FedSplit's step.
		{"secagg fedproxsplit", func(c *ServerConfig) {
			c.Algorithm, c.Params.Step, c.SecAgg = AlgoFedProxSplit, 1, &SecAggConfig{Clip: 1}
		}, "not a mean of deltas"},
		{"beta1 1", func(c *ServerConfig) { c.ServerOpt.Beta1 = 1 }, "beta1"},
		{"tau 0", func(c *ServerConfig) { c.ServerOpt.Tau = 0 }, "tau"},
		{"unknown", func(c *ServerConfig) { c.ServerOpt.Kind = "lamb" }, "lamb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config()
			cfg.ServerOpt = adam
			tc.mod(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
	cfg := f.config()
	cfg.ServerOpt = adam
	if err := cfg.Validate(); err != nil {
		t.Fatalf("fedavg with adam refused: %v", err)
	}
	// FedProx under --secagg: the optimiser steps on the secure sum's
	// uniform mean (TestSimMatchesLive/secagg/server-opt runs it).
	cfg.Algorithm, cfg.SecAgg = AlgoFedProx, &SecAggConfig{Clip: 1}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("fedprox with adam and --secagg refused: %v", err)
	}
}

// A bundle's provenance names the optimiser with its parameters; without
// one it says nothing of it.
func TestBundleParamsNameServerOpt(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		opt  serveropt.Params
		want string
	}{
		{serveropt.Params{Kind: serveropt.Yogi, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}, "yogi:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001"},
		{serveropt.Params{}, ""},
	} {
		cfg := f.config()
		cfg.StatePath = t.TempDir() + "/state.db"
		cfg.ServerOpt = tc.opt
		s, err := NewServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := s.bundleParams()["server_opt"]
		s.Close()
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%v: provenance server_opt %q (present %v), want %q", tc.opt.Kind, got, ok, tc.want)
		}
	}
}
