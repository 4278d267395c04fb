package sim

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/sim/localfed"
	"github.com/edgefl/edgefl/testkit"
)

// TestSimMatchesLive runs the same federation twice: in `simulate`, and live
// over MQTT (the embedded broker with its ACL, the real aggregator.Server and
// one real agent.Agent per client, each with its client's training data), for
// FedProx:FedSplit and FedProx over the lossless fp32 codec and two lossy
// ones. Every round, each
// site's update (kind, base round and frame bytes, read back from the
// aggregator's round log) is byte for byte the frame simulate's client sent,
// and the next global model (reported and checkpointed) is bit for bit
// simulate's: the copies of z_j and the error-feedback residuals agree across
// rounds. The solve is L-BFGS and the codecs draw nothing, so both runs are
// deterministic; stochastic draws (SGD order, qsgd) come from run streams in
// simulate and site streams at a site (internal/streams) and agree only in
// distribution.
func TestSimMatchesLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	for _, algo := range []string{FedProxSplit, FedProx} {
		// fp32: a lossless codec keeps no residual (simulate kept one of
		// float32 rounding errors until it used package uplink).
		for _, codec := range []string{"fp32", "topk:0.2+q8", "dct:6x10x10+topk:0.3+q4+ac"} {
			t.Run(algo+"/"+codec, func(t *testing.T) { testSimMatchesLive(t, algo, codec, nil) })
		}
	}
	// FedAvg's sample cap (no site counts for more than 3 x the other
	// sites' median, on by default): one of these four sites has 321
	// samples against the others' median of 65, so the cap counts it for
	// 195 every round, in simulate and in the daemon alike.
	t.Run(FedAvg+"/fp32", func(t *testing.T) { testSimMatchesLive(t, FedAvg, "fp32", nil) })
	// SCAFFOLD (proto/uplink/scaffold.go): mini-batch SGD shifted by
	// c - c_i (simulate draws each site's SGD order from the agent's own
	// stream), delta c for the steps taken (the gamma target stops some
	// solves early), c_i in each site's state file, c in the aggregator's
	// checkpoint: the same frames, control deltas and models bit for bit,
	// with a lossy codec, and across a restart of the whole federation
	// after round 1 (c_i and c come back from the state files).
	for i, codec := range []string{"fp32", "topk:0.2+q8"} {
		t.Run(Scaffold+"/"+codec, func(t *testing.T) { testSimMatchesLive(t, Scaffold, codec, nil, i) })
	}
	// Central DP (docs/privacy.md): the clip at the sites, the re-clip
	// and the noisy mean at the aggregator, with simulate's noise key
	// (--dp-noise-seed) given to the aggregator, give the same frames and
	// the same noised global models, bit for bit; with error feedback too,
	// and across a restart of the whole federation after round 1 (the
	// accountant, the noise key and the sites' residuals come back from
	// their state files).
	for i, codec := range []string{"fp32", "topk:0.2+q8"} {
		t.Run("dp/"+FedProx+"/"+codec, func(t *testing.T) {
			testSimMatchesLive(t, FedProx, codec, &dp.Config{Clip: 0.3, Noise: 0.8, Delta: 1e-5}, i)
		})
	}
	// Secure aggregation (docs/privacy.md): the sites' quantised inputs
	// are simulate's byte for byte (their stochastic rounding drawn from
	// the run's streams in both), the next global model is bit for bit
	// simulate's uniform mean of the sum, neither the aggregator's state
	// file nor the daemons' log holds one site's input; also across a
	// restart of the whole federation after round 1 (secagg_live_test.go).
	for _, restart := range []int{0, 1} {
		t.Run(fmt.Sprintf("secagg/%s/restart=%d", FedProx, restart), func(t *testing.T) { testSimMatchesLiveSecAgg(t, FedProx, restart, nil, false) })
	}
	// FedProx:FedSplit under secure aggregation runs in sum mode
	// (docs/privacy.md, "FedSplit under secure aggregation"): each site's
	// quantised delta against its own record (joins in round 1, against x
	// on the grid), S and m at the aggregator, the records advanced on the
	// rounds' UPDATE receipts; across a restart, and with distributed DP.
	t.Run("secagg/"+FedProxSplit+"/restart=1", func(t *testing.T) { testSimMatchesLiveSecAgg(t, FedProxSplit, 1, nil, false) })
	// Distributed DP under secure aggregation (docs/privacy.md "Threat
	// models"): each site's clipped update plus its noise share, from the
	// same per-site keys in both, then the same sum: the same models bit
	// for bit and the same epsilons every round.
	for _, algo := range []string{FedProx, FedProxSplit} {
		t.Run("secagg/dp-distributed/"+algo, func(t *testing.T) {
			testSimMatchesLiveSecAgg(t, algo, 1, &dp.Config{Clip: 0.3, Noise: 0.8, Delta: 1e-5, Distributed: true, Colluders: 1}, false)
		})
	}
	// Server optimisers under secure aggregation: the optimiser steps on
	// the uniform mean of the secure sum (with distributed DP, its noise
	// included), post-processing of what the aggregator learns anyway;
	// the moments come back from the checkpoint across the restart.
	t.Run("secagg/server-opt/adam/"+FedProx+"/restart=1", func(t *testing.T) {
		testSimMatchesLiveSecAggOpt(t, FedProx, 1, nil, false, serveropt.Params{Kind: serveropt.Adam, LR: 0.05, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3})
	})
	t.Run("secagg/dp-distributed/server-opt/yogi/"+FedProx, func(t *testing.T) {
		testSimMatchesLiveSecAggOpt(t, FedProx, 1, &dp.Config{Clip: 0.3, Noise: 0.8, Delta: 1e-5, Distributed: true, Colluders: 1}, false,
			serveropt.Params{Kind: serveropt.Yogi, LR: 0.05, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3})
	})
	// Signed secure aggregation (docs/privacy.md, "Threat model per
	// mode"): every site signs its keys with its certificate and checks
	// every key of the KeyList against the federation CA; nothing is
	// forged, so the sums, and the models, are simulate's bit for bit.
	t.Run("secagg/signed/"+FedProx+"/restart=1", func(t *testing.T) { testSimMatchesLiveSecAgg(t, FedProx, 1, nil, true) })
	// FedProx:FedSplit under DP runs in sum mode (docs/privacy.md,
	// "FedSplit"): the sites' deltas against their own records (joins in
	// round 1), the aggregator's S and m; the records advance on the
	// receipts live and after each round in simulate, and S and m come
	// back from the state file after the restart.
	for i, codec := range []string{"fp32", "q8"} {
		t.Run("dp/"+FedProxSplit+"/"+codec, func(t *testing.T) {
			testSimMatchesLive(t, FedProxSplit, codec, &dp.Config{Clip: 0.3, Noise: 0.8, Delta: 1e-5}, i)
		})
	}
	// Adaptive clipping: the clip bits on the wire, the noised bit sum and
	// the next clip norm at the aggregator (stored with the checkpoint,
	// so it survives the restart), for both families.
	for _, algo := range []string{FedProx, FedProxSplit} {
		t.Run("dp-adaptive/"+algo, func(t *testing.T) {
			testSimMatchesLive(t, algo, "fp32", &dp.Config{Clip: 0.3, Noise: 0.8, Delta: 1e-5,
				Adaptive: &dp.Adaptive{Quantile: 0.5, LR: 0.2, BitNoise: 0.5}}, 1)
		})
	}
	// Server optimisers (docs/aggregators.md, "Server optimisers"): the
	// aggregate's step through FedAdam, FedYogi, FedAvgM and SCAFFOLD's
	// global learning rate, with a lossy codec and under central DP (the
	// optimiser steps on the noisy mean), and across a restart after
	// round 1: the moments come back from the checkpoint, so rounds 2 and
	// 3 are simulate's bit for bit too.
	for _, tc := range []struct {
		algo, codec string
		opt         serveropt.Params
		private     *dp.Config
	}{
		{FedAvg, "topk:0.2+q8", serveropt.Params{Kind: serveropt.Adam, LR: 0.05, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}, nil},
		{FedProx, "fp32", serveropt.Params{Kind: serveropt.AvgM, LR: 1, Beta1: 0.9}, nil},
		{FedProx, "fp32", serveropt.Params{Kind: serveropt.Yogi, LR: 0.05, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}, &dp.Config{Clip: 0.3, Noise: 0.8, Delta: 1e-5}},
		// SCAFFOLD's global learning rate eta_g (x += eta_g mean(delta y))
		// is the sgd step; c moves as without it.
		{Scaffold, "topk:0.2+q8", serveropt.Params{Kind: serveropt.SGD, LR: 0.5}, nil},
	} {
		name := "server-opt/" + string(tc.opt.Kind) + "/" + tc.algo + "/" + tc.codec
		if tc.private != nil {
			name += "/dp"
		}
		t.Run(name, func(t *testing.T) { testSimMatchesLiveOpt(t, tc.algo, tc.codec, tc.private, tc.opt, 1) })
	}
	// Poisson sampling (--dp's default selector, docs/privacy.md "Sampling
	// rate"): each site in a round with probability 0.5, from the secret
	// selection key (simulate: derived from --dp-noise-seed, the daemon:
	// the same key as a test hook), so rounds of every size, an empty one
	// included, over the fixed denominator q*N; simulate and the daemons
	// draw the same sites (the live announcements name nobody: the sites
	// learn of it by invitation) and release the same noised models.
	// The same draws for FedProx:FedSplit's sum mode: the roster of 4 is
	// counted from round 1, sites start at x_0 whatever round they are
	// first drawn in, and the empty round is noised like any other.
	for _, algo := range []string{FedProx, FedProxSplit} {
		t.Run("dp/poisson/"+algo+"/fp32", func(t *testing.T) {
			testSimMatchesLive(t, algo, "fp32", &dp.Config{Clip: 0.3, Noise: 0.8, Delta: 1e-5}, 2)
		})
	}
	// The contrastive local objectives (MOON; FedSiam-DA with its
	// prediction head and dual aggregation) over an MLP: each site's solve
	// against the global model and its previous local model, which it
	// commits with its update; across a restart of the whole federation
	// after round 1 (the sites' previous models come back from their state
	// files), with a lossy codec (the previous model is the site's exact
	// w, not what the aggregator decoded).
	for _, algo := range []string{model.AlgoMOON, model.AlgoFedSiamDA} {
		for i, codec := range []string{"fp32", "topk:0.2+q8"} {
			t.Run(algo+"/"+codec, func(t *testing.T) { testSimMatchesLive(t, algo, codec, nil, i) })
		}
	}
}

// testSimMatchesLive compares simulate with a live federation (private: under
// DP; restartAfter > 0: the live federation is stopped once round
// restartAfter is aggregated and started again on its state files).
func testSimMatchesLive(t *testing.T, algo, codec string, private *dp.Config, restartAfter ...int) {
	testSimMatchesLiveOpt(t, algo, codec, private, serveropt.Params{}, restartAfter...)
}

// testSimMatchesLiveOpt is testSimMatchesLive with the server optimiser
// opt in both runs.
func testSimMatchesLiveOpt(t *testing.T, algo, codec string, private *dp.Config, opt serveropt.Params, restartAfter ...int) {
	cfg := DefaultConfig()
	cfg.ServerOpt = opt
	cfg.Dataset, cfg.Partition, cfg.Clients, cfg.PerRound, cfg.Rounds, cfg.Seed = "synthetic:1,1", "natural", 4, 4, 3, 5
	cfg.L2, cfg.Codec, cfg.Downlink, cfg.Workers, cfg.OptimumEvals = 0.01, codec, "fp32", 2, 300
	local := Local{Solver: proxsolver.LBFGS, Mu: 1, Gamma: 1e-6, MaxEpochs: 3, Batch: 10, LR: 0.01, Step: 10, Relax: 1}
	agg := split.StepRobust
	switch algo {
	case FedProx:
		agg = "mean"
	case FedAvg:
		agg, local.Mu = "fedavg", 0
	case Scaffold:
		agg, local.Mu, local.Solver, local.Gamma, local.LR = "mean", 0, proxsolver.SGD, 0.4, 0.05
		seed := uint64(1) // localfed's agents: Seed + i
		cfg.siteSeed = &seed
	}
	cfg.Algos = []Algo{{Label: algo, Family: algo, Agg: agg, Local: local}}
	mspec := model.Spec{Kind: model.KindLogReg, L2: cfg.L2}
	contrast := model.ContrastKindOf(algo) != ""
	if contrast {
		// ParseAlgos's entry for the name; an MLP drawn from the
		// daemon's --init model stream.
		a, err := ParseAlgos(algo, local, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Algos, local = a, a[0].Local
		cfg.Model, cfg.Hidden, cfg.Activation = model.KindMLP, 6, model.ActivationReLU
		if algo == model.AlgoFedSiamDA {
			// Mini-batch SGD: the solver whose steps alternate with the
			// copy of the global model's (the paper's eq. 8); L-BFGS
			// would leave the copy at the global model.
			cfg.Activation = model.ActivationTanh
			local.Solver, local.Gamma, local.LR, local.Batch = proxsolver.SGD, 0, 0.05, 4
			cfg.Algos[0].Local = local
			seed := uint64(1) // localfed's agents: Seed + i
			cfg.siteSeed = &seed
		}
		cfg.initModel = func(m model.Model) []float64 { return m.InitParams(streams.ModelInit(cfg.Seed)) }
	}
	var key, selKey *[32]byte
	poisson := private != nil && len(restartAfter) > 0 && restartAfter[0] == 2
	if private != nil {
		cfg.DP, cfg.DPNoiseSeed = private, 7
		k, sk := dp.TestKey(cfg.DPNoiseSeed), dp.TestSelectionKey(cfg.DPNoiseSeed)
		cfg.Select = "poisson:q=1" // every site every round: K = N
		if poisson {
			// The daemons close these rounds early (no fixed-length
			// rounds on a fake clock), so they charge every round at
			// q = 1 (dp.Config.EarlyClose), and simulate is told to.
			early := *private
			early.EarlyClose = true
			private, cfg.DP = &early, &early
			// 6 rounds so that the draws over 4 sites vary; the key of
			// seed 11 makes them 1, 0, 4, 1, 4, 3 sites (checked below):
			// the restart follows the empty round.
			cfg.Select, cfg.Rounds, cfg.DPNoiseSeed = "poisson:q=0.5", 6, 11
			k, sk = dp.TestKey(cfg.DPNoiseSeed), dp.TestSelectionKey(cfg.DPNoiseSeed)
		}
		key, selKey = &k, &sk
	}
	rounds := cfg.Rounds

	// simulate, recording every round's frames and next global model.
	simFrames := map[int]map[string]*uplink.Frame{}
	simGlobal := map[int][]float64{}
	var simRounds []Round
	cfg.trace = func(_ string, round int, frames map[string]*uplink.Frame, x []float64) {
		simFrames[round], simGlobal[round] = frames, slices.Clone(x)
	}
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	simRounds = res.Runs[0].Rounds
	fed, _, err := loadFederation(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if algo == FedAvg { // the test is of the cap: it must act
		var ups []aggregate.Update
		for _, c := range fed.Clients {
			ups = append(ups, aggregate.Update{Client: c.ID, Samples: c.Train.N})
		}
		if _, capped := aggregate.CapSamples(ups, aggregate.DefaultFedAvgCap); len(capped) == 0 {
			t.Fatalf("no site's count is capped: %+v", ups)
		} else {
			t.Logf("capped: %+v", capped)
		}
	}

	mspec.Inputs, mspec.Classes = fed.D, fed.Classes
	if contrast {
		mspec.Kind, mspec.Hidden, mspec.Activation = model.KindMLP, cfg.Hidden, cfg.Activation
	}
	// The same federation live.
	// The daemons log to a buffer (safe from their goroutines, even after
	// the test), shown when the test fails.
	log, _ := testkit.FailureLog(t, "the live federation")
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	liveGlobal := map[int][]float64{}
	sites := make([]localfed.Site, len(fed.Clients))
	for i, c := range fed.Clients {
		data := c.Train
		sites[i] = localfed.Site{ID: c.ID, Data: &data}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	waitCtx, stopFirst := context.WithCancel(ctx)
	defer stopFirst()
	restart := 0
	if len(restartAfter) > 0 {
		restart = restartAfter[0]
	}
	liveSelected := map[int][]string{}
	srvCfg := aggregator.ServerConfig{
		K: len(fed.Clients), QuorumFraction: 1, RoundTimeout: 10 * time.Minute, Rounds: rounds, Seed: cfg.Seed,
		Algorithm: algo,
		Params: aggregator.Params{Solver: local.Solver, Gamma: local.Gamma, MaxEpochs: local.MaxEpochs,
			Step: local.Step, Relax: local.Relax, Mu: local.Mu, Tau: local.Tau},
		Model:     mspec,
		ServerOpt: opt,
		Codec:     codec, Downlink: cfg.Downlink, PrivacyConfig: aggregator.PrivacyConfig{DP: private, DPTestKey: key, DPTestSelectionKey: selKey}, Selector: cfg.Select,
		Clock: clock.NewFake(t0), Logger: log.With("party", "aggregator"),
		OnRound: func(rr aggregator.RoundReport) {
			mu.Lock()
			defer mu.Unlock()
			liveGlobal[rr.Round] = slices.Clone(rr.Global)
			liveSelected[rr.Round] = append(slices.Clone(rr.Contributors), rr.Stragglers...)
			if rr.Round == restart {
				stopFirst()
			}
		},
	}
	if algo == Scaffold || algo == model.AlgoFedSiamDA {
		srvCfg.Params.LR, srvCfg.Params.Batch = local.LR, local.Batch
	}
	if contrast {
		srvCfg.Init, srvCfg.InitSeed = aggregator.InitModel, cfg.Seed
	}
	start := func() *localfed.Federation {
		lf, err := localfed.Start(ctx, localfed.Config{Federation: "simlive", Dir: dir, Sites: sites, Seed: 1,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
			NewClock: func() clock.Clock { return clock.NewFake(t0) }, Logger: log, Server: srvCfg})
		if err != nil {
			t.Fatal(err)
		}
		return lf
	}
	lf := start()
	if restart > 0 {
		if lf.Wait(waitCtx) {
			t.Fatalf("finished before the restart after round %d", restart)
		}
		if err := lf.Stop(); err != nil {
			t.Logf("stopping the federation for the restart: %v", err)
		}
		lf = start()
		t.Logf("the federation was stopped after round %d and started again", restart)
	}
	finished := lf.Wait(ctx)
	if err := lf.Stop(); err != nil {
		t.Error(err)
	}
	if !finished {
		t.Fatal("the live federation did not finish")
	}
	state := lf.StatePath

	// The aggregator's round log against simulate.
	store, err := aggstore.OpenAgg(state, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var sizes []int
	for r := 1; r <= rounds; r++ {
		n := 0
		err := store.ForEachUpdate(uint64(r), func(u aggstore.Update) error {
			n++
			m, err := wire.DecodeUpdate(u.Msg, wire.Limits{})
			if err != nil {
				return err
			}
			want := simFrames[r][u.ClientID]
			switch {
			case want == nil:
				t.Errorf("round %d: %s sent an update live, none in simulate", r, u.ClientID)
			case m.Kind != want.Kind || m.BaseRound != want.BaseRound:
				t.Errorf("round %d, %s: live %v against round %d, simulate %v against round %d", r, u.ClientID, m.Kind, m.BaseRound, want.Kind, want.BaseRound)
			case (algo == Scaffold) != (m.ControlDelta != nil):
				t.Errorf("round %d, %s: control delta %v under %s", r, u.ClientID, m.ControlDelta != nil, algo)
			case !bytes.Equal(m.Vector.Payload, want.Payload):
				t.Errorf("round %d, %s: the live frame (%d bytes) is not simulate's (%d bytes)", r, u.ClientID, len(m.Vector.Payload), len(want.Payload))
			case private != nil && private.Adaptive != nil && (m.ClipBit == 1) == want.Clipped.Clipped:
				t.Errorf("round %d, %s: clip bit %d, simulate's update was clipped: %v", r, u.ClientID, m.ClipBit, want.Clipped.Clipped)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := len(fed.Clients)
		if poisson {
			want = len(simFrames[r])
			mu.Lock()
			if sel := liveSelected[r]; len(sel) != want {
				t.Errorf("round %d: the aggregator selected %v, simulate %d sites", r, sel, want)
			}
			mu.Unlock()
			sizes = append(sizes, want)
		}
		if n != want || len(simFrames[r]) != want {
			t.Errorf("round %d: %d updates live, %d in simulate, want %d", r, n, len(simFrames[r]), want)
		}
		if f0 := simFrames[r][fed.Clients[0].ID]; f0 != nil && algo == FedProxSplit { // nil: not drawn (poisson)
			// Drawn every round, a site's base is the previous round; by
			// Poisson, the last round it was drawn in (0: its first).
			if r > 1 && (!poisson && f0.BaseRound != uint64(r-1) || f0.BaseRound >= uint64(r)) {
				t.Errorf("round %d: deltas are not against the copy of round %d", r, r-1)
			}
			if private != nil && f0.Kind != wire.UpdateKind_UPDATE_KIND_SUM_DELTA {
				t.Errorf("round %d: FedSplit under DP sent %v, want sum-mode deltas", r, f0.Kind)
			}
		}
		mu.Lock()
		live := liveGlobal[r]
		mu.Unlock()
		if !bitsEqual(live, simGlobal[r]) {
			t.Errorf("round %d: the live global model differs from simulate's (max |diff| %g)", r, maxDiff(live, simGlobal[r]))
		}
		ck, err := store.Checkpoint(uint64(r + 1))
		if err != nil || !bitsEqual(ck, live) {
			t.Errorf("round %d: the checkpoint is not the reported global model: %v", r, err)
		}
	}
	if maxDiff(simGlobal[rounds], simGlobal[1]) == 0 {
		t.Error("the global model did not move: the comparison proves nothing")
	}
	if private != nil && private.Adaptive != nil && simRounds[rounds].Clip == simRounds[1].Clip {
		t.Errorf("adaptive clipping kept the clip norm at %v: the comparison proves nothing", simRounds[1].Clip)
	}
	if zs, err := store.LatestZ(); err != nil || (private != nil && len(zs) > 0) {
		t.Errorf("under DP the aggregator kept %d per-site z (%v)", len(zs), err)
	}
	if poisson && !slices.Equal(sizes, []int{1, 0, 4, 1, 4, 3}) {
		t.Errorf("round sizes %v: the selection key no longer gives the rounds this test was written for (an empty one, a partial one)", sizes)
	}
	if private != nil {
		store.Close()
		srvCfg.Federation, srvCfg.BrokerURL, srvCfg.StatePath, srvCfg.OnRound = "simlive", "tcp://127.0.0.1:1", state, nil
		checkPrivacyRestored(t, srvCfg, rounds, res.Runs[0].DP)
	}
}

// checkPrivacyRestored: the accountant is in the state file (bbolt): the
// status read from it, and an aggregator reopened on it, report the
// epsilon of the rounds run, and the unamplified per-site epsilon,
// simulate's figures; reopening with another DP setting is refused.
func checkPrivacyRestored(t *testing.T, cfg aggregator.ServerConfig, rounds int, sim *DPRun) {
	t.Helper()
	c := cfg.DP
	want := float64(sim.Epsilon)
	if cfg.Selector == "uniform" && math.Abs(want-dp.EpsilonAfter(1, c.Noise, rounds, c.Delta, nil)) > 1e-9*want {
		t.Errorf("simulate's epsilon %v is not that of %d rounds at q = 1", want, rounds)
	}
	wantSite := float64(sim.EpsilonUnamplified)
	store, err := aggstore.OpenAgg(cfg.StatePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := aggregator.ReadStatus(store)
	store.Close()
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Privacy; p == nil || p.Rounds != uint64(rounds) || math.Abs(p.Epsilon-want) > 1e-9*want ||
		math.Abs(p.EpsilonUnamplified-wantSite) > 1e-9*wantSite || p.SiteRounds != uint64(sim.MaxSiteRounds) {
		t.Fatalf("status from the state file: privacy %+v, want epsilon %v after %d rounds, unamplified %v over %d rounds",
			st.Privacy, want, rounds, wantSite, sim.MaxSiteRounds)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv, err := aggregator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := srv.Watch()
	srv.Close()
	if p := v.Privacy; p == nil || p.Rounds != uint64(rounds) || p.Epsilon != st.Privacy.Epsilon || math.Abs(p.EpsilonUnamplified-wantSite) > 1e-9*wantSite {
		t.Fatalf("reopened aggregator: privacy %+v, want %+v", v.Privacy, st.Privacy)
	}
	other := *c
	other.Noise *= 2
	if a := other.Adaptive; a != nil {
		b := *a
		b.BitNoise *= 2 // still enough for the doubled noise
		other.Adaptive = &b
	}
	cfg.DP = &other
	if srv, err := aggregator.NewServer(cfg); err == nil || !strings.Contains(err.Error(), "--dp") {
		if err == nil {
			srv.Close()
		}
		t.Fatalf("reopened with another noise multiplier: %v, want a refusal naming --dp", err)
	}
}

func bitsEqual(a, b []float64) bool {
	return len(a) > 0 && slices.EqualFunc(a, b, func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) })
}

func maxDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(a[i]-b[i]))
	}
	return m
}
