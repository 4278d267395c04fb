package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/agent"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/sim/localfed"
	"github.com/edgefl/edgefl/testkit"
	"github.com/edgefl/edgefl/testkit/secaggid"
)

// testSimMatchesLiveSecAgg is TestSimMatchesLive's secure-aggregation case
// for algo (FedProx, or FedProxSplit in sum mode; restartAfter > 0: the
// live federation is stopped once that round is aggregated and started
// again on its state files).
func testSimMatchesLiveSecAgg(t *testing.T, algo string, restartAfter int, private *dp.Config, signed bool) {
	testSimMatchesLiveSecAggOpt(t, algo, restartAfter, private, signed, serveropt.Params{})
}

// testSimMatchesLiveSecAggOpt is testSimMatchesLiveSecAgg with the server
// optimiser opt in both runs (stepping on the secure sum's mean).
func testSimMatchesLiveSecAggOpt(t *testing.T, algo string, restartAfter int, private *dp.Config, signed bool, opt serveropt.Params) {
	const rounds = 3
	cfg := DefaultConfig()
	cfg.ServerOpt = opt
	cfg.Dataset, cfg.Partition, cfg.Clients, cfg.PerRound, cfg.Rounds, cfg.Seed = "synthetic:1,1", "natural", 4, 4, rounds, 5
	cfg.L2, cfg.Codec, cfg.Downlink, cfg.Workers, cfg.OptimumEvals = 0.01, "fp32", "fp32", 2, 300
	local := Local{Solver: proxsolver.LBFGS, Mu: 1, Gamma: 1e-6, MaxEpochs: 3, Batch: 10, LR: 0.01, Step: 10, Relax: 1}
	agg := "mean"
	if algo == FedProxSplit {
		agg = split.StepMean
	}
	cfg.Algos = []Algo{{Label: algo, Family: algo, Agg: agg, Local: local}}
	cfg.SecAgg = &SecAgg{Clip: 0.5}
	cfg.DP, cfg.DPNoiseSeed = private, 9
	// Both sides draw a site's rounding from the run's SecAgg stream of
	// its index (a deployed site: crypto/rand).
	index := map[string]int{}
	rnd := func(idx int, round uint64) io.Reader {
		return streams.Reader(streams.Of(cfg.Seed, streams.SecAgg, int(round), idx))
	}
	cfg.secAggRand = func(_ string, idx, round int) io.Reader { return rnd(idx, uint64(round)) }
	simInputs := map[int]map[string][]uint32{}
	simGlobal := map[int][]float64{}
	cfg.traceSecAgg = func(_ string, round int, in map[string][]uint32) { simInputs[round] = in }
	cfg.trace = func(_ string, round int, _ map[string]*uplink.Frame, x []float64) { simGlobal[round] = slices.Clone(x) }
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	fed, _, err := loadFederation(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}

	log, logs := testkit.FailureLog(t, "the live federation")
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	liveGlobal := map[int][]float64{}
	liveEps := map[int][2]float64{}
	sites := make([]localfed.Site, len(fed.Clients))
	for i, c := range fed.Clients {
		data := c.Train
		sites[i] = localfed.Site{ID: c.ID, Data: &data}
		index[c.ID] = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	waitCtx, stopFirst := context.WithCancel(ctx)
	defer stopFirst()
	srvCfg := aggregator.ServerConfig{
		K: len(fed.Clients), QuorumFraction: 1, RoundTimeout: 10 * time.Minute, Rounds: rounds, Seed: cfg.Seed,
		Algorithm: algo, Aggregator: agg,
		Params: aggregator.Params{Solver: local.Solver, Gamma: local.Gamma, MaxEpochs: local.MaxEpochs, Mu: local.Mu, Step: local.Step, Relax: local.Relax},
		Model:  model.Spec{Kind: model.KindLogReg, Inputs: fed.D, Classes: fed.Classes, L2: cfg.L2},
		Codec:  "fp32", Downlink: cfg.Downlink, ServerOpt: opt,
		SecAgg: &aggregator.SecAggConfig{Clip: cfg.SecAgg.Clip, Timeout: time.Minute}, PrivacyConfig: aggregator.PrivacyConfig{DP: private},
		Clock: clock.NewFake(t0), Logger: log.With("party", "aggregator"),
		OnRound: func(rr aggregator.RoundReport) {
			mu.Lock()
			defer mu.Unlock()
			liveGlobal[rr.Round] = slices.Clone(rr.Global)
			liveEps[rr.Round] = [2]float64{rr.Epsilon, rr.EpsilonUnamplified}
			if rr.Round == restartAfter {
				stopFirst()
			}
		},
	}
	var ident func(string) *uplink.SecAggIdentity
	if signed {
		ids := make([]string, len(fed.Clients))
		for i, c := range fed.Clients {
			ids[i] = c.ID
		}
		ident = secaggid.New(t, t0, ids...).Get
	}
	start := func() *localfed.Federation {
		lf, err := localfed.Start(ctx, localfed.Config{Federation: "simlive", Dir: dir, Sites: sites, Seed: 1,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
			NewClock: func() clock.Clock { return clock.NewFake(t0) }, Logger: log, Server: srvCfg,
			SecAggRand: func(site string, round uint64) io.Reader { return rnd(index[site], round) },
			SecAggNoiseKey: func(site string) *[32]byte {
				k := SiteNoiseKey(cfg, index[site])
				return &k
			},
			SecAggIdentity: ident})
		if err != nil {
			t.Fatal(err)
		}
		return lf
	}
	lf := start()
	if restartAfter > 0 {
		if lf.Wait(waitCtx) {
			t.Fatalf("finished before the restart after round %d", restartAfter)
		}
		if err := lf.Stop(); err != nil {
			t.Logf("stopping the federation for the restart: %v", err)
		}
		lf = start()
	}
	finished := lf.Wait(ctx)
	if err := lf.Stop(); err != nil {
		t.Error(err)
	}
	if !finished {
		t.Fatal("the live federation did not finish")
	}
	if signed {
		as, err := aggstore.OpenAgg(lf.StatePath, storage.Options{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := aggregator.ReadStatus(as)
		as.Close()
		if err != nil {
			t.Fatal(err)
		}
		if sa := st.SecAgg; sa == nil || sa.Model != aggregator.SecAggModelSigned || sa.Aborts != 0 {
			t.Fatalf("status secagg %+v: want the signed model and no abort", sa)
		}
	}

	for r := 1; r <= rounds; r++ {
		mu.Lock()
		live := liveGlobal[r]
		mu.Unlock()
		if len(simInputs[r]) != len(fed.Clients) {
			t.Fatalf("round %d: %d inputs in simulate, want %d", r, len(simInputs[r]), len(fed.Clients))
		}
		if !bitsEqual(live, simGlobal[r]) {
			t.Errorf("round %d: the live global model differs from simulate's (max |diff| %g)", r, maxDiff(live, simGlobal[r]))
		}
		if private != nil {
			mu.Lock()
			eps := liveEps[r]
			mu.Unlock()
			want := [2]float64{-1, -1}
			for _, row := range res.Runs[0].Rounds {
				if row.Round == r {
					want = [2]float64{float64(row.Epsilon), float64(row.EpsilonUnamplified)}
				}
			}
			if eps != want || !(eps[0] > 0) || !(eps[1] > 0) {
				t.Errorf("round %d: epsilon and unamplified epsilon %v live, %v in simulate", r, eps, want)
			}
		}
	}
	if maxDiff(simGlobal[rounds], simGlobal[1]) == 0 {
		t.Error("the global model did not move: the comparison proves nothing")
	}
	if got, want := res.Runs[0].ServerOpt, opt.WithDefaults().String(); opt.On() && got != want {
		t.Errorf("simulate ran server optimiser %q, want %q", got, want)
	}
	// The last round's inputs, as each site stored them, are simulate's.
	for _, c := range fed.Clients {
		es, err := edgestore.OpenEdge(filepath.Join(dir, c.ID+".db"), storage.Options{})
		if err != nil {
			t.Fatal(err)
		}
		r, _, in, err := agent.SecAggSession(es)
		if err != nil || r != rounds || !slices.Equal(in, simInputs[rounds][c.ID]) {
			t.Errorf("site %s: stored input of round %d (%v) is not simulate's", c.ID, r, err)
		}
		if algo == FedProxSplit {
			// Sum mode: every round's UPDATE receipt advanced the site's
			// record once (the inputs above depend on it); the last
			// round's may still have been on its way when the federation
			// stopped, its entry and pending contribution then kept.
			cr, _, err := es.Contribution()
			out, oerr := es.Outbox()
			_, pending, perr := es.Pending(rounds)
			switch {
			case err != nil || oerr != nil || perr != nil:
				t.Errorf("site %s: %v, %v, %v", c.ID, err, oerr, perr)
			case cr == rounds && len(out) == 0 && !pending:
			case cr == rounds-1 && len(out) == 1 && out[0].Round == rounds && pending:
				t.Logf("site %s: the last round's receipt was on its way when the federation stopped", c.ID)
			default:
				t.Errorf("site %s: record of round %d, %d outbox entries, pending %v: want the record of round %d, or of %d with round %d's entry pending",
					c.ID, cr, len(out), pending, rounds, rounds-1, rounds)
			}
		}
		es.Close()
	}
	// Neither the aggregator's state file nor the log holds one site's
	// input: its quantised bytes, or its dequantised update as float64 or
	// float32.
	state, err := os.ReadFile(lf.StatePath)
	if err != nil {
		t.Fatal(err)
	}
	haystacks := map[string][]byte{"state file": state, "log": []byte(logs.String())}
	sb := cfg.SecAgg.ScaleBits
	if sb == 0 {
		sb, _ = uplink.SecAggScaleBits(cfg.SecAgg.Clip, cfg.PerRound)
	}
	checked := 0
	for r, ins := range simInputs {
		for id, in := range ins {
			for _, needle := range inputWindows(in, sb) {
				checked++
				for name, h := range haystacks {
					if bytes.Contains(h, needle) {
						t.Fatalf("round %d: the aggregator's %s contains site %s's input (%x)", r, name, id, needle)
					}
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d windows searched", checked)
	}
}

// inputWindows are byte strings of a site's input to search for: every
// window of 4 consecutive quantised values (little-endian uint32, as the
// secagg encoding writes them) whose values are non-zero and distinct, and
// the same coordinates dequantised as float64 and float32.
func inputWindows(in []uint32, scaleBits int) [][]byte {
	var out [][]byte
	for i := 0; i+4 <= len(in); i++ {
		w := in[i : i+4]
		if slices.Contains(w, 0) || len(slices.Compact(slices.Sorted(slices.Values(w)))) < 4 {
			continue
		}
		var q, f64, f32 []byte
		for _, v := range w {
			q = binary.LittleEndian.AppendUint32(q, v)
			x := math.Ldexp(float64(secagg.Signed(v)), -scaleBits)
			f64 = binary.LittleEndian.AppendUint64(f64, math.Float64bits(x))
			f32 = binary.LittleEndian.AppendUint32(f32, math.Float32bits(float32(x)))
		}
		out = append(out, q, f64, f32)
	}
	return out
}
